"""Small text helpers shared by parsers."""

from __future__ import annotations

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
