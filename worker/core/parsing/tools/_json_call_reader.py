"""The ``llama3_json`` call in progress, read incrementally: per record O(its own text).

vLLM re-reads the call object at every record with the partial-JSON completion
(:mod:`._partial_json`) and diffs ``json.dumps`` of its arguments against the
previous read. For text that is a JSON prefix, that completion keeps every
finished member, closes every open container, and completes the value in
progress at the end: a string is kept (less a truncated escape, and less
trailing blanks) and closed; a number loses a
dangling sign/exponent/point; a literal prefix becomes the literal; a lone
``-`` or a key without its value is left out.

So the arguments JSON is an append-only *stable* part (the opening of each open
container and its finished members, and the decoded part of a string in
progress) followed by a short *volatile* part (the number, literal or string
tail in progress and the open containers' closers). :class:`CallReader` keeps
a scan position and a stack of open containers, takes each record's
characters once, and gives that split; the parser diffs only the volatile
parts and what became stable since.

A duplicate key (``json.loads`` keeps its first position and its last value)
cuts the stable part back to that first position once its new value shows in
the completion; the members after it wait in a fixed *suffix* (after the
volatile part) until the member ends. That costs one copy of those members
per duplicate member, not per record. The same key given twice in the call
object restarts the arguments; ``parameters`` and ``arguments`` both given
fail every later read (vLLM asserts), as text JSON rejects does (``dead``); a
key JSON rejects is left out with its member until the member's value shows,
then does too.

A syntax error raises :class:`Broken` (where, and what the completion could
still mend there), a number ending in a sign, exponent or point before a
delimiter :class:`Frozen` (the completion cuts there). A blank JSON rejects
outside strings stops the scan: while blanks follow, the reads are those of the
text before it or fail; a comma or closer after a value, or a value starting
(but a lone ``-``, or a string before the name is sent), makes every read fail
for good (``dead``; see :meth:`CallReader._blank`). Whatever else it does not
model (such a blank before a key or colon or followed by other text, nesting
deeper than :data:`MAX_DEPTH`) raises :class:`Unsupported`, and the parser
re-reads that call as vLLM does.
"""

from __future__ import annotations

import json
import re

from worker.core.parsing.tools._partial_json import complete_str, dump
from worker.core.parsing.tools._string_tail import AppendOnlyText, StringTail, slice_parts

MAX_DEPTH = 256
_WS = " \t\n\r"
_NUM_CHARS = frozenset("0123456789.-+eE")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
#: The literals the completion knows, in the order it tries them.
_LITERALS = ("null", "true", "false", "Infinity", "-Infinity", "NaN")
_STRING_STOP = re.compile(r'["\\]')
_NON_BLANK = re.compile(r"\S")  # \s is str.isspace
_HIGH_SURROGATE = re.compile(r"\\u[dD][89abAB]")
_ARGS_KEYS = ("parameters", "arguments")
#: ``json.dumps`` of the falsy values (vLLM sends nothing for falsy arguments); at most 5 characters.
_FALSY = frozenset(("{}", "[]", '""', "0", "0.0", "-0.0", "false", "null"))

# Container states: what may come next.
_KEY_OR_END, _KEY, _COLON, _VALUE, _VALUE_OR_END, _AFTER = range(6)


class Unsupported(Exception):
    """Text the reader does not model: the caller re-reads the call as vLLM does."""


class Broken(Unsupported):
    """The text stopped being a JSON prefix at ``at``, where the completion's walk rejects it too.

    Every completion that keeps ``text[at]`` then fails. It cuts before ``at`` only without
    incomplete strings, at the bracket or quote before one string opened after ``at``.
    """

    def __init__(self, at: int, why: str) -> None:
        super().__init__(why)
        self.at = at


