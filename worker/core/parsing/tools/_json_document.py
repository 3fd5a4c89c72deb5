"""Whether a growing text is one JSON document as ``json.loads`` reads it, each character once.

hermes asks this of an open call's body at every record (vLLM parses the body whole each
time). :class:`JsonDocument` keeps the open containers and the token in progress and follows
CPython's C scanner: strict strings (no control characters, only JSON's escapes), ASCII
digits, ``NaN``/``Infinity``/``-Infinity``, JSON's four blanks between tokens, and an integer
of more digits than ``sys.get_int_max_str_digits()`` (its conversion raises). An error is
final: no text after it makes the document valid. Nesting is counted, not parsed: at
``deep_at`` levels json's answer may be a ``RecursionError``, which depends on the caller's
stack, so :attr:`deep` tells the caller to parse the text itself.
"""

from __future__ import annotations

import re
import sys

_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]+')
_DIGITS = re.compile(r"[0-9]+")
_BLANKS = re.compile(r"[ \t\n\r]+")
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrt')
#: A literal's first character -> the rest of it.
_WORDS = {"n": "ull", "t": "rue", "f": "alse", "N": "aN", "I": "nfinity"}

# Where the scan stands: between tokens (what may come next), or inside a token.
_VALUE = 0  # a value
_FIRST_ITEM = 1  # after "[": a value or "]"
_FIRST_KEY = 2  # after "{": a key or "}"
_KEY = 3  # after "," in an object
_COLON = 4
_AFTER = 5  # after a value in a container: "," or its closer
_DONE = 6  # after the top value: only the end
_STRING = 7
_ESCAPE = 8
_HEX_DIGITS = 9
_WORD = 10
_MINUS = 11
_ZERO = 12
_INT = 13
_DOT = 14
_FRACTION = 15
_E = 16
_E_SIGN = 17
_EXPONENT = 18
# Last, in this order: ``feed`` stops at the states from _BROKEN on and steps numbers from _MINUS on.
_BROKEN = 19
_DEEP = 20

#: Where JSON's blanks may stand.
_BETWEEN = frozenset((_VALUE, _FIRST_ITEM, _FIRST_KEY, _KEY, _COLON, _AFTER, _DONE))
#: Number states where the number may end (json's number grammar; anything else then is an error).
_NUMBER_ENDS = frozenset((_ZERO, _INT, _FRACTION, _EXPONENT))


