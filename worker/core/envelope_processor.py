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
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from schemas.derender import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
    DerenderStreamState,
)
from schemas.envelope import InputEnvelope
from schemas.openai import ChatCompletionRequest, CompletionRequest
from worker.core.derenderer import Derenderer
from worker.core.live_parsers import LiveParserPool
from worker.core.sequence_state import SequenceState
from worker.errors import InvalidRecordError, RequestError, SequenceError

JsonDict = dict[str, Any]
ModelT = TypeVar("ModelT", bound=BaseModel)
Endpoint = Literal["chat", "completion"]

DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_LIVE_PARSERS = 10_000
_INHERITED_FIELDS = ("model", "prompt_tokens", "prompt_token_ids")
_REQUEST_FIELD = {"chat": "chat_request", "completion": "completion_request"}
_CLOSED_MEMORY = 65536
STATE_FORMAT = 1


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
        return cls(
            endpoint=endpoint,
            last_seq=int(progress["last_seq"]),
            inherited=dict(context.get("inherited") or {}),
            request=model_cls.model_validate(raw) if raw is not None else None,
            request_raw=raw,
            sequences={
                int(i): SequenceState.from_wire(DerenderStreamState.model_validate(s))
                for i, s in (progress.get("sequences") or {}).items()
            },
            finished=set(progress.get("finished") or ()),
            last_choice_index=int(progress.get("last_choice_index", 0)),
        )


@dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str
    value: bytes
    key: bytes | None

    def to_record(
        self, headers: list[tuple[str, str]] | None = None, source: JsonDict | None = None
    ) -> JsonDict:
        try:
            original, encoding = self.value.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            original, encoding = base64.b64encode(self.value).decode("ascii"), "base64"
        key = None
        if self.key is not None:
            key = self.key.decode("utf-8", errors="replace")
        return {
            "reason": self.reason,
            "original": original,
            "original_encoding": encoding,
            "key": key,
            "headers": headers or [],
            "source": source,
        }


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """What one input record produced. Exactly one of output / dead_letter / duplicate."""

    request_id: str | None = None
    output: JsonDict | None = None
    dead_letter: DeadLetter | None = None
    duplicate: bool = False
    closed: bool = False
    """The request ended (or failed) with this record: its state is gone."""


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    errors = exc.errors(include_url=False)
    lines = [f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}:"]
    for err in errors:
        loc = ".".join(str(part) for part in ("body", *err["loc"]))
        lines.append(f"  {{'type': {err['type']!r}, 'loc': {loc!r}, 'msg': {err['msg']!r}}}")
    first = errors[0]["loc"] if errors else ()
    param = ".".join(str(part) for part in ("body", *first)) if errors else None
    return "\n".join(lines), param


def _error_envelope(request_id: str, seq: int, endpoint: str, error: RequestError) -> JsonDict:
    return {
        "request_id": request_id,
        "seq": seq,
        "endpoint": endpoint,
        "error": {
            "message": error.message,
            "type": error.error_type,
            "param": error.param,
            "code": error.code,
        },
    }


