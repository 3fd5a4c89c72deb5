"""Small text helpers shared by parsers."""

from __future__ import annotations

import re
from typing import Any


def partial_tag_overlap(text: str, tag: str) -> int:
    """Length of the longest proper prefix of ``tag`` that ends ``text``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def thinking_requested(chat_template_kwargs: dict[str, Any]) -> bool:
    """The ``thinking``/``enable_thinking`` switches of GLM and Kimi: on unless set, else either one."""
    thinking = chat_template_kwargs.get("thinking")
    enable = chat_template_kwargs.get("enable_thinking")
    if thinking is None and enable is None:
        return True
    return bool(thinking) or bool(enable)


class NameProbe:
    """``"name"\\s*:\\s*"..."`` searched in text arriving in pieces, each character a few times.

    A match still in progress holds at most three quotes (around ``name`` and the value's
    opening one), so after a failed search only the text from the third-last quote is kept;
    the search reruns only when a quote arrives, since a match ends with one.
    """

    def __init__(self, pattern: re.Pattern[str]) -> None:
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