class Frozen(Unsupported):
    """A number ending in a sign, exponent or point, then a delimiter (``1.,``): the walk stops there.

    The library's walk of any container holding it cuts it back to its digits and closes every
    container there, so a read (with incomplete strings) either gives that one value or fails
    (when the read keeps the number: see the parser's ``_Frozen``). ``openers``: the containers
    open at the number, outermost first; ``quote``: the last bracket or quote before it closed a
    string; ``end``: where the number ends.
    """

    def __init__(self, end: int, openers: str, quote: bool) -> None:
        super().__init__("a number ending in a sign, exponent or point")
        self.end = end
        self.openers = openers
        self.quote = quote


class JsonStringTail(StringTail):
    """A JSON string in progress: ``\\uXXXX`` escapes are six characters, never split between surrogates."""

    def unit(self, text: str, slash: int) -> int:
        return 6 if text[slash + 1] == "u" else 2

    def splits_after(self, text: str, slash: int, unit: int) -> bool:
        return not (unit == 6 and _HIGH_SURROGATE.match(text, slash))

    def decode(self, piece: str) -> str | None:
        try:
            return dump(json.loads('"' + piece + '"'))[1:-1]
        except ValueError:
            return None

    def tail(self, text: str) -> str | None:
        """The JSON text of the string after ``done`` as the completion keeps it; None if unreadable."""
        rest = '"' + text[self.done : self.end]
        self.scanned += len(rest)
        result = complete_str(rest, 0, True)
        if result is None:
            return None
        return self.decode(rest[1 : result[0]])

    def finish(self, text: str, close: int) -> str | None:
        """The JSON text of the whole string, closed at ``close``; None if JSON rejects it."""
        self.scanned += close - self.done
        rest = self.decode(text[self.done : close])
        return None if rest is None or not self.valid else self.stable + rest


class _Frame:
    __slots__ = (
        "at",
        "base",
        "count",
        "dup",
        "is_list",
        "key",
        "keys",
        "lengths",
        "live",
        "post",
        "saved",
        "start",
        "state",
        "tracked",
    )

    def __init__(self, is_list: bool, tracked: bool, base: int, at: int) -> None:
        self.at = at  # its opening bracket's index in the text
        self.is_list = is_list
        self.tracked = tracked  # inside the arguments: its JSON text is built
        self.count = 0  # members in the arguments JSON so far
        self.state = _VALUE_OR_END if is_list else _KEY_OR_END
        self.key = ""  # JSON text of the member in progress's key
        # Tracked objects, for duplicate keys: each key's member index, the members' lengths in
        # the stable part (from ``base``), where the member in progress starts.
        self.keys: dict[str, int] = {}
        self.lengths: list[int] = []
        self.base = base
        self.start = base
        self.dup = -1  # the member in progress repeats this member's key
        self.live = False  # ... and its value shows: the stable part was cut back to that member
        self.post = ""  # the members after it, added back when the member ends
        self.saved = ("", "")  # the reader's closers and suffix before the cut


class _Scalar:
    """The string, number or literal the scan is in."""

    __slots__ = (
        "end",
        "is_key",
        "kind",
        "start",
        "string",
        "taken",
        "tracked",
    )

    def __init__(self, kind: str, start: int, tracked: bool, is_key: bool = False) -> None:
        self.kind = kind  # "str", "num" or "lit"
        self.start = start
        self.end = -1  # numbers and literals: where the token ended (blanks may follow)
        self.tracked = tracked
        self.is_key = is_key
        self.string: JsonStringTail | None = None
        self.taken = 0  # characters of ``string.stable`` already in the stable part


class View:
    """One read's arguments JSON: ``stable[:size] + volatile + suffix``.

    ``suffix`` is shared by the reads of one duplicate member (members after its first position).
    Once a duplicate key cuts the stable part back below ``size``, the view's text from ``lost_at``
    on is kept in ``lost``.
    """

    __slots__ = ("lost", "lost_at", "size", "suffix", "truthy", "volatile")

    def __init__(self, size: int, volatile: str, truthy: bool, suffix: str = "") -> None:
        self.size = size
        self.volatile = volatile
        self.truthy = truthy
        self.suffix = suffix
        self.lost_at = -1
        self.lost = ""


#: ``CallReader.read`` of a record whose completion fails (vLLM skips the record).
FAILED = None


