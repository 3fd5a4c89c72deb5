"""Property tests on real tokenizers: chunking and state transport never change the text."""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.golden_cases import derenderer_for, sample_config
from tests.stream_builders import chat_one_shot, chat_stream, split, written
from worker.core.envelope_processor import EnvelopeProcessor


class ModelIds(NamedTuple):
    eos: int
    prompt: list[int]


MODELS = {
    # Byte-level BPE (NFC) and SentencePiece with byte fallback and Metaspace.
    "qwen3": ModelIds(eos=151645, prompt=[151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]),
    "mistral-7b-v0.1": ModelIds(eos=2, prompt=[1, 733, 16289, 28793, 6312, 28705, 733, 28748, 16289, 28793]),
}

# Scripts and symbols that exercise multi-byte UTF-8, byte fallback and merges across records.
ALPHABET = (
    "abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,!?'\"-\n\t"
    "éèàçñüößøåÉ"
    "中文北京是国的首都日本語한국어"
    "ключиπλάσμααβγ"
    "🤗🚀✨👍🏽👨‍👩‍👧🇫🇷😀"
    "العربيةहिन्दी"
)
texts = st.text(alphabet=ALPHABET, min_size=1, max_size=60)


def _run(model_dir: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    processor = EnvelopeProcessor(derenderer_for(sample_config(model_dir=model_dir)))
    outputs = []
    for record in records:
        result = processor.process(orjson.dumps(record))
        assert result.output is not None, result
        outputs.append(written(result))
    return outputs


def _encode(model_dir: str, text: str) -> list[int]:
    tokenizer = derenderer_for(sample_config(model_dir=model_dir)).tokenizer.backend
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
    return ids


def _streamed_text(outputs: list[dict[str, Any]]) -> str:
    return "".join(o["body"]["chunk"]["choices"][0]["delta"]["content"] or "" for o in outputs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model_dir=st.sampled_from(sorted(MODELS)),
    text=texts,
    cuts=st.lists(st.integers(min_value=1, max_value=80), max_size=20),
)
def test_any_chunking_gives_the_one_shot_text(model_dir: str, text: str, cuts: list[int]) -> None:
    info = MODELS[model_dir]
    ids = [*_encode(model_dir, text), info.eos]
    chunks = split(ids, cuts)
    streamed = _run(model_dir, chat_stream("r", chunks, prompt_token_ids=info.prompt))
    one_shot = _run(model_dir, [chat_one_shot("r", ids, prompt_token_ids=info.prompt)])
    message = one_shot[0]["body"]["choices"][0]["message"]
    assert _streamed_text(streamed) == message["content"]
    # Chunking is invisible: one token per record gives the same text too.
    per_token = _run(model_dir, chat_stream("r", [[t] for t in ids], prompt_token_ids=info.prompt))
    assert _streamed_text(per_token) == message["content"]
    assert streamed[-1]["body"]["chunk"]["choices"][0]["finish_reason"] == "stop"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model_dir=st.sampled_from(sorted(MODELS)),
    text=texts,
    cuts=st.lists(st.integers(min_value=1, max_value=80), max_size=12),
)
def test_carried_state_equals_held_state(model_dir: str, text: str, cuts: list[int]) -> None:
    """Handing each output ``stream_state`` back (through JSON) equals letting the core hold it."""
    info = MODELS[model_dir]
    ids = [*_encode(model_dir, text), info.eos]
    records = chat_stream("r", split(ids, cuts), prompt_token_ids=info.prompt)
    held = _run(model_dir, records)

    context = {k: v for k, v in records[0]["body"].items() if k != "generate_chunk"}
    carried = []
    state: Any = None
    for record in records:
        record = copy.deepcopy(record)
        record["body"].update(context)
        record["body"]["stream_state"] = state
        # A fresh processor per record: every record is resumed as if by another worker.
        processor = EnvelopeProcessor(derenderer_for(sample_config(model_dir=model_dir)))
        result = processor.process(orjson.dumps(record))
        assert result.output is not None
        carried.append(written(result))
        state = result.stream_state()
    strip = [{**o, "body": {**o["body"], "chunk": {**o["body"]["chunk"], "created": 0}}} for o in held]
    assert [
        {**o, "body": {**o["body"], "chunk": {**o["body"]["chunk"], "created": 0}}} for o in carried
    ] == strip
