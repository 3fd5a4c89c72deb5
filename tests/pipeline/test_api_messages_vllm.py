"""The gateway's Messages events and messages equal vLLM's own converters' for the same chat chunks.

``tests/golden_apis/messages_vllm_0.33.json`` holds what vLLM 0.33.0's ``message_stream_converter`` and
``messages_full_converter`` (``entrypoints/anthropic/serving.py``; the same in 0.34.0) made of the chat
chunks ``tests/api_golden_streams.py`` builds from the golden cases; how it was made is in
``tests/golden_apis/README.md``. Compared as serialized JSON, so key order counts too; the one random
value on both sides, a thinking block's ``signature`` (a uuid4), is compared by its shape. Our one
difference (compatibility item 27: a thinking block starts with ``"signature": ""``) is taken out of our
events first, in ``as_vllm_sends``; item 28 (the first chunk's text kept) has its own test.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

import pytest

from tests.api_golden_streams import chat_streams, one_shots
from tests.paths import REPO_ROOT
from worker.pipeline.apis.messages import MessageStream, to_message

FIXTURE = REPO_ROOT / "tests" / "golden_apis" / "messages_vllm_0.33.json"
JsonDict = dict[str, Any]
_SIGNATURE = re.compile(r"[0-9a-f]{32}")


@cache
def fixture() -> JsonDict:
    loaded: JsonDict = json.loads(FIXTURE.read_text(encoding="utf-8"))
    return loaded


def our_events(chunks: list[JsonDict], error: JsonDict | None) -> list[list[Any]]:
    stream = MessageStream()
    events = [event for chunk in chunks for event in stream.feed(chunk)]
    events += stream.error(error) if error is not None else stream.end()
    return [[name, data] for name, data in events]


def as_vllm_sends(events: list[list[Any]]) -> list[list[Any]]:
    """Our events without the ``"signature": ""`` a thinking block starts with (compatibility item 27):
    Anthropic's schema requires the field, vLLM leaves it out."""
    out = []
    for name, data in events:
        block = data.get("content_block")
        if name == "content_block_start" and block["type"] == "thinking":
            assert block["signature"] == ""
            data = {**data, "content_block": {k: v for k, v in block.items() if k != "signature"}}
        out.append([name, data])
    return out


def signatures_shaped(value: Any) -> Any:
    """``value`` with each ``signature`` replaced by whether it is a uuid4's 32 hex digits."""
    if isinstance(value, dict):
        return {
            k: (
                bool(_SIGNATURE.fullmatch(v))
                if k == "signature" and isinstance(v, str)
                else signatures_shaped(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [signatures_shaped(v) for v in value]
    return value


def test_the_fixture_covers_every_golden_chat_stream_and_completion() -> None:
    assert sorted(fixture()["streams"]) == sorted(chat_streams())
    assert sorted(fixture()["messages"]) == sorted(one_shots())
    assert len(chat_streams()) > 100 and len(one_shots()) > 40


@pytest.mark.parametrize("name", sorted(chat_streams()))
def test_stream_events_equal_vllms(name: str) -> None:
    chunks, error = chat_streams()[name]
    ours = json.dumps(signatures_shaped(as_vllm_sends(our_events(chunks, error))))
    assert ours == json.dumps(signatures_shaped(fixture()["streams"][name]))


@pytest.mark.parametrize("name", sorted(one_shots()))
def test_message_equals_vllms(name: str) -> None:
    ours = json.dumps(signatures_shaped(to_message(one_shots()[name])))
    assert ours == json.dumps(signatures_shaped(fixture()["messages"][name]))


def test_text_in_the_first_chunk_is_kept_where_vllm_drops_it() -> None:
    """The worker's first chunk carries the role *with* the first text (vLLM's derender does); vLLM's
    converter skips the first chunk's deltas, which would lose that text (docs/compatibility.md)."""
    chunks, _ = chat_streams()["plain_stream/plain-chat-qwen3-multibyte"]
    without_role = chunks[1:]
    assert without_role[0]["choices"][0]["delta"].get("content")
    events = our_events(without_role, None)
    text = "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")
    assert text == "".join(
        c["choices"][0]["delta"].get("content") or "" for c in without_role if c["choices"]
    )
