"""A streamed request's context between its records, and what it costs: the size of its state
records (an upper bound, from the layout in ``worker.core.state_record``) and the memory it holds
(an estimate, measured with tracemalloc).

The envelope processor keeps one ``RequestContext`` per open request; the runtime's changelog
writes it to the state topic and rebuilds it from there (``RequestContext.resume``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, cast

import orjson

from schemas.derender import (
    DerenderChatStreamRequest,
    DerenderCompletionStreamRequest,
    DerenderStreamState,
)
from schemas.openai import ChatCompletionRequest, CompletionRequest
from worker.core import state_record
from worker.core.derenderer import Derenderer
from worker.core.json_scan import json_structure_counts
from worker.core.sequence_state import SequenceState

JsonDict = dict[str, Any]
Endpoint = Literal["chat", "completion"]

# Per endpoint: a stream record's body model and its request object's model.
STREAM_MODELS: dict[
    str,
    tuple[type[DerenderChatStreamRequest], type[ChatCompletionRequest]]
    | tuple[type[DerenderCompletionStreamRequest], type[CompletionRequest]],
] = {
    "chat": (DerenderChatStreamRequest, ChatCompletionRequest),
    "completion": (DerenderCompletionStreamRequest, CompletionRequest),
}
# live_bytes: a context object with its dicts; an int in a list (8-byte slot + 28-byte int); the
# request held parsed and raw: a fixed part, plus its JSON size (its strings, shared by both forms,
# dominate a large request). Measured with tracemalloc (tests check them).
_CONTEXT_BASE_BYTES = 1200
_INT_IN_LIST_BYTES = 36
_REQUEST_FIXED_BYTES = 1100
# A request's structure costs more held than encoded (``json_structure_bytes``): a dict with a
# key or two, a list, and each further element's slot and object, past their JSON text.
_OBJECT_BYTES = 200
_ARRAY_BYTES = 60
_ELEMENT_BYTES = 32
# A context record's context part with no inherited fields ({}) and no request (null).
_EMPTY_CONTEXT_BYTES = state_record.CONTEXT_FIXED_BYTES + len(b"{}") + len(b"null")


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
    inherited_validated: bool = False
    """``inherited`` holds the values a validated body gave them (not as read from a state record),
    so later records take them as they are instead of validating the prompt ids again."""
    context_bytes: int = _EMPTY_CONTEXT_BYTES
    """Size of the encoded context (endpoint, inherited fields, request), checked when it is set;
    until then that of an empty one, which its context record holds all the same."""
    request_bytes: int = 0
    """Size of the encoded request alone (part of ``context_bytes``)."""
    request_live_bytes: int = 0
    """The request's estimated memory held, parsed and raw (``measure_context``)."""
    measured_request: JsonDict | None = None
    """The ``request_raw`` that ``context_bytes`` was measured with."""
    wire_bytes: dict[int, int] = field(default_factory=dict)
    """Size of each choice's encoded ``stream_state``, as of its last record."""
    _wire_total: int = 0

    def note_wire(self, index: int, size: int) -> None:
        self._wire_total += size - self.wire_bytes.get(index, 0)
        self.wire_bytes[index] = size

    def state_bytes(self) -> int:
        """An upper bound of what its state records take: its context record, which holds a
        progress record's fields too (a progress record alone is ``state_bytes - context_bytes``
        at most)."""
        return (
            self.context_bytes
            + state_record.PROGRESS_FIXED_BYTES
            + self._wire_total
            + state_record.CHOICE_BYTES * len(self.wire_bytes)
            + state_record.FINISHED_BYTES * len(self.finished)
        )

    def live_bytes(self) -> int:
        """A cheap estimate of the Python memory this request holds, O(choices + decode windows).

        Counts the prompt ids as ints in a list (36 bytes each), the request as parsed and raw
        (``_REQUEST_FIXED_BYTES`` plus its JSON size) and each choice's state. Live parser
        sessions are not in it: the pool holds and counts them (``LiveParserPool.live_bytes``), since
        it evicts them without the request being touched. Within about 20% of tracemalloc's figure,
        with the pool's, in the tests.
        """
        size = _CONTEXT_BASE_BYTES
        if self.request is not None:
            size += _REQUEST_FIXED_BYTES + self.request_live_bytes
        prompt = self.inherited.get("prompt_token_ids")
        if isinstance(prompt, list):
            size += _INT_IN_LIST_BYTES * len(prompt)
        size += 64 * len(self.finished)
        for state in self.sequences.values():
            size += state.live_bytes()
        return size

    @property
    def expected_choices(self) -> int:
        return expected_choices(self.request)

    @property
    def wants_usage_record(self) -> bool:
        options = self.request.stream_options if self.request is not None else None
        return bool(options is not None and options.include_usage)

    @classmethod
    def resume(
        cls,
        endpoint: str,
        inherited: JsonDict,
        request_raw: JsonDict | None,
        *,
        last_seq: int,
        sequences: dict[int, JsonDict],
        finished: set[int],
        last_choice_index: int,
        derenderer: Derenderer,
    ) -> RequestContext:
        """A request's context rebuilt from its parts (as a state record stored them): the request
        and each choice's ``stream_state`` are validated and measured as when they came in.
        Raises ``ValueError`` (``ValidationError`` included) for parts that do not validate."""
        if endpoint not in STREAM_MODELS:
            raise ValueError(f"unknown endpoint {endpoint!r}")
        model_cls = STREAM_MODELS[endpoint][1]
        ctx = cls(
            endpoint=cast(Endpoint, endpoint),
            last_seq=last_seq,
            inherited=dict(inherited),
            request=(
                model_cls.model_validate(request_raw, context=derenderer.options.behaviour.request_context)
                if request_raw is not None
                else None
            ),
            request_raw=request_raw,
            # Restored by this worker: written back in its own window form, whichever it was stored in.
            sequences={
                i: SequenceState.from_wire(
                    DerenderStreamState.model_validate(w),
                    derenderer.decoder,
                    derenderer.options.behaviour.state_form,
                    keep_form=False,
                )
                for i, w in sequences.items()
            },
            finished=set(finished),
            last_choice_index=last_choice_index,
        )
        ctx.context_bytes, ctx.request_bytes, ctx.request_live_bytes = measure_context(
            ctx.inherited, request_raw
        )
        ctx.measured_request = request_raw
        # Measured as this worker writes them: its window form may differ from the stored one, and
        # the two differ in size (a token string against its id).
        for index, state in ctx.sequences.items():
            ctx.note_wire(index, len(state.wire_json()))
        return ctx


def measure_context(inherited: JsonDict, request: Any) -> tuple[int, int, int]:
    """Encoded sizes of a request context as its state record holds it, whole and of its request
    alone, and the request's estimated memory held; ``TypeError`` when it cannot be encoded."""
    encoded = orjson.dumps(request)
    request_size = len(encoded)
    context_size = request_size + len(orjson.dumps(inherited)) + state_record.CONTEXT_FIXED_BYTES
    return context_size, request_size, request_size + json_structure_bytes(encoded)


def json_structure_bytes(value: bytes) -> int:
    """What the JSON document ``value`` costs held in Python beyond its length: each object, array
    and further element. A request of two million empty lists is 6 MB encoded and ~130 MB held."""
    objects, arrays, elements = json_structure_counts(value)
    return _OBJECT_BYTES * objects + _ARRAY_BYTES * arrays + _ELEMENT_BYTES * elements


def expected_choices(request: ChatCompletionRequest | CompletionRequest | None) -> int:
    n = request.n if request is not None else 1
    return n if n and n > 0 else 1
