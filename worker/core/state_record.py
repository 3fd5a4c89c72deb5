"""The values of the state topic's records: their fields, their format version, and the sizes
that follow from them.

The one definition of what a state record holds (docs/state.md). A request's *context record*
holds its endpoint, inherited fields (``model``, the prompt ids, ...), request and a progress part;
its *progress record* holds that part alone: ``offset``, ``last_seq``, one ``stream_state`` per
choice, the window form of each, the finished choices and the last choice index. A partition's
*replay-from* record holds an input offset. ``worker.runtime.state.changelog`` writes and reads them
through this module (keys, checkpoints and restore are its own), and the request context's size
model (``worker.core.request_context``) takes its fixed sizes from records encoded here, so a
change of the layout changes the model with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from schemas.bounds import INT64_MIN
from worker.core.vllm_version import StateForm

JsonDict = dict[str, Any]

# 3: a choice's ``stream_state`` may hold its window as ids (vLLM 0.34's ``prev_token_ids``), and
# the progress record names the form (``window``). A build that reads only 1 and 2 would drop that
# window without a word; it refuses the record instead, and the request fails loudly.
FORMAT_VERSION = 3
READABLE_VERSIONS = frozenset({1, 2, 3})


class ChoiceState(Protocol):
    """What a progress record takes of one choice's state (``SequenceState``)."""

    @property
    def form(self) -> StateForm: ...

    def wire_json(self) -> bytes: ...


# --- writing ----------------------------------------------------------------------------------


def progress_record(
    *,
    offset: int | None,
    last_seq: int,
    sequences: Mapping[int, ChoiceState],
    finished: Iterable[int],
    last_choice_index: int,
) -> JsonDict:
    return {
        "v": FORMAT_VERSION,
        "kind": "progress",
        "offset": offset,
        "last_seq": last_seq,
        "sequences": {str(i): orjson.Fragment(s.wire_json()) for i, s in sequences.items()},
        # Each state's window key says it too; this is for a reader of the record alone.
        "window": {str(i): s.form.value for i, s in sequences.items()},
        "finished": sorted(finished),
        "last_choice_index": last_choice_index,
    }


def context_record(endpoint: str, inherited: JsonDict, request: Any, progress: JsonDict) -> JsonDict:
    """A complete checkpoint, also restorable alone: the context and a ``progress_record``."""
    return {
        "v": FORMAT_VERSION,
        "kind": "context",
        "endpoint": endpoint,
        "inherited": inherited,
        "request": request,
        "progress": progress,
    }


def replay_from_record(offset: int | None) -> JsonDict:
    return {"v": FORMAT_VERSION, "kind": "replay-from", "offset": offset}


# --- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredRequest:
    """A request's parts as its latest state records hold them."""

    endpoint: str
    inherited: JsonDict
    request: JsonDict | None
    offset: int | None
    """The input offset the records reflect; None for format 1 (current as of the committed offset)."""
    last_seq: int
    sequences: dict[int, JsonDict]
    finished: set[int]
    last_choice_index: int


def check_version(record: JsonDict) -> None:
    if record.get("v") not in READABLE_VERSIONS:
        raise ValueError(f"unknown state record format {record.get('v')!r}")


def read_request(context: bytes, progress: bytes | None = None) -> StoredRequest:
    """A request's parts from its context record and, when newer, its progress record. Raises
    ``ValueError`` (or ``KeyError``, ``TypeError``) for records that are not these."""
    data = orjson.loads(context)
    check_version(data)
    if data.get("kind") != "context":
        raise ValueError("not a context record")
    latest = data["progress"]
    if progress is not None:
        latest = orjson.loads(progress)
        check_version(latest)
    offset = latest.get("offset")
    return StoredRequest(
        endpoint=data["endpoint"],
        inherited=data.get("inherited") or {},
        request=data.get("request"),
        offset=int(offset) if offset is not None else None,
        last_seq=int(latest["last_seq"]),
        sequences={int(i): s for i, s in (latest.get("sequences") or {}).items()},
        finished={int(i) for i in latest.get("finished") or ()},
        last_choice_index=int(latest.get("last_choice_index", 0)),
    )


def read_replay_from(record: bytes) -> int | None:
    value = orjson.loads(record)
    check_version(value)
    return None if value["offset"] is None else int(value["offset"])


# --- sizes ------------------------------------------------------------------------------------
# Upper bounds of the encoded records, measured on records built above: every integer at its
# widest (an int64's 20 characters), the longest endpoint and window form, each empty part ({},
# [], null) counted apart from what fills it.

_WIDEST = INT64_MIN
_LONGEST_ENDPOINT = max(("chat", "completion"), key=len)
_LONGEST_FORM = max(StateForm, key=lambda form: len(form.value))


@dataclass(frozen=True, slots=True)
class _EmptyChoice:
    form: StateForm = _LONGEST_FORM

    def wire_json(self) -> bytes:
        return b"{}"


def _progress_size(choices: int = 0, finished: int = 0) -> int:
    record = progress_record(
        offset=_WIDEST,
        last_seq=_WIDEST,
        sequences={_WIDEST + i: _EmptyChoice() for i in range(choices)},
        finished=[_WIDEST + i for i in range(finished)],
        last_choice_index=_WIDEST,
    )
    return len(orjson.dumps(record))


PROGRESS_FIXED_BYTES = _progress_size()
"""A progress record without choices or finished ones."""
CHOICE_BYTES = _progress_size(2) - _progress_size(1) - len(b"{}")
"""A choice in a progress record besides its ``stream_state``: its index twice, its form, the
separators (the first choice needs fewer)."""
FINISHED_BYTES = _progress_size(finished=2) - _progress_size(finished=1)
"""A finished choice's index with its separator."""
CONTEXT_FIXED_BYTES = (
    len(orjson.dumps(context_record(_LONGEST_ENDPOINT, {}, None, {}))) - 2 * len(b"{}") - len(b"null")
)
"""A context record besides the encodings of its inherited fields, request and progress part."""
