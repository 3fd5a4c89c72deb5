"""Input envelopes to output envelopes: the dispatch and request bookkeeping around the derenderer.

Pure and synchronous (no I/O), shared by ``replay`` and the Kafka worker so
both hold state the same way:

* per request: the context the first record brought (``model``,
  ``prompt_tokens``, ``prompt_token_ids``, the chat/completion request), the
  last ``seq`` and one ``SequenceState`` per choice index;
* ``seq`` discipline: a record at or below the last ``seq`` is a duplicate
  (skipped, counted), a jump ahead is a gap (error output, request failed);
* the end of a request: every choice finished and, when
  ``stream_options.include_usage`` asks for it, the usage-only record seen.

What a request holds between records, and its size, is ``request_context``; what an error
says, ``record_errors``.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import orjson
from pydantic import BaseModel, ValidationError

from schemas.bounds import INT64_MAX
from schemas.derender import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderStreamState,
)
from schemas.envelope import CloseRecord, InputEnvelope
from schemas.openai import ChatCompletionRequest, CompletionRequest
from worker.core.cycle_collection import pause_cycle_collection, resume_cycle_collection
from worker.core.derenderer import Derenderer
from worker.core.json_scan import json_depth_exceeds
from worker.core.limits import DEFAULT_MAX_LIVE_PARSERS as DEFAULT_MAX_LIVE_PARSERS
from worker.core.limits import DEFAULT_MAX_OUTPUT_BYTES as DEFAULT_MAX_OUTPUT_BYTES
from worker.core.limits import DEFAULT_MAX_RECORD_BYTES as DEFAULT_MAX_RECORD_BYTES
from worker.core.limits import DEFAULT_MAX_REQUEST_STATE_BYTES as DEFAULT_MAX_REQUEST_STATE_BYTES
from worker.core.live_parsers import LiveParserPool
from worker.core.record_errors import (
    clip,
    envelope_errors,
    error_envelope,
    too_deep_error,
    validation_message,
)
from worker.core.request_context import (
    STREAM_MODELS,
    Endpoint,
    RequestContext,
    expected_choices,
    measure_context,
)
from worker.core.sequence_state import SequenceState, StateWindowConflict
from worker.errors import (
    InvalidRecordError,
    RequestError,
    RequestStateTooLargeError,
    SequenceError,
    SequenceGapError,
)

JsonDict = dict[str, Any]
ModelT = TypeVar("ModelT", bound=BaseModel)

_INHERITED_FIELDS = ("model", "prompt_tokens", "prompt_token_ids")
_REQUEST_FIELD = {"chat": "chat_request", "completion": "completion_request"}
_CLOSED_MEMORY = 65536
# One remembered closed request (for duplicate detection): its seq and the dict slot; its id
# is counted as it is (``_closed_entry_bytes``).
CLOSED_ENTRY_BYTES = 130
_MISSING = object()


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that is not an envelope (or could not be processed): why, and what it was. The
    runtime writes it as a ``DeadLetterRecord`` with the record's Kafka headers and source."""

    reason: str
    value: bytes
    key: bytes | None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a record that would open a new request is not admitted (a 503 error output)."""

    cap: str  # which cap, a metric label
    message: str


class Admission(Protocol):
    """Decides whether a record of ``record_bytes`` may open a new streamed request (memory caps)."""

    def refusal(self, record_bytes: int) -> Refusal | None: ...


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs 1.4 µs more, once a record
class ProcessResult:
    """What one input record produced: exactly one of an output (a body or an error record), a
    dead letter, or a skipped duplicate, already serialized (``payload``); a ``CloseRecord``
    produces none of them. Read-only by contract."""

    request_id: str | None = None
    output: JsonDict | None = None
    """The output envelope as built; a stream body's ``stream_state`` in it is encoded (an
    ``orjson.Fragment``: ``stream_state()`` decodes it), so copy or compare ``payload``."""
    dead_letter: DeadLetter | None = None
    duplicate: bool = False
    closed: bool = False
    """The request ended (or failed) with this record: its state is gone."""
    payload: bytes | None = None
    """The output envelope's bytes, never larger than the processor's ``max_output_bytes``; None
    for a duplicate or a dead letter (which the runtime writes, ``dead_letter_record``)."""
    internal_error: Exception | None = None
    """The dead letter is a processing bug, this unexpected exception, not a bad record."""
    sequence_gap: bool = False
    """The output is the ``SequenceGapError`` record of a request whose records went missing."""
    refused: str | None = None
    """The record would have opened a request and ``Admission`` refused it: the cap's name."""

    def stream_state(self) -> JsonDict | None:
        """The output body's ``stream_state`` as a dict, or None without one.

        ``output`` holds it encoded, an ``orjson.Fragment`` of the bytes ``payload`` carries: built
        as Python lists too, it cost O(the output so far) per record (92 µs at 32,000 output
        tokens) for a dict that only a library caller reads.
        """
        body = self.output.get("body") if self.output is not None else None
        state = body.get("stream_state") if isinstance(body, dict) else None
        if state is None:
            return None
        decoded: JsonDict = orjson.loads(orjson.dumps(state))
        return decoded