class EnvelopeProcessor:
    """Turns input records into output records, holding each open request's state."""

    def __init__(
        self,
        derenderer: Derenderer,
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        max_live_parsers: int = DEFAULT_MAX_LIVE_PARSERS,
        clock: Callable[[], float] = time.monotonic,
        live_parsers: LiveParserPool | None = None,
    ) -> None:
        self.derenderer = derenderer
        self.max_record_bytes = max_record_bytes
        self.requests: dict[str, RequestContext] = {}
        self._closed: OrderedDict[str, int] = OrderedDict()
        # Sequences holding a live parser; a worker shares one pool between its processors.
        self.parsers = live_parsers if live_parsers is not None else LiveParserPool(max_live_parsers)
        self._clock = clock

    # --- entry point -------------------------------------------------------------------------

    def process(self, value: bytes, key: bytes | None = None) -> ProcessResult:
        try:
            envelope = self._parse(value, key)
        except InvalidRecordError as exc:
            return ProcessResult(dead_letter=DeadLetter(exc.reason, value, key))
        rid, seq, endpoint, body = envelope.request_id, envelope.seq, envelope.endpoint, envelope.body
        stream = body.get("stream") is True
        was_open = rid in self.requests
        try:
            if not stream:
                return self._one_shot(rid, seq, endpoint, body)
            return self._stream(rid, seq, endpoint, body)
        except RequestError as exc:
            # A gap fails the whole request: report that its state is gone.
            closed = was_open and rid not in self.requests
            return ProcessResult(
                request_id=rid, output=_error_envelope(rid, seq, endpoint, exc), closed=closed
            )

    def _parse(self, value: bytes, key: bytes | None) -> InputEnvelope:
        if len(value) > self.max_record_bytes:
            raise InvalidRecordError(
                f"record of {len(value)} bytes exceeds the limit of {self.max_record_bytes}"
            )
        try:
            data = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise InvalidRecordError(f"malformed JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise InvalidRecordError(f"an envelope must be a JSON object, got {type(data).__name__}")
        try:
            envelope = InputEnvelope.model_validate(data)
        except ValidationError as exc:
            details = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
                for e in exc.errors(include_url=False)
            )
            raise InvalidRecordError(f"not a valid envelope: {details}") from exc
        if key is not None and key != envelope.request_id.encode("utf-8"):
            raise InvalidRecordError(
                f"record key {key.decode('utf-8', errors='replace')!r} differs from "
                f"request_id {envelope.request_id!r}"
            )
        return envelope

    # --- one-shot ----------------------------------------------------------------------------

    def _one_shot(self, rid: str, seq: int, endpoint: Endpoint, body: JsonDict) -> ProcessResult:
        if self._is_duplicate(rid, seq):
            return ProcessResult(request_id=rid, duplicate=True)
        self._remember_closed(rid, seq)
        if endpoint == "chat":
            chat = _validate(DerenderChatRequest, body)
            response = self.derenderer.chat(chat)
        else:
            completion = _validate(DerenderCompletionRequest, body)
            response = self.derenderer.completion(completion)
        return ProcessResult(
            request_id=rid,
            output={"request_id": rid, "seq": seq, "endpoint": endpoint, "body": response},
            closed=True,
        )

    # --- streams -----------------------------------------------------------------------------

    def _stream(self, rid: str, seq: int, endpoint: Endpoint, body: JsonDict) -> ProcessResult:
        if self._is_duplicate(rid, seq):
            return ProcessResult(request_id=rid, duplicate=True)
        ctx = self.requests.get(rid)
        if ctx is not None and ctx.endpoint != endpoint:
            raise RequestError(f"request {rid!r} started on endpoint {ctx.endpoint!r}, not {endpoint!r}")
        if ctx is not None and seq > ctx.last_seq + 1:
            self._close(rid, seq)
            raise SequenceError(
                f"seq {seq} of request {rid!r} skips ahead of the last processed seq {ctx.last_seq}; "
                "the request is failed because records are missing",
                code=409,
                error_type="SequenceGapError",
                param="seq",
            )
        if ctx is None and seq > 0 and body.get("stream_state") is None:
            self._remember_closed(rid, seq)
            raise SequenceError(
                f"no state for request {rid!r} at seq {seq}: a stream starts at seq 0, or a record "
                "resuming it must carry stream_state",
                code=409,
                error_type="SequenceGapError",
                param="seq",
            )
        created = ctx is None
        if ctx is None:
            ctx = RequestContext(endpoint=endpoint, last_seq=seq - 1)
            self.requests[rid] = ctx
        ctx.last_seq = seq
        ctx.last_seen = self._clock()
        try:
            return self._derender_stream(ctx, rid, seq, endpoint, body)
        except RequestError:
            if created:
                # The request never got going: its later records must not run without its context.
                self._close(rid, seq)
            raise

    def _derender_stream(
        self, ctx: RequestContext, rid: str, seq: int, endpoint: Endpoint, body: JsonDict
    ) -> ProcessResult:
        given = {name: body[name] for name in _INHERITED_FIELDS if name in body}
        for name in _INHERITED_FIELDS:
            if name not in given and name in ctx.inherited:
                body[name] = ctx.inherited[name]
        request_field = _REQUEST_FIELD[endpoint]
        raw_request = body.pop(request_field, None)

        if endpoint == "chat":
            chat = _validate(DerenderChatStreamRequest, body)
            chat.chat_request = self._request_for(ctx, raw_request, ChatCompletionRequest)  # type: ignore[assignment]
            index = (
                chat.generate_chunk.choices[0].index if chat.generate_chunk.choices else ctx.last_choice_index
            )
            state = self._state_for(ctx, index, chat.stream_state)
            chunk, state = self.derenderer.chat_stream(chat, state)
            choices = chat.generate_chunk.choices
            has_usage = chat.generate_chunk.usage is not None
        else:
            completion = _validate(DerenderCompletionStreamRequest, body)
            completion.completion_request = self._request_for(  # type: ignore[assignment]
                ctx, raw_request, CompletionRequest
            )
            index = (
                completion.generate_chunk.choices[0].index
                if completion.generate_chunk.choices
                else ctx.last_choice_index
            )
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
        output = {
            "request_id": rid,
            "seq": seq,
            "endpoint": endpoint,
            "body": {"chunk": chunk, "stream_state": state.to_wire()},
        }
        done = len(ctx.finished) >= ctx.expected_choices and (
            not ctx.wants_usage_record or (not choices and has_usage)
        )
        if done:
            self._close(rid, seq)
        return ProcessResult(request_id=rid, output=output, closed=done)

    def _request_for(
        self,
        ctx: RequestContext,
        raw: Any,
        model_cls: type[ChatCompletionRequest] | type[CompletionRequest],
    ) -> ChatCompletionRequest | CompletionRequest | None:
        """The request object for this record: its own, else the one the request started with."""
        if raw is None:
            return ctx.request
        if not isinstance(raw, dict):
            raise RequestError(f"{_REQUEST_FIELD[ctx.endpoint]} must be an object", error_type="Bad Request")
        if raw == ctx.request_raw:
            return ctx.request
        try:
            parsed = model_cls.model_validate(raw)
        except ValidationError as exc:
            message, param = _validation_message(exc)
            raise RequestError(message, error_type="Bad Request", param=param) from exc
        ctx.request, ctx.request_raw = parsed, raw
        return parsed

    def _state_for(
        self, ctx: RequestContext, index: int, carried: DerenderStreamState | None
    ) -> SequenceState | None:
        if carried is not None:
            return SequenceState.from_wire(carried)
        return ctx.sequences.get(index)

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
            self._close(rid, ctx.last_seq + 1)
            results.append(
                ProcessResult(
                    request_id=rid,
                    output=_error_envelope(rid, ctx.last_seq + 1, ctx.endpoint, error),
                    closed=True,
                )
            )
        return results


def _validate(model_cls: type[ModelT], body: JsonDict) -> ModelT:
    try:
        return model_cls.model_validate(body)
    except ValidationError as exc:
        message, param = _validation_message(exc)
        raise RequestError(message, error_type="Bad Request", param=param) from exc


def serialize(record: JsonDict) -> bytes:
    return orjson.dumps(record)
