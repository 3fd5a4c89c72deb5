"""The engine's argument layer: a call's raw argument text → its arguments JSON.

Two converters: raw JSON (configs without ``arguments``: the text streams as
written, see the machine) and XML-to-JSON (:class:`XmlArguments`). A format's
regular expressions and its one-pass :class:`ArgScanner` live in its family's
module (``families/glm45.py``: ``<arg_key>``/``<arg_value>`` pairs,
``families/qwen3.py``: ``<parameter=...>``); this layer only turns scanner
events into the streamed JSON, so a new XML-style family never edits it.

vLLM's engine rebuilds a call's arguments JSON from the whole raw argument
text with regular expressions whenever a record is more than a plain
continuation of the open value: O(arguments) per record, and worse on text
that makes the lazy patterns backtrack (a key that never closes). Here the raw
text is scanned once, left to right, by a small state machine per format with
the patterns' exact semantics (leftmost match, lazy key or value up to the
first terminator), and the JSON is kept per argument, so a record costs its
own text plus, when it completes an argument, that argument once (its type
conversion). What is streamed is what the regular expressions would give: the
safe JSON prefix of ``convert(raw, partial=True)`` with the tool schema's
types, and at the end of the call the rest of ``convert(raw, partial=False)``.
The regular expressions themselves convert one-shot output (read once).

Two differences, both only on malformed markup: an argument whose markers
are spelled across a completed argument is not seen (the regular
expressions scan the text with completed arguments cut out), and while a
repeated argument name is still open its earlier position counts as changed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from worker.core.parsing.engine.schema import TypesOf, coerce, coerce_value

#: ``\s`` of the ``regex`` module vLLM compiles its patterns with (Unicode
#: White_Space); Python's ``re`` would also match U+001C..U+001F.
WS = r"[^\S\x1c-\x1f]"

#: ("done", key, value, *format fields) | ("open", key) | ("grow", raw text added to the open value)
ArgEvent = tuple[str, ...]
#: A done value and its format fields (DSML's ``string`` attribute) → the value before schema typing
ValueDecoder = Callable[[str, tuple[str, ...]], Any]


def is_ws(ch: str) -> bool:
    """``\\s`` of the ``regex`` module vLLM compiles its patterns with."""
    return ch.isspace() and not "\x1c" <= ch <= "\x1f"


def lstrip_ws(text: str) -> str:
    start = 0
    while start < len(text) and is_ws(text[start]):
        start += 1
    return text[start:]


def trim_newlines(value: str) -> str:
    """One leading and one trailing newline dropped (template markup around values)."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _escape(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


