"""Shared logic of the pythonic tool parsers (``pythonic``, ``llama4_pythonic``).

The model writes ``[name(arg=value, ...), ...]``. Text is only ever read with
:func:`ast.parse` and literal AST nodes are converted by hand: nothing is
evaluated, so no model text can run code.

Streaming mirrors vLLM's approach (close the open brackets/quotes, parse,
diff the JSON of each call against what was sent) but keeps state across
records: the bracket scan is incremental; calls that are finished and
followed by a top-level comma are parsed once and then left out of every
later parse, and so are the finished arguments of the call in progress (their
JSON kept) and the finished elements of a list or dict argument in progress and
of the containers open in its last element (``_Level``), so a parse sees that
call's name, each level's head (written anew) and the last element; while the
call ends inside a string literal (plain, ``u``, ``r``, ``f``), a record without
its quote costs only its own text plus a short tail (``_Fast``, on the shared
``StringTail`` scan), and so does one inside a triple-quoted string whose
completion closes it (``_Triple``); a record whose read surely fails makes none
(``PythonicStream._read_fails``).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import warnings
from typing import Any

from worker.core.parsing.deltas import args_delta, name_delta
from worker.core.parsing.ids import random_tool_call_id
from worker.core.parsing.tools._string_tail import AppendOnlyText, StringTail, slice_parts
from worker.core.parsing.types import DeltaOut, ToolCallDeltaOut, ToolCallOut

_NAME_RE = re.compile(r"[a-zA-Z]+\w*")
_CLOSE_LIST_RE = re.compile(r"\)\s*\]")
_JSON_NAMES: dict[str, Any] = {"null": None, "true": True, "false": False}
_CLOSING = {"[": "]", "(": ")", "{": "}", "'": "'", '"': '"'}
_QUOTES = ("'", '"')
#: Python 3.12 reads quotes nested in an f-string's braces (PEP 701); before, an f-string is a
#: string token like any other, whose end is found as a plain string's.
_NESTED_FSTRINGS = sys.version_info >= (3, 12)
#: The pythonic families' parse-budget window (``ToolParser.reread_window``): every parse reads
#: the call's name and the levels' heads again (pretty-printed nesting, six levels deep, needs
#: ~30 characters a record beside 8 times its text), so the window is larger than the JSON ones'.
PYTHONIC_REREAD_WINDOW = 256
#: Backslashes counted before a quote inside a string (``_closes``).
_MAX_SLASHES = 64
#: Containers nested in an argument container whose elements are parsed once; deeper ones are
#: parsed whole with the element they are in (and a record's bookkeeping stays O(this)).
_MAX_LEVELS = 16
#: Longest head a parse reads for a level (``name=[``, ``'key': {``, blanks and comments left out):
#: every parse reads all the levels' heads.
_MAX_HEAD = 64
#: Longest text before a level's bracket (its indentation too): it is parsed once, when it opens.
_MAX_RAW_HEAD = 1024
#: Bracket depth past which no piece is parsed alone (CPython refuses 200 nested brackets).
_MAX_SPLIT_DEPTH = 100
#: Unary signs in a row that ``_value`` recurses through (the recursion limit is the caller's).
_SIGN_CHAIN = re.compile(r"(?:[-+~]\s*){32}")
#: The blanks Python's tokenizer skips inside brackets (``\s`` takes U+3000 too, which it refuses).
_BLANK = r"(?:[ \t\f\r\n]|\\\r?\n)*"
_BLANKS = re.compile(_BLANK)
#: An argument whose value is a list or dict: ``name=`` and the opening bracket.
_CONTAINER_ARG = re.compile(_BLANK + r"([A-Za-z_][A-Za-z0-9_]*)" + _BLANK + "=" + _BLANK + r"[\[{]")


class _NotACall(Exception):
    """The text is not a list of calls with literal arguments."""


class _Redo(Exception):
    """The parse left out committed elements it needs (a repeated dict key): parse them too."""


# -- one-shot --------------------------------------------------------------


def looks_like_call_list(text: str) -> bool:
    """vLLM's gate before parsing, decided without its backtracking regex.

    vLLM matches ``[`` + calls + ``]`` with ``.*`` argument bodies at the start
    of the text. Because ``.*`` can swallow anything, that accepts exactly:
    ``[``, then empty calls ``name()`` joined by ``,`` (with optional spaces
    after the comma), ending either in ``)`` + spaces + ``]`` or in a call whose
    first argument starts ``ident=`` with some ``)`` + spaces + ``]`` later on.
    This is linear, so adversarial text cannot make it slow.
    """
    if not text.startswith("["):
        return False
    pos = 1
    while True:
        name = _NAME_RE.match(text, pos)
        if name is None or text[name.end() : name.end() + 1] != "(":
            return False
        pos = name.end() + 1
        if text.startswith(")", pos):
            pos += 1
            if text.startswith(",", pos):
                pos += 1
                while pos < len(text) and text[pos].isspace():
                    pos += 1
                continue
            while pos < len(text) and text[pos].isspace():
                pos += 1
            return text.startswith("]", pos)
        arg = _NAME_RE.match(text, pos)
        if arg is None or text[arg.end() : arg.end() + 1] != "=":
            return False
        return _CLOSE_LIST_RE.search(text, arg.end() + 1) is not None


def _parse(source: str) -> ast.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escape sequences in model text
        return ast.parse(source)


def _value(node: ast.expr) -> Any:
    """A JSON-able value from a literal AST node (vLLM's accepted literal forms)."""
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, (str, int, float)):
            return node.value
        raise _NotACall("argument is not a JSON value")
    if isinstance(node, ast.Dict):
        if not all(isinstance(key, ast.Constant) for key in node.keys):
            raise _NotACall("dict keys must be literals")
        return {key.value: _value(value) for key, value in zip(node.keys, node.values, strict=True)}  # type: ignore[union-attr]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_value(item) for item in node.elts]
    if isinstance(node, ast.JoinedStr) and all(isinstance(part, ast.Constant) for part in node.values):
        return "".join(str(part.value) for part in node.values)  # type: ignore[attr-defined]
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    raise _NotACall("argument is not a literal")


def _dotted_name(node: ast.expr) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise _NotACall("call target is not a (dotted) name")
    parts.append(node.id)
    return ".".join(reversed(parts))


