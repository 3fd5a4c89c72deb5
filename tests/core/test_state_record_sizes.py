"""The request context's size model against the state records really written.

``RequestContext.state_bytes`` bounds a request's state records before they are encoded (the
per-request state limit refuses on it), and ``worker.core.state_record`` defines both the records and
the model's fixed sizes. Here requests of several shapes are encoded the way the changelog writes
them: the model must bound every record, and not by more than its worst-case assumptions (every
integer at 20 characters, the longest endpoint and window form), so a change of either side shows.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from schemas.bounds import INT64_MAX
from tests.golden_cases import derenderer_for, sample_config
from tests.stream_builders import chat_stream
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.request_context import RequestContext
from worker.core.vllm_version import VllmVersion
from worker.runtime.state.changelog import decode, encode_context, encode_progress

JsonDict = dict[str, Any]
PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
# "Hello! 你好 😀": ids whose token strings are longer than the ids (byte-level BPE).
TEXT_IDS = [9707, 0, 220, 108386, 26525, 222]
SPACES_128 = 56940  # one token of 128 spaces: 256 bytes as a token string, 5 digits as an id


def _slack(ctx: RequestContext) -> int:
    """How far the model may lie above a record written at offset 0: its integers at their widest
    (offset, last_seq, last_choice_index, two keys per choice, a finished index each), the longest
    endpoint and window form, and separators the first choice does not need."""
    return 64 + 48 * len(ctx.sequences) + 21 * len(ctx.finished)


def _check(ctx: RequestContext) -> None:
    widest = encode_context(ctx, INT64_MAX)
    assert len(widest) <= ctx.state_bytes()
    assert len(encode_progress(ctx, INT64_MAX)) <= ctx.state_bytes() - ctx.context_bytes
    assert ctx.state_bytes() - len(encode_context(ctx, 0)) <= _slack(ctx)
    # The context part alone, as written: the record without its progress part (the model counts
    # the longest endpoint, "completion" against "chat").
    progress = orjson.dumps(orjson.loads(widest)["progress"])
    assert 0 <= ctx.context_bytes - (len(widest) - len(progress)) <= len("completion") - len("chat")


def _run(version: VllmVersion, records: list[JsonDict], *, parsers: bool = False) -> EnvelopeProcessor:
    processor = EnvelopeProcessor(derenderer_for(sample_config(parsers=parsers), version))
    for record in records:
        result = processor.process(orjson.dumps(record))
        assert result.output is not None and "body" in result.output, result.output
    return processor


def _completion(rid: str, n: int, steps: list[tuple[int, list[int], str | None]]) -> list[JsonDict]:
    records = []
    for seq, (index, ids, finish) in enumerate(steps):
        choice: JsonDict = {"index": index, "token_ids": ids, "finish_reason": finish}
        body: JsonDict = {"stream": True, "generate_chunk": {"request_id": rid, "choices": [choice]}}
        if seq == 0:
            body |= {
                "model": "test-model",
                "prompt_token_ids": PROMPT,
                "prompt_tokens": len(PROMPT),
                "completion_request": {"model": "test-model", "prompt": "Say hi", "n": n, "logprobs": 2},
            }
        records.append({"request_id": rid, "seq": seq, "endpoint": "completion", "body": body})
    return records


@pytest.mark.parametrize("version", list(VllmVersion))
def test_one_open_chat_choice(version: VllmVersion) -> None:
    records = chat_stream("r", [[9707], [0, 220], [151645]], prompt_token_ids=PROMPT)[:2]
    _check(_run(version, records).requests["r"])


def test_a_stream_without_any_context() -> None:
    """A stream whose records bring no model, prompt or request: its context is never measured,
    and its context record still holds the empty fields."""
    record = chat_stream("r", [[9707, 0, 220], [151645]], prompt_token_ids=PROMPT)[0]
    for name in ("model", "prompt_token_ids", "prompt_tokens", "chat_request"):
        del record["body"][name]
    ctx = _run(VllmVersion.V0_34, [record]).requests["r"]
    assert ctx.inherited == {} and ctx.request_raw is None
    _check(ctx)


@pytest.mark.parametrize("version", list(VllmVersion))
def test_a_large_non_ascii_request_with_tools(version: VllmVersion) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "天气 🌦 " * 50,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    request = {
        "model": "test-model",
        "messages": [{"role": "user", "content": "你好 😀 " * 400}],
        "tools": [tool],
        "tool_choice": "auto",
    }
    records = chat_stream("r", [TEXT_IDS, [151645]], prompt_token_ids=PROMPT, chat_request=request)[:1]
    _check(_run(version, records, parsers=True).requests["r"])


@pytest.mark.parametrize("version", list(VllmVersion))
def test_several_choices_some_finished(version: VllmVersion) -> None:
    steps: list[tuple[int, list[int], str | None]] = [
        (0, [9707], None),
        (1, [0, 220], None),
        (2, TEXT_IDS, "length"),
        (0, [151645], "stop"),
        (1, [9707], None),
    ]
    ctx = _run(version, _completion("c", 3, steps)).requests["c"]
    assert len(ctx.sequences) == 3 and ctx.finished == {0, 2}
    _check(ctx)


@pytest.mark.parametrize("stored_by", list(VllmVersion))
def test_a_context_restored_by_a_worker_of_either_version(stored_by: VllmVersion) -> None:
    """A restored request is written back in the restoring worker's window form, which may take
    more bytes than the form it was stored in: token strings of 256 bytes against 5-digit ids."""
    records = chat_stream("r", [[SPACES_128] * 8, [SPACES_128] * 4, [151645]], prompt_token_ids=PROMPT)[:2]
    stored = encode_context(_run(stored_by, records).requests["r"], 7)
    for version in VllmVersion:
        restored = decode(derenderer_for(sample_config(), version), stored).ctx
        _check(restored)
