"""Tool-schema helpers for the engine's tool adapter (vLLM's ``tool_parsers.utils`` behaviour).

Request tools arrive as
chat-completions dicts (``{"type": "function", "function": {"name",
"parameters"}}``). Argument values parsed from XML-ish markup are strings; the
schema decides whether vLLM turns them into numbers, booleans, null, objects
or arrays.
"""

from __future__ import annotations

import json
import math
from typing import Any

_TYPE_ALIASES: dict[str, str] = {
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "enum": "string",
    "int": "integer",
    "int32": "integer",
    "int64": "integer",
    "uint": "integer",
    "uint32": "integer",
    "uint64": "integer",
    "long": "integer",
    "short": "integer",
    "unsigned": "integer",
    "float": "number",
    "float32": "number",
    "float64": "number",
    "double": "number",
    "bool": "boolean",
    "dict": "object",
    "arr": "array",
    "list": "array",
    "sequence": "array",
}

_PRIORITY = ("null", "integer", "number", "boolean", "object", "array", "string")


def _function_of(tool: Any) -> dict[str, Any] | None:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        return None
    function = tool.get("function")
    return function if isinstance(function, dict) else None


def find_tool_properties(tools: list[dict[str, Any]] | None, name: str) -> dict[str, Any]:
    """The ``properties`` of the named tool's parameters, or ``{}``."""
    for tool in tools or ():
        function = _function_of(tool)
        if function is not None and function.get("name") == name:
            params = function.get("parameters") or {}
            props = params.get("properties", {}) if isinstance(params, dict) else {}
            # A non-object ``properties`` would crash vLLM; treat it as no schema.
            return props if isinstance(props, dict) else {}
    return {}


def has_tool(tools: list[dict[str, Any]] | None, name: str) -> bool:
    return any((f := _function_of(t)) is not None and f.get("name") == name for t in tools or ())


def schema_types(schema: Any) -> list[str]:
    """Every type a JSON schema admits (``type``, ``enum`` values, ``anyOf``/``oneOf``/``allOf``)."""
    if not isinstance(schema, dict):
        return ["string"]
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(t for t in declared if isinstance(t, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        for value in enum:
            types.add(_json_type_of(value))
    for key in ("anyOf", "oneOf", "allOf"):
        choices = schema.get(key)
        if isinstance(choices, list):
            for choice in choices:
                types.update(schema_types(choice))
    return list(types) if types else ["string"]


def _json_type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "string"


def _finite(obj: Any) -> bool:
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_finite(v) for v in obj)
    return True


def coerce(value: str, types: list[str]) -> Any:
    """Best-effort conversion of a raw string; returns ``value`` itself when nothing applies."""
    wanted = {_TYPE_ALIASES.get(k, k) for t in types for k in [t.strip().lower()]}
    for kind in _PRIORITY:
        if kind not in wanted:
            continue
        if kind == "null":
            if value.lower() == "null":
                return None
        elif kind == "string":
            return value
        elif kind == "integer":
            try:
                return int(value)
            except ValueError:
                pass
        elif kind == "number":
            try:
                return int(value)
            except ValueError:
                pass
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                return number if number != int(number) else int(number)
        elif kind == "boolean":
            lowered = value.lower().strip()
            if lowered in ("true", "1"):
                return True
            if lowered in ("false", "0"):
                return False
        else:  # object / array
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if _finite(parsed):
                return parsed
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _finite(parsed) else value


def _coerce_value(value: Any, schema: dict[str, Any]) -> tuple[Any, bool]:
    if isinstance(value, str):
        converted = coerce(value, schema_types(schema))
        return converted, converted is not value
    if isinstance(value, dict):
        nested = schema.get("properties")
        return value, isinstance(nested, dict) and coerce_dict(value, nested)
    if isinstance(value, list):
        items = schema.get("items")
        changed = False
        if isinstance(items, dict):
            for i, item in enumerate(value):
                converted, item_changed = _coerce_value(item, items)
                if item_changed:
                    value[i] = converted
                    changed = True
        return value, changed
    converted = coerce(json.dumps(value, ensure_ascii=False), schema_types(schema))
    if type(converted) is not type(value) or converted != value:
        return converted, True
    return value, False


def coerce_dict(args: dict[str, Any], properties: dict[str, Any]) -> bool:
    """Coerce ``args`` in place by ``properties``; True when anything changed."""
    changed = False
    for key, value in args.items():
        schema = properties.get(key)
        if not isinstance(schema, dict):
            continue
        converted, value_changed = _coerce_value(value, schema)
        if value_changed:
            args[key] = converted
            changed = True
    return changed


def fix_arg_types(args_json: str, tools: list[dict[str, Any]] | None, name: str) -> str:
    """Re-serialize arguments with schema types applied (unchanged text when nothing changes)."""
    if not tools or not name:
        return args_json
    try:
        args = json.loads(args_json)
    except ValueError:
        return args_json
    if not isinstance(args, dict):
        return args_json
    properties = find_tool_properties(tools, name)
    if not properties:
        return args_json
    if coerce_dict(args, properties):
        return json.dumps(args, ensure_ascii=False)
    return args_json


def streamable_string_keys(properties: dict[str, Any]) -> set[str] | None:
    """Keys whose open string value may stream early; None without a schema (all may)."""
    if not properties:
        return None
    return {key for key, schema in properties.items() if set(schema_types(schema)) == {"string"}}
