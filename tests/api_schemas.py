"""Events and objects checked against the published schemas: the SDKs' typed models, with nothing unknown.

The SDKs' models accept unknown fields (and their stream parsers skip validation); here every object must
validate, with its required fields present, and no field the model does not declare, at any depth.
"""

from __future__ import annotations

from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel, TypeAdapter


def unknown_fields(value: Any, path: str = "") -> list[str]:
    if isinstance(value, BaseModel):
        found = [f"{path}.{name}" for name in (value.model_extra or {})]
        for name in type(value).model_fields:
            found += unknown_fields(getattr(value, name), f"{path}.{name}")
        return found
    if isinstance(value, list):
        return [f for i, v in enumerate(value) for f in unknown_fields(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in unknown_fields(v, f"{path}.{k}")]
    return []


def parsed_exactly(schema: Any, data: Any) -> Any:
    """``data`` as ``schema`` (a model or a union); fails on a missing required or an unknown field."""
    parsed = TypeAdapter(schema).validate_python(data)
    extra = unknown_fields(parsed)
    assert not extra, f"fields the schema does not have: {extra} in {data}"
    return parsed


def models_by_type(union: Any) -> dict[str, type[BaseModel]]:
    """The members of an SDK's event union, by their ``type`` literal."""
    while get_origin(union) is Annotated:
        union = get_args(union)[0]
    found: dict[str, type[BaseModel]] = {}
    for member in get_args(union):
        for literal in get_args(member.model_fields["type"].annotation):
            found[literal] = member
    return found


def event_parsed_exactly(union: Any, event: dict[str, Any]) -> Any:
    """``event`` as the member of ``union`` its ``type`` names, exactly."""
    model = models_by_type(union).get(event["type"])
    assert model is not None, f"no event type {event['type']!r} in the schema"
    return parsed_exactly(model, event)