def _echoed(source: JsonDict | None, envelope: InputEnvelope) -> JsonDict:
    """The fields an output envelope takes from its input record: where it was read, and its origin."""
    echoed: JsonDict = {}
    if source is not None:
        echoed["source"] = source
    if envelope.origin is not None:
        echoed["origin"] = envelope.origin.model_dump(exclude_none=True)
    return echoed


_CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f]")


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
        admission: Admission | None = None,
    ) -> None:
        self.derenderer = derenderer
        # The request rules of the version matched (``tools: []`` and the like).
        self._request_context = derenderer.options.behaviour.request_context
        self.max_record_bytes = max_record_bytes
        self.max_output_bytes = max_output_bytes
        self.max_request_state_bytes = max_request_state_bytes
        # Kafka records must be keyed by request_id (placement); JSON Lines have no keys.
        self.require_key = require_key
        self.requests: dict[str, RequestContext] = {}
        # Closed request -> (its last seq, the bytes counted for it when it was remembered).
        self._closed: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._closed_bytes = 0
        # Sequences holding a live parser; a worker shares one pool between its processors.
        self.parsers = live_parsers if live_parsers is not None else LiveParserPool(max_live_parsers)
        self._clock = clock
        self.admission = admission

    # --- entry point -------------------------------------------------------------------------

    def process(
        self, value: bytes, key: bytes | None = None, *, source: JsonDict | None = None
    ) -> ProcessResult:
        """One record in, its one outcome out. ``source`` (the record's topic, partition and
        offset) and the record's ``origin`` go into the output envelope."""
        pause_cycle_collection()
        try:
            return self._process(value, key, source)
        except Exception as exc:  # noqa: BLE001 - the record boundary: every bug becomes a dead letter
            # A bug in the core must not stop the partition (a poison pill): the record is
            # dead-lettered with the error and processing goes on.
            letter = DeadLetter(f"processing failed: {exc!r}", value, key)
            return ProcessResult(dead_letter=letter, internal_error=exc)
        finally:
            resume_cycle_collection()

    def _process(self, value: bytes, key: bytes | None, source: JsonDict | None) -> ProcessResult:
        try:
            envelope, too_deep = self._parse(value, key)
        except InvalidRecordError as exc:
            return ProcessResult(dead_letter=DeadLetter(exc.reason, value, key))
        if isinstance(envelope, CloseRecord):
            return self._close_record(envelope.request_id)
        rid, seq, endpoint, body = envelope.request_id, envelope.seq, envelope.endpoint, envelope.body
        echoed = _echoed(source, envelope)
        stream = body.get("stream") is True
        was_open = rid in self.requests
        try:
            if not stream:
                return self._one_shot(rid, seq, endpoint, body, too_deep, echoed)
            return self._stream(rid, seq, endpoint, body, too_deep, echoed, len(value))
        except RequestError as exc:
            # A gap fails the whole request: report that its state is gone.
            closed = was_open and rid not in self.requests
            result = self.output_result(
                rid, error_envelope(rid, seq, endpoint, exc), closed=closed, echoed=echoed
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
                rid, error_envelope(rid, seq, endpoint, error), closed=True, echoed=echoed
            )
            return dataclasses.replace(failed, internal_error=exc)

    def _close_record(self, rid: str) -> ProcessResult:
        """A ``CloseRecord``: the request's state goes now; nothing is written."""
        ctx = self.requests.get(rid)
        if ctx is None:
            return ProcessResult(request_id=rid)
        self._close(rid, ctx.last_seq)
        return ProcessResult(request_id=rid, closed=True)

    def _parse(self, value: bytes, key: bytes | None) -> tuple[InputEnvelope | CloseRecord, bool]:
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
        model: type[InputEnvelope | CloseRecord] = (
            CloseRecord if "close" in data and "seq" not in data else InputEnvelope
        )
        try:
            envelope = _model_from(model, data)
        except ValidationError as exc:
            raise InvalidRecordError(envelope_errors(exc)) from exc
        if key is not None and key != envelope.request_id.encode("utf-8"):
            raise InvalidRecordError(
                f"record key {clip(key.decode('utf-8', errors='replace'), 256)!r} differs from "
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
        echoed: JsonDict | None = None,
    ) -> ProcessResult:
        """An output envelope, serialized, with the fields ``echoed`` from its input record (``source``,
        ``origin``). Output that cannot be written (a 500) or is larger than ``max_output_bytes`` (a 413)
        becomes an error record instead, which fails the request."""
        if echoed:
            output.update(echoed)
        try:
            payload = orjson.dumps(output)
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
        failed = error_envelope(request_id, output["seq"], output["endpoint"], error)
        return self.output_result(request_id, failed, closed=True, echoed=echoed)

    # --- one-shot ----------------------------------------------------------------------------

    def _one_shot(
        self, rid: str, seq: int, endpoint: Endpoint, body: JsonDict, too_deep: bool, echoed: JsonDict
    ) -> ProcessResult:
        if self._is_duplicate(rid, seq):
            return ProcessResult(request_id=rid, duplicate=True)
        self._open_request(rid, seq, endpoint, stream=False)  # raises for an open stream's id
        self._remember_closed(rid, seq)
        if too_deep:
            raise too_deep_error()
        if endpoint == "chat":
            chat = _validate(DerenderChatRequest, body, self._request_context)
            response = self.derenderer.chat(chat)
        else:
            completion = _validate(DerenderCompletionRequest, body, self._request_context)
            response = self.derenderer.completion(completion)
        output = {"request_id": rid, "seq": seq, "endpoint": endpoint, "body": response}
        return self.output_result(rid, output, closed=True, echoed=echoed)

    # --- streams -----------------------------------------------------------------------------

    def _stream(
        self,
        rid: str,
        seq: int,
        endpoint: Endpoint,
        body: JsonDict,
        too_deep: bool,
        echoed: JsonDict,
        record_bytes: int,
    ) -> ProcessResult:
        if self._is_duplicate(rid, seq):
            return ProcessResult(request_id=rid, duplicate=True)
        ctx = self._open_request(rid, seq, endpoint, stream=True)
        # Admission first: every record of a request refused at a cap gets the same 503.
        refusal = self.admission.refusal(record_bytes) if ctx is None and self.admission is not None else None
        if refusal is not None:
            error = RequestError(refusal.message, code=503, error_type="ServiceUnavailableError")
            refused = self.output_result(rid, error_envelope(rid, seq, endpoint, error), echoed=echoed)
            return dataclasses.replace(refused, refused=refusal.cap)
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
                raise too_deep_error()
            return self._derender_stream(ctx, rid, seq, endpoint, body, echoed)
        except RequestError as exc:
            # A request that never got going: its later records must not run without its context.
            # One whose state cannot go on (past its state limit or parse budget) neither.
            if created or exc.ends_request:
                self._close(rid, seq)
            raise

    def _open_request(self, rid: str, seq: int, endpoint: Endpoint, *, stream: bool) -> RequestContext | None:
        """The open request a record that is not a duplicate continues, if any, once it passed the
        checks of a later record. A record past a gap fails the request (409); one that cannot
        continue it (another endpoint, or ``stream`` false) is a 400 that takes its seq, so the
        request goes on with the next record."""
        ctx = self.requests.get(rid)
        if ctx is None:
            return None
        if seq > ctx.last_seq + 1:
            self._close(rid, seq)
            raise SequenceGapError(
                f"seq {seq} of request {rid!r} skips ahead of the last processed seq {ctx.last_seq}; "
                "the request is failed because records are missing"
            )
        if ctx.endpoint != endpoint or not stream:
            ctx.last_seq = seq
            if ctx.endpoint != endpoint:
                raise RequestError(f"request {rid!r} started on endpoint {ctx.endpoint!r}, not {endpoint!r}")
            raise RequestError(
                f"request {rid!r} is an open stream: a record with stream=false cannot continue it"
            )
        return ctx

    def _derender_stream(
        self,
        ctx: RequestContext,
        rid: str,
        seq: int,
        endpoint: Endpoint,
        body: JsonDict,
        echoed: JsonDict,
    ) -> ProcessResult:
        given = {name: body[name] for name in _INHERITED_FIELDS if name in body}
        # What earlier records gave: already validated (reused as is, so a later record costs
        # nothing per prompt id), else as a state record held it (validated with this body).
        carried: JsonDict = ctx.inherited
        if given:
            carried = {name: v for name, v in carried.items() if name not in given}
        if not ctx.inherited_validated:
            body.update(carried)
            carried = {}
        request_field = _REQUEST_FIELD[endpoint]
        raw_request = body.pop(request_field, None)

        body_cls, request_cls = STREAM_MODELS[endpoint]
        validated = _validate(body_cls, body)
        request, request_raw = self._validated_request(ctx, raw_request, request_cls)
        rebuilt = validated.stream_state is not None  # a carried state rebuilds its parser anyway
        held_prompt = ctx.inherited.get("prompt_token_ids")
        prompt_changed = (
            held_prompt is not None
            and "prompt_token_ids" in given
            and (validated.prompt_token_ids != held_prompt)
        )
        if prompt_changed or (ctx.request is not None and request is not None and request is not ctx.request):
            self._check_parser_inputs(ctx, rid, request, prompt_changed, rebuilt)
        measured = self._measured_context(ctx, given, request_raw)
        _set_fields(validated, {**carried, request_field: request})
        chunk_in = validated.generate_chunk
        index = _choice_index(request, ctx.last_choice_index, chunk_in.choices)
        if index in ctx.finished and not rebuilt and self.derenderer.parsing is not None:
            _refuse_stepping_a_finished_choice(rid, index, chunk_in.choices)
        state = self._state_for(ctx, index, validated.stream_state)
        if isinstance(validated, DerenderChatStreamRequest):
            chunk, state = self.derenderer.chat_stream(validated, state)
        else:
            chunk, state = self.derenderer.completion_stream(validated, state)
        choices = chunk_in.choices
        has_usage = chunk_in.usage is not None

        # The record is taken: what it brought becomes the request's (a refused one changes nothing).
        ctx.request, ctx.request_raw = request, request_raw
        if measured is not None:
            ctx.context_bytes, ctx.request_bytes, ctx.request_live_bytes = measured
            ctx.measured_request = request_raw

        if given or not ctx.inherited_validated:  # else ``inherited`` holds these values already
            for name in (*given, *ctx.inherited):
                ctx.inherited[name] = getattr(validated, name)
            ctx.inherited_validated = True
        ctx.sequences[index] = state
        self._track_live_parser(rid, index, state)
        ctx.last_choice_index = index
        for choice in choices:
            if choice.finish_reason is not None:
                ctx.finished.add(choice.index)
        wire_json = state.wire_json()  # validated, bounded values: it cannot fail
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
            "body": {"chunk": chunk, "stream_state": orjson.Fragment(wire_json)},  # see ProcessResult
        }
        done = len(ctx.finished) >= ctx.expected_choices and (
            not ctx.wants_usage_record or (not choices and has_usage)
        )
        if done:
            self._close(rid, seq)
        return self.output_result(rid, output, closed=done, echoed=echoed)

    def _measured_context(
        self, ctx: RequestContext, given: JsonDict, request_raw: JsonDict | None
    ) -> tuple[int, int, int] | None:
        """Measure the request context when this record sets or changes it (None: unchanged): it
        must encode (for the state topic) and fit the per-request state limit, or the record is
        refused here, before the request takes any of it."""
        if request_raw is ctx.measured_request and (
            not given or all(ctx.inherited.get(name, _MISSING) == v for name, v in given.items())
        ):
            return None
        try:
            size, request_size, request_live = measure_context({**ctx.inherited, **given}, request_raw)
        except TypeError as exc:  # cannot happen for input within the bounds; refused if it does
            raise RequestError(f"the request context cannot be stored: {exc}") from exc
        if size > self.max_request_state_bytes:
            raise RequestStateTooLargeError(
                f"the request context of {size} bytes (request and prompt) exceeds the limit of "
                f"{self.max_request_state_bytes} bytes per request"
            )
        return size, request_size, request_live

    def _validated_request(
        self,
        ctx: RequestContext,
        raw: Any,
        model_cls: type[ChatCompletionRequest] | type[CompletionRequest],
    ) -> tuple[ChatCompletionRequest | CompletionRequest | None, JsonDict | None]:
        """The request object for this record and its raw form: its own, else the one the request
        started with (the same object when the record resends an equal one)."""
        request, request_raw = ctx.request, ctx.request_raw
        if raw is not None:
            if not isinstance(raw, dict):
                raise RequestError(
                    f"{_REQUEST_FIELD[ctx.endpoint]} must be an object", error_type="Bad Request"
                )
            if raw != ctx.request_raw:
                try:
                    request = model_cls.model_validate(raw, context=self._request_context)
                except ValidationError as exc:
                    message, param = validation_message(exc, (_REQUEST_FIELD[ctx.endpoint],))
                    raise RequestError(message, error_type="Bad Request", param=param) from exc
                request_raw = raw
        return request, request_raw

    def _check_parser_inputs(
        self,
        ctx: RequestContext,
        rid: str,
        new: ChatCompletionRequest | CompletionRequest | None,
        prompt_changed: bool,
        rebuilt: bool,
    ) -> None:
        """A record brings a request or prompt ids other than those the request's parser sessions
        were built from. vLLM builds its parser from each call's request and prompt and replays the
        history through it; held sessions would have to do the same, at O(the output so far) for
        one record, so once there is output a change the parsers read is refused (a 400; the
        request goes on as it was), unless the record carries its ``stream_state`` (it pays for
        its own replay)."""
        old = ctx.request
        changed = prompt_changed or (
            old is not None and new is not None and self.derenderer.parses_differently(old, new)
        )
        if not changed or self.derenderer.parsing is None:
            return
        # A carried state pays for its own choice's replay, not for the other choices' sessions.
        with_output = sum(1 for state in ctx.sequences.values() if state.output_token_ids)
        if with_output > (1 if rebuilt else 0):
            raise RequestError(
                f"the {_REQUEST_FIELD[ctx.endpoint]} or prompt_token_ids of request {rid!r} change what "
                "the parsers read (tools, tool_choice, parallel_tool_calls, include_reasoning, template "
                "kwargs, messages, the prompt) after output was parsed: send the record with its "
                "stream_state to have it replayed",
                param="prompt_token_ids" if prompt_changed else _REQUEST_FIELD[ctx.endpoint],
            )
        self._drop_live_parsers(rid, ctx)

    def _state_for(
        self, ctx: RequestContext, index: int, carried: DerenderStreamState | None
    ) -> SequenceState | None:
        if carried is not None:
            self._check_carried(carried)
            derenderer = self.derenderer
            try:
                # A caller's state is answered in the form it came in: safe in a mixed-version fleet.
                return SequenceState.from_wire(
                    carried, derenderer.decoder, derenderer.options.behaviour.state_form
                )
            except StateWindowConflict as exc:
                raise RequestError(str(exc), param="stream_state") from exc
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
        closed = self._closed.get(rid)
        return closed is not None and seq <= closed[0]

    def _remember_closed(self, rid: str, seq: int) -> None:
        known = self._closed.get(rid)
        if known is None:
            size = _closed_entry_bytes(rid)
            self._closed_bytes += size
            self._closed[rid] = (seq, size)
        else:
            self._closed[rid] = (max(seq, known[0]), known[1])
            self._closed.move_to_end(rid)
        while len(self._closed) > _CLOSED_MEMORY:
            self._closed_bytes -= self._closed.popitem(last=False)[1][1]

    def _close(self, rid: str, seq: int) -> None:
        if self.requests.pop(rid, None) is not None:
            self.parsers.drop_request(self, rid)
        self._remember_closed(rid, seq)

    def _drop_live_parsers(self, rid: str, ctx: RequestContext) -> None:
        """The request changed what the parsers read: sessions built from the old one go (rebuilt
        with the new one from the history, which ``_check_parser_inputs`` keeps empty or carried)."""
        for index, state in ctx.sequences.items():
            if state.live is not None:
                state.live = None
                self.parsers.discard((self, rid, index))

    def _track_live_parser(self, rid: str, index: int, state: SequenceState) -> None:
        """Keep parsers alive within the pool's cap; an evicted one is rebuilt by replay."""
        self.parsers.touch(self, rid, index, state)

    def closed_live_bytes(self) -> int:
        """The memory of closed requests kept for duplicate detection (bounded: ``_CLOSED_MEMORY``)."""
        return self._closed_bytes

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
            seq = min(ctx.last_seq + 1, INT64_MAX)
            self._close(rid, seq)
            results.append(
                self.output_result(rid, error_envelope(rid, seq, ctx.endpoint, error), closed=True)
            )
        return results