class ArgsStream:
    """One call's arguments JSON as ``json.dumps`` of the parsed arguments, typed by the schema.

    Keeps one rendered ``"key": value`` piece per argument and what has been streamed, so the
    next diff is found without rebuilding the object.
    """

    def __init__(
        self,
        properties: dict[str, Any],
        string_keys: set[str] | None,
        types: TypesOf,
        *,
        trim_newlines: bool,
        decode: ValueDecoder | None = None,
    ) -> None:
        self._decode = decode
        self._properties = properties
        self._types = types  # the request's :class:`ToolSchemas` lookup: no schema walk per value
        self._string_keys = string_keys
        self._trim = trim_newlines
        self._order: list[str] = []
        self._position: dict[str, int] = {}
        self._rendered: dict[str, str] = {}  # done arguments' JSON values
        self._open: str | None = None
        self._open_new = False
        self._open_raw: list[str] = []
        self._open_text: list[str] = []  # the open value as convert_args shows it (escaped)
        self._held = ""
        self._started = False
        # What has been streamed: whole pieces, then the head of the next one.
        self._sent: list[str] = []
        self._head = ""  # streamed head of the last piece; the open value's parts follow it
        self._head_open_parts = 0
        self._head_is_open = False
        self._any_sent = False
        self._changed: set[int] = set()  # streamed pieces that differ now

    # -- feeding -------------------------------------------------------------------

    def apply(self, events: list[ArgEvent]) -> bool:
        """Take scanner events; True when only the open value grew."""
        structural = False
        for event in events:
            if event[0] == "grow":
                self._grow(event[1])
                continue
            if self._head_is_open:
                # The open value's streamed parts are about to be reset: keep them as text.
                self._head, self._head_is_open = self._sent_head(), False
            if event[0] == "open":
                structural = True
                key = event[1]
                self._open, self._open_raw, self._open_text = key, [], []
                self._held, self._started = "", False
                self._open_new = key not in self._position
                if self._open_new:
                    self._position[key] = len(self._order)
                    self._order.append(key)
                elif self._position[key] < len(self._sent):
                    self._changed.add(self._position[key])
            else:
                structural = True
                self._done(event[1], event[2], event[3:])
        return not structural

    def _grow(self, raw: str) -> None:
        if self._open is None:
            return
        self._open_raw.append(raw)
        if not self._trim:
            self._open_text.append(_escape(raw))
            return
        text = self._held + raw
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\n")
        self._held = "\n" if text.endswith("\n") else ""
        text = text[: len(text) - len(self._held)]
        if text:
            self._open_text.append(_escape(text))

    def _done(self, key: str, value: str, extra: tuple[str, ...] = ()) -> None:
        open_key, self._open = self._open, None
        if self._open_new and open_key is not None and open_key != key:
            # The name read while open differs from the finished one (whitespace-only names).
            del self._position[open_key]
            self._order.pop()
        if key not in self._position:
            self._position[key] = len(self._order)
            self._order.append(key)
        rendered = self._render(key, value, extra)
        self._rendered[key] = rendered
        index = self._position[key]
        if index < len(self._sent):
            if self._piece(key, rendered) == self._sent[index]:
                self._changed.discard(index)
            else:
                self._changed.add(index)

    def _render(self, key: str, value: str, extra: tuple[str, ...] = ()) -> str:
        decoded: Any = self._decode(value, extra) if self._decode is not None else value
        schema = self._properties.get(key)
        if isinstance(schema, dict):
            if isinstance(decoded, str):
                decoded = coerce(decoded, self._types(schema))
            else:
                decoded = coerce_value(decoded, schema, self._types)[0]
        return json.dumps(decoded, ensure_ascii=False)

    @staticmethod
    def _piece(key: str, rendered: str) -> str:
        return f"{json.dumps(key, ensure_ascii=False)}: {rendered}"

    def _streams(self, key: str) -> bool:
        # The safe prefix compares the key as it is spelled in the JSON.
        return self._string_keys is None or _escape(key) in self._string_keys

    def _full(self, index: int) -> str:
        key = self._order[index]
        if key == self._open and not self._open_new:
            # An open repeat of an earlier name shows its partial value there.
            partial = "".join(self._open_raw)
            return self._piece(key, self._render(key, trim_newlines(partial) if self._trim else partial))
        return self._piece(key, self._rendered[key])

    def _head_of(self, index: int) -> str:
        key = self._order[index]
        start = f"{json.dumps(key, ensure_ascii=False)}: "
        if not self._streams(key):
            return start
        if key == self._open:
            return start + '"' + "".join(self._open_text)
        rendered = self._rendered[key]
        return start + rendered[:-1] if rendered.startswith('"') else start

    # -- diffs -----------------------------------------------------------------------

    def _sent_head(self) -> str:
        if self._head_is_open:
            return self._head + "".join(self._open_text[: self._head_open_parts])
        return self._head

    def diff(self, grew_only: bool) -> str | None:
        """The new safe prefix text of the streaming (partial) arguments, or None."""
        count = len(self._order)
        if count == 0:
            return None
        last = count - 1
        sent = len(self._sent)
        if self._changed or sent > last:
            return None
        if grew_only and self._head_is_open and sent == last:
            # The open value only lengthened: its new escaped text is the whole diff.
            if not self._streams(self._order[last]):
                return None
            added = "".join(self._open_text[self._head_open_parts :])
            self._head_open_parts = len(self._open_text)
            return added or None
        pieces = [self._full(i) for i in range(sent, last)]
        head = self._head_of(last)
        current = pieces[0] if pieces else head
        previous = self._sent_head()
        if self._any_sent and not current.startswith(previous):
            return None
        out = ("" if self._any_sent else "{") + current[len(previous) :]
        if pieces:
            out += "".join(", " + piece for piece in pieces[1:]) + ", " + head
        self._sent.extend(pieces)
        self._head_is_open = self._order[last] == self._open and self._streams(self._order[last])
        if self._head_is_open:
            self._head = f"{json.dumps(self._order[last], ensure_ascii=False)}: " + '"'
            self._head_open_parts = len(self._open_text)
        else:
            self._head = head
        self._any_sent = True
        return out or None

    def final_diff(self) -> str | None:
        """The rest of the finished arguments JSON (open arguments dropped), or None."""
        final = [key for key in self._order if key in self._rendered]
        # Every streamed piece is checked once here (a call ends once): an open repeat of an
        # earlier name may have been streamed in that name's place and then dropped.
        if len(self._sent) > len(final):
            return None
        if any(self._sent[i] != self._final(final[i]) for i in range(len(self._sent))):
            return None
        sent = len(self._sent)
        if sent == len(final):
            if self._any_sent:
                return None
            out = "{}"
        else:
            current = self._final(final[sent])
            previous = self._sent_head()
            if self._any_sent and (final[sent] != self._order[sent] or not current.startswith(previous)):
                return None
            rest = [self._final(key) for key in final[sent + 1 :]]
            out = ("" if self._any_sent else "{") + current[len(previous) :]
            out += "".join(", " + piece for piece in rest) + "}"
        self._sent = [self._final(key) for key in final]
        self._head, self._head_is_open = "", False
        self._any_sent = True
        return out or None

    def _final(self, key: str) -> str:
        return self._piece(key, self._rendered[key])


