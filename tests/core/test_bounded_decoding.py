"""The decode window stays bounded: a byte run that never completes a character is forced forward.

The bound is structural (the window's length after N bad tokens), and the text is
checked against vLLM's own algorithm: the same window with no bound.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

import worker.core.decoding as decoding
from schemas.derender import DerenderCompletionStreamRequest
from tests.golden_cases import derenderer_for, sample_config
from worker.core.decoding import MAX_PENDING_TOKENS, TextDecoder

MODELS = ("qwen3", "llama-3", "deepseek-v3", "mistral-7b-v0.3")
PROMPT = [1, 2, 3, 4, 5, 6, 7]


def _decoder(model_dir: str) -> TextDecoder:
    return derenderer_for(sample_config(model_dir=model_dir)).decoder


def _byte_ids(decoder: TextDecoder) -> list[int]:
    """Ids of tokens that are one byte of a multi-byte character (never a whole one)."""
    vocab: dict[str, int] = decoder.tokenizer.backend.get_vocab()
    fallback = [
        i
        for piece, i in vocab.items()
        if len(piece) == 6 and piece.startswith("<0x") and piece[3] in "89ABCDEF"
    ]
    if fallback:
        return sorted(fallback)
    table = decoding._BYTE_LEVEL_BYTES
    return sorted(i for piece, i in vocab.items() if len(piece) == 1 and table.get(piece, 0) >= 0x80)


def _lead_id(decoder: TextDecoder) -> int:
    """The token of the lone byte 0xE2 (a three-byte lead): a run of it never completes."""
    backend = decoder.tokenizer.backend
    lead = backend.token_to_id("<0xE2>")
    if lead is None:
        lead = backend.token_to_id(decoding._BYTE_LEVEL_CHARS[0xE2])
    assert lead is not None
    return int(lead)


def _stream(decoder: TextDecoder, ids: Sequence[int], chunk: int) -> tuple[str, int]:
    """Concatenated text and the longest window seen between records."""
    window = decoder.seed_window(PROMPT, skip_special_tokens=False)
    parts: list[str] = []
    longest = 0
    for start in range(0, len(ids), chunk):
        parts.append(decoder.extend(window, ids[start : start + chunk], False))
        longest = max(longest, len(window.tokens))
    return "".join(parts), longest


@pytest.mark.parametrize("model_dir", MODELS)
def test_window_stays_bounded_over_a_run_that_never_completes(model_dir: str) -> None:
    decoder = _decoder(model_dir)
    lead = _lead_id(decoder)
    for chunk in (1, 7, 4000):
        text, longest = _stream(decoder, [lead] * 4000, chunk)
        # Context (at most one released stuck run, or the prompt tail) plus unread tokens.
        assert longest <= 2 * MAX_PENDING_TOKENS + len(PROMPT), (chunk, longest)
        assert text.count("\ufffd") >= 4000 - MAX_PENDING_TOKENS


@pytest.mark.parametrize("model_dir", MODELS)
def test_forced_text_equals_the_unbounded_window(model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    decoder = _decoder(model_dir)
    backend = decoder.tokenizer.backend
    bytes_ = _byte_ids(decoder)
    words = backend.encode("hello world, café 北京 🚀 ok", add_special_tokens=False).ids
    replacement = backend.encode("\ufffd\ufffd", add_special_tokens=False).ids
    flush = backend.encode(" and done", add_special_tokens=False).ids
    rng = random.Random(8)
    for _ in range(150):
        pool = rng.choice(
            [bytes_, bytes_ + words, bytes_ + replacement + [10**7, -1], bytes_ + words + replacement]
        )
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 100))] + flush
        with monkeypatch.context() as patch:
            patch.setattr(decoding, "MAX_PENDING_TOKENS", 10**9)
            expected, _ = _stream(decoder, ids, rng.choice([1, 5, 200]))
        for bound in (4, MAX_PENDING_TOKENS):
            monkeypatch.setattr(decoding, "MAX_PENDING_TOKENS", bound)
            got, longest = _stream(decoder, ids, rng.choice([1, 3, 200]))
            assert got == expected, ids
            assert longest <= 2 * bound + len(PROMPT)


def test_forced_byte_level_text_equals_a_one_shot_decode() -> None:
    decoder = _decoder("qwen3")
    backend = decoder.tokenizer.backend
    run = [*_byte_ids(decoder)[:40]] * 30  # 1,200 continuation/lead bytes in a row
    ids = [*run, *backend.encode(" tail", add_special_tokens=False).ids]
    window = decoder.seed_window(None, skip_special_tokens=False)
    text = decoder.extend(window, ids, False)
    assert text == backend.decode(ids, skip_special_tokens=False)


def test_a_stream_state_carries_the_bounded_window() -> None:
    """Through the derenderer: the output ``stream_state.prev_tokens`` never passes the bound."""
    derenderer = derenderer_for(sample_config(model_dir="mistral-7b-v0.3"))
    bad = derenderer.tokenizer.backend.token_to_id("<0xE2>")
    state = None
    for _ in range(50):
        body = DerenderCompletionStreamRequest.model_validate(
            {
                "stream": True,
                "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": [bad] * 40}]},
            }
        )
        _, state = derenderer.completion_stream(body, state)
        assert len(state.to_wire()["prev_tokens"]) <= MAX_PENDING_TOKENS + 2


def _vllm_incremental(decoder: TextDecoder, prompt: list[int], ids: Sequence[int], skip: bool) -> str:
    """vLLM's incremental detokenization, one token at a time over the whole unbounded token list
    (no rebasing, no remembered joins): the reference ``extend`` must equal."""
    join = decoder.tokenizer.backend.decoder.decode
    special = decoder.tokenizer.special_ids
    tokens = [decoder.piece(i) or "" for i in prompt if not (skip and i in special)]
    read = len(tokens)
    prefix = max(read - 5, 0)
    parts = []
    for token_id in ids:
        if not skip or token_id not in special:
            tokens.append(decoder.piece(token_id) or "")
        prefix_text, new_text = join(tokens[prefix:read]), join(tokens[prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            parts.append(new_text[len(prefix_text) :])
            prefix, read = read, len(tokens)
    return "".join(parts)


@pytest.mark.parametrize("model_dir", MODELS)
def test_extend_equals_vllms_incremental_detokenization(
    model_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decoding, "MAX_PENDING_TOKENS", 10**9)  # the reference has no bound
    decoder = _decoder(model_dir)
    backend = decoder.tokenizer.backend
    words = backend.encode(" hello world, café 北京 🚀 ok\n  x", add_special_tokens=False).ids
    pool = words + _byte_ids(decoder)[:20] + sorted(decoder.tokenizer.special_ids)[:5]
    rng = random.Random(3)
    for _ in range(60):
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 80))]
        skip = rng.random() < 0.5
        window = decoder.seed_window(PROMPT, skip_special_tokens=skip)
        chunk = rng.choice([1, 1, 2, 7])
        got = "".join(
            decoder.extend(window, ids[start : start + chunk], skip) for start in range(0, len(ids), chunk)
        )
        assert got == _vllm_incremental(decoder, PROMPT, ids, skip), (ids, skip, chunk)


def test_remembered_one_token_joins_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    decoder = _decoder("qwen3")
    monkeypatch.setattr(decoder, "_join_one_cache", {})  # the decoder is shared between tests
    monkeypatch.setattr(decoding, "_JOIN_ONE_ENTRIES", 3)
    junk = "\U0001f680" * 32  # a carried window's string, no vocabulary piece
    assert decoder._join_one(junk) == junk
    assert junk not in decoder._join_one_cache
    for piece in ("a", "b", "c", "d", "e"):
        assert decoder._join_one(piece) == piece
    assert list(decoder._join_one_cache) == ["a", "b", "c"]
