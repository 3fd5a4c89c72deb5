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
from collections.abc import Callable
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


def _properties_of(function: dict[str, Any]) -> dict[str, Any]:
    params = function.get("parameters") or {}
    props = params.get("properties", {}) if isinstance(params, dict) else {}
    # A non-object ``properties`` would crash vLLM; treat it as no schema.
    return props if isinstance(props, dict) else {}


def find_tool_properties(tools: list[dict[str, Any]] | None, name: str) -> dict[str, Any]:
    """The ``properties`` of the named tool's parameters, or ``{}``."""
    for tool in tools or ():
        function = _function_of(tool)
        if function is not None and function.get("name") == name:
            return _properties_of(function)
    return {}


class ToolSchemas:
    """A request's ``tools``, indexed once: every lookup a call or an argument makes is a dict
    read, so a record's cost does not grow with the number or size of the tool schemas.

    The first tool of a name wins (as in :func:`find_tool_properties`); a schema's types are
    worked out the first time they are asked for and kept for the request.
    """

    __slots__ = ("_properties", "_string_keys", "_types")

    def __init__(self, tools: list[dict[str, Any]] | None) -> None:
        self._properties: dict[str, dict[str, Any]] = {}
        for tool in tools or ():
            function = _function_of(tool)
            name = function.get("name") if function is not None else None
            if function is not None and isinstance(name, str) and name not in self._properties:
                self._properties[name] = _properties_of(function)
        self._string_keys: dict[str, set[str] | None] = {}
        # id(schema) -> (schema, types); the schema is kept so its id cannot be reused.
        self._types: dict[int, tuple[dict[str, Any], list[str]]] = {}

    def has(self, name: str) -> bool:
        return name in self._properties

    def properties(self, name: str) -> dict[str, Any]:
        """The named tool's ``properties``, or ``{}``."""
        return self._properties.get(name, {})

    def types(self, schema: Any) -> list[str]:
        """:func:`schema_types` of one schema of these tools, worked out once."""
        if not isinstance(schema, dict):
            return ["string"]
        known = self._types.get(id(schema))
        if known is None:
            known = self._types[id(schema)] = (schema, schema_types(schema))
        return known[1]

    def string_keys(self, name: str) -> set[str] | None:
        """:func:`streamable_string_keys` of the named tool, worked out once."""
        if name not in self._string_keys:
            self._string_keys[name] = streamable_string_keys(self.properties(name), self.types)
        return self._string_keys[name]


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


TypesOf = Callable[[Any], list[str]]


def coerce_value(value: Any, schema: dict[str, Any], types: TypesOf) -> tuple[Any, bool]:
    if isinstance(value, str):
        converted = coerce(value, types(schema))
        return converted, converted is not value
    if isinstance(value, dict):
        nested = schema.get("properties")
        return value, isinstance(nested, dict) and coerce_dict(value, nested, types)
    if isinstance(value, list):
        items = schema.get("items")
        changed = False
        if isinstance(items, dict):
            for i, item in enumerate(value):
                converted, item_changed = coerce_value(item, items, types)
                if item_changed:
                    value[i] = converted
                    changed = True
        return value, changed
    converted = coerce(json.dumps(value, ensure_ascii=False), types(schema))
    if type(converted) is not type(value) or converted != value:
        return converted, True
    return value, False


def coerce_dict(args: dict[str, Any], properties: dict[str, Any], types: TypesOf = schema_types) -> bool:
    """Coerce ``args`` in place by ``properties``; True when anything changed."""
    changed = False
    for key, value in args.items():
        schema = properties.get(key)
        if not isinstance(schema, dict):
            continue
        converted, value_changed = coerce_value(value, schema, types)
        if value_changed:
            args[key] = converted
            changed = True
    return changed


def fix_arg_types(args_json: str, tools: list[dict[str, Any]] | ToolSchemas | None, name: str) -> str:
    """Re-serialize arguments with schema types applied (unchanged text when nothing changes)."""
    if not tools or not name:
        return args_json
    try:
        args = json.loads(args_json)
    except ValueError:
        return args_json
    if not isinstance(args, dict):
        return args_json
    if isinstance(tools, ToolSchemas):
        properties, types = tools.properties(name), tools.types
    else:
        properties, types = find_tool_properties(tools, name), schema_types
    if not properties:
        return args_json
    if coerce_dict(args, properties, types):
        return json.dumps(args, ensure_ascii=False)
    return args_json


def streamable_string_keys(properties: dict[str, Any], types: TypesOf = schema_types) -> set[str] | None:
    """Keys whose open string value may stream early; None without a schema (all may)."""
    if not properties:
        return None
    return {key for key, schema in properties.items() if set(types(schema)) == {"string"}}