class ArgScanner(Protocol):
    """A format's one-pass argument scanner (it lives in its family's module): raw text in, events out."""

    def feed(self, text: str) -> list[ArgEvent]: ...


ScannerFactory = Callable[[], ArgScanner]


@dataclass(frozen=True)
class XmlArguments:
    """The XML-to-JSON argument converter of one format."""

    #: raw argument text → JSON object text (``partial``: the text may still grow); vLLM's
    #: regular expressions, run once on one-shot output
    convert: Callable[[str, bool], str]
    #: the one-pass streaming scanner (what ``convert`` gives, in O(delta) per record)
    scanner: ScannerFactory
    #: ``convert`` drops one leading and one trailing newline of each value
    trim_values: bool = False
    #: how a done value is read before schema typing (None: the raw string)
    decode: ValueDecoder | None = None
    #: vLLM's ``arg_structural_chars``: a streamed record whose argument text has none of
    #: these sends no argument delta (None: every record may)
    structural_chars: frozenset[str] | None = None


#: A call's name written into its arguments (when the markup gave none); ``\s`` as
#: vLLM's ``regex`` reads it (vllm/parser/engine/parser_engine.py ``_NAME_RE``).
NAME_IN_ARGS_RE = re.compile(rf'"name"{WS}*:{WS}*"([^"]*)"')


class NameProbe:
    """``"name"\\s*:\\s*"..."`` searched in text arriving in pieces, each character a few times.

    A match still in progress holds at most three quotes (around ``name`` and the value's
    opening one), so after a failed search only the text from the third-last quote is kept;
    the search reruns only when a quote arrives, since a match ends with one.
    """

    def __init__(self, pattern: re.Pattern[str] = NAME_IN_ARGS_RE) -> None:
        self._pattern = pattern
        self._parts: list[str] = []
        self.done = False
        self.name: str | None = None

    def feed(self, text: str) -> None:
        if self.done or not text:
            return
        self._parts.append(text)
        if '"' not in text:
            return
        region = "".join(self._parts)
        match = self._pattern.search(region)
        if match is not None:
            self.done, self.name, self._parts = True, match.group(1) or None, []
            return
        cut = len(region)
        for _ in range(3):
            cut = region.rfind('"', 0, cut)
            if cut < 0:
                self._parts = [region]
                return
        self._parts = [region[cut:]]


def name_and_args(raw: str) -> tuple[str, str]:
    """A JSON-object body (``{"name": ..., "arguments": ...}``) when markup is missing."""
    raw = raw.strip()
    try:
        parsed = json.loads(raw)
    except ValueError:
        return "", raw
    if not isinstance(parsed, dict):
        return "", raw
    name = parsed.get("name", "")
    # A non-string name would fail vLLM's response model; treat it as none.
    name = name if isinstance(name, str) else ""
    for key in ("arguments", "parameters"):
        if key in parsed:
            value = parsed[key]
            return name, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return name, json.dumps({k: v for k, v in parsed.items() if k != "name"}, ensure_ascii=False)
