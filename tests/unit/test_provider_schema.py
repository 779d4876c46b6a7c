"""The provider file schema document (node_agent/policy/provider-config-1.0.json)."""

from __future__ import annotations

from node_agent.policy import provider_schema


def _subschemas(schema, path="#"):
    if isinstance(schema, dict):
        yield path, schema
        for key, value in schema.items():
            yield from _subschemas(value, f"{path}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from _subschemas(value, f"{path}/{i}")


def test_the_schema_is_a_valid_draft_2020_12_schema():
    provider_schema.validator(strict=True)  # raises SchemaError otherwise


def test_every_message_belongs_to_a_keyword_of_its_own_subschema():
    # A message keyed by a keyword the subschema lacks is never shown: the
    # operator would get the generic text instead.
    orphans = [
        (path, keyword)
        for path, schema in _subschemas(provider_schema.load())
        for keyword in schema.get("x-why", {})
        if keyword not in schema
    ]
    assert orphans == []


def _closed(schema) -> list[str]:
    return [path for path, sub in _subschemas(schema) if sub.get("additionalProperties") is False]


def test_a_later_minor_drops_only_the_unknown_key_refusals():
    strict = provider_schema.validator(strict=True).schema
    opened = provider_schema.validator(strict=False).schema
    assert _closed(strict) and _closed(opened) == []
    assert opened["required"] == strict["required"]
    assert opened["$defs"]["inventory"]["required"] == ["total"]
