"""A dead letter as the dead-letter topic holds it: the ``DeadLetterRecord`` with the original
record's bytes, Kafka key, headers and source, within a size limit.

The core decides that a record is a dead letter (``worker.core.envelope_processor.DeadLetter``);
the Kafka parts (headers, where the record sat, the topic's size limit) are the runtime's.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from typing import Any, Literal

import orjson

from worker.core.envelope_processor import DeadLetter
from worker.core.record_errors import clip

MAX_DEAD_LETTER_KEY_BYTES = 4096
MAX_DEAD_LETTER_HEADERS_BYTES = 16 * 1024


def kafka_key(letter: DeadLetter) -> bytes | None:
    """The dead-letter record's own key: the original key, cut when it is absurdly long."""
    if letter.key is None or len(letter.key) <= MAX_DEAD_LETTER_KEY_BYTES:
        return letter.key
    return letter.key[:MAX_DEAD_LETTER_KEY_BYTES]


def encode(
    letter: DeadLetter,
    headers: Sequence[tuple[str, bytes | str]] | None,
    source: dict[str, Any] | None,
    *,
    max_bytes: int,
) -> bytes:
    """The ``DeadLetterRecord``, at most ``max_bytes`` with its key.

    The original value is stored in whichever of UTF-8 text and base64 is shorter as JSON (NUL
    bytes would take 6 bytes each as text). When it does not fit, only its first bytes are
    stored and ``truncated`` says so; ``original_size`` and ``original_sha256`` always describe
    the whole value.
    """
    value = letter.value
    key = kafka_key(letter)
    header_pairs, headers_cut = _dead_letter_headers(headers)
    record: dict[str, Any] = {
        "reason": clip(letter.reason),
        "original": "",
        "original_encoding": "base64",  # the longer name, while measuring the rest
        "original_size": len(value),
        "original_sha256": hashlib.sha256(value).hexdigest(),
        "truncated": headers_cut or (letter.key is not None and len(letter.key) > MAX_DEAD_LETTER_KEY_BYTES),
        "key": None if letter.key is None else clip(letter.key.decode("utf-8", errors="replace")),
        "headers": header_pairs,
        "source": source,
    }
    budget = max_bytes - len(orjson.dumps(record)) - (len(key) if key is not None else 0)
    original, encoding, size = _shorter_encoding(value)
    if size > budget:
        original, encoding = _prefix_that_fits(value, encoding, max(budget, 0), size)
        record["truncated"] = True
    record["original"] = original
    record["original_encoding"] = encoding
    return orjson.dumps(record)


def _dead_letter_headers(
    headers: Sequence[tuple[str, bytes | str]] | None,
) -> tuple[list[tuple[str, str] | tuple[str, str, Literal["base64"]]], bool]:
    """Kafka headers as ``(name, text)`` pairs, or ``(name, base64, "base64")`` for a value that is
    not UTF-8 (so ``dlq replay`` re-sends the exact bytes), within ``MAX_DEAD_LETTER_HEADERS_BYTES``;
    and whether any were cut."""
    out: list[tuple[str, str] | tuple[str, str, Literal["base64"]]] = []
    total = 0
    for name, value in headers or ():
        raw = value.encode("utf-8", errors="surrogatepass") if isinstance(value, str) else value
        label = str(name).encode("utf-8", errors="replace").decode("utf-8")
        try:
            pair: tuple[str, str] | tuple[str, str, Literal["base64"]] = (label, raw.decode("utf-8"))
        except UnicodeDecodeError:
            pair = (label, base64.b64encode(raw).decode("ascii"), "base64")
        total += len(label) + len(pair[1])
        if total > MAX_DEAD_LETTER_HEADERS_BYTES:
            return out, True
        out.append(pair)
    return out, False


def _shorter_encoding(value: bytes) -> tuple[str, Literal["utf-8", "base64"], int]:
    """The original as text or base64, whichever is shorter as a JSON string, and that length."""
    b64_size = 4 * ((len(value) + 2) // 3) + 2
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(value).decode("ascii"), "base64", b64_size
    text_size = len(orjson.dumps(text))
    if text_size <= b64_size:
        return text, "utf-8", text_size
    return base64.b64encode(value).decode("ascii"), "base64", b64_size


def _prefix_that_fits(
    value: bytes, encoding: Literal["utf-8", "base64"], budget: int, full_size: int
) -> tuple[str, Literal["utf-8", "base64"]]:
    """A prefix of ``value`` whose JSON string (``full_size`` bytes for all of it) fits in
    ``budget`` bytes, nearly the longest."""
    if budget <= 2:
        return "", encoding  # not even an empty string fits: the record stays over (never here)
    if encoding == "utf-8":
        n = (budget - 2) * len(value) // max(full_size - 2, 1)
        for _ in range(8):  # escapes are spread unevenly: shrink by what the last try overshot
            # The value is valid UTF-8: "ignore" only drops a character cut in half at the end.
            text = value[:n].decode("utf-8", errors="ignore")
            size = len(orjson.dumps(text))
            if size <= budget:
                return text, "utf-8"
            n = min(n - 1, n * (budget - 2) // (size - 2))
        return "", "utf-8"
    n = (budget - 2) // 4 * 3
    return base64.b64encode(value[:n]).decode("ascii"), "base64"
