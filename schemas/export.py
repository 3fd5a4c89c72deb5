"""Export the wire contract as JSON Schema files (``python -m schemas.export``).

The files in ``schemas/json/`` are the contract other teams code against;
``tests/test_schemas.py`` fails when a model and its file drift apart.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from schemas.derender import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderChatStreamResponse,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
    DerenderCompletionStreamResponse,
    DerenderStreamState,
)
from schemas.envelope import CloseRecord, DeadLetterRecord, InputEnvelope, OutputEnvelope
from schemas.openai import ChatCompletionResponse, CompletionResponse, ErrorResponse
from schemas.pipeline import CancelRecord, IngestErrorRecord, IngestMarker, RequestEnvelope

SCHEMA_DIR = Path(__file__).resolve().parent / "json"

EXPORTED: dict[str, type[BaseModel]] = {
    "input_envelope": InputEnvelope,
    "close_record": CloseRecord,
    "output_envelope": OutputEnvelope,
    "dead_letter_record": DeadLetterRecord,
    "derender_stream_state": DerenderStreamState,
    "derender_chat_request": DerenderChatRequest,
    "derender_chat_stream_request": DerenderChatStreamRequest,
    "derender_completion_request": DerenderCompletionRequest,
    "derender_completion_stream_request": DerenderCompletionStreamRequest,
    "derender_chat_stream_response": DerenderChatStreamResponse,
    "derender_completion_stream_response": DerenderCompletionStreamResponse,
    "chat_completion_response": ChatCompletionResponse,
    "completion_response": CompletionResponse,
    "error_response": ErrorResponse,
    "request_envelope": RequestEnvelope,
    "cancel_record": CancelRecord,
    "ingest_marker": IngestMarker,
    "ingest_error_record": IngestErrorRecord,
}


def render(model: type[BaseModel]) -> str:
    """The schema file's exact text: stable key order, trailing newline."""
    schema = model.model_json_schema(mode="validation")
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def export(directory: Path = SCHEMA_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in EXPORTED.items():
        path = directory / f"{name}.schema.json"
        path.write_text(render(model), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in export():
        print(path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path, file=sys.stdout)
