"""A JSON Schema transformation shared by the provider-file and wire formats. Pure."""

from __future__ import annotations

from typing import Any


def opened(schema: Any) -> Any:
    """``schema`` without ``additionalProperties: false``, at every depth:
    the same rules, but keys it does not name are let through (a newer
    minor version's, or a later provider-file version's)."""
    if isinstance(schema, dict):
        return {
            k: opened(v)
            for k, v in schema.items()
            if not (k == "additionalProperties" and v is False)
        }
    if isinstance(schema, list):
        return [opened(v) for v in schema]
    return schema
