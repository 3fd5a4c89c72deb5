"""What a record's errors say: the 400 message and ``param`` of a body that does not validate
(vLLM's wording), the error output envelope, the dead-letter reason of a record that is not an
envelope, all cut to a bounded length."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from schemas.bounds import MAX_JSON_DEPTH
from schemas.openai import RequestRuleError
from worker.errors import RequestError

JsonDict = dict[str, Any]

MAX_MESSAGE_CHARS = 4096  # error messages and dead-letter reasons are cut here


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


_LISTED_ERRORS = 20

# Names pydantic-core puts into an error's loc for a union member or a wrapping validator
# (``str``, ``list[int]``, ``function-after[...]``), not for a field. vLLM's handler leaves them
# out of both the listed loc and ``param``: ``body.stop``, not ``body.stop.list[str]``.
_SCHEMA_KINDS = frozenset(
    [
        "function-wrap",
        "function-after",
        "function-before",
        "function-plain",
        "json-or-python",
        "lax-or-strict",
        "chain",
        "default",
        "nullable",
        "tagged-union",
        "union",
        "call",
        "arguments",
        "is-instance",
        "is-subclass",
        "callable",
        "str",
        "int",
        "float",
        "bool",
        "bytes",
        "bytearray",
        "list",
        "tuple",
        "dict",
        "set",
        "frozenset",
        "complex",
        "none",
        "nonetype",
    ]
)
_BRACKETED = re.compile(r"[\[\]{}()]")


def _where(at: tuple[str, ...], loc: tuple[int | str, ...]) -> str:
    """An error's place in the body, as a dotted path without pydantic's schema kinds."""
    parts = [str(part) for part in loc]
    kept = [p for p in parts if not _BRACKETED.search(p) and p.lower() not in _SCHEMA_KINDS]
    return clip(".".join(("body", *at, *kept)), 256)


def validation_message(exc: ValidationError, at: tuple[str, ...] = ()) -> tuple[str, str | None]:
    """The message and ``param`` of a 400 for ``exc``; ``at`` is where the validated part sits in
    the body. As vLLM's handler does, ``param`` is the parameter of the first broken request rule
    that names one, else where the first error is."""
    errors = exc.errors(include_url=False, include_input=False)
    lines = [f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}:"]
    for err in errors[:_LISTED_ERRORS]:
        lines.append(
            f"  {{'type': {err['type']!r}, 'loc': {_where(at, err['loc'])!r}, 'msg': {err['msg']!r}}}"
        )
    if len(errors) > _LISTED_ERRORS:
        lines.append(f"  ... and {len(errors) - _LISTED_ERRORS} more")
    param = None
    for err in errors:
        rule = err.get("ctx", {}).get("error")
        if isinstance(rule, RequestRuleError):
            param = rule.parameter
            break
    if param is None and errors:
        param = _where(at, errors[0]["loc"])
    return "\n".join(lines), param


def error_envelope(request_id: str, seq: int, endpoint: str, error: RequestError) -> JsonDict:
    return {
        "request_id": request_id,
        "seq": seq,
        "endpoint": endpoint,
        "error": {
            "message": clip(error.message),
            "type": error.error_type,
            "param": error.param,
            "code": error.code,
        },
    }


def envelope_errors(exc: ValidationError) -> str:
    """Why a record is not a valid envelope (its dead-letter reason)."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    details = "; ".join(
        f"{clip('.'.join(str(p) for p in e['loc']), 256) or '<root>'}: {e['msg']}"
        for e in errors[:_LISTED_ERRORS]
    )
    more = f"; ... and {len(errors) - _LISTED_ERRORS} more" if len(errors) > _LISTED_ERRORS else ""
    return f"not a valid envelope: {details}{more}"


def too_deep_error() -> RequestError:
    return RequestError(
        f"the record nests arrays and objects deeper than {MAX_JSON_DEPTH} levels", param="body"
    )
