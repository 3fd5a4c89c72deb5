"""The live, mutable form of one sequence's ``DerenderStreamState``.

The wire model (``schemas.derender.DerenderStreamState``) is validated input;
this is what the core mutates per record and serializes back. It also holds
what cannot be serialized: the live parser session and its decode window,
which are rebuilt from ``output_token_ids`` when missing.

The decode window is held as token strings whatever form it came in; ``form`` says which one it
is written back in (``prev_tokens`` or ``prev_token_ids``, ``worker.core.vllm_version.StateForm``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from schemas.derender import DerenderStreamState
from worker.core.decoding import DecodeWindow, TextDecoder
from worker.core.parsing import ChatStreamSession
from worker.core.vllm_version import StateForm

_STATE_BASE_BYTES = 700  # the object, its window and empty lists (tracemalloc)


@dataclass(slots=True)
class LiveParser:
    """A parser session kept alive between records, with its own (special-tokens-kept) window."""

    session: ChatStreamSession[Any]
    window: DecodeWindow


@dataclass(slots=True)
class _AppendOnlyJson:
    """The JSON array of an append-only list of ints, each element encoded once.

    With parsers on, every output ``stream_state`` carries the whole ``output_token_ids`` (vLLM's
    protocol): encoding it anew on each record made a record cost O(the output so far), 17x an
    early record's at 32,000 tokens. Now a record encodes its own ids and copies the rest as bytes.
    """

    body: bytearray = field(default_factory=bytearray)
    count: int = 0

    def encoded(self, items: list[int]) -> orjson.Fragment:
        if len(items) < self.count:  # not appended to: start again
            self.body.clear()
            self.count = 0
        if len(items) > self.count:
            if self.count:
                self.body += b","
            self.body += orjson.dumps(items[self.count :])[1:-1]
            self.count = len(items)
        return orjson.Fragment(b"[" + self.body + b"]")


class StateWindowConflict(ValueError):
    """A ``stream_state`` carries ``prev_tokens`` and ``prev_token_ids`` that are not one window."""


def read_window(state: DerenderStreamState, decoder: TextDecoder) -> tuple[DecodeWindow, StateForm | None]:
    """A carried state's window, from either form, and the form it came in (None: both or neither).

    An id window is read through the tokenizer; a state with both keys must hold the same window
    in each (``StateWindowConflict`` otherwise): neither is ever dropped.
    """
    tokens, ids = state.prev_tokens, state.prev_token_ids
    if ids is not None:
        window = decoder.window_from_ids(ids, state.prefix_offset, state.read_offset)
        if tokens is None:
            return window, StateForm.IDS
        if list(tokens) != window.tokens:
            raise StateWindowConflict(
                "stream_state.prev_tokens and stream_state.prev_token_ids disagree: they are not the "
                "same window (send one of them)"
            )
        return window, None
    window = DecodeWindow(list(tokens or ()), state.prefix_offset, state.read_offset)
    return window, (StateForm.TOKENS if tokens is not None else None)


@dataclass(slots=True)
class SequenceState:
    window: DecodeWindow = field(default_factory=DecodeWindow)
    form: StateForm = StateForm.TOKENS
    """The window's form on the wire; ``IDS`` needs ``decoder``."""
    decoder: TextDecoder | None = None
    role_sent: bool = False
    logprob_context_token_ids: list[int] = field(default_factory=list)
    logprob_text_offset: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    output_chunk_lens: list[int] = field(default_factory=list)
    tools_streamed: bool = False
    last_tool_call_ids: list[str] = field(default_factory=list)
    live: LiveParser | None = None
    _ids_json: _AppendOnlyJson = field(default_factory=_AppendOnlyJson)
    _lens_json: _AppendOnlyJson = field(default_factory=_AppendOnlyJson)

    @classmethod
    def from_wire(
        cls,
        state: DerenderStreamState,
        decoder: TextDecoder,
        default_form: StateForm,
        *,
        keep_form: bool = True,
    ) -> SequenceState:
        """The live state of a validated wire state. ``keep_form``: it answers in the form it came in
        (a caller's state), else in ``default_form`` (a state record restored by this worker);
        ``default_form`` also when it holds both forms or none. ``StateWindowConflict`` for a state
        whose two windows disagree."""
        window, carried_form = read_window(state, decoder)
        return cls(
            window=window,
            form=carried_form if keep_form and carried_form is not None else default_form,
            decoder=decoder,
            role_sent=state.role_sent,
            logprob_context_token_ids=list(state.logprob_context_token_ids),
            logprob_text_offset=state.logprob_text_offset,
            output_token_ids=list(state.output_token_ids),
            output_chunk_lens=list(state.output_chunk_lens),
            tools_streamed=state.tools_streamed,
            last_tool_call_ids=list(state.last_tool_call_ids),
        )

    def to_wire(self) -> dict[str, Any]:
        """The ``stream_state`` object, keys in vLLM's order; lists are copies."""
        return self._wire(list(self.output_token_ids), list(self.output_chunk_lens), copy=True)

    def wire_json(self) -> bytes:
        """``orjson.dumps(self.to_wire())``, in O(this record's ids): the two output lists only grow
        (a list that shrank is encoded again)."""
        ids = self._ids_json.encoded(self.output_token_ids)
        lens = self._lens_json.encoded(self.output_chunk_lens)
        return orjson.dumps(self._wire(ids, lens, copy=False))

    def _wire(self, output_token_ids: Any, output_chunk_lens: Any, *, copy: bool) -> dict[str, Any]:
        """The ``stream_state`` fields in vLLM's order, the other lists copied or as they are."""
        window = self.window
        if self.form is StateForm.IDS:
            assert self.decoder is not None, "an id window is written through its tokenizer"
            items, prefix_offset, read_offset = self.decoder.window_ids(window)
            held: Any = items
        else:
            held = list(window.tokens) if copy else window.tokens
            prefix_offset, read_offset = window.prefix_offset, window.read_offset
        return {
            self.form.value: held,
            "prefix_offset": prefix_offset,
            "read_offset": read_offset,
            "role_sent": self.role_sent,
            "logprob_context_token_ids": (
                list(self.logprob_context_token_ids) if copy else self.logprob_context_token_ids
            ),
            "logprob_text_offset": self.logprob_text_offset,
            "output_token_ids": output_token_ids,
            "output_chunk_lens": output_chunk_lens,
            "tools_streamed": self.tools_streamed,
            "last_tool_call_ids": list(self.last_tool_call_ids) if copy else self.last_tool_call_ids,
        }

    def live_bytes(self) -> int:
        """A cheap estimate of its Python memory, without a live parser (see ``RequestContext``):
        the object and its lists, a token string ~ 60 bytes plus its length, an id ~ 36 bytes, and
        the output lists' kept JSON."""
        return (
            _STATE_BASE_BYTES
            + len(self._ids_json.body)
            + len(self._lens_json.body)
            + sum(60 + len(t) for t in self.window.tokens)
            + 36 * (len(self.output_token_ids) + len(self.logprob_context_token_ids))
            + 8 * len(self.output_chunk_lens)
            + sum(60 + len(i) for i in self.last_tool_call_ids)
        )
