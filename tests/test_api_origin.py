"""A request's ``origin`` (the API it came in on): carried by the worker from its input record to that
record's output, named by assembly (``replay`` / ``consume --assemble``) and by ``audit``'s report.

The records are the real Qwen3 demo streams through the worker's core; records without ``origin``
(chat requests, or records written before it existed) still read as before.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pytest

from schemas.envelope import InputEnvelope, Origin
from schemas.pipeline import IngestErrorRecord, RequestEnvelope
from tests.audit_streams import (
    DEMO_FLAGS,
    NO_REASONING_FLAGS,
    demo_envelopes,
    read_jsonl,
    replay_outputs,
    settings_for,
    shared_derenderer,
    write_jsonl,
)
from tests.golden_cases import normalize
from worker.assembly import Assembler, origin_name, render_text
from worker.cli import main
from worker.commands import audit as audit_command
from worker.pipeline.ingest import error_record
from worker.runtime import composition
from worker.runtime.composition import new_processor

MESSAGE = {"api": "messages", "id": "msg_0123abcd"}
BATCH_LINE = {"api": "batch", "id": "batch_77", "line": 4}
RESPONSE = {"api": "responses", "id": "resp_feed"}


@pytest.fixture(autouse=True)
def _load_each_tokenizer_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit_command, "load_derenderer", shared_derenderer)
    monkeypatch.setattr(composition, "load_derenderer", shared_derenderer)


def tagged_demo() -> list[dict[str, Any]]:
    """The demo streams, their first records named as ingest names them; ``demo-plain`` left as is."""
    origins = {"demo-reasoning": MESSAGE, "demo-tool": BATCH_LINE, "demo-completion": RESPONSE}
    envelopes = demo_envelopes()
    for envelope in envelopes:
        if envelope["seq"] == 0 and envelope["request_id"] in origins:
            envelope["origin"] = origins[envelope["request_id"]]
    return envelopes


def test_the_worker_copies_an_inputs_origin_to_its_output_and_nothing_else_changes() -> None:
    tagged = replay_outputs(DEMO_FLAGS, tagged_demo())
    plain = replay_outputs(DEMO_FLAGS, demo_envelopes())
    for output in tagged:
        origin = output.pop("origin", None)
        if output["seq"] == 0 and output["request_id"] != "demo-plain":
            assert origin in (MESSAGE, BATCH_LINE, RESPONSE)
        else:
            assert origin is None
    assert normalize(tagged) == normalize(plain)  # the clock and random tool-call ids aside


def test_an_error_record_of_a_first_record_keeps_its_origin() -> None:
    """A first record the worker refuses (here: no generate chunk) still names its API."""
    processor = new_processor(settings_for(DEMO_FLAGS), shared_derenderer(settings_for(DEMO_FLAGS)))
    bad = {"request_id": "r", "seq": 0, "endpoint": "chat", "body": {"stream": True}, "origin": MESSAGE}
    result = processor.process(orjson.dumps(bad))
    assert result.output is not None and result.output["error"]["code"] == 400
    assert result.output["origin"] == MESSAGE


def test_an_origin_of_no_known_api_makes_the_record_a_dead_letter() -> None:
    processor = new_processor(settings_for(DEMO_FLAGS), shared_derenderer(settings_for(DEMO_FLAGS)))
    record = demo_envelopes()[0]
    record["origin"] = {"api": "embeddings", "id": "x"}
    result = processor.process(orjson.dumps(record))
    assert result.output is None and result.dead_letter is not None
    assert "origin.api" in result.dead_letter.reason


def test_the_wire_models_take_an_origin_and_leave_it_out_when_absent() -> None:
    request = RequestEnvelope.model_validate(
        {"request_id": "batch_77-4", "endpoint": "chat", "request": {}, "origin": BATCH_LINE}
    )
    assert request.origin is not None and request.origin.model_dump(exclude_none=True) == BATCH_LINE
    assert (
        RequestEnvelope.model_validate({"request_id": "a", "endpoint": "chat", "request": {}}).origin is None
    )
    envelope = InputEnvelope.model_validate({"request_id": "a", "seq": 0, "endpoint": "chat", "body": {}})
    assert envelope.origin is None
    error = {"message": "m", "type": "t", "code": 500}
    record = {"request_id": "a", "seq": 0, "endpoint": "chat", "error": error, "origin": MESSAGE}
    assert IngestErrorRecord.model_validate(record).origin is not None


def test_ingests_error_records_carry_the_requests_origin() -> None:
    origin = Origin.model_validate(BATCH_LINE)
    record = error_record("batch_77-4", 3, "chat", {"message": "cut", "type": "t", "code": 503}, origin)
    assert orjson.loads(record)["origin"] == BATCH_LINE
    assert IngestErrorRecord.model_validate_json(record).origin == origin
    assert "origin" not in orjson.loads(
        error_record("r", 0, "chat", {"message": "m", "type": "t", "code": 400})
    )


def test_assembly_names_each_request_by_its_api() -> None:
    assembler = Assembler()
    for output in replay_outputs(DEMO_FLAGS, tagged_demo()):
        assembler.add(output)
    text = {rid: render_text(response) for rid, response in assembler.responses.items()}
    assert text["demo-reasoning"].startswith("== messages msg_0123abcd (request demo-reasoning) (chat, ")
    assert text["demo-tool"].startswith("== batch batch_77 line 4 (request demo-tool) (chat, ")
    assert text["demo-completion"].startswith(
        "== responses resp_feed (request demo-completion) (completion, "
    )
    assert text["demo-plain"].startswith("== demo-plain (chat, ")
    assert origin_name(None) is None and origin_name({"id": "no api"}) is None


def test_the_audit_report_names_the_api_of_each_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envelopes = tagged_demo()
    inputs = write_jsonl(tmp_path / "in.jsonl", envelopes)
    outputs = write_jsonl(tmp_path / "out.jsonl", replay_outputs(DEMO_FLAGS, envelopes))
    report = tmp_path / "report.jsonl"
    argv = ["audit", "--input-file", str(inputs), "--output-file", str(outputs), "--report", str(report)]
    assert main([*argv, *NO_REASONING_FLAGS]) == 1  # without the reasoning parser, reasoning differs
    err = capsys.readouterr().err
    lines = {line["request_id"]: line for line in read_jsonl(report)}
    assert set(lines) == {"demo-reasoning", "demo-tool"}  # the two that think
    assert lines["demo-reasoning"]["origin"] == MESSAGE and lines["demo-tool"]["origin"] == BATCH_LINE
    assert "demo-reasoning (messages msg_0123abcd) seq 0: differing" in err
    assert "demo-tool (batch batch_77 line 4) seq 0: differing" in err


def test_old_records_without_origin_assemble_and_audit_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envelopes = demo_envelopes()
    outputs = replay_outputs(DEMO_FLAGS, envelopes)
    assert all("origin" not in o for o in outputs)
    assembler = Assembler()
    for output in outputs:
        assembler.add(output)
    out = io.StringIO()
    for response in assembler.responses.values():
        assert response.origin is None
        print(render_text(response), file=out)
    assert "== demo-reasoning (chat, " in out.getvalue()
    inputs = write_jsonl(tmp_path / "in.jsonl", envelopes)
    recorded = write_jsonl(tmp_path / "out.jsonl", outputs)
    report = tmp_path / "report.jsonl"
    argv = ["audit", "--input-file", str(inputs), "--output-file", str(recorded), "--report", str(report)]
    assert main([*argv, *NO_REASONING_FLAGS]) == 1
    assert "  demo-reasoning seq 0: differing" in capsys.readouterr().err
    lines = read_jsonl(report)
    assert [line["request_id"] for line in lines] == ["demo-reasoning", "demo-tool"]
    assert all("origin" not in line for line in lines)
