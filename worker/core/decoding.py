"""Token ids to text, exactly as vLLM 0.33.0's derender decodes them.

Three decoders live here, each matching one vLLM code path:

* the incremental window (``DecodeWindow`` + ``TextDecoder.extend``): vLLM's
  ``detokenize_incrementally`` on a window trimmed and rebased after every
  token, so per-token cost and carried state stay O(window);
* ``seed_window``: the prompt tail that primes the window, so a Metaspace
  tokenizer keeps the first output token's leading space;
* ``token_strings``: per-token strings and UTF-8 bytes for logprobs, with the
  leading-space restoration of ``convert_ids_list_to_tokens``.

vLLM's window never advances while its text ends in U+FFFD (or yields no new
text), so a run of bytes that never completes a character grows it without
bound and makes every token cost the whole run. Here a window with more than
``MAX_PENDING_TOKENS`` unread tokens is forced forward: the text no later
token can change is emitted and the window keeps only what can still change
(at most one incomplete UTF-8 sequence), rebuilt so that every later token
decodes exactly as in vLLM's unbounded window. The concatenated text is
vLLM's; only the record that carries it can come earlier.

Everything runs on the Rust ``tokenizers`` object; the metadata that decides
what is "special" was resolved through transformers at load time.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from schemas.bounds import MAX_TOKEN_ID
from worker.core.model_dir import LoadedTokenizer

REPLACEMENT_CHAR = "\ufffd"
# vLLM primes the window with this many prompt tokens (plus two for specials).
_SEED_OFFSET = 5
#: Unread tokens a window may hold before it is forced forward. No UTF-8
#: character is longer than 4 bytes, so a character still being completed
#: spans at most 4 pending byte tokens; 4x that leaves every ordinary stream
#: (a few pending tokens at most) exactly as vLLM chunks it.
MAX_PENDING_TOKENS = 16
# ``_join_one``'s memory: at most this many vocabulary pieces and their text (~10 MB).
_JOIN_ONE_ENTRIES = 1 << 16
#: A byte-fallback token that no UTF-8 sequence can start: as the window's
#: context it keeps a run that can never become valid text invalid.
_INVALID_BYTE_TOKEN = "<0xFF>"
_HEX = frozenset("0123456789abcdefABCDEF")


class _DecoderKind(Enum):
    """Decoder families whose forced step is exact (every bundled tokenizer is one)."""

    BYTE_LEVEL = "byte_level"  # GPT-2 byte-level BPE: the text is the lossy UTF-8 of all bytes
    BYTE_FALLBACK = "byte_fallback"  # SentencePiece: ▁ -> space, <0xNN> runs, one leading space stripped
    OTHER = "other"


def _byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet: one printable character per byte value."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {byte: byte for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = 256 + extra
            extra += 1
    return {chr(code): byte for byte, code in chars.items()}


_BYTE_LEVEL_BYTES = _byte_level_alphabet()
_BYTE_LEVEL_CHARS = {byte: char for char, byte in _BYTE_LEVEL_BYTES.items()}


def _decoder_kind(decoder: Any) -> _DecoderKind:
    try:
        spec = json.loads(decoder.__getstate__())
    except (AttributeError, TypeError, ValueError):
        return _DecoderKind.OTHER
    if not isinstance(spec, dict):
        return _DecoderKind.OTHER
    if spec.get("type") == "ByteLevel":
        return _DecoderKind.BYTE_LEVEL
    parts = spec.get("decoders") if spec.get("type") == "Sequence" else None
    if not isinstance(parts, list):
        return _DecoderKind.OTHER
    if not all(isinstance(part, dict) for part in parts):
        return _DecoderKind.OTHER
    types = [part.get("type") for part in parts]
    strip = parts[-1] if types[-1:] == ["Strip"] else None
    if types[:3] != ["Replace", "ByteFallback", "Fuse"] or len(types) != 3 + (strip is not None):
        return _DecoderKind.OTHER
    if parts[0].get("pattern") != {"String": "\u2581"} or parts[0].get("content") != " ":
        return _DecoderKind.OTHER
    if strip is not None and (strip.get("content"), strip.get("start"), strip.get("stop")) != (" ", 1, 0):
        return _DecoderKind.OTHER
    return _DecoderKind.BYTE_FALLBACK


def _token_bytes(token: str) -> bytes:
    """A byte-level token's bytes (a token outside the alphabet stands for its UTF-8)."""
    table = _BYTE_LEVEL_BYTES
    if all(char in table for char in token):
        return bytes(table[char] for char in token)
    return token.encode("utf-8", errors="surrogatepass")