def _choice_index(
    request: ChatCompletionRequest | CompletionRequest | None, last_index: int, choices: Sequence[Any]
) -> int:
    """The choice a record continues (with none, the last one); it must be one of the ``n`` its
    request asks for."""
    if not choices:
        return last_index
    index: int = choices[0].index
    n = expected_choices(request)
    if not 0 <= index < n:
        raise RequestError(
            f"choice index {index} is out of range: the request has n={n} choice(s)",
            param="generate_chunk.choices.0.index",
        )
    return index


def _refuse_stepping_a_finished_choice(rid: str, index: int, choices: Sequence[Any]) -> None:
    """A record that steps a choice after its finish. No engine sends one; vLLM answers it by
    replaying the choice's history without the finish, which held sessions can only do by a
    rebuild: O(the output so far) for one record. So with parsers on it is a 400 (the request goes
    on), unless it carries its ``stream_state``."""
    for choice in choices:
        if choice.index == index and (choice.token_ids or choice.finish_reason is not None):
            raise RequestError(
                f"choice {index} of request {rid!r} already finished: a later record cannot step it "
                "(send it with its stream_state to have the history replayed)",
                param="generate_chunk.choices.0",
            )


def _closed_entry_bytes(rid: str) -> int:
    """A remembered closed request's memory: a ``request_id`` may be 512 characters of any script,
    and CPython keeps a UTF-8 copy of a non-ASCII string once it was written out."""
    size = CLOSED_ENTRY_BYTES + sys.getsizeof(rid)
    if not rid.isascii():
        size += len(rid.encode("utf-8", "surrogatepass")) + 1
    return size


def _set_fields(model: BaseModel, values: JsonDict) -> None:
    """Set already validated field values, as pydantic's own ``__setattr__`` does for a model
    without assignment validation, without its per-call dispatch (~1 µs a field)."""
    model.__dict__.update(values)
    model.__pydantic_fields_set__.update(values)


def _model_from(model_cls: type[ModelT], data: Any, context: JsonDict | None = None) -> ModelT:
    """``model_cls.model_validate(data)`` without its Python wrapper, which costs ~0.6 µs a call
    (two calls a record: the envelope and the body)."""
    return cast(ModelT, model_cls.__pydantic_validator__.validate_python(data, context=context))


def _validate(model_cls: type[ModelT], body: JsonDict, context: JsonDict | None = None) -> ModelT:
    try:
        return _model_from(model_cls, body, context)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise RequestError(message, error_type="Bad Request", param=param) from exc
