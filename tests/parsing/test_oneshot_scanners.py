"""The one-shot scanners that replaced vLLM's call and argument regexes.

vLLM matches the whole output against ``deepseek_v31``'s call pattern,
``glm45``'s argument patterns and pre-v11 ``mistral``'s array fallback; on
output whose markup never closes Python's ``re`` takes cubic or quadratic time
on them. The scanners must give exactly what the regexes give (checked here
against the compiled patterns over text built from the markers, pieces of them,
blanks and plain text, and the hostile shapes), while examining each character
of the text a bounded number of times (counted, not timed: every ``find`` and
``rfind`` the scanners make on a counting string adds the characters it passed).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, SupportsIndex

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from worker.core.parsing.families import glm45, mistral
from worker.core.parsing.tools import deepseek_v31
from worker.core.parsing.tools.deepseek_v31 import CALL_BEGIN, CALL_END, CALLS_BEGIN, SEP

#: Blanks of every kind the patterns tell apart: ASCII, Unicode, and U+001C..U+001F,
#: which ``str.isspace`` (and ``re``'s ``\s``) count but GLM's blank class does not.
BLANKS = [" ", "\n", "\r\n", "\t", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u2028", "\u3000"]
PLAIN = st.text(alphabet="ab{}[]<>/\"'_|:,", max_size=3)


def _pieces(markers: list[str]) -> list[str]:
    """The markers, and their first and last characters (a marker's cut-off ends)."""
    cut = [m[:n] for m in markers for n in (1, len(m) // 2, len(m) - 1)]
    cut += [m[-n:] for m in markers for n in (1, len(m) // 2)]
    return markers + cut


def _texts(markers: list[str], *whole: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Markers, their pieces, blanks and plain text in any order, with ``whole`` (well-formed
    markup, so that matches are common) as likely as each of those."""
    piece = st.one_of(
        st.sampled_from(markers), st.sampled_from(_pieces(markers)), st.sampled_from(BLANKS), PLAIN, *whole
    )
    return st.lists(piece, max_size=24).map("".join)


#: short text that may hold a newline or another blank
SHORT = st.lists(st.sampled_from(BLANKS) | PLAIN, max_size=3).map("".join)


class CountingStr(str):
    """A string that counts the characters its ``find`` and ``rfind`` calls pass over."""

    examined = 0

    def find(self, sub: str, start: SupportsIndex | None = None, end: SupportsIndex | None = None, /) -> int:
        found = super().find(sub, start, end)
        begin = 0 if start is None else max(0, int(start))
        self.examined += max(0, (found if found >= 0 else len(self)) - begin)
        return found

    def rfind(self, sub: str, start: SupportsIndex | None = None, end: SupportsIndex | None = None, /) -> int:
        found = super().rfind(sub, start, end)
        begin = 0 if start is None else max(0, int(start))
        self.examined += max(0, len(self) - (found if found >= 0 else begin))
        return found


# -- deepseek_v31: <｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>([\s\S]*?)<｜tool▁call▁end｜> ------------

DS_MARKERS = [CALL_BEGIN, SEP, CALL_END, CALLS_BEGIN, "\n"]
DS_CALL = st.builds(lambda name, args: f"{CALL_BEGIN}{name}{SEP}{args}{CALL_END}", SHORT, SHORT)
DS_OPEN_CALL = st.builds(lambda name, args: f"{CALL_BEGIN}{name}{SEP}{args}", SHORT, SHORT)
DS_TEXTS = _texts(DS_MARKERS, DS_CALL, DS_OPEN_CALL)
#: Calls that never end, names broken by newlines, a later begin marker before the end.
DS_HOSTILE = [
    CALLS_BEGIN + f"{CALL_BEGIN}f{SEP}{{" * 60,
    CALLS_BEGIN + f"{CALL_BEGIN}f{SEP}{{" * 60 + CALL_END,
    CALLS_BEGIN + f"{CALL_BEGIN}f\n{SEP}{{" * 60 + CALL_END,
    CALLS_BEGIN + f"{CALL_BEGIN}f" * 60 + f"\n{SEP}x{CALL_END}",
    CALLS_BEGIN + f"{CALL_BEGIN}\n" * 30 + f"{CALL_BEGIN}f{SEP}a{CALL_END}" * 30,
    CALLS_BEGIN + f"{CALL_BEGIN}a{CALL_BEGIN}b{SEP}x{SEP}y{CALL_END}{CALL_END}" * 20,
]


@given(DS_TEXTS)
@settings(max_examples=1500, deadline=None)
@example(f"{CALL_BEGIN}a\n{CALL_BEGIN}b{SEP}c{CALL_END}")
@example(f"{CALL_BEGIN}a{SEP}b\n{CALL_END}{CALL_BEGIN}{SEP}{CALL_END}")
def test_deepseek_calls_are_the_regex_matches(text: str) -> None:
    assert deepseek_v31.find_calls(text) == deepseek_v31.CALL_RE.findall(text)


@pytest.mark.parametrize("text", DS_HOSTILE)
def test_deepseek_hostile_calls_are_the_regex_matches(text: str) -> None:
    assert deepseek_v31.find_calls(text) == deepseek_v31.CALL_RE.findall(text)


# -- glm45: <arg_key>(.*?)</arg_key>WS*<arg_value>(.*?)</arg_value>, and the open value ----------

GLM_MARKERS = ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<tool_call>", "</tool_call>"]
BLANK_RUN = st.lists(st.sampled_from(BLANKS), max_size=3).map("".join)
GLM_ARG = st.builds(
    lambda key, blanks, value: f"<arg_key>{key}</arg_key>{blanks}<arg_value>{value}</arg_value>",
    SHORT,
    BLANK_RUN,
    SHORT,
)
GLM_OPEN_ARG = st.builds(
    lambda key, blanks, value: f"<arg_key>{key}</arg_key>{blanks}<arg_value>{value}", SHORT, BLANK_RUN, SHORT
)
GLM_TEXTS = _texts(GLM_MARKERS, GLM_ARG, GLM_ARG, GLM_OPEN_ARG)
GLM_HOSTILE = [
    "<tool_call>write_file\n" + "<arg_key>k</arg_key><arg_value>v" * 60,
    "<tool_call>write_file\n" + "<arg_key>k</arg_key><arg_value>v" * 60 + "</arg_value>",
    "<tool_call>write_file\n" + "<arg_key>k" * 60 + "</arg_key> \u3000<arg_value>v",
    "<arg_key>k</arg_key>\x1c<arg_value>v</arg_value>" * 40 + "<arg_key>k</arg_key>\n<arg_value>open\n",
    "<arg_key>k" + "</arg_key> \n x" * 60 + "</arg_key>\x0b<arg_value>v</arg_value>",
    "<arg_key>a</arg_key><arg_value>b</arg_value>" * 40 + "<arg_key>c</arg_key>" * 40,
]


def _arg_matches(text: str) -> list[tuple[str, str, int, int]]:
    return [(m.group(1), m.group(2), m.start(), m.end()) for m in glm45.ARG_RE.finditer(text)]


def _open_arg(text: str) -> tuple[str, str] | None:
    match = glm45.OPEN_ARG_RE.search(text)
    return (match.group(1), match.group(2)) if match else None


def _regex_parse_args(raw: str, partial: bool) -> tuple[dict[str, Any], str | None]:
    """vLLM's argument parse, with its regexes (what ``glm45._parse_args`` was)."""
    params: dict[str, Any] = {}
    for match in glm45.ARG_RE.finditer(raw):
        params[match.group(1).strip()] = match.group(2)
    open_key = None
    if partial:
        open_match = glm45.OPEN_ARG_RE.search(glm45.ARG_RE.sub("", raw))
        if open_match:
            key = open_match.group(1).strip()
            if key:
                params[key] = open_match.group(2)
                open_key = key
    return params, open_key


def _same_glm(text: str) -> None:
    assert glm45.find_args(text) == _arg_matches(text)
    assert glm45.find_open_arg(text) == _open_arg(text)
    for partial in (False, True):
        ours = glm45._parse_args(text, partial)
        theirs = _regex_parse_args(text, partial)
        assert ours == theirs
        assert list(ours[0]) == list(theirs[0])  # the key order shows in the JSON


@given(GLM_TEXTS)
@settings(max_examples=1500, deadline=None)
@example("<arg_key>a</arg_key>\n\x1c<arg_value>b</arg_value>")
@example("<arg_key>a</arg_key></arg_key> <arg_value>b</arg_value>\n")
@example("<arg_key> k </arg_key><arg_value>open\n")
def test_glm_arguments_are_the_regex_matches(text: str) -> None:
    _same_glm(text)


@pytest.mark.parametrize("text", GLM_HOSTILE)
def test_glm_hostile_arguments_are_the_regex_matches(text: str) -> None:
    _same_glm(text)


def test_glm_blanks_are_the_pattern_class() -> None:
    """Between ``</arg_key>`` and ``<arg_value>`` exactly the pattern's blanks are skipped."""
    for code in range(0x3001):
        ch = chr(code)
        text = f"<arg_key>k</arg_key>{ch}<arg_value>v</arg_value>"
        assert glm45.find_args(text) == _arg_matches(text), hex(code)


# -- mistral (pre-v11): \[{.*}\] ------------------------------------------------------------------

MISTRAL_MARKERS = ["[{", "}]", "[", "{", "}", "]", "[TOOL_CALLS]"]
MISTRAL_TEXTS = _texts(MISTRAL_MARKERS, SHORT.map(lambda body: "[{" + body + "}]"))
MISTRAL_HOSTILE = ["[TOOL_CALLS] x" + "[{ " * 200, "x" + "[{ " * 200 + "}]" + " }]" * 5 + "[{"]


@given(MISTRAL_TEXTS)
@settings(max_examples=1500, deadline=None)
@example("[{}]")
@example("[{]")
@example("[{a}][{b}]\n}]")
def test_mistral_array_is_the_regex_match(text: str) -> None:
    assert mistral.find_array(text) == mistral.ARRAY_RE.findall(text)


@pytest.mark.parametrize("text", MISTRAL_HOSTILE)
def test_mistral_hostile_array_is_the_regex_match(text: str) -> None:
    assert mistral.find_array(text) == mistral.ARRAY_RE.findall(text)


def test_mistral_pattern_braces_are_literal() -> None:
    """``{`` without a count is a literal brace in ``re``: the fallback needs ``[{`` and ``}]``."""
    assert mistral.ARRAY_RE.pattern == r"\[{.*}\]"
    assert re.fullmatch(mistral.ARRAY_RE, "[{}]") and not re.search(mistral.ARRAY_RE, "[]")


# -- linear work -----------------------------------------------------------------------------------

#: (scanner, hostile text of n units, how many searches may cover the text)
HOSTILE_SHAPES: list[tuple[Callable[[str], object], Callable[[int], str], int]] = [
    (deepseek_v31.find_calls, lambda n: CALLS_BEGIN + f"{CALL_BEGIN}f{SEP}{{" * n, 4),
    # each begin marker fails on a newline before the one separator far away
    (deepseek_v31.find_calls, lambda n: f"{CALL_BEGIN}f" * n + f"\n{SEP}x{CALL_END}", 4),
    (deepseek_v31.find_calls, lambda n: f"{CALL_BEGIN}f\n" * n + f"{SEP}x{CALL_END}", 4),
    # many calls, the one newline at the very end
    (deepseek_v31.find_calls, lambda n: f"{CALL_BEGIN}f{SEP}x{CALL_END}" * n + "\n", 4),
    (deepseek_v31.find_calls, lambda n: f"{CALL_BEGIN}f\n{SEP}{{" * n + CALL_END, 4),
    (glm45.find_args, lambda n: "<tool_call>write_file\n" + "<arg_key>k</arg_key><arg_value>v" * n, 3),
    (glm45.find_args, lambda n: "<arg_key>k" + "</arg_key> x" * n, 3),
    (glm45.find_open_arg, lambda n: "<tool_call>write_file\n" + "<arg_key>k" * n, 2),
    (mistral.find_array, lambda n: "[TOOL_CALLS] x" + "[{ " * n, 2),
]


@pytest.mark.parametrize(("scan", "shape", "searches"), HOSTILE_SHAPES)
def test_hostile_output_is_examined_a_bounded_number_of_times(
    scan: Callable[[str], object], shape: Callable[[int], str], searches: int
) -> None:
    """Each marker's search resumes where the last one stopped: at most ``searches`` passes over
    the text whatever its size (a scanner that searched afresh from every start marker would
    pass over it once per marker)."""
    for n in (250, 1000, 4000):
        text = CountingStr(shape(n))
        scan(text)
        assert 0 < text.examined <= searches * len(text), (n, text.examined, len(text))


@given(DS_TEXTS)
@settings(max_examples=300, deadline=None)
def test_deepseek_examines_each_character_once_per_marker(text: str) -> None:
    counted = CountingStr(text)
    assert deepseek_v31.find_calls(counted) == deepseek_v31.CALL_RE.findall(text)
    assert counted.examined <= 4 * len(text)


@given(GLM_TEXTS)
@settings(max_examples=300, deadline=None)
def test_glm_examines_each_character_once_per_marker(text: str) -> None:
    counted = CountingStr(text)
    glm45.find_args(counted)
    assert counted.examined <= 3 * len(text)
    counted = CountingStr(text)
    glm45.find_open_arg(counted)
    assert counted.examined <= 2 * len(text)
