"""Token ids to text, exactly as vLLM 0.33.0's derender decodes them.

Three decoders live here, each matching one vLLM code path:

* the incremental window (``DecodeWindow`` + ``TextDecoder.extend``): vLLM's
  ``detokenize_incrementally`` on a window trimmed and rebased after every
  token, so per-token cost and carried state stay O(window);
* ``seed_window``: the prompt tail that primes the window, so a Metaspace
  tokenizer keeps the first output token's leading space;
* ``token_strings``: per-token strings and UTF-8 bytes for logprobs, with the
  leading-space restoration of ``convert_ids_list_to_tokens``.

Everything runs on the Rust ``tokenizers`` object; the metadata that decides
what is "special" was resolved through transformers at load time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from worker.core.model_dir import LoadedTokenizer

REPLACEMENT_CHAR = "\ufffd"
# vLLM primes the window with this many prompt tokens (plus two for specials).
_SEED_OFFSET = 5


@dataclass(slots=True)
class DecodeWindow:
    """The trailing tokens the incremental decoder still reads, and its two offsets."""

    tokens: list[str] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0

    def copy(self) -> DecodeWindow:
        return DecodeWindow(list(self.tokens), self.prefix_offset, self.read_offset)


class TextDecoder:
    """Decoding operations over one loaded tokenizer."""

    def __init__(self, tokenizer: LoadedTokenizer) -> None:
        self.tokenizer = tokenizer
        backend = tokenizer.backend
        self._id_to_token = backend.id_to_token
        decoder = backend.decoder
        self._join = decoder.decode if decoder is not None else " ".join
        self._backend_decode = backend.decode
        self._vocab_size = tokenizer.vocab_size
        self._special_ids = tokenizer.special_ids
        # transformers skips its clean-up for BPE models; only others get it.
        self._clean_up = tokenizer.clean_up_tokenization_spaces and type(backend.model).__name__ != "BPE"
        self._piece_cache: dict[int, str] = {}

    # --- helpers -----------------------------------------------------------------------------

    def piece(self, token_id: int) -> str | None:
        """The raw vocabulary piece of an id, or None when there is none."""
        if token_id < 0:
            return None
        cached = self._piece_cache.get(token_id)
        if cached is not None:
            return cached
        try:
            result = self._id_to_token(token_id)
        except OverflowError:
            return None
        if result is not None and len(self._piece_cache) < 200_000:
            self._piece_cache[token_id] = result
        return result

    def decode(self, token_ids: Sequence[int]) -> str:
        """``tokenizer.decode(ids)`` with special tokens kept."""
        try:
            text: str = self._backend_decode(list(token_ids), skip_special_tokens=False)
        except OverflowError:
            text = self._backend_decode([t for t in token_ids if 0 <= t < 2**32], skip_special_tokens=False)
        if self._clean_up:
            text = _clean_up_tokenization(text)
        return text

    # --- incremental window -----------------------------------------------------------------

    def seed_window(self, prompt_token_ids: Sequence[int] | None, skip_special_tokens: bool) -> DecodeWindow:
        """Prime the window from the prompt tail; empty when there is no prompt."""
        if not prompt_token_ids:
            return DecodeWindow()
        tail = prompt_token_ids[-_SEED_OFFSET - 2 :]
        tokens: list[str] = []
        for token_id in tail:
            if skip_special_tokens and token_id in self._special_ids:
                continue
            tokens.append(self.piece(token_id) or "")
        read_offset = len(tokens)
        return DecodeWindow(tokens, max(read_offset - _SEED_OFFSET, 0), read_offset)

    def extend(self, window: DecodeWindow, token_ids: Sequence[int], skip_special_tokens: bool) -> str:
        """Feed ``token_ids`` through the window (mutated in place); return the new text."""
        parts: list[str] = []
        join = self._join
        tokens = window.tokens
        prefix_offset = window.prefix_offset
        read_offset = window.read_offset
        for token_id in token_ids:
            if 0 <= token_id < self._vocab_size:
                if skip_special_tokens and token_id in self._special_ids:
                    new_tokens: list[str] = []
                else:
                    new_tokens = [self.piece(token_id) or ""]
            else:
                new_tokens = [""]
            start = min(prefix_offset, read_offset, len(tokens))
            visible = tokens[start:] + new_tokens
            prefix_text = join(visible[prefix_offset - start : read_offset - start])
            new_text = join(visible[prefix_offset - start :])
            tokens = tokens + new_tokens
            if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
                parts.append(new_text[len(prefix_text) :])
                prefix_offset, read_offset = read_offset, len(tokens)
            # Everything before prefix_offset is never read again: drop it and rebase.
            tokens = tokens[prefix_offset:]
            read_offset -= prefix_offset
            prefix_offset = 0
        window.tokens = tokens
        window.prefix_offset = prefix_offset
        window.read_offset = read_offset
        return "".join(parts)

    # --- per-token strings for logprobs -------------------------------------------------------

    def token_strings(self, token_ids: Sequence[int]) -> list[tuple[str, list[int] | None]]:
        """Each id decoded alone, with its UTF-8 bytes; ``("", None)`` for an id with no piece."""
        marker = self.tokenizer.leading_space_marker
        out: list[tuple[str, list[int] | None]] = []
        for token_id in token_ids:
            raw = self.piece(token_id)
            if raw is None:
                out.append(("", None))
                continue
            text = self.decode([token_id]) or ""
            if marker is not None:
                text = _restore_leading_spaces(raw, text, marker)
            out.append((text, list(text.encode("utf-8", errors="replace"))))
        return out


def _restore_leading_spaces(raw_piece: str, text: str, marker: str) -> str:
    """Put back the leading spaces ``decode`` strips from a lone SentencePiece token."""
    wanted = len(raw_piece) - len(raw_piece.lstrip(marker))
    if wanted == 0:
        return text
    present = len(text) - len(text.lstrip(" "))
    return " " * (wanted - present) + text if wanted > present else text


def _clean_up_tokenization(text: str) -> str:
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text