class JsonDocument:
    """Feed a text's characters in order (:meth:`feed`); :attr:`complete` says whether what was
    fed is exactly one JSON document, :attr:`deep` that nesting reached ``deep_at``."""

    __slots__ = (
        "_digits",
        "_hex_due",
        "_key",
        "_max_digits",
        "_stack",
        "_state",
        "_word",
        "_word_at",
        "deep_at",
    )

    def __init__(self, deep_at: int) -> None:
        self.deep_at = deep_at
        self._stack: list[str] = []  # closers of the open containers
        self._state = _VALUE
        self._key = False  # the string in progress is an object key
        self._word = ""  # the rest of the literal in progress
        self._word_at = 0  # its next index
        self._hex_due = 0  # hex digits of a \u escape still due
        self._digits = 0  # the integer part's digits of the number in progress
        self._max_digits = sys.get_int_max_str_digits()  # 0: no limit

    @property
    def complete(self) -> bool:
        state = self._state
        return state == _DONE or (not self._stack and state in _NUMBER_ENDS and not self._too_long(state))

    def _too_long(self, state: int) -> bool:
        """An integer (no fraction, no exponent) longer than int() converts from text."""
        return state in (_ZERO, _INT) and 0 < self._max_digits < self._digits

    @property
    def broken(self) -> bool:
        return self._state == _BROKEN

    @property
    def deep(self) -> bool:
        return self._state == _DEEP

    def feed(self, text: str, pos: int, end: int) -> None:
        """Take ``text[pos:end]``."""
        state = self._state
        while pos < end and state < _BROKEN:
            char = text[pos]
            if state == _STRING:
                run = _STRING_RUN.match(text, pos, end)
                if run is not None:
                    pos = run.end()
                    continue
                pos += 1
                if char == '"':
                    state = _COLON if self._key else self._closed()
                else:
                    state = _ESCAPE if char == "\\" else _BROKEN  # else: a control character
            elif state == _ESCAPE:
                pos += 1
                if char == "u":
                    state, self._hex_due = _HEX_DIGITS, 4
                else:
                    state = _STRING if char in _ESCAPES else _BROKEN
            elif state == _HEX_DIGITS:
                pos += 1
                self._hex_due -= 1
                state = _BROKEN if char not in _HEX else _STRING if not self._hex_due else state
            elif state == _WORD:
                pos += 1
                if char != self._word[self._word_at]:
                    state = _BROKEN
                else:
                    self._word_at += 1
                    if self._word_at == len(self._word):
                        state = self._closed()
            elif state >= _MINUS:
                state, pos = self._number(state, text, pos, end)
            elif state in _BETWEEN and char in " \t\n\r":
                blanks = _BLANKS.match(text, pos, end)
                assert blanks is not None
                pos = blanks.end()
            else:
                pos += 1
                state = self._structural(state, char)
        self._state = state

    def _closed(self) -> int:
        return _AFTER if self._stack else _DONE

    def _structural(self, state: int, char: str) -> int:
        if state == _VALUE or (state == _FIRST_ITEM and char != "]"):
            return self._value(char)
        if state == _FIRST_ITEM or (state == _FIRST_KEY and char == "}"):
            self._stack.pop()
            return self._closed()
        if state in (_FIRST_KEY, _KEY):
            self._key = True
            return _STRING if char == '"' else _BROKEN
        if state == _COLON:
            return _VALUE if char == ":" else _BROKEN
        if state == _AFTER:
            closer = self._stack[-1]
            if char == ",":
                return _VALUE if closer == "]" else _KEY
            if char == closer:
                self._stack.pop()
                return self._closed()
        return _BROKEN  # after the top value, or a character no token starts with

    def _value(self, char: str) -> int:
        if char in "{[":
            if len(self._stack) + 1 >= self.deep_at:
                return _DEEP
            self._stack.append("}" if char == "{" else "]")
            return _FIRST_KEY if char == "{" else _FIRST_ITEM
        if char == '"':
            self._key = False
            return _STRING
        if char == "-":
            return _MINUS
        if "0" <= char <= "9":
            self._digits = 1
            return _ZERO if char == "0" else _INT
        word = _WORDS.get(char)
        if word is None:
            return _BROKEN
        self._word, self._word_at = word, 0
        return _WORD

    def _number(self, state: int, text: str, pos: int, end: int) -> tuple[int, int]:
        """One step of a number at ``text[pos]``; a character that cannot go on ends it unread."""
        char = text[pos]
        digit = "0" <= char <= "9"
        if state in (_INT, _FRACTION, _EXPONENT) and digit:
            run = _DIGITS.match(text, pos, end)
            assert run is not None
            if state == _INT:
                self._digits += run.end() - pos
            return state, run.end()
        if state == _MINUS:
            if char == "I":  # -Infinity
                self._word, self._word_at = _WORDS["I"], 0
                return _WORD, pos + 1
            self._digits = 1
            return (_ZERO if char == "0" else _INT if digit else _BROKEN), pos + 1
        if state in (_ZERO, _INT) and char == ".":
            return _DOT, pos + 1
        if state in (_ZERO, _INT, _FRACTION) and char in "eE":
            return _E, pos + 1
        if state in (_DOT, _E, _E_SIGN):
            if state == _E and char in "+-":
                return _E_SIGN, pos + 1
            return (_FRACTION if state == _DOT else _EXPONENT) if digit else _BROKEN, pos + 1
        if self._too_long(state):
            return _BROKEN, pos
        return self._closed(), pos  # the number ended before this character