def _fallback_byte(token: str) -> int | None:
    """The byte a SentencePiece ``<0xNN>`` token stands for, else None."""
    if len(token) != 6 or not token.startswith("<0x") or token[5] != ">":
        return None
    digits = token[3:5]
    if not (all(c in _HEX for c in digits) or (digits[0] == "+" and digits[1] in _HEX)):
        return None
    return int(digits, 16)


def _can_become_valid(data: bytes) -> bool:
    """Whether some continuation makes ``data`` valid UTF-8."""
    try:
        codecs.getincrementaldecoder("utf-8")("strict").decode(data, final=False)
    except UnicodeDecodeError:
        return False
    return True


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
        self._token_to_id = backend.token_to_id
        decoder = backend.decoder
        self._join = decoder.decode if decoder is not None else " ".join
        self._backend_decode = backend.decode
        self._vocab_size = tokenizer.vocab_size
        self._special_ids = tokenizer.special_ids
        # transformers skips its clean-up for BPE models; only others get it.
        self._clean_up = tokenizer.clean_up_tokenization_spaces and type(backend.model).__name__ != "BPE"
        self._piece_cache: dict[int, str] = {}
        self._join_one_cache: dict[str, str] = {}
        # Logprob candidates repeat across positions: each id is decoded once (vocabulary-bounded).
        self._string_cache: dict[int, tuple[str, bytes | None]] = {}
        self._kind = _decoder_kind(decoder) if decoder is not None else _DecoderKind.OTHER

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
            in_range = [t for t in token_ids if 0 <= t <= MAX_TOKEN_ID]
            text = self._backend_decode(in_range, skip_special_tokens=False)
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

    def extend(
        self,
        window: DecodeWindow,
        token_ids: Sequence[int],
        skip_special_tokens: bool,
        *,
        skip_unknown_ids: bool = False,
    ) -> str:
        """Feed ``token_ids`` through the window (mutated in place); return the new text.

        An id outside the vocabulary decodes to nothing: vLLM 0.33 keeps ``""`` for it in the
        window, 0.34 (``skip_unknown_ids``, an id window cannot hold it) leaves it out.

        A window keeps ``prefix_offset <= read_offset <= len(tokens)`` (the schema holds a carried
        one to it), so it is rebased once to prefix offset 0. A token then costs two joins, where
        the prefix is most often the one token read before it: that join is remembered per piece.
        """
        parts: list[str] = []
        join = self._join
        piece = self.piece
        vocab_size = self._vocab_size
        skipped = self._special_ids if skip_special_tokens else frozenset()
        # A copy: the caller's list may be held elsewhere (a state being written).
        tokens = window.tokens[window.prefix_offset :]
        read_offset = window.read_offset - window.prefix_offset
        for token_id in token_ids:
            if not 0 <= token_id < vocab_size:
                if skip_unknown_ids:
                    continue
                tokens.append("")
            elif token_id not in skipped:
                tokens.append(piece(token_id) or "")
            # (A skipped special token adds nothing, yet may release text held back before it.)
            new_text = join(tokens)
            prefix_text = self._join_one(tokens[0]) if read_offset == 1 else join(tokens[:read_offset])
            if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
                parts.append(new_text[len(prefix_text) :])
                # Everything before the old read offset is never read again: drop it.
                tokens = tokens[read_offset:]
                read_offset = len(tokens)
            elif len(tokens) - read_offset > MAX_PENDING_TOKENS:
                forced, tokens, read_offset = self._force_forward(tokens, read_offset)
                parts.append(forced)
        window.tokens = tokens
        window.prefix_offset = 0
        window.read_offset = read_offset
        return "".join(parts)

    # --- the window as ids (vLLM 0.34's ``prev_token_ids``) -----------------------------------

    def window_from_ids(self, token_ids: Sequence[int], prefix_offset: int, read_offset: int) -> DecodeWindow:
        """A carried id window as the token strings the decoder reads (an id without a piece: "")."""
        return DecodeWindow([self.piece(t) or "" for t in token_ids], prefix_offset, read_offset)

    def window_ids(self, window: DecodeWindow) -> tuple[list[int], int, int]:
        """``window`` as ids and its offsets into them.

        Every vocabulary piece is its id. A string that is no piece is a window this decoder built
        past vLLM (``_force_forward``: pending bytes as one string, an empty separator) or a token
        window a 0.33 caller sent: spelled as its characters' ids when each is a piece (the same
        bytes), else left out (an unknown id decodes to nothing), the offsets moved with it.
        """
        ids: list[int] = []
        prefix, read = window.prefix_offset, window.read_offset
        to_id = self._token_to_id
        for position, token in enumerate(window.tokens):
            token_id = to_id(token) if token else None
            if token_id is not None:
                ids.append(token_id)
                continue
            parts = [to_id(char) for char in token]
            spelled = [p for p in parts if p is not None] if parts and None not in parts else []
            ids.extend(spelled)
            moved = len(spelled) - 1
            if position < window.prefix_offset:
                prefix += moved
            if position < window.read_offset:
                read += moved
        return ids, prefix, read

    def _join_one(self, token: str) -> str:
        """``self._join([token])``, remembered for vocabulary pieces only (a carried window's tokens
        are the caller's strings: they could fill the cache with junk)."""
        cache = self._join_one_cache
        text = cache.get(token)
        if text is None:
            text = self._join([token])
            if len(cache) < _JOIN_ONE_ENTRIES and self._token_to_id(token) is not None:
                cache[token] = text
        return text

    def _force_forward(self, tokens: list[str], read_offset: int) -> tuple[str, list[str], int]:
        """Emit what no later token can change; the new window and its read offset (prefix 0).

        ``tokens`` is a rebased window (prefix offset 0) stuck with many unread tokens.
        """
        join = self._join
        emitted = join(tokens[:read_offset])
        if self._kind is _DecoderKind.BYTE_LEVEL:
            # The text is the lossy UTF-8 of the concatenated bytes: everything but a trailing
            # incomplete sequence (at most 3 bytes) is final, and it starts a fresh decode.
            data = b"".join(_token_bytes(token) for token in tokens)
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            decoder.decode(data, final=False)
            pending = decoder.getstate()[0]
            done = data[: len(data) - len(pending)]
            text = join(["".join(_BYTE_LEVEL_CHARS[b] for b in done)])
            rest = ["".join(_BYTE_LEVEL_CHARS[b] for b in pending)] if pending else []
            return text[len(emitted) :], rest, 0
        if self._kind is _DecoderKind.BYTE_FALLBACK:
            run_start = len(tokens)
            while run_start > 0 and _fallback_byte(tokens[run_start - 1]) is not None:
                run_start -= 1
            run = bytes(_fallback_byte(token) or 0 for token in tokens[run_start:])
            if run and not _can_become_valid(run):
                # A run that is already invalid decodes as one U+FFFD per byte token until it ends;
                # an invalid byte as the context keeps the rest of the run invalid.
                return join(tokens)[len(emitted) :], [_INVALID_BYTE_TOKEN], 1
            if run_start >= read_offset:
                text = join(tokens[:run_start])
                # What follows is decoded on its own; the leading space it may start with is
                # stripped only when nothing at all came before it in the window.
                if join([*tokens[:run_start], "\u2581x"]) == "x":
                    context: list[str] = []
                else:
                    context = [_INVALID_BYTE_TOKEN, ""]
                return text[len(emitted) :], [*context, *tokens[run_start:]], len(context)
        # Unknown decoder family: same bound, the window's text taken as it is now.
        return join(tokens)[len(emitted) :], [], 0

    # --- per-token strings for logprobs -------------------------------------------------------

    def token_strings(self, token_ids: Sequence[int]) -> list[tuple[str, list[int] | None]]:
        """Each id decoded alone, with its UTF-8 bytes; ``("", None)`` for an id with no piece."""
        out: list[tuple[str, list[int] | None]] = []
        cache = self._string_cache
        for token_id in token_ids:
            known = cache.get(token_id)
            if known is None:
                known = self._token_string(token_id)
                if len(cache) < 200_000:
                    cache[token_id] = known
            text, data = known
            out.append((text, None if data is None else list(data)))
        return out

    def _token_string(self, token_id: int) -> tuple[str, bytes | None]:
        raw = self.piece(token_id)
        if raw is None:
            return "", None
        text = self.decode([token_id]) or ""
        marker = self.tokenizer.leading_space_marker
        if marker is not None:
            text = _restore_leading_spaces(raw, text, marker)
        return text, text.encode("utf-8", errors="replace")


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
