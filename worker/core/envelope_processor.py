"""Input envelopes to output envelopes: the request bookkeeping around the derenderer.

Pure and synchronous (no I/O), shared by ``replay`` and the Kafka worker so
both hold state the same way:

* per request: the context the first record brought (``model``,
  ``prompt_tokens``, ``prompt_token_ids``, the chat/completion request), the
  last ``seq`` and one ``SequenceState`` per choice index;
* ``seq`` discipline: a record at or below the last ``seq`` is a duplicate
  (skipped, counted), a jump ahead is a gap (error output, request failed);
* the end of a request: every choice finished and, when
  ``stream_options.include_usage`` asks for it, the usage-only record seen.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import re
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from schemas.bounds import INT64_MAX, MAX_JSON_DEPTH
from schemas.derender import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
    DerenderStreamState,
)
from schemas.envelope import InputEnvelope
from schemas.openai import ChatCompletionRequest, CompletionRequest
from worker.core.cycle_collection import cycle_collection_paused
from worker.core.derenderer import Derenderer
from worker.core.live_parsers import LiveParserPool
from worker.core.sequence_state import SequenceState
from worker.errors import (
    InvalidRecordError,
    RequestError,
    RequestStateTooLargeError,
    SequenceError,
    SequenceGapError,
)

JsonDict = dict[str, Any]
ModelT = TypeVar("ModelT", bound=BaseModel)
Endpoint = Literal["chat", "completion"]

DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_LIVE_PARSERS = 10_000
# Under the producers' 16 MiB max request size, with room for the key and the batch overhead.
DEFAULT_MAX_OUTPUT_BYTES = 15 * 1024 * 1024
# A request's context plus progress (what its state records hold); under the output limit, so its
# context record (context + progress) always fits in one Kafka record.
DEFAULT_MAX_REQUEST_STATE_BYTES = 12 * 1024 * 1024
MAX_MESSAGE_CHARS = 4096  # error messages and dead-letter reasons are cut here
MAX_DEAD_LETTER_KEY_BYTES = 4096
MAX_DEAD_LETTER_HEADERS_BYTES = 16 * 1024
# Measured live size of one parser session (tracemalloc, Qwen3 with the qwen3 reasoning and hermes
# tool parsers, after a few hundred tokens); ``RequestContext.live_bytes`` counts it as a constant.
LIVE_PARSER_BYTES = 32 * 1024
_INHERITED_FIELDS = ("model", "prompt_tokens", "prompt_token_ids")
_REQUEST_FIELD = {"chat": "chat_request", "completion": "completion_request"}
_CLOSED_MEMORY = 65536
_MISSING = object()
STATE_FORMAT = 1
# A progress record's fixed part: {"v":1,"kind":"progress","last_seq":N,"sequences":{},...}.
_PROGRESS_OVERHEAD = 160
# A context record's fixed part besides its inherited fields and request.
_CONTEXT_OVERHEAD = 96
# live_bytes: a context object with its dicts; an int in a list (8-byte slot + 28-byte int); the
# request held parsed and raw, per byte of its JSON. Measured with tracemalloc (tests check them).
_CONTEXT_BASE_BYTES = 1200
_INT_IN_LIST_BYTES = 36
_REQUEST_BYTES_PER_BYTE = 6


@dataclass(slots=True)
class RequestContext:
    """What a stream request keeps between its records."""

    endpoint: Endpoint
    last_seq: int
    inherited: JsonDict = field(default_factory=dict)
    request: ChatCompletionRequest | CompletionRequest | None = None
    request_raw: JsonDict | None = None
    sequences: dict[int, SequenceState] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    last_choice_index: int = 0
    last_seen: float = 0.0
    """This process's clock at the last record; not persisted (another process's clock means nothing)."""
    context_bytes: int = 0
    """Size of the encoded context (endpoint, inherited fields, request), checked when it is set."""
    request_bytes: int = 0
    """Size of the encoded request alone (part of ``context_bytes``)."""
    measured_request: JsonDict | None = None
    """The ``request_raw`` that ``context_bytes`` was measured with."""
    wire_bytes: dict[int, int] = field(default_factory=dict)
    """Size of each choice's encoded ``stream_state``, as of its last record."""
    _wire_total: int = 0

    def note_wire(self, index: int, size: int) -> None:
        self._wire_total += size - self.wire_bytes.get(index, 0)
        self.wire_bytes[index] = size

    def state_bytes(self) -> int:
        """An upper bound of what its state records take: context plus progress record."""
        per_choice = 24  # the index as a key, separators
        return (
            self.context_bytes
            + _PROGRESS_OVERHEAD
            + self._wire_total
            + per_choice * len(self.wire_bytes)
            + 21 * len(self.finished)
        )

    def live_bytes(self) -> int:
        """A cheap estimate of the Python memory this request holds, O(choices + decode windows).

        Counts the prompt ids as ints in a list (36 bytes each), the request as parsed and raw
        (``_REQUEST_BYTES_PER_BYTE`` per byte of its JSON), each choice's state and a live parser
        session as ``LIVE_PARSER_BYTES``. Within about 20% of tracemalloc's figure in the tests.
        """
        size = _CONTEXT_BASE_BYTES + _REQUEST_BYTES_PER_BYTE * self.request_bytes
        prompt = self.inherited.get("prompt_token_ids")
        if isinstance(prompt, list):
            size += _INT_IN_LIST_BYTES * len(prompt)
        size += 64 * len(self.finished)
        for state in self.sequences.values():
            size += state.live_bytes()
            if state.live is not None:
                size += LIVE_PARSER_BYTES
        return size

    @property
    def expected_choices(self) -> int:
        n = self.request.n if self.request is not None else 1
        return n if n and n > 0 else 1

    @property
    def wants_usage_record(self) -> bool:
        options = self.request.stream_options if self.request is not None else None
        return bool(options is not None and options.include_usage)

    def to_snapshot(self) -> JsonDict:
        """A full, self-contained snapshot (``kind: context``); ``from_snapshot`` restores it.

        The state topic holds two kinds of records per request (see ``worker.runtime.state_store``):
        this one, written when the request is first persisted (and again only if its context
        changes), and a ``progress_snapshot`` at each later commit.
        """
        return {
            "v": STATE_FORMAT,
            "kind": "context",
            "endpoint": self.endpoint,
            "inherited": self.inherited,
            "request": self.request_raw,
            "progress": self.progress_snapshot(),
        }

    def progress_snapshot(self) -> JsonDict:
        """What changes from record to record (``kind: progress``): no request context."""
        return {
            "v": STATE_FORMAT,
            "kind": "progress",
            "last_seq": self.last_seq,
            "sequences": {str(i): s.to_wire() for i, s in self.sequences.items()},
            "finished": sorted(self.finished),
            "last_choice_index": self.last_choice_index,
        }

    @classmethod
    def from_snapshot(cls, data: JsonDict) -> RequestContext:
        """Restores a context record (carrying the progress of its time) or a pair
        ``{"v": 1, "context": ..., "progress": ...}`` whose progress record supersedes it.
        """
        version = data.get("v")
        if version != STATE_FORMAT:
            raise ValueError(f"unknown state snapshot format {version!r}")
        if data.get("kind") == "context":
            context, progress = data, data["progress"]
        elif "context" in data:
            context, progress = data["context"], data["progress"]
        else:
            raise ValueError("a progress record without its request's context record")
        endpoint: Endpoint = context["endpoint"]
        raw = context.get("request")
        model_cls = ChatCompletionRequest if endpoint == "chat" else CompletionRequest
        inherited = dict(context.get("inherited") or {})
        wires = {int(i): s for i, s in (progress.get("sequences") or {}).items()}
        ctx = cls(
            endpoint=endpoint,
            last_seq=int(progress["last_seq"]),
            inherited=inherited,
            request=model_cls.model_validate(raw) if raw is not None else None,
            request_raw=raw,
            sequences={
                i: SequenceState.from_wire(DerenderStreamState.model_validate(s)) for i, s in wires.items()
            },
            finished=set(progress.get("finished") or ()),
            last_choice_index=int(progress.get("last_choice_index", 0)),
        )
        ctx.context_bytes, ctx.request_bytes = measure_context(inherited, raw)
        ctx.measured_request = raw
        for index, wire in wires.items():
            ctx.note_wire(index, len(orjson.dumps(wire)))
        return ctx


