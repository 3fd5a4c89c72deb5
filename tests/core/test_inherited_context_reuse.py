"""A request's later records reuse the context its first record brought, validated once.

``model``, ``prompt_tokens`` and ``prompt_token_ids`` may come on the first record only. A later
record must not validate or copy them again (that made every record cost grow with the prompt:
~1 ms per 1-token record at 8,000 prompt ids), and must derender to the same bytes as a record
that carries them itself. Counted, not timed: prompt ids handed to the body validator per record,
and the identity of the prompt list the derenderer is given.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from schemas.derender import DerenderChatStreamRequest, DerenderCompletionStreamRequest
from tests.golden_cases import derenderer_for, sample_config
from worker.core import envelope_processor
from worker.core.derenderer import Derenderer
from worker.core.envelope_processor import EnvelopeProcessor
from worker.core.request_context import RequestContext

JsonDict = dict[str, Any]
PROMPT_LEN = 2000
RECORDS = 12
# Qwen3 ids of ordinary text; the prompt repeats them.
TEXT_IDS = [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13, 220, 151645]
PROMPT = [(TEXT_IDS * (PROMPT_LEN // len(TEXT_IDS) + 1))[i] for i in range(PROMPT_LEN)]
PLAIN: JsonDict = sample_config(max_model_len=40960)
PARSERS: JsonDict = sample_config(parsers=True, max_model_len=40960)


def _records(endpoint: str, *, every: bool = False, lax: bool = False) -> list[bytes]:
    """A stream of 1-token records; the context on the first record only, or on ``every`` one.
    ``lax``: the context in forms the schema converts (numbers as strings)."""
    context: JsonDict = {
        "model": "test-model",
        "prompt_tokens": str(PROMPT_LEN) if lax else PROMPT_LEN,
        "prompt_token_ids": [str(i) for i in PROMPT] if lax else PROMPT,
    }
    out = []
    for seq in range(RECORDS):
        choice: JsonDict = {"index": 0, "token_ids": [TEXT_IDS[seq % len(TEXT_IDS)]]}
        chunk: JsonDict = {"request_id": "r", "choices": [choice]}
        if seq == RECORDS - 1:
            choice["finish_reason"] = "length"
            chunk["usage"] = {"prompt_tokens": 1, "completion_tokens": RECORDS, "total_tokens": RECORDS + 1}
        body: JsonDict = {"stream": True, "generate_chunk": chunk}
        if seq == 0 or every:
            body |= context
        if seq == 0:
            if endpoint == "chat":
                messages = [{"role": "user", "content": "hi"}]
                body["chat_request"] = {"model": "test-model", "messages": messages}
            else:
                body["completion_request"] = {"model": "test-model", "prompt": "hi"}
        out.append(orjson.dumps({"request_id": "r", "seq": seq, "endpoint": endpoint, "body": body}))
    return out


def _processor(config: JsonDict) -> EnvelopeProcessor:
    shared = derenderer_for(config)
    # A fixed clock, so two runs can be compared byte for byte.
    derenderer = Derenderer(shared.tokenizer, shared.options, shared.parsing, clock=lambda: 1_800_000_000.0)
    return EnvelopeProcessor(derenderer)


@pytest.fixture
def validated_prompt_ids(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Per validated stream body, how many prompt ids it held (a spy on the body validation)."""
    counts: list[int] = []
    real = envelope_processor._validate

    def spy(model_cls: type[Any], body: JsonDict) -> Any:
        if model_cls in (DerenderChatStreamRequest, DerenderCompletionStreamRequest):
            counts.append(len(body.get("prompt_token_ids") or ()))
        return real(model_cls, body)

    monkeypatch.setattr(envelope_processor, "_validate", spy)
    return counts


def _payloads(processor: EnvelopeProcessor, records: list[bytes]) -> list[bytes]:
    payloads = []
    for record in records:
        result = processor.process(record)
        assert result.payload is not None and result.output is not None
        assert "error" not in result.output, result.output
        payloads.append(result.payload)
    return payloads


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_later_records_validate_no_prompt_ids(endpoint: str, validated_prompt_ids: list[int]) -> None:
    _payloads(_processor(PLAIN), _records(endpoint))
    assert validated_prompt_ids == [PROMPT_LEN] + [0] * (RECORDS - 1)


@pytest.mark.parametrize(("endpoint", "config"), [("chat", PLAIN), ("chat", PARSERS), ("completion", PLAIN)])
def test_later_records_share_the_first_records_prompt(endpoint: str, config: JsonDict) -> None:
    processor = _processor(config)
    derenderer = processor.derenderer
    seen: list[list[int] | None] = []
    method = derenderer.chat_stream if endpoint == "chat" else derenderer.completion_stream

    def spy(body: Any, state: Any) -> Any:
        seen.append(body.prompt_token_ids)
        return method(body, state)

    setattr(derenderer, f"{endpoint}_stream", spy)  # an instance attribute over the method
    _payloads(processor, _records(endpoint))
    first = seen[0]
    assert first == PROMPT
    assert all(ids is first for ids in seen[1:])  # no copy per record


@pytest.mark.parametrize(("endpoint", "config"), [("chat", PLAIN), ("chat", PARSERS), ("completion", PLAIN)])
@pytest.mark.parametrize("lax", [False, True])
def test_inherited_context_gives_the_bytes_of_records_carrying_it(
    endpoint: str, config: JsonDict, lax: bool
) -> None:
    inherited = _payloads(_processor(config), _records(endpoint, lax=lax))
    carried = _payloads(_processor(config), _records(endpoint, every=True, lax=lax))
    assert inherited == carried
    last = orjson.loads(inherited[-1])["body"]["chunk"]
    assert last["usage"]["prompt_tokens"] == PROMPT_LEN  # the first record's count, as an int


def test_context_restored_from_state_is_validated_once(validated_prompt_ids: list[int]) -> None:
    """A context read back from a state record (``RequestContext.resume``) holds the values as
    stored: the first record after it validates them once, the later ones reuse them."""
    records = _records("chat", lax=True)
    whole = _payloads(_processor(PLAIN), records)
    first = _processor(PLAIN)
    head = _payloads(first, records[:4])
    ctx = first.requests["r"]
    stored = orjson.loads(orjson.dumps({"inherited": ctx.inherited, "request": ctx.request_raw}))
    stored["inherited"]["prompt_token_ids"] = [str(i) for i in PROMPT]  # as a state record may hold it
    second = _processor(PLAIN)
    second.requests["r"] = RequestContext.resume(
        "chat",
        stored["inherited"],
        stored["request"],
        last_seq=ctx.last_seq,
        sequences={i: s.to_wire() for i, s in ctx.sequences.items()},
        finished=set(ctx.finished),
        last_choice_index=ctx.last_choice_index,
        derenderer=second.derenderer,
    )
    validated_prompt_ids.clear()
    tail = _payloads(second, records[4:])
    assert head + tail == whole
    assert validated_prompt_ids == [PROMPT_LEN] + [0] * (RECORDS - 5)
    assert second.requests == {}  # finished
