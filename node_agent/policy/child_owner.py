"""Which child providers are the agent's own. Pure.

The agent makes two kinds of children whose allocations it may have to move
back to the root when they go away: NUMA node children
(``<host>_NUMA_<n>``, :mod:`node_agent.tree.numa`) and GPU children
(``<host>_pci_<domain>_<bus>_<slot>_<function>``, :mod:`node_agent.tree.pci`).
It must recognise them even when its state file is lost, and never take
someone else's child for one of them.

A child is the agent's when it sits under the agent's root (a GPU child may
sit under one of the agent's NUMA children instead), bears
one of those exact names, and either

* carries :data:`AGENT_CHILD_TRAIT`, which the agent puts on every NUMA and
  GPU child it reports (a custom trait, as os-traits asks of traits it does
  not define), or
* is listed in the state file as a child the agent created or adopted.

A child with the agent's name but neither proof is left alone: nova's
libvirt driver names its GPU children the same way, and a provider the
agent cannot prove it made is not its to empty or delete. The agent marks
every NUMA and GPU child it still reports at each sync, so after one cycle
of this version every child it reports carries the mark.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

# CUSTOM_ + [A-Z0-9_], as os-traits' custom traits must be.
AGENT_CHILD_TRAIT = "CUSTOM_NODE_AGENT_CHILD"

NUMA = "numa"
GPU = "gpu"


def _patterns(host: str) -> dict[str, re.Pattern]:
    prefix = re.escape(host)
    return {
        NUMA: re.compile(prefix + r"_NUMA_\d+"),
        GPU: re.compile(prefix + r"_pci_[0-9a-f]{4}_[0-9a-f]{2}_[0-9a-f]{2}_[0-7]"),
    }


def child_kind(host: str, name: str) -> Optional[str]:
    """``numa`` or ``gpu`` if ``name`` is how the agent names such a child of ``host``."""
    for kind, pattern in _patterns(host).items():
        if pattern.fullmatch(name):
            return kind
    return None


@dataclass(frozen=True)
class ListedChild:
    """A provider of the root's tree, as Placement lists it."""

    uuid: str
    name: str
    parent_uuid: Optional[str]
    traits: frozenset[str] = frozenset()
    # None: not read yet (a bare ``?in_tree`` listing has no inventories).
    inventories: Optional[Mapping[str, dict]] = None


def _parents(host: str, root_uuid: str, listed: list[ListedChild]) -> dict[str, set[str]]:
    """kind -> where a child of that kind may sit: NUMA children under the
    root, GPU children under the root or a NUMA child (named so, under the
    root) of the node their device is attached to."""
    nodes = {
        c.uuid for c in listed if c.parent_uuid == root_uuid and child_kind(host, c.name) == NUMA
    }
    return {NUMA: {root_uuid}, GPU: {root_uuid} | nodes}


def agent_children(
    host: str, root_uuid: str, listed: Iterable[ListedChild], owned: Iterable[str] = ()
) -> dict[str, str]:
    """uuid -> kind (``numa``/``gpu``) of the children in ``listed`` that
    are the agent's (see the module docstring). ``owned``: the uuids the
    state file says the agent created or adopted."""
    owned = set(owned)
    listed = list(listed)
    parents = _parents(host, root_uuid, listed)
    found = {}
    for child in listed:
        kind = child_kind(host, child.name)
        if kind is None or child.parent_uuid not in parents.get(kind, ()):
            continue
        if AGENT_CHILD_TRAIT in child.traits or child.uuid in owned:
            found[child.uuid] = kind
    return found


def candidates(
    host: str, root_uuid: str, listed: Iterable[ListedChild], keep: Iterable[str]
) -> list[ListedChild]:
    """Children named like the agent's, directly under the root, that the
    desired tree does not keep (by name): those a shell must look at closer
    (traits, inventories) to decide."""
    keep = set(keep)
    listed = list(listed)
    parents = _parents(host, root_uuid, listed)
    return [
        c
        for c in listed
        if c.parent_uuid in parents.get(child_kind(host, c.name) or "", ())
        and c.name not in keep
        and child_kind(host, c.name) is not None
    ]
