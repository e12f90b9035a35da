"""Typed values of tool-call parameters written as text (Qwen3.5 ``<parameter=...>`` blocks).

The model writes every parameter as text: mappings and lists as JSON, scalars as plain text. The
tool's JSON schema, when the request gave one, says which type to read back; without it a value
becomes JSON only when it parses as a mapping, list, number or boolean.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["convert_parameter", "parameter_schemas"]

_INT = re.compile(r"-?\d+")


def parameter_schemas(tools: list[dict[str, Any]] | None, name: str) -> dict[str, Any] | None:
    """The ``properties`` mapping of the tool called ``name``, or None when unknown."""
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            params = function.get("parameters")
            if isinstance(params, dict) and isinstance(params.get("properties"), dict):
                return params["properties"]
            return None
    return None


def _schema_types(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    types = [kind] if isinstance(kind, str) else [t for t in kind or () if isinstance(t, str)]
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            types.extend(_schema_types(sub))
    return types


def _untyped(value: str) -> Any:
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return value
    if isinstance(parsed, dict | list | bool | int | float):
        return parsed
    return value


def _as_type(value: str, kind: str) -> tuple[bool, Any]:
    if kind == "string":
        return True, value
    if kind == "integer":
        return (True, int(value)) if _INT.fullmatch(value.strip()) else (False, None)
    if kind == "boolean":
        lowered = value.strip().lower()
        return (True, lowered == "true") if lowered in ("true", "false") else (False, None)
    if kind == "null":
        return (True, None) if value.strip() == "null" else (False, None)
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return False, None
    wanted: dict[str, type | tuple[type, ...]] = {
        "number": (int, float),
        "object": dict,
        "array": list,
    }
    expected = wanted.get(kind)
    if expected is None or isinstance(parsed, bool) or not isinstance(parsed, expected):
        return False, None
    return True, parsed


def convert_parameter(value: str, schema: Any) -> Any:
    """Read one parameter value; text that fits no declared type stays a string."""
    types = _schema_types(schema)
    if not types:
        return _untyped(value)
    # A string always fits, so it is tried last whatever order the schema lists the types in.
    for kind in sorted(types, key=lambda kind: kind == "string"):
        ok, parsed = _as_type(value, kind)
        if ok:
            return parsed
    return value
