"""Tool call id formats."""

from __future__ import annotations

import re
import uuid

_MASK_64 = (1 << 64) - 1
RANDOM_TOOL_CALL_ID = re.compile(r"chatcmpl-tool-[0-9a-f]{16}")
"""What ``random_tool_call_id`` makes (``fullmatch``): the audit renames these, as random."""


def random_tool_call_id() -> str:
    """vLLM's default id: ``chatcmpl-tool-`` and 16 hex digits of a random uuid."""
    return f"chatcmpl-tool-{uuid.uuid4().int & _MASK_64:016x}"


def kimi_tool_call_id(function_name: str, index: int) -> str:
    """Kimi-family ids number calls across the conversation: ``functions.NAME:IDX``."""
    return f"functions.{function_name}:{index}"