def call_of(node: ast.expr) -> tuple[str, str]:
    """(name, JSON arguments) of one call node; keyword arguments only, like vLLM."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, (ast.Name, ast.Attribute)):
        raise _NotACall("element is not a call")
    name = _dotted_name(node.func)
    arguments: dict[Any, Any] = {}
    for keyword in node.keywords:
        arguments[keyword.arg] = _value(keyword.value)
    return name, json.dumps(arguments, ensure_ascii=False)


def _call_list(module: ast.Module) -> list[ast.expr]:
    parsed = getattr(module.body[0], "value", None)
    if not isinstance(parsed, ast.List) or not all(isinstance(e, ast.Call) for e in parsed.elts):
        raise _NotACall("output is not a list of calls")
    return parsed.elts


def extract_calls(text: str) -> list[ToolCallOut] | None:
    """One-shot: the calls of a whole output, or None when it stays content."""
    if not looks_like_call_list(text):
        return None
    try:
        calls = [call_of(e) for e in _call_list(_parse(text))]
    except Exception:  # vLLM: any failure (syntax, nesting, values) keeps the text as content
        return None
    return [ToolCallOut(id=random_tool_call_id(), name=name, arguments=args) for name, args in calls]


# -- streaming -------------------------------------------------------------


class _Scanner:
    """Incremental form of vLLM's bracket/quote completion of partial Python.

    Tracks the open bracket/quote stack, whether the last char is escaped,
    the counts vLLM's heuristics read (``=``, ``,``, ``:`` before the last
    ``(``/``{``), the top-level commas of the leading list, and each call's
    ``(`` and the commas between its arguments.
    """

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.broken = False  # mismatched closer: every later completion fails
        self.pos = 0
        self.backslashes = 0  # run of backslashes ending at pos
        self.n_eq = self.n_comma = self.n_colon = 0
        self.eq_before_paren = self.comma_before_paren = -1
        self.colon_before_brace = self.comma_before_brace = -1
        self.list_open = True  # the leading '[' has not closed yet
        self.quote_at = -1  # offset of the last quote that opened a string
        self.boundaries: list[int] = []  # offsets just after top-level commas
        self.parens: list[int] = []  # offsets of the '(' opened right inside the leading list
        self.arg_commas: list[tuple[int, int]] = []  # (index in parens, offset just after the comma)
        self.opened: list[int] = []  # offset of each stack entry
        #: offsets just after the commas right inside each open '[' / '{' within a call, by its offset
        self.commas: dict[int, list[int]] = {}
        self.inner_parens = 0  # '(' on the stack above a call's own: see PythonicStream._read_fails
        self.deepest = 0  # the most brackets ever open at once (see ``_splittable``)

    def feed(self, text: str) -> None:
        stack = self.stack
        for char in text:
            pos = self.pos
            self.pos += 1
            if self.broken:
                continue
            if stack and stack[-1] in _QUOTES:
                if char == stack[-1] and self.backslashes % 2 == 0:
                    stack.pop()
                    self.opened.pop()
            elif char in "[({":
                if char == "(" and self.list_open and len(stack) == 1:
                    self.parens.append(pos)
                elif char == "(" and len(stack) >= 2:
                    self.inner_parens += 1
                stack.append(char)
                self.opened.append(pos)
                self.deepest = max(self.deepest, len(stack))
            elif char in "])}":
                if not stack or stack.pop() != {"]": "[", ")": "(", "}": "{"}[char]:
                    self.broken = True
                else:
                    self.commas.pop(self.opened.pop(), None)
                    if char == ")" and len(stack) >= 2:
                        self.inner_parens -= 1
                    elif char == "]" and not stack:
                        self.list_open = False
            elif char in _QUOTES:
                stack.append(char)
                self.opened.append(pos)
                self.quote_at = pos
            elif char == "," and self.list_open and len(stack) == 1:
                self.boundaries.append(pos + 1)
            elif char == "," and self.list_open and len(stack) == 2 and stack[-1] == "(":
                self.arg_commas.append((len(self.parens) - 1, pos + 1))
            elif char == "," and self.list_open and len(stack) >= 3 and stack[1] == "(" and stack[-1] != "(":
                self.commas.setdefault(self.opened[-1], []).append(pos + 1)
            # the counts see every char, strings included (as vLLM's do)
            if char == "(":
                self.eq_before_paren, self.comma_before_paren = self.n_eq, self.n_comma
            elif char == "{":
                self.colon_before_brace, self.comma_before_brace = self.n_colon, self.n_comma
            elif char == "=":
                self.n_eq += 1
            elif char == ",":
                self.n_comma += 1
            elif char == ":":
                self.n_colon += 1
            self.backslashes = self.backslashes + 1 if char == "\\" else 0

    def completion(self, text: str) -> tuple[str, str] | None:
        """(text to parse, added closers) for the scanned ``text``; None when too partial.

        Raises :class:`_NotACall` for mismatched brackets.
        """
        if self.broken:
            raise _NotACall("mismatched brackets")
        stripped = text.rstrip()
        if stripped.endswith(("=", ":")):
            return None
        stack = self.stack
        top = stack[-1] if stack else None
        if top == "{" and self.colon_before_brace <= self.comma_before_brace:
            return None
        if top == "(" and self.eq_before_paren <= self.comma_before_paren:
            return None
        if stripped.endswith(","):
            stripped = stripped[:-1]
        if top == "[" and not stripped.endswith(("[", ")")):
            return None
        return stripped, "".join(_CLOSING[c] for c in reversed(stack))


class _PythonStrings:
    """Python's own reading of strings and comments in the call text, kept up as the text grows.

    vLLM's completion scans quote by quote, so inside a triple-quoted string it closes a string of
    one quote: Python then meets an unterminated triple-quoted string and the read fails, unless
    the text ends in two of its quotes the added one completes (``triple_open_at_end``). Reading
    stops for good (``off``) at an f-string on Python 3.12 and later (``_NESTED_FSTRINGS``) or at
    a string a newline ends (Python's error: every later read fails anyway).
    """

    def __init__(self) -> None:
        self.pos = 0  # text before it is read; what is left waits for the characters it needs
        self.quote = ""  # the open string's quote character; "" in code
        self.triple = False
        self.body = -1  # where the open string's text starts
        self.comment = False
        self.off = False
        self.first_comment = -1  # offset of the first comment's '#'
        #: A comment or a triple quote was read (or the reading stopped): from there the
        #: quote-by-quote scan may see brackets and calls where Python does not.
        self.unsure = False
        self.first_off = -1  # offset where the reading first stopped (text after it was not read)

    def advance(self, text: str) -> None:
        pos, size = self.pos, len(text)
        while pos < size and not self.off:
            if self.comment:
                found = _LINE_END.search(text, pos)
                self.comment = found is None
                pos = size if found is None else found.end()
                continue
            if not self.quote:
                found = _CODE_MARK.search(text, pos)
                if found is None:
                    pos = size
                    continue
                at = found.start()
                if text[at] == "#":
                    self.comment, pos, self.unsure = True, at + 1, True
                    if self.first_comment < 0:
                        self.first_comment = at
                    continue
                if at + 3 > size:
                    pos = at  # a quote: one, two or three of them?
                    break
                prefix = at
                while prefix > 0 and text[prefix - 1].isalpha() and at - prefix < 3:
                    prefix -= 1
                if _NESTED_FSTRINGS and "f" in text[prefix:at].lower():
                    self._stop(at)
                    break
                self.quote, self.triple = text[at], text.startswith(text[at] * 3, at)
                self.unsure = self.unsure or self.triple
                pos = self.body = at + (3 if self.triple else 1)
                continue
            found = (_TRIPLE_MARK if self.triple else _SINGLE_MARK)[self.quote].search(text, pos)
            if found is None:
                pos = size
                continue
            at = found.start()
            mark = text[at]
            if mark == "\\":
                if at + 2 > size:
                    pos = at
                    break
                pos = at + 2
            elif mark != self.quote:
                self._stop(at)  # a newline ends a one-quote string: Python's error
            elif not self.triple:
                self.quote, pos = "", at + 1
            elif at + 3 > size:
                pos = at
                break
            elif text.startswith(self.quote * 3, at):
                self.quote, self.triple, pos = "", False, at + 3
            else:
                pos = at + 1
        self.pos = pos

    def _stop(self, at: int) -> None:
        self.off = self.unsure = True
        if self.first_off < 0:
            self.first_off = at

    @property
    def in_triple(self) -> bool:
        """The text read so far ends inside a triple-quoted string (Python's reading)."""
        return self.triple and bool(self.quote) and not self.off

    def comment_free_to(self) -> int:
        """Python's reading of the text before this offset holds no comment: a ``#`` there is in a
        string."""
        return min(end for end in (self.pos, self.first_comment, self.first_off) if end >= 0)

    def restart(self, at: int) -> None:
        """Python reads code at ``at`` (a finished piece parsed alone ends there): after an f-string
        turned the reading off, start it again from there."""
        if self.off and at >= self.pos:
            self.quote, self.triple, self.body = "", False, -1
            self.comment = self.off = False
            self.pos = at

    def triple_open_at_end(self, text: str, top: str | None) -> bool:
        """Whether ``text`` (read up to its end) ends inside a triple-quoted string that the
        completion of ``text`` (closers for the scanner's stack, ``top`` first) leaves open."""
        return self.in_triple and self.closing_at(text, top) == -1

    def quote_left_open(self, size: int, top: str | None) -> bool:
        """Whether the completion of the text (read to its end, ``size``) leaves a one-quote
        string open where Python reads it: ``top``, the quote the completion adds, opens one in
        code (or in a comment, where its closers stay too), or inside a string of the other
        quote the closers are text. The scan and Python disagree so only after a triple quote or
        a comment (a triple-quoted string is ``triple_open_at_end``'s)."""
        if self.off or self.pos < size or self.triple:
            return False  # not read to the end (a quote run or backslash waits for what follows)
        return top in _QUOTES if not self.quote else top != self.quote

    def closing_at(self, text: str, top: str | None) -> int:
        """Inside a triple-quoted string: the offset of the two quotes at its end that the
        completion's quote (``top``) completes to close it; -1 when the completion leaves it open,
        -2 when that cannot be told here (a backslash run too long to count: the parse decides)."""
        if top != self.quote:
            return -1  # the completion adds no such quote
        end = len(text)  # the completion's rstrip (a copy of the text: C's only past a long run)
        while end > self.body and text[end - 1].isspace() and len(text) - end < _MAX_SLASHES:
            end -= 1
        if end > self.body and text[end - 1].isspace():
            end = max(len(text.rstrip()), self.body)
        if end > self.body and text[end - 1] == ",":  # then a comma it drops
            end -= 1
        quotes = end
        while quotes > self.body and text[quotes - 1] == self.quote:
            quotes -= 1
        slashes = quotes
        while slashes > self.body and text[slashes - 1] == "\\":
            slashes -= 1
            if quotes - slashes > _MAX_SLASHES:
                return -2
        run = end - quotes - (quotes - slashes) % 2
        return end - 2 if run >= 2 else -1


_LINE_END = re.compile(r"[\r\n]")
_CODE_MARK = re.compile(r"[#'\"]")
_SINGLE_MARK = {q: re.compile(r"[\\\r\n" + q + "]") for q in _QUOTES}
_TRIPLE_MARK = {q: re.compile(r"[\\" + q + "]") for q in _QUOTES}


def _contains_set(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Set) for n in ast.walk(node))


# -- the string in progress, read incrementally ------------------------------
#
# While the text ends inside a plain (prefix-less) string literal and records
# add none of its quote, the completion only changes that string's text: the
# arguments JSON is P + (the string's JSON text) + Q with P and Q fixed, so a
# record decodes its own characters plus a short tail, not the call.

#: Longest ``\N{...}`` escape read (Unicode names are shorter); longer is an error.
_MAX_NAMED = 100
_SENTINEL = "\ue000"
_F_MARK = re.compile(r"[\\{}]")
_OCTAL = "01234567"
#: Longest Q (the arguments JSON after the string) the record's work may include.
_MAX_SUFFIX = 64


def _literal(quote: str, body: str, prefix: str = "") -> str | None:
    """The value of the string literal ``prefix + quote + body + quote``; None when Python rejects it."""
    try:
        node = _parse(prefix + quote + body + quote).body[0]
    except Exception:
        return None
    value = getattr(node, "value", None)
    if isinstance(value, ast.JoinedStr) and all(isinstance(part, ast.Constant) for part in value.values):
        return "".join(str(part.value) for part in value.values)  # type: ignore[attr-defined]
    if not isinstance(value, ast.Constant) or not isinstance(value.value, str):
        return None
    return value.value


def _closes(text: str, start: int, quote: str) -> bool:
    """Whether ``text[start:]`` may hold the quote that closes the literal it is inside: an
    unescaped ``quote`` (an even run of backslashes before it; a run too long to count is taken
    as closing, and the call is parsed)."""
    at = text.find(quote, start)
    while at != -1:
        slash = at
        while slash > 0 and text[slash - 1] == "\\" and at - slash <= _MAX_SLASHES:
            slash -= 1
        if (at - slash) % 2 == 0 or at - slash > _MAX_SLASHES:
            return True
        at = text.find(quote, at + 1)
    return False


def _plain_prefix(text: str, quote_at: int) -> str | None:
    """The prefix of the literal opened at ``quote_at`` when the fast path reads that kind: "" (or
    ``u``, the same), ``r`` or ``f``; None for any other (``b``, ``rb``, ``rf``...) or a longer name."""
    at = quote_at
    while at > 0 and (text[at - 1].isalnum() or text[at - 1] == "_") and quote_at - at < 3:
        at -= 1
    prefix = text[at:quote_at].lower()
    return "" if prefix in ("", "u") else prefix if prefix in ("r", "f") else None


class _Fast(StringTail):
    """Incremental read of the string literal the call in progress ends in.

    The arguments JSON is ``base + prefix + stable + tail + suffix``: ``base``
    the arguments committed before (see ``PythonicStream``), ``prefix`` and
    ``suffix`` fixed around the literal's JSON text.
    """

    def __init__(self, text: str, quote_at: int, end: int, base: AppendOnlyText, kind: str = "") -> None:
        super().__init__(quote_at + 1, end)
        self.quote = text[quote_at]
        self.kind = kind  # "", "r" or "f" (an f-string: its braces are escapes, see ``unit``)
        self.raw = kind == "r"  # r'...': a backslash only keeps the next character from ending it
        self.base = base
        self.prefix = ""  # P less the base
        self.suffix = ""  # Q less what the completion invented
        self.advance(text)

    def next_mark(self, text: str, pos: int, target: int) -> int:
        if self.kind != "f":
            return text.find("\\", pos, target)
        found = _F_MARK.search(text, pos, target)
        return -1 if found is None else found.start()

    def unit(self, text: str, slash: int) -> int:
        kind = text[slash + 1]
        mark = text[slash]
        if mark != "\\":
            # An f-string's brace: doubled, it is one; alone, a placeholder or an error, so no read
            # of the text (which keeps it) succeeds again.
            return 2 if kind == mark else -1
        if kind in "{}" and self.kind == "f":
            return 1  # the backslash stays (no such escape) and the braces after it pair alone
        if self.raw:
            return 3 if kind == "\r" and text[slash + 2] == "\n" else 2
        if kind in _OCTAL:
            size = 2
            while size < 4 and text[slash + size] in _OCTAL:
                size += 1
            return size
        if kind == "N":
            close = text.find("}", slash + 3, slash + 3 + _MAX_NAMED)
            if close != -1:
                return close + 1 - slash
            return -1 if self.end - slash > _MAX_NAMED + 3 else 0
        if kind == "\r":  # a line continuation; the tokenizer reads CR LF as one newline
            return 3 if text[slash + 2] == "\n" else 2
        return {"x": 4, "u": 6, "U": 10}.get(kind, 2)

    def splits_after(self, text: str, slash: int, unit: int) -> bool:
        return unit != 1  # a piece that ends in that backslash would escape the quote after it

    def decode(self, piece: str) -> str | None:
        value = _literal(self.quote, piece, self.kind)
        return None if value is None else json.dumps(value, ensure_ascii=False)[1:-1]

    def tail(self, text: str) -> str | None:
        """The JSON text of the literal after ``done`` as the completion keeps it; None if unreadable."""
        body = text[self.done : self.end]
        self.scanned += len(body)
        if body.endswith(("=", ":")):
            return None  # the completion gives up on such text
        if body.endswith(","):
            body = body[:-1]
        return self.decode(body)

    def length(self, tail: str) -> int:
        return self.base.length + len(self.prefix) + len(self.stable) + len(tail) + len(self.suffix)

    def slice(self, tail: str, low: int) -> str:
        """The arguments JSON from ``low`` on."""
        size = self.base.length
        head = self.base.between(low, size) if low < size else ""
        return head + slice_parts((self.prefix, self.stable, tail, self.suffix), max(low - size, 0))


class _Triple(_Fast):
    """``_Fast`` for a triple-quoted literal the call in progress ends in.

    vLLM reads such a string only at records whose completion closes it (the text ends in two of
    its quotes: ``_PythonStrings.closing_at``), and then as the text up to those two quotes: that
    is ``stable`` plus a tail read to them. Python reads CR LF in it as one newline, and a piece
    that ends in the quote would close the literal early, so no piece ends at either.
    """

    def __init__(
        self, text: str, body: int, end: int, base: AppendOnlyText, kind: str, opened: list[int]
    ) -> None:
        super().__init__(text, body - 1, end, base, kind)
        self.body = body
        self.opened = opened  # the scanner's stack offsets under the quote when it was anchored

    def decode(self, piece: str) -> str | None:
        value = _literal(self.quote * 3, piece, self.kind)
        return None if value is None else json.dumps(value, ensure_ascii=False)[1:-1]

    def plain_end(self, text: str, low: int, at: int) -> int:
        while at > low and (text[at - 1] == self.quote or (text[at - 1] == "\r" and text[at] == "\n")):
            at -= 1
        return at

    def tail_to(self, text: str, stop: int) -> str | None:
        """The JSON text of the literal from ``done`` to ``stop``; None if unreadable."""
        body = text[self.done : stop]
        self.scanned += len(body)
        return self.decode(body)


def _after_members(rest: str) -> str:
    """What follows committed JSON members (``{`` + members) for the JSON object ``rest`` of the others."""
    return "}" if rest == "{}" else ", " + rest[1:]


class _Args:
    """A call's arguments JSON: what was committed before (``base``) and the parsed ``rest`` after it."""

    def __init__(self, base: AppendOnlyText, rest: str) -> None:
        self.base = base
        self.rest = rest
        self.length = base.length + len(rest)

    def endswith(self, suffix: str) -> bool:
        if len(suffix) <= len(self.rest):
            return self.rest.endswith(suffix)
        return self.text_from(0).endswith(suffix)

    def cut(self, size: int) -> None:
        """Drop the last ``size`` characters."""
        if size > len(self.rest):
            self.rest, self.base = self.text_from(0)[:-size], AppendOnlyText()
        else:
            self.rest = self.rest[: len(self.rest) - size]
        self.length -= size

    def text_from(self, low: int) -> str:
        size = self.base.length
        head = self.base.between(low, size) if low < size else ""
        return head + self.rest[max(low - size, 0) :]


class _Level:
    """A container whose finished elements are parsed once: the argument's (``name=[``), or one open
    in the last element of the level before (``'k': {`` in a dict, ``[`` in a list)."""

    def __init__(self, at: int, head: str, key: Any, opener: str, mark: int) -> None:
        self.at = at  # its bracket's offset
        self.bracket = head[-1]
        self.head = head  # the text from the parent's uncommitted elements (or the argument) to the bracket
        self.key = key  # the argument's name, the dict key it is the value of, or None in a list
        self.opener = opener  # its JSON before any element ('"name": [', '"k": {', '[')
        self.mark = mark  # ``_elem_json``'s length before its opener (and separator)
        self.start = at + 1  # where its uncommitted elements start
        self.count = 0  # committed elements
        self.used = 0  # its commas looked at
        self.keys: set[Any] = set()  # a dict's committed keys
        self.off_at = -1  # a container in its last element not modelled (its head, or an element)


class PythonicStream:
    """Streaming state of one choice; ``step`` gets each record's share of the call text.

    Calls that are finished and followed by a top-level comma are parsed once and
    left out of later parses; inside the call in progress, so are its arguments
    followed by a comma (each is parsed once, its JSON kept) and the elements of the
    levels (``_Level``), so a parse sees that call's name, the levels' heads and the
    last argument or element (see the module's docstring).
    """

    def __init__(self, end_marker: str | None = None) -> None:
        self._end_marker = end_marker  # cut from the end of the text before parsing
        self._scanner = _Scanner()
        self._strings = _PythonStrings()
        self._text = ""  # call text so far
        self._streamed: list[str] = []  # arguments sent per call
        self._index = -1  # vLLM's current_tool_id
        self._any_delta = False  # vLLM's prev_tool_call_arr placeholder
        # finished calls dropped from later parses
        self._committed = 0
        self._committed_at = 1  # text offset where the uncommitted calls start
        self._committed_has_set = False
        self._no_commit = False
        self._dead = False  # a finished call can never parse: every step fails
        self._fast: _Fast | None = None  # set while the text ends inside a string literal
        self._triple: _Triple | None = None  # set while it ends inside a triple-quoted one
        self._triple_tried = -1  # the body offset of the last triple-quoted literal anchored
        # finished arguments of the call in progress, dropped from later parses
        self._arg_paren = -1  # that call's '(' (index in the scanner's parens); -1: none yet
        self._arg_start = -1  # where its uncommitted arguments start; -1: none committed
        self._arg_used = 0  # argument commas looked at
        self._arg_names: set[str] = set()
        self._arg_json = AppendOnlyText()  # '{' + the committed arguments' JSON members
        self._arg_has_set = False
        self._arg_off = False  # an argument that is not one plain keyword: parse the call whole
        # The list or dict the argument in progress is (``name=[...``) and the containers open in its
        # last element, each a level: every element a comma follows is parsed once and dropped from
        # later parses, its JSON kept in ``_elem_json`` after the arguments' (see ``_Level``).
        self._levels: list[_Level] = []
        self._elem_off_at = -1  # an argument container with an element not modelled: parse it whole
        self._elem_json = AppendOnlyText()  # with ``_elem_ready``: the JSON up to the committed elements
        self._elem_ready = False  # an element is committed at some level
        self._elem_has_set = False
        self.scanned = 0  # characters handed to the parser, for the bounded-work tests
        #: False parses the call in progress at every record (the reference the tests compare with).
        self.incremental = True

    def step(self, delta: str) -> DeltaOut | None:
        # The end marker's chars hold no bracket, quote, '=', ',' or ':', so
        # scanning them never changes the scan state: only the view is cut.
        self._scanner.feed(delta)
        self._text += delta
        text = self._text
        marker = self._end_marker
        cut = bool(marker) and text.endswith(marker)  # type: ignore[arg-type]
        if cut:
            text = text[: text.rfind(marker)]  # type: ignore[arg-type]
        fast = self._fast
        if fast is not None:
            if not cut and not _closes(self._text, len(self._text) - len(delta), fast.quote):
                return self._step_fast(fast, delta)
            self._fast = None
        if self._dead:
            return None
        if self.incremental:
            self._strings.advance(self._text)  # first: a commit below may restart it after an f-string
            self._commit_args(text)
            self._commit_elems(text)
            if self._triple is not None:
                handled, result = self._step_triple(self._triple, delta, cut)
                if handled:
                    self._commit(text)
                    return result
            if self._read_fails(text):
                self._commit(text)
                return None
        try:
            try:
                parsed = self._parse_calls(text)
            except _Redo:
                self._revert()
                parsed = self._parse_calls(text)
            if parsed is None:
                return None
            calls, added = parsed
            deltas = self._diff(calls, added)
        except Exception:  # vLLM skips the record on any failure
            return None
        finally:
            self._commit(text)
        if self.incremental and calls and not cut:
            strings = self._strings
            if not strings.in_triple:
                self._fast = self._anchor(text, added, calls[-1][2])
            elif self._triple_tried != strings.body:  # one try per literal: the probe is a parse
                self._triple_tried = strings.body
                fast = self._anchor(text, added, calls[-1][2])
                self._triple = fast if isinstance(fast, _Triple) else None
        if deltas:
            self._any_delta = True
            return DeltaOut(tool_calls=deltas)
        if not added and self._index > 0:
            return DeltaOut(content="")  # vLLM's "all calls done" marker
        return None

    def _read_fails(self, text: str) -> bool:
        """Whether vLLM's read of this record surely fails, leaving its state as it is.

        Inside a triple-quoted string the completion leaves open, or where the string the
        completion opens or closes is not Python's, the parse fails (``_PythonStrings``).
        With a ``(`` open inside the call in progress (a tuple, a nested
        call), the suffix the completion adds and vLLM withholds from that call's arguments holds
        a ``)`` followed by closers and ``}``; json.dumps writes ``)`` only inside a string, which
        no such suffix closes, so the arguments never end in it and the read raises. Nothing
        changes before it raises once every call before is streamed and complete and this one
        has its entry, and while the scan's calls are Python's (``_PythonStrings.unsure``: after
        a triple quote the scan can take a finished call for the one in progress).
        """
        scanner = self._scanner
        top = scanner.stack[-1] if scanner.stack else None
        strings = self._strings
        if strings.triple_open_at_end(text, top) or strings.quote_left_open(len(self._text), top):
            return True
        return (
            scanner.inner_parens > 0
            and not strings.unsure  # the scan's call in progress is Python's
            and scanner.list_open
            and len(scanner.stack) >= 3
            and scanner.stack[1] == "("
            and self._index >= len(scanner.parens) - 1
            and len(self._streamed) > self._index
        )

    def _parse_calls(self, text: str) -> tuple[list[tuple[str, _Args, str]], str] | None:
        """(calls, added closers) of vLLM's parse of the completed ``text``; None when it gives none."""
        completed = self._scanner.completion(text)
        if completed is None:
            return None
        body, added = completed
        head, start = self._region()
        source = "[" + head + body[start:] + added
        self.scanned += len(source)
        module = _parse(source)
        if not module.body:
            return None
        has_set = self._committed_has_set or self._arg_has_set or self._elem_has_set
        if "}" in added and (has_set or _contains_set(module)):
            return None
        # Only the first call can have committed arguments (the others follow it, unstreamed).
        return [self._call(e, "" if i else head) for i, e in enumerate(_call_list(module))], added

    # -- committed arguments of the call in progress ---------------------------

    def _region(self) -> tuple[str, int]:
        """(text standing for the committed part of the call in progress, where the rest starts)."""
        if self._elem_ready:
            paren = self._scanner.parens[self._arg_paren]
            heads = "".join(level.head for level in self._levels)
            return self._text[self._committed_at : paren + 1] + heads, self._levels[-1].start
        if self._arg_start < 0:
            return "", self._committed_at
        paren = self._scanner.parens[self._arg_paren]
        return self._text[self._committed_at : paren + 1], self._arg_start

    def _call(self, node: ast.expr, head: str) -> tuple[str, _Args, str]:
        """(name, arguments JSON, JSON of the parsed arguments only) of a parsed call."""
        if not head:
            name, args = call_of(node)
            return name, _Args(AppendOnlyText(), args), args
        assert isinstance(node, ast.Call)
        # What the whole call's parse would reject, with the committed arguments before these.
        if any(not isinstance(arg, ast.Starred) for arg in node.args):
            raise _NotACall("positional argument follows keyword argument")
        if any(keyword.arg in self._arg_names for keyword in node.keywords):
            raise _Redo  # the last value in the first place: the JSON is not a concatenation
        if self._elem_ready:
            self._check_elems(node)
        name, args = call_of(node)
        return name, _Args(self._base(), self._join(args)), args

    def _base(self) -> AppendOnlyText:
        return self._elem_json if self._elem_ready else self._arg_json

    def _join(self, parsed: str) -> str:
        """The arguments JSON after ``_base()``, from the JSON of the parsed arguments only."""
        if not self._elem_ready:
            return _after_members(parsed) if self._arg_json.length else parsed
        opener = "{" + "".join(level.opener for level in self._levels)
        if not parsed.startswith(opener):
            raise _Redo  # not what was committed: the whole parse decides
        rest = parsed[len(opener) :]
        inner = self._levels[-1]
        return rest if not inner.count or rest.startswith(_CLOSING[inner.bracket]) else ", " + rest

    def _check_elems(self, node: ast.Call) -> None:
        """The parsed call holds only the levels' uncommitted elements, as the text says it does.

        The text after the committed elements lies inside every level, so the parse holds one
        keyword, the argument container, whose only element at each outer level is the next level.
        Anything else raises ``_Redo`` (the whole parse decides): the quote-by-quote scan and
        Python read the text differently (a triple-quoted string can close the levels where the
        scan sees none), or the innermost alone parses as a comprehension or a set where the
        whole parse fails.
        """
        keywords = node.keywords
        if node.args or len(keywords) != 1 or keywords[0].arg != self._levels[0].key:
            raise _Redo
        value = keywords[0].value
        last = len(self._levels) - 1
        for depth, level in enumerate(self._levels):
            if level.bracket == "[":
                if not isinstance(value, ast.List):
                    raise _Redo
                if depth < last:
                    if len(value.elts) != 1:
                        raise _Redo
                    value = value.elts[0]
                continue
            if not isinstance(value, ast.Dict):
                raise _Redo
            for key in value.keys:
                if isinstance(key, ast.Constant) and key.value in level.keys:
                    raise _Redo  # a repeated key keeps its first place: the JSON is not a concatenation
            if depth < last:
                if len(value.keys) != 1 or not isinstance(value.keys[0], ast.Constant):
                    raise _Redo
                value = value.values[0]

    def _commit_elems(self, text: str) -> None:
        """Parse once each element that a comma follows in the argument container and the containers
        open in its last element (down to ``_MAX_LEVELS``)."""
        scanner = self._scanner
        stack = scanner.stack
        paren = self._arg_paren
        usable = (
            not self._no_commit
            and not self._arg_off
            and paren >= 0
            and paren == len(scanner.parens) - 1
            and self._committed >= len(scanner.boundaries)
            and len(stack) >= 3
            and stack[1] == "("
            and scanner.opened[2] > max(self._arg_start, scanner.parens[paren])
        )
        kept = 0
        while (
            usable
            and kept < len(self._levels)
            and kept + 2 < len(stack)
            and scanner.opened[kept + 2] == self._levels[kept].at
        ):
            kept += 1
        if kept < len(self._levels):
            self._drop_levels(kept)
        if not usable:
            return
        depth = 0
        while True:
            if depth == len(self._levels) and not self._enter(text, depth):
                return
            level = self._levels[depth]
            commas = scanner.commas.get(level.at, ())
            while level.used < len(commas):
                end = commas[level.used]
                if end > len(text):
                    return
                level.used += 1
                if not self._commit_elem(level, text[level.start : end - 1], end - 1):
                    self._leave(depth)
                    return
                level.start = end
                self._strings.restart(end)
            depth += 1

    def _enter(self, text: str, depth: int) -> bool:
        """Open the level for the container at ``depth`` of the argument, if it is one we model."""
        scanner = self._scanner
        stack = scanner.stack
        index = depth + 2
        if index >= len(stack) or stack[index] not in "[{" or depth >= _MAX_LEVELS:
            return False
        at = scanner.opened[index]
        if depth == 0:
            if at == self._elem_off_at:
                return False
            begin = self._arg_start if self._arg_start >= 0 else scanner.parens[self._arg_paren] + 1
            matched = None
            if at + 1 - begin <= _MAX_RAW_HEAD:
                self.scanned += at + 1 - begin
                matched = _CONTAINER_ARG.fullmatch(text, begin, at + 1)
            if matched is None:
                self._elem_off_at = at  # not `name=` and the bracket: parse it whole
                return False
            key: Any = matched.group(1)
            opener = json.dumps(key, ensure_ascii=False) + ": " + stack[index]
            self._levels.append(_Level(at, key + "=" + stack[index], key, opener, 0))
            self._ready()  # from now on parses read the heads, not the text before the levels
            return True
        parent = self._levels[depth - 1]
        if at == parent.off_at:
            return False
        child = None
        if at + 1 - parent.start <= _MAX_RAW_HEAD:
            raw = text[parent.start : at + 1]
            self.scanned += len(raw)
            # A '#' Python reads as a comment keeps the level off (the scan may misplace things).
            commented = "#" in raw and at + 1 > self._strings.comment_free_to()
            child = None if commented else self._opener(parent, raw, stack[index])
        if child is None:
            parent.off_at = at
            return False
        head = child[2]
        if len(head) > _MAX_HEAD:  # every later parse reads the heads: keep them short
            parent.off_at = at
            return False
        mark = self._elem_json.length
        if self._elem_ready:
            self._elem_json.add((", " if parent.count else "") + child[1])
        self._levels.append(_Level(at, head, child[0], child[1], mark))
        return True

    @staticmethod
    def _opener(parent: _Level, head: str, bracket: str) -> tuple[Any, str, str] | None:
        """(key, JSON before the elements, the head later parses read) of a container that starts
        ``parent``'s element ``head``: a string key's head is written anew, without blanks."""
        if parent.bracket == "[":
            alone = head[-1] == bracket and _BLANKS.fullmatch(head, 0, len(head) - 1) is not None
            return (None, bracket, bracket) if alone else None
        try:
            node = _parse("{" + head + _CLOSING[bracket] + "}").body[0]
            display = getattr(node, "value", None)
            if not isinstance(display, ast.Dict) or len(display.keys) != 1:
                return None
            key_node = display.keys[0]
            if not isinstance(key_node, ast.Constant) or key_node.value in parent.keys:
                return None
            # The value is the bracket alone (not ``[1] + [``), so a head written anew reads alike.
            value = display.values[0]
            empty_list = isinstance(value, ast.List) and not value.elts
            empty_dict = isinstance(value, ast.Dict) and not value.keys
            if not (empty_list if bracket == "[" else empty_dict):
                return None
            written = json.dumps({key_node.value: 0}, ensure_ascii=False)
        except Exception:
            return None
        key = key_node.value
        canonical = repr(key) + ": " + bracket if isinstance(key, str) else head.strip()
        return key, written[1:-2] + bracket, canonical

    def _splittable(self, piece: str, end: int) -> bool:
        """Whether ``piece`` (ending at ``end``) parsed alone reads as it does in the whole text: no
        comment (the quote-by-quote scan may not split where Python does; a ``#`` Python read in a
        string is none), and no nesting near Python's limits, which a piece alone meets less deep
        than the whole parse (200 brackets; a long sign chain in ``_value``)."""
        if "#" in piece and end > self._strings.comment_free_to():
            return False
        return self._scanner.deepest <= _MAX_SPLIT_DEPTH and _SIGN_CHAIN.search(piece) is None

    def _commit_elem(self, level: _Level, piece: str, end: int) -> bool:
        """Add one element's JSON; False for anything not modelled (the container is then parsed whole)."""
        self.scanned += len(piece)
        if not self._splittable(piece, end):
            return False
        is_list = level.bracket == "["
        try:
            node = _parse(("[" if is_list else "{") + piece + ("]" if is_list else "}")).body[0]
            display = getattr(node, "value", None)
            if is_list:
                if not isinstance(display, ast.List) or len(display.elts) != 1:
                    return False
                element = display.elts[0]
                member = json.dumps([_value(element)], ensure_ascii=False)[1:-1]
                key: Any = None
            else:
                if not isinstance(display, ast.Dict) or len(display.keys) != 1:
                    return False
                key_node, element = display.keys[0], display.values[0]
                if not isinstance(key_node, ast.Constant) or key_node.value in level.keys:
                    return False
                key = key_node.value
                member = json.dumps({key: _value(element)}, ensure_ascii=False)[1:-1]
        except Exception:
            return False  # the whole parse decides (it fails alike, or tells what this missed)
        if not self._elem_ready:
            self._ready()
        self._elem_json.add((", " if level.count else "") + member)
        level.count += 1
        if not is_list:
            level.keys.add(key)
        self._elem_has_set = self._elem_has_set or _contains_set(element)
        return True

    def _ready(self) -> None:
        """Start the elements' JSON: the committed arguments, then each level's opener."""
        members = self._arg_json.between(0, self._arg_json.length)
        self._elem_json = AppendOnlyText()
        self._elem_json.add(members + ", " if self._arg_names else "{")
        for level in self._levels:  # none has a committed element yet
            level.mark = self._elem_json.length
            self._elem_json.add(level.opener)
        self._elem_ready = True

    def _leave(self, depth: int) -> None:
        """An element at ``depth`` is not modelled: parse that level's container whole from now on."""
        if depth == 0:
            self._elem_off_at = self._levels[0].at
        else:
            self._levels[depth - 1].off_at = self._levels[depth].at
        self._drop_levels(depth)

    def _drop_levels(self, kept: int) -> None:
        """Close the levels from ``kept`` on (their containers ended, or are parsed whole)."""
        if kept == 0:
            self._reset_elems()
            return
        if self._elem_ready:
            self._elem_json.truncate(self._levels[kept].mark)
        del self._levels[kept:]

    def _revert(self) -> None:
        """Parse the call in progress whole from now on, its committed arguments and elements too."""
        at = self._levels[0].at if self._levels else -1
        self._reset_args()
        self._elem_off_at = at if at >= 0 else self._elem_off_at
        self._arg_off = True

    def _reset_elems(self) -> None:
        self._levels = []
        self._elem_json = AppendOnlyText()
        self._elem_ready = False
        self._elem_has_set = False

    def _commit_args(self, text: str) -> None:
        """Parse once each argument of the call in progress that a comma follows, and drop it."""
        scanner = self._scanner
        if self._no_commit or self._arg_off or self._committed < len(scanner.boundaries):
            return
        parens = scanner.parens
        if self._arg_paren < 0:
            if not parens or parens[-1] < self._committed_at:
                return
            self._arg_paren = len(parens) - 1
            while self._arg_paren > 0 and parens[self._arg_paren - 1] >= self._committed_at:
                self._arg_paren -= 1
        commas = scanner.arg_commas
        while self._arg_used < len(commas):
            paren, end = commas[self._arg_used]
            if paren < self._arg_paren:
                self._arg_used += 1
                continue
            if paren > self._arg_paren or end > len(text):
                if paren > self._arg_paren:
                    self._arg_off = True  # another call in the same stretch: parse it whole
                return
            self._arg_used += 1
            start = self._arg_start if self._arg_start >= 0 else parens[paren] + 1
            if not self._commit_arg(text[start : end - 1], end - 1):
                return
            self._arg_start = end
            self._strings.restart(end)

    def _commit_arg(self, piece: str, end: int) -> bool:
        self.scanned += len(piece)
        if not self._splittable(piece, end):
            self._arg_off = True
            return False
        try:
            node = _parse("f(" + piece + ")").body[0]
            call = getattr(node, "value", None)
            if not isinstance(call, ast.Call) or call.args or len(call.keywords) != 1:
                raise _NotACall("not one keyword argument")
            keyword = call.keywords[0]
            if keyword.arg is None:
                raise _NotACall("a ** argument")
        except Exception:
            self._arg_off = True
            return False
        try:
            value = _value(keyword.value)
        except Exception:
            self._dead = True  # vLLM's whole parse fails on this argument from now on
            return False
        if keyword.arg in self._arg_names:
            self._revert()  # ast keeps a repeated keyword; its value replaces the first one's in place
            return False
        try:
            member = json.dumps({keyword.arg: value}, ensure_ascii=False)[1:-1]
        except (TypeError, ValueError):  # a key JSON cannot write ({b"x": 1}): the whole parse decides
            self._arg_off = True
            return False
        self._arg_json.add(("{" if not self._arg_names else ", ") + member)
        self._arg_names.add(keyword.arg)
        self._arg_has_set = self._arg_has_set or _contains_set(keyword.value)
        return True

    def _reset_args(self) -> None:
        self._arg_paren = self._arg_start = -1
        self._arg_names = set()
        self._arg_json = AppendOnlyText()
        self._arg_has_set = self._arg_off = False
        self._reset_elems()

    # -- the string in progress ------------------------------------------------

    def _anchor(self, text: str, added: str, args: str) -> _Fast | None:
        """A ``_Fast`` when this record's parse ended in a plain string literal, else None (a
        ``_Triple`` when that literal is triple-quoted).

        ``args``: the JSON of the arguments that parse read (the committed ones aside).
        """
        scanner = self._scanner
        strings = self._strings
        triple = strings.in_triple
        quote_at = strings.body - 3 if triple else scanner.quote_at
        open_end = strings.body if triple else quote_at + 1
        boundaries = scanner.boundaries
        head, start = self._region()
        if (
            not scanner.stack
            or scanner.stack[-1] not in _QUOTES
            or quote_at < start
            or not self._streamed
            or len(self._streamed) != self._index + 1
            or not self._streamed[self._index]
            or ")]" not in added  # the call is still open
            or (not self._no_commit and self._committed < min(len(boundaries), self._index))
            or _SENTINEL in text
            or "e000" in text.lower()  # an escape of the sentinel
        ):
            return None
        quote = text[quote_at]
        kind = _plain_prefix(text, quote_at)
        if kind is None or (triple and kind == "f"):  # b, rb...: the text means something else
            return None
        stop = strings.closing_at(text, scanner.stack[-1]) if triple else -1
        if triple and stop < 0:
            return None
        probe = "\\\\x41" if kind == "r" else "A"  # the JSON of what the probe's "\x41" reads as
        try:
            # The probe after the quote reads "A" (raw: "\x41") only in a literal of that kind opened
            # by that very quote: inside another literal (the quote-by-quote scan can misplace
            # strings after a triple quote) the two quotes are text or the kind differs.
            closing = quote * 3 if triple else quote
            source = "[" + head + text[start:open_end] + "\\x41" + closing + quote + _SENTINEL + added
            self.scanned += len(source)
            elements = _call_list(_parse(source))
            head = head if len(elements) == 1 else ""
            located = self._call(elements[-1], head)[2]
            if located.count(_SENTINEL) != 1:
                return None
            withheld = (added[:-2] + ("}" if added[-2] == ")" else "")).replace("'", '"')
            before, after = located.split(_SENTINEL)
            if not before.endswith(probe) or not after.endswith(withheld) or len(after) > _MAX_SUFFIX:
                return None
            before = before[: -len(probe)]
            # ...and the JSON string opens right before it: a quote the scan misplaced inside an
            # f-string after a triple quote (f"a\"{) reads "A" too, after the text before it.
            if not before.endswith('"') or (len(before) - 1 - len(before[:-1].rstrip("\\"))) % 2:
                return None
            base = self._base() if head else AppendOnlyText()
            fast: _Fast
            if triple:
                # Its base is a copy: garbage brackets in the string can close a level (and cut
                # ``_elem_json``) before ``_step_triple`` sees that the stack changed.
                copy = AppendOnlyText()
                copy.add(base.between(0, base.length))
                fast = _Triple(text, open_end, len(text.rstrip()), copy, kind, scanner.opened[:-1])
                tail_now = fast.tail_to(text, stop)
            else:
                fast = _Fast(text, quote_at, len(text.rstrip()), base, kind)
                tail_now = fast.tail(text)
            # The parse this record made must be what the model says it is.
            if not fast.valid or tail_now is None or args != before + fast.stable + tail_now + after:
                return None
            fast.prefix = self._join(before + "}")[:-1] if head else before
            fast.suffix = after[: len(after) - len(withheld)]
        except Exception:
            return None
        return fast

    def _step_fast(self, fast: _Fast, delta: str) -> DeltaOut | None:
        """``step`` for a record that extends the string literal the call in progress ends in."""
        kept = delta.rstrip()
        fast.extend(self._text, len(self._text) - len(delta) + len(kept) if kept else fast.end)
        tail = fast.tail(self._text) if fast.valid else None
        return self._send(fast, tail)

    def _step_triple(self, triple: _Triple, delta: str, cut: bool) -> tuple[bool, DeltaOut | None]:
        """(handled, delta) of a record while the call in progress ends in the triple-quoted
        literal ``triple`` reads: only a record whose completion closes it reads, and then as vLLM's
        parse would, while the scanner's stack under the quote is the one anchored (brackets the
        quote-by-quote scan finds in the string change the completion: the parse decides)."""
        strings, scanner = self._strings, self._scanner
        if cut or not strings.in_triple or strings.body != triple.body:
            self._triple = None  # the literal closed (or the end marker came): read as usual
            return False, None
        kept = delta.rstrip()
        triple.extend(self._text, len(self._text) - len(delta) + len(kept) if kept else triple.end)
        stop = strings.closing_at(self._text, scanner.stack[-1] if scanner.stack else None)
        if stop == -1:
            return True, None  # the parse fails: nothing changes
        if stop < 0 or scanner.broken or scanner.opened[:-1] != triple.opened:
            return False, None
        return True, self._send(triple, triple.tail_to(self._text, stop) if triple.valid else None)

    def _send(self, fast: _Fast, tail: str | None) -> DeltaOut | None:
        """The record's delta when the call in progress's arguments JSON is ``fast`` with ``tail``."""
        if tail is None:
            return None  # the parse fails: nothing changes
        index = self._index
        sent = len(self._streamed[index])
        if fast.length(tail) <= sent:
            return None
        diff = fast.slice(tail, sent)
        self._streamed[index] += diff
        self._any_delta = True
        return DeltaOut(tool_calls=[args_delta(index, diff)])

    # -- deltas and finished calls ---------------------------------------------

    def _diff(self, calls: list[tuple[str, _Args, str]], added: str) -> list[ToolCallDeltaOut]:
        deltas: list[ToolCallDeltaOut] = []
        offset = self._committed
        total = offset + len(calls)
        for local, (name, args, _) in enumerate(calls):
            index = offset + local
            if index < self._index:
                continue
            self._index = index
            if len(self._streamed) == index:
                self._streamed.append("")
            complete = index < total - 1 or ")]" not in added
            if complete:
                self._index += 1
            if not complete:
                # still open: hold back what the completion invented
                withheld = added[:-2] + ("}" if added[-2] == ")" else "")
                withheld = withheld.replace("'", '"')
                if not args.endswith(withheld):
                    raise _NotACall("completion suffix not found in arguments")
                if withheld:
                    args.cut(len(withheld))
            sent = self._streamed[index]
            if not sent:
                whole = args.text_from(0)
                deltas.append(name_delta(index, name, whole))
                self._streamed[index] += whole
            elif args.length > len(sent):
                diff = args.text_from(len(sent))
                deltas.append(args_delta(index, diff))
                self._streamed[index] += diff
        return deltas

    def _commit(self, text: str) -> None:
        """Drop calls that are finished, streamed and followed by a top-level comma."""
        boundaries = self._scanner.boundaries
        while not self._no_commit and self._committed < min(len(boundaries), self._index):
            end = boundaries[self._committed]
            if end > len(text):
                return
            head, start = self._region()
            if not self._splittable(text[start : end - 1], end - 1):
                self._no_commit = True
                return
            try:
                module = _parse("[" + head + text[start : end - 1] + "]")
                elements = _call_list(module)
            except Exception:
                elements = []
            if len(elements) != 1:
                # Not one plain call between top-level commas (e.g. a lambda):
                # parse from here on in full, as vLLM does.
                self._no_commit = True
                return
            try:
                self._call(elements[0], head)
            except _Redo:
                self._revert()
                continue
            except Exception:
                self._dead = True
                return
            has_set = self._arg_has_set or _contains_set(module)
            self._committed_has_set = self._committed_has_set or has_set
            self._committed += 1
            self._committed_at = end
            self._strings.restart(end)
            self._reset_args()

    def remaining_args(self) -> str:
        """vLLM's end-of-stream fill-up: judged against a placeholder ``{}`` of call 0."""
        if not self._any_delta:
            return ""
        sent = self._streamed[0] if self._streamed else ""
        return "{}"[len(sent) :] if "{}".startswith(sent) else ""
