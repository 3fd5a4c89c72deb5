"""Small text helpers shared by parsers."""

from __future__ import annotations


def partial_tag_overlap(text: str, tag: str) -> int:
    """Length of the longest proper prefix of ``tag`` that ends ``text``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