def measure_context(inherited: JsonDict, request: Any) -> tuple[int, int]:
    """Encoded sizes of a request context as its state record holds it, whole and of its request
    alone; ``TypeError`` when it cannot be encoded."""
    request_size = len(orjson.dumps(request))
    return request_size + len(orjson.dumps(inherited)) + _CONTEXT_OVERHEAD, request_size


@dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str
    value: bytes
    key: bytes | None

    @property
    def kafka_key(self) -> bytes | None:
        """The dead-letter record's own key: the original key, cut when it is absurdly long."""
        if self.key is None or len(self.key) <= MAX_DEAD_LETTER_KEY_BYTES:
            return self.key
        return self.key[:MAX_DEAD_LETTER_KEY_BYTES]

    def encode(
        self,
        headers: Sequence[tuple[str, bytes | str]] | None = None,
        source: JsonDict | None = None,
        *,
        max_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> bytes:
        """The ``DeadLetterRecord``, at most ``max_bytes`` with its key.

        The original value is stored in whichever of UTF-8 text and base64 is shorter as JSON (NUL
        bytes would take 6 bytes each as text). When it does not fit, only its first bytes are
        stored and ``truncated`` says so; ``original_size`` and ``original_sha256`` always describe
        the whole value.
        """
        value = self.value
        key = self.kafka_key
        header_pairs, headers_cut = _dead_letter_headers(headers)
        record: JsonDict = {
            "reason": _clip(self.reason),
            "original": "",
            "original_encoding": "base64",  # the longer name, while measuring the rest
            "original_size": len(value),
            "original_sha256": hashlib.sha256(value).hexdigest(),
            "truncated": headers_cut or (self.key is not None and len(self.key) > MAX_DEAD_LETTER_KEY_BYTES),
            "key": None if self.key is None else _clip(self.key.decode("utf-8", errors="replace")),
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


def _clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


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


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """What one input record produced: exactly one of an output (a body or an error record), a
    dead letter, or a skipped duplicate, already serialized (``payload``)."""

    request_id: str | None = None
    output: JsonDict | None = None
    dead_letter: DeadLetter | None = None
    duplicate: bool = False
    closed: bool = False
    """The request ended (or failed) with this record: its state is gone."""
    payload: bytes | None = None
    """The bytes to send: the output envelope, or the ``DeadLetterRecord``; None for a duplicate.
    Never larger than the processor's ``max_output_bytes``."""
    internal_error: Exception | None = None
    """The dead letter is a processing bug, this unexpected exception, not a bad record."""
    sequence_gap: bool = False
    """The output is the ``SequenceGapError`` record of a request whose records went missing."""


_LISTED_ERRORS = 20


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    lines = [f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}:"]
    for err in errors[:_LISTED_ERRORS]:
        loc = _clip(".".join(str(part) for part in ("body", *err["loc"])), 256)
        lines.append(f"  {{'type': {err['type']!r}, 'loc': {loc!r}, 'msg': {err['msg']!r}}}")
    if len(errors) > _LISTED_ERRORS:
        lines.append(f"  ... and {len(errors) - _LISTED_ERRORS} more")
    first = errors[0]["loc"] if errors else ()
    param = _clip(".".join(str(part) for part in ("body", *first)), 256) if errors else None
    return "\n".join(lines), param


def _error_envelope(request_id: str, seq: int, endpoint: str, error: RequestError) -> JsonDict:
    return {
        "request_id": request_id,
        "seq": seq,
        "endpoint": endpoint,
        "error": {
            "message": _clip(error.message),
            "type": error.error_type,
            "param": error.param,
            "code": error.code,
        },
    }


_CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f]")
# JSON strings, so the brackets inside them are not counted as nesting.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# Opening brackets to 1, closing ones to -1 (as signed bytes).
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def json_depth_exceeds(value: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON document ``value`` nests arrays and objects deeper than ``limit``.

    Nearly free for ordinary records: fewer opening brackets than ``limit`` (those in strings
    included) cannot nest deeper. Otherwise strings are cut out and the nesting is summed up.
    """
    if value.count(b"[") + value.count(b"{") <= limit:
        return False
    if b'"' in value:
        value = _JSON_STRING.sub(b"", value)
    steps = array("b", value.translate(_BRACKET_STEPS, _NOT_BRACKETS))
    return max(accumulate(steps), default=0) > limit


class EnvelopeProcessor:
    """Turns input records into output records, holding each open request's state.

    ``process`` is the one boundary per record: whatever the bytes, it returns exactly one of an
    output (a body or an error record), a dead letter or a skipped duplicate, already serialized
    within the limits, and never raises.
    """

    def __init__(
        self,
        derenderer: Derenderer,
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        max_live_parsers: int = DEFAULT_MAX_LIVE_PARSERS,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        max_request_state_bytes: int = DEFAULT_MAX_REQUEST_STATE_BYTES,
        require_key: bool = False,
        clock: Callable[[], float] = time.monotonic,
        live_parsers: LiveParserPool | None = None,
    ) -> None:
        self.derenderer = derenderer
        self.max_record_bytes = max_record_bytes
        self.max_output_bytes = max_output_bytes
        self.max_request_state_bytes = max_request_state_bytes
        # Kafka records must be keyed by request_id (placement); JSON Lines have no keys.
        self.require_key = require_key
        self.requests: dict[str, RequestContext] = {}
        self._closed: OrderedDict[str, int] = OrderedDict()
        # Sequences holding a live parser; a worker shares one pool between its processors.
        self.parsers = live_parsers if live_parsers is not None else LiveParserPool(max_live_parsers)
        self._clock = clock

    # --- entry point -------------------------------------------------------------------------

    def process(
        self,
        value: bytes,
        key: bytes | None = None,
        *,
        source: JsonDict | None = None,
        headers: Sequence[tuple[str, bytes | str]] | None = None,
    ) -> ProcessResult:
        """One record in, its one outcome out. ``source`` (the record's topic, partition and
        offset) goes into the output envelope; ``headers`` (Kafka's) into a dead letter."""
        try:
            with cycle_collection_paused():
                result = self._process(value, key, source)
        except Exception as exc:  # noqa: BLE001 - the record boundary: every bug becomes a dead letter
            # A bug in the core must not stop the partition (a poison pill): the record is
            # dead-lettered with the error and processing goes on.
            letter = DeadLetter(f"processing failed: {exc!r}", value, key)
            return self._dead_letter_result(letter, headers, source, internal_error=exc)
        if result.dead_letter is not None:
            return self._dead_letter_result(result.dead_letter, headers, source)
        return result

    def _process(self, value: bytes, key: bytes | None, source: JsonDict | None) -> ProcessResult:
        try:
            envelope, too_deep = self._parse(value, key)
        except InvalidRecordError as exc:
            return ProcessResult(dead_letter=DeadLetter(exc.reason, value, key))
        rid, seq, endpoint, body = envelope.request_id, envelope.seq, envelope.endpoint, envelope.body
        stream = body.get("stream") is True
        was_open = rid in self.requests
        try:
            if not stream:
                return self._one_shot(rid, seq, endpoint, body, too_deep, source)
            return self._stream(rid, seq, endpoint, body, too_deep, source)
        except RequestError as exc:
            # A gap fails the whole request: report that its state is gone.
            closed = was_open and rid not in self.requests
            result = self.output_result(
                rid, _error_envelope(rid, seq, endpoint, exc), closed=closed, source=source
            )
            return dataclasses.replace(result, sequence_gap=isinstance(exc, SequenceGapError))
        except Exception as exc:  # noqa: BLE001 - every bug becomes this request's 500
            # A bug while derendering a valid envelope: the request's state may be half-advanced, so
            # the request fails (a 500, our fault, not the client's) and its client learns it now.
            self._close(rid, seq)
            error = RequestError(
                f"internal error while derendering: {exc!r}", code=500, error_type="InternalServerError"
            )
            failed = self.output_result(
                rid, _error_envelope(rid, seq, endpoint, error), closed=True, source=source
            )
            return dataclasses.replace(failed, internal_error=exc)

    def _parse(self, value: bytes, key: bytes | None) -> tuple[InputEnvelope, bool]:
        if len(value) > self.max_record_bytes:
            raise InvalidRecordError(
                f"record of {len(value)} bytes exceeds the limit of {self.max_record_bytes}"
            )
        if key is None and self.require_key:
            raise InvalidRecordError("record has no key: records must be keyed by their request_id")
        try:
            data = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise InvalidRecordError(f"malformed JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise InvalidRecordError(f"an envelope must be a JSON object, got {type(data).__name__}")
        try:
            envelope = InputEnvelope.model_validate(data)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False, include_context=False)
            details = "; ".join(
                f"{_clip('.'.join(str(p) for p in e['loc']), 256) or '<root>'}: {e['msg']}"
                for e in errors[:_LISTED_ERRORS]
            )
            more = f"; ... and {len(errors) - _LISTED_ERRORS} more" if len(errors) > _LISTED_ERRORS else ""
            raise InvalidRecordError(f"not a valid envelope: {details}{more}") from exc
        if key is not None and key != envelope.request_id.encode("utf-8"):
            raise InvalidRecordError(
                f"record key {_clip(key.decode('utf-8', errors='replace'), 256)!r} differs from "
                f"request_id {envelope.request_id!r}"
            )
        if self.require_key and _CONTROL_CHARACTERS.search(envelope.request_id):
            raise InvalidRecordError(f"request_id {envelope.request_id!r} contains control characters")
        return envelope, json_depth_exceeds(value)

    # --- serialized results ------------------------------------------------------------------

    def output_result(
        self,
        request_id: str,
        output: JsonDict,
        *,
        closed: bool = False,
        source: JsonDict | None = None,
        wire: orjson.Fragment | None = None,
    ) -> ProcessResult:
        """An output envelope, serialized. Output that cannot be written (a 500) or is larger than
        ``max_output_bytes`` (a 413) becomes an error record instead, which fails the request.

        ``wire``: the stream body's ``stream_state`` already encoded (``orjson.Fragment``).
        """
        if source is not None:
            output["source"] = source
        written = output
        if wire is not None:
            written = {**output, "body": {**output["body"], "stream_state": wire}}
        try:
            payload = orjson.dumps(written)
        except TypeError as exc:  # orjson.JSONEncodeError: a value the input bounds let through
            error = RequestError(
                f"the response cannot be written as JSON: {exc}", code=500, error_type="InternalServerError"
            )
        else:
            if len(payload) <= self.max_output_bytes:
                return ProcessResult(request_id=request_id, output=output, closed=closed, payload=payload)
            error = RequestError(
                f"the response of {len(payload)} bytes exceeds the output limit of "
                f"{self.max_output_bytes} bytes",
                code=413,
                error_type="OutputTooLargeError",
            )
        if "error" in output:
            raise AssertionError("an error record must always be writable") from None
        if request_id in self.requests:
            self._close(request_id, output["seq"])  # its client missed this record's text
        failed = _error_envelope(request_id, output["seq"], output["endpoint"], error)
        return self.output_result(request_id, failed, closed=True, source=source)

    def dead_letter_result(
        self,
        letter: DeadLetter,
        headers: Sequence[tuple[str, bytes | str]] | None = None,
        source: JsonDict | None = None,
        *,
        max_bytes: int | None = None,
    ) -> ProcessResult:
        """A dead letter, serialized within ``max_bytes`` (default ``max_output_bytes``)."""
        return self._dead_letter_result(letter, headers, source, max_bytes=max_bytes)

    def _dead_letter_result(
        self,
        letter: DeadLetter,
        headers: Sequence[tuple[str, bytes | str]] | None,
        source: JsonDict | None,
        *,
        max_bytes: int | None = None,
        internal_error: Exception | None = None,
    ) -> ProcessResult:
        payload = letter.encode(headers, source, max_bytes=max_bytes or self.max_output_bytes)
        return ProcessResult(dead_letter=letter, payload=payload, internal_error=internal_error)

    # --- one-shot ----------------------------------------------------------------------------

    def _one_shot(
        self, rid: str, seq: int, endpoint: Endpoint, body: JsonDict, too_deep: bool, source: JsonDict | None
    ) -> ProcessResult:
        if self._is_duplicate(rid, seq):
            return ProcessResult(request_id=rid, duplicate=True)
        self._remember_closed(rid, seq)
        if too_deep:
            raise _too_deep_error()
        if endpoint == "chat":
            chat = _validate(DerenderChatRequest, body)
            response = self.derenderer.chat(chat)
        else:
            completion = _validate(DerenderCompletionRequest, body)
            response = self.derenderer.completion(completion)
        output = {"request_id": rid, "seq": seq, "endpoint": endpoint, "body": response}
        return self.output_result(rid, output, closed=True, source=source)

    # --- streams -----------------------------------------------------------------------------

    def _stream(
        self, rid: str, seq: int, endpoint: Endpoint, body: JsonDict, too_deep: bool, source: JsonDict | None
    ) -> ProcessResult:
        if self._is_duplicate(rid, seq):
            return ProcessResult(request_id=rid, duplicate=True)
        ctx = self.requests.get(rid)
        if ctx is not None and ctx.endpoint != endpoint:
            raise RequestError(f"request {rid!r} started on endpoint {ctx.endpoint!r}, not {endpoint!r}")
        if ctx is not None and seq > ctx.last_seq + 1:
            self._close(rid, seq)
            raise SequenceGapError(
                f"seq {seq} of request {rid!r} skips ahead of the last processed seq {ctx.last_seq}; "
                "the request is failed because records are missing"
            )
        if ctx is None and seq > 0 and body.get("stream_state") is None:
            self._remember_closed(rid, seq)
            raise SequenceGapError(
                f"no state for request {rid!r} at seq {seq}: a stream starts at seq 0, or a record "
                "resuming it must carry stream_state"
            )
        created = ctx is None
        if ctx is None:
            ctx = RequestContext(endpoint=endpoint, last_seq=seq - 1)
            self.requests[rid] = ctx
        ctx.last_seq = seq
        ctx.last_seen = self._clock()
        try:
            if too_deep:
                raise _too_deep_error()
            return self._derender_stream(ctx, rid, seq, endpoint, body, source)
        except RequestError as exc:
            # A request that never got going: its later records must not run without its context.
            # One past its state limit cannot go on either.
            if created or isinstance(exc, RequestStateTooLargeError):
                self._close(rid, seq)
            raise

    def _derender_stream(
        self,
        ctx: RequestContext,
        rid: str,
        seq: int,
        endpoint: Endpoint,
        body: JsonDict,
        source: JsonDict | None,
    ) -> ProcessResult:
        given = {name: body[name] for name in _INHERITED_FIELDS if name in body}
        for name in _INHERITED_FIELDS:
            if name not in given and name in ctx.inherited:
                body[name] = ctx.inherited[name]
        request_field = _REQUEST_FIELD[endpoint]
        raw_request = body.pop(request_field, None)

        if endpoint == "chat":
            chat = _validate(DerenderChatStreamRequest, body)
            chat.chat_request = self._request_for(ctx, raw_request, ChatCompletionRequest, given)  # type: ignore[assignment]
            index = self._choice_index(ctx, chat.generate_chunk.choices)
            state = self._state_for(ctx, index, chat.stream_state)
            chunk, state = self.derenderer.chat_stream(chat, state)
            choices = chat.generate_chunk.choices
            has_usage = chat.generate_chunk.usage is not None
        else:
            completion = _validate(DerenderCompletionStreamRequest, body)
            completion.completion_request = self._request_for(  # type: ignore[assignment]
                ctx, raw_request, CompletionRequest, given
            )
            index = self._choice_index(ctx, completion.generate_chunk.choices)
            state = self._state_for(ctx, index, completion.stream_state)
            chunk, state = self.derenderer.completion_stream(completion, state)
            choices = completion.generate_chunk.choices
            has_usage = completion.generate_chunk.usage is not None

        ctx.inherited.update(given)
        ctx.sequences[index] = state
        self._track_live_parser(rid, index, state)
        ctx.last_choice_index = index
        for choice in choices:
            if choice.finish_reason is not None:
                ctx.finished.add(choice.index)
        wire = state.to_wire()
        wire_json = orjson.dumps(wire)  # validated, bounded values: it cannot fail
        ctx.note_wire(index, len(wire_json))
        if ctx.state_bytes() > self.max_request_state_bytes:
            raise RequestStateTooLargeError(
                f"the state of request {rid!r} ({ctx.state_bytes()} bytes: its request, prompt and "
                f"{len(ctx.sequences)} choice state(s)) exceeds the limit of {self.max_request_state_bytes} "
                "bytes per request"
            )
        output = {
            "request_id": rid,
            "seq": seq,
            "endpoint": endpoint,
            "body": {"chunk": chunk, "stream_state": wire},
        }
        done = len(ctx.finished) >= ctx.expected_choices and (
            not ctx.wants_usage_record or (not choices and has_usage)
        )
        if done:
            self._close(rid, seq)
        return self.output_result(rid, output, closed=done, source=source, wire=orjson.Fragment(wire_json))

    def _check_context(self, ctx: RequestContext, given: JsonDict, request_raw: JsonDict | None) -> None:
        """Measure the request context when this record sets or changes it: it must encode (for
        the state topic) and fit the per-request state limit, or the record is refused here,
        before the request takes any of it."""
        if request_raw is ctx.measured_request and (
            not given or all(ctx.inherited.get(name, _MISSING) == v for name, v in given.items())
        ):
            return
        try:
            size, request_size = measure_context({**ctx.inherited, **given}, request_raw)
        except TypeError as exc:  # cannot happen for input within the bounds; refused if it does
            raise RequestError(f"the request context cannot be stored: {exc}") from exc
        if size > self.max_request_state_bytes:
            raise RequestStateTooLargeError(
                f"the request context of {size} bytes (request and prompt) exceeds the limit of "
                f"{self.max_request_state_bytes} bytes per request"
            )
        ctx.context_bytes, ctx.request_bytes = size, request_size
        ctx.measured_request = request_raw

    def _choice_index(self, ctx: RequestContext, choices: Sequence[Any]) -> int:
        """The choice this record continues; it must be one of the request's ``n``."""
        if not choices:
            return ctx.last_choice_index
        index: int = choices[0].index
        n = ctx.expected_choices
        if not 0 <= index < n:
            raise RequestError(
                f"choice index {index} is out of range: the request has n={n} choice(s)",
                param="generate_chunk.choices.0.index",
            )
        return index

    def _request_for(
        self,
        ctx: RequestContext,
        raw: Any,
        model_cls: type[ChatCompletionRequest] | type[CompletionRequest],
        given: JsonDict,
    ) -> ChatCompletionRequest | CompletionRequest | None:
        """The request object for this record: its own, else the one the request started with.
        A new one is adopted once the context it makes was measured (``_check_context``)."""
        request, request_raw = ctx.request, ctx.request_raw
        if raw is not None:
            if not isinstance(raw, dict):
                raise RequestError(
                    f"{_REQUEST_FIELD[ctx.endpoint]} must be an object", error_type="Bad Request"
                )
            if raw != ctx.request_raw:
                try:
                    request = model_cls.model_validate(raw)
                except ValidationError as exc:
                    message, param = _validation_message(exc)
                    raise RequestError(message, error_type="Bad Request", param=param) from exc
                request_raw = raw
        self._check_context(ctx, given, request_raw)
        ctx.request, ctx.request_raw = request, request_raw
        return request

    def _state_for(
        self, ctx: RequestContext, index: int, carried: DerenderStreamState | None
    ) -> SequenceState | None:
        if carried is not None:
            self._check_carried(carried)
            return SequenceState.from_wire(carried)
        return ctx.sequences.get(index)

    def _check_carried(self, carried: DerenderStreamState) -> None:
        """Bounds of a caller-carried state that depend on the model (the schema checks the rest)."""
        limit = self.derenderer.options.max_model_len
        for name, items in (
            ("output_token_ids", carried.output_token_ids),
            ("last_tool_call_ids", carried.last_tool_call_ids),
        ):
            if len(items) > limit:
                raise RequestError(
                    f"stream_state.{name} length ({len(items)}) exceeds max_model_len ({limit}).",
                    param=f"stream_state.{name}",
                )

    # --- request lifetime --------------------------------------------------------------------

    def _is_duplicate(self, rid: str, seq: int) -> bool:
        ctx = self.requests.get(rid)
        if ctx is not None:
            return seq <= ctx.last_seq
        closed_at = self._closed.get(rid)
        return closed_at is not None and seq <= closed_at

    def _remember_closed(self, rid: str, seq: int) -> None:
        self._closed[rid] = max(seq, self._closed.get(rid, seq))
        self._closed.move_to_end(rid)
        while len(self._closed) > _CLOSED_MEMORY:
            self._closed.popitem(last=False)

    def _close(self, rid: str, seq: int) -> None:
        if self.requests.pop(rid, None) is not None:
            self.parsers.drop_request(self, rid)
        self._remember_closed(rid, seq)

    def _track_live_parser(self, rid: str, index: int, state: SequenceState) -> None:
        """Keep parsers alive within the pool's cap; an evicted one is rebuilt by replay."""
        self.parsers.touch(self, rid, index, state)

    @property
    def live_parsers(self) -> int:
        """Sessions held by this processor's requests."""
        return self.parsers.count(self)

    @property
    def parser_evictions(self) -> int:
        """Evictions in this processor's pool (worker-wide when the pool is shared)."""
        return self.parsers.evictions

    def is_open(self, request_id: str) -> bool:
        """Whether ``request_id`` has state here (its next record continues it)."""
        return request_id in self.requests

    def would_open(self, value: bytes, key: bytes | None) -> InputEnvelope | None:
        """The envelope when ``value`` would open a new streamed request here, else ``None``: a record
        of an open request, a one-shot, a duplicate, or anything ``process`` rejects (a dead letter
        holds no state). The runtime's memory caps admit new requests by this, with the same rules."""
        if key is not None and self.is_open(key.decode("utf-8", errors="replace")):
            return None  # records are keyed by request_id: the common case needs no parse
        try:
            envelope, _ = self._parse(value, key)
        except InvalidRecordError:
            return None
        if envelope.body.get("stream") is not True or self.is_open(envelope.request_id):
            return None
        if self._is_duplicate(envelope.request_id, envelope.seq):
            return None
        return envelope

    def expire_idle(self, ttl_seconds: float) -> list[ProcessResult]:
        """Close requests idle longer than ``ttl_seconds``, each with an error output record."""
        now = self._clock()
        expired = [rid for rid, ctx in self.requests.items() if now - ctx.last_seen > ttl_seconds]
        results = []
        for rid in expired:
            ctx = self.requests[rid]
            error = SequenceError(
                f"request {rid!r} was idle for more than {ttl_seconds:g} s after seq {ctx.last_seq} "
                "and was closed",
                code=408,
                error_type="RequestTimeoutError",
            )
            seq = min(ctx.last_seq + 1, INT64_MAX)
            self._close(rid, seq)
            results.append(
                self.output_result(rid, _error_envelope(rid, seq, ctx.endpoint, error), closed=True)
            )
        return results


def _too_deep_error() -> RequestError:
    return RequestError(
        f"the record nests arrays and objects deeper than {MAX_JSON_DEPTH} levels", param="body"
    )


def _validate(model_cls: type[ModelT], body: JsonDict) -> ModelT:
    try:
        return model_cls.model_validate(body)
    except ValidationError as exc:
        message, param = _validation_message(exc)
        raise RequestError(message, error_type="Bad Request", param=param) from exc
