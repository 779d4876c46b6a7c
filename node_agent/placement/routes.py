"""Placement's REST paths, the one place they are spelled (pure).

The HTTP gateway (:class:`node_agent.placement.client.PlacementClient`)
sends them through its typed operations; a planned
:class:`~node_agent.placement.planner.Change` names its request with
:func:`request_of` so ``--dry-run`` and the notifications can show it. No
other module builds a URL, nor parses one.
"""

from __future__ import annotations

from urllib.parse import quote

PROVIDERS = "/resource_providers"
RESHAPER = "/reshaper"


def provider(uuid: str) -> str:
    return f"{PROVIDERS}/{uuid}"


def inventories(uuid: str) -> str:
    return f"{PROVIDERS}/{uuid}/inventories"


def traits(uuid: str) -> str:
    return f"{PROVIDERS}/{uuid}/traits"


def aggregates(uuid: str) -> str:
    return f"{PROVIDERS}/{uuid}/aggregates"


def usages(uuid: str) -> str:
    return f"{PROVIDERS}/{uuid}/usages"


def provider_allocations(uuid: str) -> str:
    return f"{PROVIDERS}/{uuid}/allocations"


def providers_named(name: str) -> str:
    return f"{PROVIDERS}?name={quote(name)}"


def providers_with_trait(trait: str) -> str:
    """Providers carrying ``trait`` (``required``: microversion 1.18)."""
    return f"{PROVIDERS}?required={quote(trait)}"


def sharing_providers(aggregates, trait: str) -> str:
    """Providers in any of ``aggregates`` carrying ``trait`` (``member_of=in:``:
    1.3; ``required``: 1.18)."""
    return f"{PROVIDERS}?member_of=in:{','.join(aggregates)}&required={quote(trait)}"


def providers_in_tree(root_uuid: str) -> str:
    return f"{PROVIDERS}?in_tree={root_uuid}"


def consumer_allocations(consumer: str) -> str:
    return f"/allocations/{consumer}"


def resource_class(name: str) -> str:
    return f"/resource_classes/{name}"


def trait(name: str) -> str:
    return f"/traits/{name}"


# A planned change's kind -> (method, path of its target). The target is the
# provider's uuid, or the name of the resource class or trait to define.
_CHANGES = {
    "resource_class": ("PUT", resource_class),
    "trait": ("PUT", trait),
    "create": ("POST", lambda _uuid: PROVIDERS),
    "update": ("PUT", provider),
    "inventories": ("PUT", inventories),
    "traits": ("PUT", traits),
    "aggregates": ("PUT", aggregates),
    "delete": ("DELETE", provider),
}
CHANGE_KINDS = frozenset(_CHANGES)


def request_of(kind: str, target: str) -> tuple[str, str]:
    """(method, path) of a planned change of ``kind`` on ``target``."""
    method, path = _CHANGES[kind]
    return method, path(target)
