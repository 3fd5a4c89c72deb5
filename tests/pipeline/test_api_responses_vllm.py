"""The gateway's Responses stream events equal those of vLLM's own simple (non-Harmony) streaming state
machine for the same chat deltas.

``tests/golden_apis/responses_vllm_0.33.json`` holds the events vLLM 0.33.0's
``SimpleStreamingEventProcessor`` (``entrypoints/openai/responses/streaming_events.py``) wrote for the
chat deltas of every golden chat stream that ends without an error (``tests/api_golden_streams.py``),
driven as ``_process_simple_streaming_events`` drives it: each delta split by ``split_delta``, one output
item open at a time, the last closed ``incomplete`` after ``length``. They are the events between
``response.in_progress`` and the terminal event, numbered from 2 as there. How the file was made:
``tests/golden_apis/README.md``. The item ids are random on both sides (``rs_``, ``msg_``, ``fc_`` + hex)
and are renamed by order of first appearance. Compared as JSON values, field for field; key order is not
compared (vLLM's is the ``openai`` package's field order, ours puts ``type`` and ``sequence_number``
first). vLLM's events are taken as a client sees them through ``as_we_send``: without the ``null`` fields
that only the ``openai`` package's models add (``phase``, ``async``, ``caller``, ``namespace``: set by
neither converter, present or not depending on that package's version) and without the ``name`` vLLM
adds to ``response.function_call_arguments.done``, which OpenAI's schema does not have (docs/apis.md).
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

import pytest

from tests.api_golden_streams import chat_streams
from tests.paths import REPO_ROOT
from worker.pipeline.apis.responses import ResponseStream, response_object

FIXTURE = REPO_ROOT / "tests" / "golden_apis" / "responses_vllm_0.33.json"
_ITEM_ID = re.compile(r"(rs|msg|fc)_[0-9a-f]{32}")


def streams() -> dict[str, list[dict[str, Any]]]:
    """The golden chat streams that end without an error: vLLM's state machine never sees one."""
    return {name: chunks for name, (chunks, error) in chat_streams().items() if error is None}


@cache
def fixture() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(FIXTURE.read_text(encoding="utf-8"))
    return loaded


_SDK_ONLY_NULLS = ("phase", "async", "caller", "namespace")


def as_we_send(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's events without the ``openai`` package's unset fields and without its extra ``name``."""

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items() if not (k in _SDK_ONLY_NULLS and v is None)}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    out = []
    for event in events:
        event = walk(event)
        if event["type"] == "response.function_call_arguments.done":
            assert isinstance(event.pop("name"), str)
        out.append(event)
    return out


def item_ids_renamed(events: Any) -> Any:
    names: dict[str, str] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, str) and _ITEM_ID.fullmatch(value):
            return names.setdefault(value, f"<{value.split('_')[0]}-{len(names)}>")
        return value

    return walk(events)


def our_item_events(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our events between ``response.in_progress`` and the terminal event."""
    stream = ResponseStream(response_object({"model": "test-model"}, "resp_1", 0, "in_progress"))
    events = stream.start()
    for chunk in chunks:
        events += stream.feed(chunk)
    events += stream.end()
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    return events[2:-1]


def test_the_fixture_covers_every_golden_chat_stream() -> None:
    assert sorted(fixture()["streams"]) == sorted(streams())
    assert len(streams()) > 90


@pytest.mark.parametrize("name", sorted(streams()))
def test_stream_events_equal_vllms(name: str) -> None:
    ours = item_ids_renamed(our_item_events(streams()[name]))
    assert ours == item_ids_renamed(as_we_send(fixture()["streams"][name]))
