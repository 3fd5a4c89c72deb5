"""A failure inside a parser session is ours (a 500, logged) unless the client carried the state.

vLLM rebuilds the parser from the caller's ``stream_state`` on every streamed chat call, so it
answers any failure there with a 400 "invalid stream_state". The worker keeps sessions alive
between records: when no state came from the caller, a failure is a bug of ours and must not be
reported as the client's fault.
"""

from __future__ import annotations

import io
import logging
from typing import Any

import orjson
import pytest

from tests.golden_cases import derenderer_for, sample_config
from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.parsing import ChatStreamSession
from worker.replay import replay_lines

PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]


def _derenderer() -> Derenderer:
    return derenderer_for(sample_config(parsers=True))


def _record(seq: int, token: int, *, state: dict[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {
        "stream": True,
        "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": [token]}]},
    }
    if seq == 0 or state is not None:
        body |= {
            "model": "test-model",
            "prompt_token_ids": PROMPT,
            "chat_request": {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]},
        }
    if state is not None:
        body["stream_state"] = state
    return orjson.dumps({"request_id": "r", "seq": seq, "endpoint": "chat", "body": body})


class _ParserBug(RuntimeError):
    pass


def _break_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: ChatStreamSession[Any], *args: Any) -> Any:
        raise _ParserBug("a bug inside the parser session")

    monkeypatch.setattr(ChatStreamSession, "step", broken)


def test_a_bug_inside_a_live_session_is_a_500_not_the_clients_400(monkeypatch: pytest.MonkeyPatch) -> None:
    processor = EnvelopeProcessor(_derenderer())
    first = processor.process(_record(0, 9707))
    assert first.output is not None and "error" not in first.output
    assert processor.requests["r"].sequences[0].live is not None  # the session lives between records

    _break_sessions(monkeypatch)
    failed = processor.process(_record(1, 0))
    assert failed.output is not None
    assert failed.output["error"]["code"] == 500
    assert failed.output["error"]["type"] == "InternalServerError"
    assert isinstance(failed.internal_error, _ParserBug)  # handed on for the traceback to be logged
    assert failed.closed and "r" not in processor.requests


def test_a_bug_on_the_first_record_is_a_500_too(monkeypatch: pytest.MonkeyPatch) -> None:
    _break_sessions(monkeypatch)
    failed = EnvelopeProcessor(_derenderer()).process(_record(0, 9707))
    assert failed.output is not None
    assert failed.output["error"]["code"] == 500
    assert isinstance(failed.internal_error, _ParserBug)


def test_a_failure_replaying_a_state_the_client_carried_is_a_400_as_in_vllm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    processor = EnvelopeProcessor(_derenderer())
    first = processor.process(_record(0, 9707))
    assert first.output is not None
    carried = first.stream_state()

    _break_sessions(monkeypatch)
    failed = EnvelopeProcessor(_derenderer()).process(_record(1, 0, state=carried))
    assert failed.output is not None
    assert failed.output["error"]["code"] == 400
    assert failed.output["error"]["message"] == "invalid stream_state: derender failed"
    assert failed.internal_error is None


def test_replay_logs_the_traceback_of_a_500(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _break_sessions(monkeypatch)
    out = io.BytesIO()
    with caplog.at_level(logging.ERROR, logger="worker.replay"):
        status = replay_lines([_record(0, 9707)], EnvelopeProcessor(_derenderer()), out, io.StringIO())
    assert status == 0  # an error record was written: the line got its one outcome
    assert orjson.loads(out.getvalue())["error"]["code"] == 500
    [logged] = [r for r in caplog.records if r.name == "worker.replay"]
    assert logged.exc_info is not None and logged.exc_info[0] is _ParserBug
