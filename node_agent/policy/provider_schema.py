"""The JSON Schema of provider files (``provider-config-1.0.json``) and the
messages its refusals give an operator.

The schema holds the format: which keys, their types and ranges, the
``CUSTOM_`` name patterns, Placement's length and integer limits. A 1.0
document is checked as it is; a later 1.x minor with every
``additionalProperties: false`` removed, so keys added by a version this
agent does not know are ignored (nova documents that a 1.x reader reads
every 1.y). What needs more than one value at a time (reserved above total,
a class listed twice, a provider named twice) is
:mod:`node_agent.policy.provider_config`'s.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from typing import Any, Sequence, Union

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from node_agent.model.json_schema import opened

SCHEMA_FILE = "provider-config-1.0.json"

# JSON Schema counts true as an integer and 1.0 as one too; Placement takes
# neither. YAML reads `.nan` and `.inf` as numbers; Placement takes neither.
_TYPES = Draft202012Validator.TYPE_CHECKER.redefine_many(
    {
        "integer": lambda _c, v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda _c, v: (
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        ),
    }
)
_Validator = jsonschema.validators.extend(Draft202012Validator, type_checker=_TYPES)

_TYPE_WORDS = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
}

DocPath = Sequence[Union[str, int]]


def load() -> dict:
    """The schema document shipped in the package."""
    return json.loads(
        resources.files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    )


@lru_cache(maxsize=None)
def validator(strict: bool) -> Any:
    """The compiled validator; ``strict`` refuses unknown keys (a 1.0 document)."""
    schema = load()
    _Validator.check_schema(schema)
    return _Validator(schema if strict else opened(schema))


def where(path: DocPath) -> str:
    """``providers[0].inventories.additional[1]`` from a path."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def _python_type(value: Any) -> str:
    return type(value).__name__


def _problem(error: ValidationError) -> tuple[DocPath, str]:
    """(path in the document, what is wrong) for one refusal."""
    path: list[Union[str, int]] = list(error.absolute_path)
    value = error.instance
    if "propertyNames" in error.schema_path:  # a key: name it in the path
        path.append(str(value))
    schema = error.schema if isinstance(error.schema, dict) else {}
    why = schema.get("x-why", {}).get(str(error.validator))
    if why:
        text = str(value)
        return path, why.format(
            value=value, limit=error.validator_value, length=len(text), short=text[:40]
        )
    if error.validator == "required":
        missing = next(k for k in error.validator_value if k not in value)
        return [*path, missing], "is required"
    if error.validator == "additionalProperties":
        allowed = list(schema.get("properties", {}))
        unknown = sorted(str(k) for k in value if k not in allowed)
        return path, (f"unknown key(s) {', '.join(unknown)} (allowed: {', '.join(allowed)})")
    if error.validator == "type":
        return path, (
            f"must be {_TYPE_WORDS.get(str(error.validator_value))}, not {_python_type(value)}"
        )
    return path, f"{value!r} breaks the schema's {error.validator} {error.validator_value!r}"


def problems(document: Any, strict: bool) -> list[tuple[DocPath, str]]:
    """Every way ``document`` breaks the schema."""
    return [_problem(e) for e in validator(strict).iter_errors(document)]