class CallReader:
    """Incremental partial-JSON read of one call object that starts at ``start`` in the text.

    ``partial_strings``: the reads complete a string in progress (vLLM's, once the name is sent);
    without, they leave it out.
    """

    def __init__(self, start: int, partial_strings: bool = True) -> None:
        self.partial_strings = partial_strings
        self.failing = False  # both argument keys show, or a rejected key and its value: reads fail for good
        self.pos = start  # next character to scan
        self.start = start
        self.frames: list[_Frame] = []
        self.scalar: _Scalar | None = None
        self.escape = False  # in a string, the last character scanned is a backslash
        self.after_quote = False  # the last bracket or quote scanned closed a string
        self.args_key: str | None = None
        self.args_pending = False  # the member whose value comes next holds the arguments
        self.args_seen = False  # the arguments' value has started
        self.dead = False  # the completion keeps text JSON rejects: every read fails for good
        # The completion keeps a key JSON rejects once its value shows.
        self.poisoned = False
        self.complete = False  # the object closed
        self.named = False  # the object has a "name" key (its value may still be in progress)
        self.name_pending = False  # the value that comes next is the name's
        self.name_values = 0  # values the "name" keys have begun
        self.name_value_at = -1  # where the last of them starts
        self.stable = AppendOnlyText()
        self.closers = ""  # the open tracked containers' closers, innermost first (to a duplicate's)
        self.suffix = ""  # from the innermost duplicate member on: the members after it and closers
        self.again = ""  # the call object's next value: "same" (restarts) or "both..." argument keys
        self.pending: _Frame | None = None  # a duplicate member's value that is a lone "-" so far
        self.last_view: View | None = None  # the last read given out
        self.last_nonblank = start  # end of the text less trailing blanks (str.isspace)
        self.string_at = -1  # where the last string closed so far opened
        # A blank JSON rejects, outside strings, followed by blanks only so far (see _blank).
        self.blank = -1
        self.blank_fails = False  # ... and the reads keep it (they fail) while only blanks follow
        self.blank_ends = ""  # the characters after it from which every read fails
        self.scanned = 0  # characters handled, for the bounded-work tests

    # -- scanning ----------------------------------------------------------

    def feed(self, text: str) -> None:
        """Scan the characters added since the last call (stops when the object closes)."""
        pos, length = self.pos, len(text)
        kept = text[pos:].rstrip()
        if kept:
            self.last_nonblank = pos + len(kept)
        self.scanned += length - pos
        if self.blank >= 0:
            self._after_blank(text, pos)
            return
        while pos < length and not self.complete and not self.dead:
            scalar = self.scalar
            if scalar is not None and scalar.kind == "str":
                pos = self._in_string(text, pos, scalar)
                continue
            if scalar is not None and scalar.end < 0:
                chars = _NUM_CHARS if scalar.kind == "num" else _LETTERS
                while pos < length and text[pos] in chars:
                    pos += 1
                if self.pending is not None and pos > scalar.start + 1:
                    self._present(self.pending)  # more than a lone "-": the completion keeps it
                if pos == length:
                    break
                if scalar.kind == "num" and text[pos] == "I" and pos == scalar.start + 1:
                    scalar.kind = "lit"  # "-I...": -Infinity
                    continue
                scalar.end = pos
            char = text[pos]
            if char in _WS:
                pos += 1
                continue
            if char.isspace() and self.frames:
                self._blank(text, pos)
                self._after_blank(text, pos + 1)
                return
            if scalar is not None:
                self._close_token(text, scalar, char)
            self._structural(text, pos, char)
            pos += 1
        self.pos = pos

    def _in_string(self, text: str, pos: int, scalar: _Scalar) -> int:
        length = len(text)
        if self.escape:
            self.escape = False
            return pos + 1
        stop = _STRING_STOP.search(text, pos)
        if stop is None:
            return length
        at = stop.start()
        if text[at] == "\\":
            if at + 1 == length:
                self.escape = True
                return length
            return at + 2
        self._close_string(text, scalar, at)
        return at + 1

    def _frame(self) -> _Frame:
        return self.frames[-1]

    def _blank(self, text: str, pos: int) -> None:
        """A blank JSON rejects (``str.isspace``, not JSON whitespace) at ``pos``, outside strings.

        The scan stops there. ``json.loads`` rejects it wherever the completion keeps it, so a read
        succeeds only when the completion cuts it off. While only blanks follow it, the completion
        strips them with the text's trailing blanks (its bracket scan, comma searches and the
        walk of the last container strip ``str.isspace``), so the read is the read of the text
        before it, except where the library keeps the text whole: after a closer, after a string
        in an array, and after a string value in an object with a comma before that string
        (its ``rfind``, which may find one inside a key). Once a non-blank ``c`` follows, every
        read fails for good (each cut the completion makes is past the blank) when, at the blank:

        * a value (or a number or literal token) ended and ``c`` is a comma or the closer;
        * a value comes (in an array, or after a colon) and ``c`` starts one other than a lone
          ``-`` (which the completion leaves out), or a string without incomplete strings (cut
          before it), or ``c`` closes an empty array;
        * an object just opened and ``c`` closes it.

        Elsewhere (before a key or a colon, a ``-``, a string before the name) whether a later cut
        lands before it turns on what follows, so the call is read whole (:class:`Unsupported`).
        """
        frame = self._frame()
        state = frame.state
        closer = "]" if frame.is_list else "}"
        self.blank = pos
        if self.scalar is not None or state == _AFTER:
            self.blank_ends = "," + closer
            self.blank_fails = self.scalar is None and (
                not self.after_quote or frame.is_list or text.rfind(",", frame.at + 1, self.string_at) >= 0
            )
        elif state in (_VALUE_OR_END, _VALUE):  # _VALUE_OR_END: an array just opened
            self.blank_ends = "{[0123456789ntfIN" + ('"' if self.partial_strings else "")
            self.blank_ends += "]" if state == _VALUE_OR_END else ""
        elif state == _KEY_OR_END:
            self.blank_ends = "}"

    def _after_blank(self, text: str, pos: int) -> None:
        """Scan the blanks after a pending blank JSON rejects; decide at the first other character."""
        found = _NON_BLANK.search(text, pos)
        if found is None:
            self.pos = len(text)
            return
        self.pos = found.start() + 1
        if text[found.start()] not in self.blank_ends:
            raise Unsupported("whitespace JSON does not allow, then text the reader does not model")
        self._fail_for_good()

    def _member_head(self, frame: _Frame) -> str:
        """What the arguments JSON holds before a member's value: separator and key."""
        head = ", " if (frame.dup if frame.dup >= 0 else frame.count) else ""
        return head if frame.is_list else head + frame.key + ": "

    def _structural(self, text: str, pos: int, char: str) -> None:
        if not self.frames:
            if char != "{":  # JSON blanks before it were skipped: json.loads skips them too
                raise Unsupported("the call is not an object")
            self._open(False, tracked=False, at=pos)
            return
        frame = self._frame()
        state = frame.state
        if state == _AFTER:
            if char == ",":
                self._end_member(frame)
                frame.state = _VALUE if frame.is_list else _KEY
            elif char == ("]" if frame.is_list else "}"):
                self._end_member(frame)
                self._close_container(frame)
            else:
                raise self._broken(pos, char, "after a value")
        elif state in (_KEY_OR_END, _KEY):
            if char == '"':
                self.scalar = _Scalar("str", pos, False, is_key=True)
            elif char == "}" and state == _KEY_OR_END:
                self._close_container(frame)
            else:
                raise self._broken(pos, char, "for a key")
        elif state == _COLON:
            if char != ":":
                raise self._broken(pos, char, "instead of ':'")
            frame.state = _VALUE
        elif char == "]" and state == _VALUE_OR_END:
            self._close_container(frame)
        else:
            self._value(text, pos, char, frame)

    def _broken(self, pos: int, char: str, where: str) -> Unsupported:
        return Broken(pos, f"unexpected {char!r} {where}")

    def _value(self, text: str, pos: int, char: str, frame: _Frame) -> None:
        if char not in '{["-0123456789ntfIN':
            raise self._broken(pos, char, "for a value")
        if self.poisoned:
            # Its value shows unless it is a lone "-", or a string in progress when the
            # completion leaves those out.
            if char == "-":
                self.pending = frame
            elif char != '"' or self.partial_strings:
                self._fail_for_good()
                return
        root = len(self.frames) == 1
        args = self.args_pending and root
        if self.name_pending and root:
            self.name_pending = False
            self.name_values += 1
            self.name_value_at = pos
        if root and self.again:
            # The arguments key again: the completion leaves a lone "-" out (the old value stays),
            # and a string in progress when it does not complete strings.
            if char == "-":
                self.pending = frame
            elif char == '"' and self.again == "both" and not self.partial_strings:
                self.again = "both, once the string closes"
            else:
                self._present(frame)
        elif frame.dup >= 0:
            if char == "-":
                self.pending = frame
            else:
                self._present(frame)
        frame.start = self.stable.length
        tracked = frame.tracked or args
        frame.state = _AFTER
        if args:
            self.args_seen = True
        if char in "{[":
            if frame.tracked:
                self._add_member(frame, char)
            elif args:
                self.stable.add(char)
            self._open(char == "[", tracked, at=pos)
        elif char == '"':
            scalar = _Scalar("str", pos, tracked)
            scalar.string = JsonStringTail(pos + 1, pos + 1)
            self.scalar = scalar
            self.after_quote = False
            if frame.tracked:
                self._add_member(frame, '"')
            elif args:
                self.stable.add('"')
        elif char in "-0123456789":
            self.scalar = _Scalar("num", pos, tracked)
        else:
            self.scalar = _Scalar("lit", pos, tracked)

    def _add_member(self, frame: _Frame, text: str) -> None:
        self.stable.add(self._member_head(frame) + text)
        if frame.dup < 0:
            frame.count += 1

    def _fail_for_good(self) -> None:
        self.dead = self.failing = True

    def _present(self, frame: _Frame) -> None:
        """The value after a repeated key shows in the completion from now on."""
        self.pending = None
        if self.poisoned:
            self._fail_for_good()
            return
        if len(self.frames) == 1 and self.again:
            again, self.again = self.again, ""
            if again.startswith("both"):
                self._fail_for_good()  # vLLM asserts on every read that has both keys
                return
            self._mark_lost(0)  # the new arguments replace the old ones whole
            self.stable.truncate(0)
            return
        j = frame.dup
        at = frame.base + sum(frame.lengths[:j])
        post = self.stable.between(at + frame.lengths[j], self.stable.length)
        self._mark_lost(at)
        self.stable.truncate(at)
        frame.start = at
        frame.live, frame.post = True, post
        frame.saved = (self.closers, self.suffix)
        self.suffix = post + self.closers + self.suffix
        self.closers = ""

    def _mark_lost(self, at: int) -> None:
        """Keep the last view's text from ``at`` on before the stable part is cut back there."""
        view = self.last_view
        if view is None or at >= view.size or 0 <= view.lost_at <= at:
            return
        if view.lost_at < 0:
            view.lost = self.text_of(view, at)
        else:
            view.lost = self.stable.between(at, view.lost_at) + view.lost
        view.lost_at = at

    def _end_member(self, frame: _Frame) -> None:
        """A member of a tracked object ended: record its length, or put a duplicate's followers back."""
        if not frame.tracked or frame.is_list:
            return
        length = self.stable.length - frame.start
        if frame.live:
            frame.lengths[frame.dup] = length
            self.stable.add(frame.post)
            self.closers, self.suffix = frame.saved
            frame.live, frame.post = False, ""
        elif frame.dup < 0:
            frame.lengths.append(length)
        frame.dup = -1

    def _open(self, is_list: bool, tracked: bool, at: int) -> None:
        if len(self.frames) >= MAX_DEPTH:
            raise Unsupported("nested too deep")
        self.frames.append(_Frame(is_list, tracked, self.stable.length, at))
        self.after_quote = False
        if tracked:
            self.closers = ("]" if is_list else "}") + self.closers

    def _close_container(self, frame: _Frame) -> None:
        if self.poisoned:
            self._fail_for_good()  # the completion keeps everything before a closer
            return
        self.frames.pop()
        self.after_quote = False
        if frame.tracked:
            self.stable.add(self.closers[0])
            self.closers = self.closers[1:]
        if not self.frames:
            self.complete = True

    def _close_string(self, text: str, scalar: _Scalar, close: int) -> None:
        self.scalar = None
        self.after_quote = True
        self.string_at = scalar.start
        frame = self._frame()
        if scalar.is_key:
            try:
                key = json.loads(text[scalar.start : close + 1])
            except ValueError:
                # The completion leaves a key without a value out; once the value shows, it keeps
                # the key and every read fails.
                self.poisoned = True
                self.args_pending = self.name_pending = False
                frame.state = _COLON
                return
            if frame.tracked:
                frame.dup = frame.keys.setdefault(key, frame.count)
                if frame.dup == frame.count:
                    frame.dup = -1
                frame.key = dump(key)
            elif len(self.frames) == 1:
                self.args_pending = False
                self.named = self.named or key == "name"
                self.name_pending = key == "name"
                if key in _ARGS_KEYS:
                    if self.args_key is None:
                        self.args_key = key
                        self.args_pending = True
                    elif key == self.args_key and not self.again.startswith("both"):
                        self.again = "same"
                        self.args_pending = True
                    else:
                        self.again = "both"
            frame.state = _COLON
            return
        if self.poisoned:
            self._fail_for_good()  # the value of a key JSON rejects closed
            return
        if len(self.frames) == 1 and self.again:
            self._present(frame)  # the second arguments key's string closed
            return
        string = scalar.string
        assert string is not None
        full = string.finish(text, close)
        self.scanned += string.scanned
        string.scanned = 0
        if full is None:
            self.dead = True
            return
        if scalar.tracked:
            self.stable.add(full[scalar.taken :] + '"')

    def _close_token(self, text: str, scalar: _Scalar, char: str) -> None:
        """A number or literal followed by ``char`` (not a blank): it is final."""
        self.scalar = None
        token = text[scalar.start : scalar.end]
        if scalar.kind == "lit" and token not in _LITERALS:
            # The walk raises at it: a literal prefix completes only where the text it reads ends,
            # and only the array tail after a string cuts ``char`` off (a "-"): see Broken.
            raise self._broken(scalar.start, token[0], "for a literal")
        if scalar.kind == "num" and token[-1] in ".-+eE":
            # The library walks back over it and cuts the container there, or keeps it and fails.
            if token.rstrip(".-+eE"):  # a digit stops the walk back inside the token
                openers = "".join("[" if frame.is_list else "{" for frame in self.frames)
                raise Frozen(scalar.end, openers, self.after_quote)
            raise Unsupported("a number of signs only: the library's walk back wraps to the text's end")
        value = _token_json(scalar.kind, token, partial=False)
        if value is None:
            self.dead = True  # the completion keeps it and JSON rejects it, from now on
            return
        if scalar.tracked:
            frame = self._frame()
            if frame.tracked:
                self._add_member(frame, value)
            else:
                self.stable.add(value)

    # -- reading -------------------------------------------------------------

    def read(self, text: str) -> View | None:
        """The arguments JSON as vLLM's read of ``text`` gives it (a View; size -1: no arguments).

        ``FAILED`` when that read fails. Call after :meth:`feed`; not when ``complete``.
        """
        if self.dead or self.blank_fails:
            return FAILED
        volatile = ""
        dropped = False
        scalar = self.scalar
        if scalar is not None and not scalar.is_key:
            frame = self._frame()
            if scalar.kind == "str":
                string = scalar.string
                assert string is not None
                string.extend(text, self._string_end(scalar))
                tail = string.tail(text) if string.valid else None
                self.scanned += string.scanned
                string.scanned = 0
                if not string.valid:
                    self.dead = True
                    return FAILED
                if tail is None:
                    return FAILED
                if scalar.tracked:
                    self.stable.add(string.stable[scalar.taken :])
                    scalar.taken = len(string.stable)
                    volatile = tail + '"'
            else:
                token = text[scalar.start : len(text) if scalar.end < 0 else scalar.end]
                self.scanned += len(token)
                if token == "-":
                    # Left out (an array's tail drops its comma too), and so are
                    # the arguments themselves (unless a repeated key's: the old value stays).
                    dropped = scalar.tracked and not frame.tracked and self.pending is None
                elif (value := _token_json(scalar.kind, token, partial=True)) is None:
                    return FAILED
                elif scalar.tracked:
                    volatile = (self._member_head(frame) if frame.tracked else "") + value
        if not self.args_seen or dropped:
            return View(-1, "", False)  # no arguments yet, or a lone "-" as the arguments: left out
        volatile += self.closers
        size, suffix = self.stable.length, self.suffix
        short = size + len(volatile) + len(suffix) <= 5
        text = self.stable.between(0, size) + volatile + suffix if short else ""
        view = View(size, volatile, not short or text not in _FALSY, suffix)
        self.last_view = view
        return view

    def reads_unnamed(self, text: str) -> bool:
        """Whether the read without incomplete strings (before the name is sent) surely succeeds.

        Call after :meth:`feed`, until the name's value closes (that read has the name; an
        incomplete string is left out of this one). The text is a JSON prefix
        the completion keeps whole up to its last finished value; what is in progress is left
        out or completed to valid JSON, except where this says False: a number or literal it
        cannot complete. A string in progress (escaped quotes included: the library's bracket
        scan skips them, and its search back for the key's quote skips escaped ones) and a lone
        ``-`` (after a string in an array too, the array tail from the last comma leaves it
        out with that comma) are left out.
        """
        if self.dead or self.blank_fails or self.complete or not self.frames or self.again.startswith("both"):
            return False
        scalar = self.scalar
        # After a "name" key's value began: only while that one value is a string in progress.
        in_name = scalar is not None and scalar.start == self.name_value_at and scalar.kind == "str"
        if self.name_values and not (self.name_values == 1 and in_name):
            return False
        if scalar is None:
            return True
        if scalar.kind == "str":
            string = scalar.string
            if string is not None:  # decode what became final, so its close decodes only a tail
                string.extend(text, len(text))
                self.scanned += string.scanned
                string.scanned = 0
            return True
        token = text[scalar.start : len(text) if scalar.end < 0 else scalar.end]
        self.scanned += len(token)
        if token == "-":
            return True
        try:
            return _token_json(scalar.kind, token, partial=True) is not None
        except Unsupported:
            return False

    def _string_end(self, scalar: _Scalar) -> int:
        """Where the completion's copy of the string in progress ends: the text less trailing blanks.

        The library completes the string from its opening quote (in an array or an object alike)
        and strips the text's trailing blanks first.
        """
        string = scalar.string
        assert string is not None
        return max(self.last_nonblank, string.done)

    def text_of(self, view: View, low: int = 0, high: int | None = None) -> str:
        """``(stable[:view.size] + view.volatile + view.suffix)[low:high]``."""
        size = view.size
        end = size + len(view.volatile) + len(view.suffix) if high is None else high
        head = self.stable.between(low, min(end, size)) if low < size else ""
        return head + slice_parts((view.volatile, view.suffix), max(low - size, 0), max(end - size, 0))


def _token_json(kind: str, token: str, partial: bool) -> str | None:
    """The JSON text the completion gives a number or literal token; None when the read fails."""
    if kind == "lit":
        for literal in _LITERALS:
            if token == literal or (partial and literal.startswith(token)):
                return literal
        return None  # the completion's walk raises at it
    if partial:
        cut = token.rstrip(".-+eE")
        if not cut:
            raise Unsupported("a number of signs only")  # the library's walk-back wraps here
        token = cut
    if not _NUMBER.fullmatch(token):
        return None
    try:
        return dump(json.loads(token))
    except ValueError:
        return None
