"""The published wire format: one JSON Schema file per major version.

``wire-<MAJOR>.<MINOR>.json`` describes every message of that minor: a
minor adds optional keys only, so a reader of 2.0 accepts a 2.1 message and
ignores the keys it does not know, while a message that says 2.0 (or any
minor this side knows) and carries a key its minor does not have is
refused: it is a bug of the sender. Each minor's file is kept, and a
message is checked against the file of the minor it names (2.1 added
``body.limits``, the host's facts the applier checks the capacity
invariant against; 2.2 the ``signature``, required from 2.2 on, see
:mod:`node_agent.remote.signing`; 2.3 ``body.limits.mem_encryption``, the
SEV guests the host's firmware has keys for; 2.4 each guest's
``memory_mb``, required from 2.4 on, ``body.without_numa`` and the root's
``aggregates``; 2.5 an inventory's ``guest_held``). Another major is refused before the schema is read (see
:func:`node_agent.remote.wire.parse_message`), with a reason that says
which side to upgrade.

The schema checks structure (types, required keys, ranges, name patterns).
What needs two fields at once (the root named as the host, parents listed
first, a CPU in one NUMA node only, GPU child names, the digest) stays in
:mod:`node_agent.remote.upstream`. Both the agent (before sending) and the
applier (on receipt) validate. Refusals name the first error's path and
the schema's ``x-why`` text, never the offending value.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any, Optional

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from node_agent.model.json_schema import opened

# major -> the schema files of that major this release ships, oldest first
FILES = {
    2: (
        "wire-2.0.json",
        "wire-2.1.json",
        "wire-2.2.json",
        "wire-2.3.json",
        "wire-2.4.json",
        "wire-2.5.json",
    )
}
# major -> the newest of them
SCHEMAS = {major: files[-1] for major, files in FILES.items()}

# JSON Schema counts 1.0 as an integer and Python counts True as one; the
# wire format wants neither (Placement takes integers).
_TYPES = Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
)
_Validator = jsonschema.validators.extend(Draft202012Validator, type_checker=_TYPES)


_TYPE_WORDS = {
    "array": "a list",
    "object": "an object",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
}


def _minor(name: str) -> int:
    return int(name.rsplit(".", 2)[1])


def file_of(major: int, minor: Optional[int] = None) -> str:
    """The file of ``major.minor``: the newest shipped minor not above
    ``minor`` (the newest of all when ``minor`` is None or newer)."""
    files = FILES[major]
    if minor is None:
        return files[-1]
    fitting = [f for f in files if _minor(f) <= minor]
    return fitting[-1] if fitting else files[0]


def load(major: int, minor: Optional[int] = None) -> dict:
    """The schema document of ``major.minor`` (a KeyError for a major not shipped)."""
    text = resources.files(__name__).joinpath(file_of(major, minor)).read_text(encoding="utf-8")
    return json.loads(text)


def minor_of(major: int) -> int:
    """The newest minor of ``major`` this release knows."""
    return _minor(SCHEMAS[major])


def _inline(schema: Any, defs: dict) -> Any:
    """``schema`` with each local ``{"$ref": "#/$defs/x"}`` replaced by
    ``x``: the file stays readable, and the validator does not resolve a
    reference per value (a third of its time on a 384-CPU host's message).
    The wire schema has no recursive definition."""
    if isinstance(schema, dict):
        ref = schema.get("$ref", "")
        if ref.startswith("#/$defs/"):
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return {**_inline(defs[ref[len("#/$defs/") :]], defs), **_inline(rest, defs)}
        return {k: _inline(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inline(v, defs) for v in schema]
    return schema


@lru_cache(maxsize=None)
def validator(major: int, newer_minor: bool = False, at: str = "", minor: Optional[int] = None):
    """The compiled validator of ``major.minor`` (the newest minor when
    None), created once per process; ``at`` names one top-level property
    to validate alone (e.g. ``host``)."""
    schema = load(major, minor)
    _Validator.check_schema(schema)
    schema = _inline(schema, schema.get("$defs", {}))
    if at:
        schema = schema["properties"][at]
    return _Validator(opened(schema) if newer_minor else schema)


def where(path) -> str:
    """``body.tree[1].inventories.VCPU`` from a jsonschema path."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or "message"


def describe(error: ValidationError) -> str:
    """One line naming the path and what is wrong, without the value."""
    here = where(error.absolute_path)
    why = error.schema.get("x-why") if isinstance(error.schema, dict) else None
    if "propertyNames" in error.schema_path:
        return f"{here}: {str(error.instance)[:80]!r} {why or 'is not an allowed key'}"
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        return f"{here}: {missing[0]!r} is required"
    if error.validator == "additionalProperties":
        known = error.schema.get("properties", {})
        extra = sorted(str(k)[:80] for k in error.instance if k not in known)
        return f"{here}: unknown key {', '.join(map(repr, extra))} (not in this wire version)"
    if why:
        return f"{here}: {why}"
    if error.validator == "type":
        types = (
            error.validator_value
            if isinstance(error.validator_value, list)
            else [error.validator_value]
        )
        return f"{here}: must be {' or '.join(_TYPE_WORDS.get(str(t), str(t)) for t in types)}"
    return f"{here}: breaks the schema's {error.validator!r} ({error.validator_value!r})"


def first_error(
    message: Any, major: int, newer_minor: bool = False, at: str = "", minor: Optional[int] = None
) -> Optional[str]:
    """None when ``message`` follows the schema of ``major.minor``, else
    :func:`describe` of the most relevant error."""
    check = validator(major, newer_minor, at, minor)
    if check.is_valid(message):
        return None
    return describe(best_match(check.iter_errors(message)))
