"""Stop tokens and stop strings, as the engine's detokenizer applies them."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

StopReason = int | str | None


@dataclass(frozen=True, slots=True)
class StopPolicy:
    """The request fields that decide what ended generation."""

    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()
    include_stop_str_in_output: bool = False
    stop_strings: tuple[str, ...] = ()
    min_tokens: int = 0


def drop_stop_token(
    token_ids: Sequence[int],
    finish_reason: str | None,
    stop_reason: StopReason,
    policy: StopPolicy | None,
    *,
    eos_token_id: int | None,
    model_eos_ids: frozenset[int],
) -> tuple[Sequence[int], StopReason]:
    """Leave out the token that stopped generation; infer ``stop_reason`` when the host did not say.

    A reported int ``stop_reason`` names the token. With none reported, the last
    id is checked against the tokenizer's EOS (``stop_reason`` stays null), the
    request's ``stop_token_ids`` and the model's other EOS ids (``stop_reason``
    becomes that id). ``ignore_eos`` turns the EOS checks off and
    ``include_stop_str_in_output`` keeps the token in the text.
    """
    if finish_reason != "stop" or isinstance(stop_reason, str) or not token_ids:
        return token_ids, stop_reason
    last = token_ids[-1]
    if stop_reason is None:
        honor_eos = policy is None or not policy.ignore_eos
        if honor_eos and last == eos_token_id:
            stopped = True
        elif (policy is not None and last in policy.stop_token_ids) or (honor_eos and last in model_eos_ids):
            stopped = True
            stop_reason = last
        else:
            stopped = False
    else:
        stopped = last == stop_reason
    if not stopped or (policy is not None and policy.include_stop_str_in_output):
        return token_ids, stop_reason
    return token_ids[:-1], stop_reason


def find_stop_string(
    text: str, new_char_count: int, stop: Sequence[str], include_in_output: bool
) -> tuple[str, int] | None:
    """The stop string that completes earliest in the last ``new_char_count`` characters.

    Returns ``(stop_string, cut)`` where ``cut`` is the length to keep, or -1 to
    keep everything. Ties go to the earlier entry of ``stop``.
    """
    if not new_char_count or not stop:
        return None
    best: str | None = None
    best_index = 0
    best_end = sys.maxsize
    for candidate in stop:
        index = text.find(candidate, 1 - new_char_count - len(candidate))
        if index == -1:
            continue
        end = index + len(candidate)
        if end < best_end:
            best, best_index, best_end = candidate, index, end
    if best is None:
        return None
    if include_in_output:
        return (best, -1) if best_end >= len(text) else (best, best_end)
    return best, best_index
