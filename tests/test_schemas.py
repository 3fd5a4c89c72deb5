"""The exported JSON Schema files match the models, and core output matches the response models."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from schemas.export import EXPORTED, SCHEMA_DIR, render
from schemas.openai import (
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    CompletionResponse,
    CompletionStreamResponse,
)
from tests.golden_cases import load_cases


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_schema_file_matches_model(name: str) -> None:
    path = SCHEMA_DIR / f"{name}.schema.json"
    assert path.exists(), f"{path.name} is missing: run `python -m schemas.export`"
    assert path.read_text(encoding="utf-8") == render(EXPORTED[name]), (
        f"{path.name} drifted from its model: run `python -m schemas.export` and review the diff"
    )


def test_every_schema_file_has_a_model() -> None:
    names = {p.name.removesuffix(".schema.json") for p in SCHEMA_DIR.glob("*.schema.json")}
    assert names == set(EXPORTED)


def _model_for(body: dict[str, Any]) -> type[BaseModel]:
    if "chunk" in body:
        obj = body["chunk"]["object"]
        return ChatCompletionStreamResponse if obj == "chat.completion.chunk" else CompletionStreamResponse
    return ChatCompletionResponse if body["object"] == "chat.completion" else CompletionResponse


def test_response_models_serialize_like_vllm() -> None:
    """Every golden output round-trips through our response models unchanged (same keys, same nulls)."""
    checked = 0
    for case in load_cases():
        for envelope in case.expected:
            body = envelope.get("body")
            if body is None:
                continue
            payload = body.get("chunk", body)
            model = _model_for(body)
            assert model.model_validate(payload).model_dump(mode="json") == payload, case.id
            checked += 1
    assert checked > 100
