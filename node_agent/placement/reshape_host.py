"""One host's reshape: the inputs :func:`~node_agent.placement.reshaper.ensure_reshaped`
needs for a cycle's ``Desired`` -- the uuids of the root and of the NUMA
and GPU children (children Placement does not have yet get fresh ones),
the agent's children the tree no longer has (retired: their allocations
move back to the root), and the rule chain
(:func:`node_agent.placement.reshape_rules.host_rule`) -- and the calls
that read them and reshape or plan.
"""

from __future__ import annotations

import logging
import uuid as uuidlib
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Optional

from node_agent.model.provider_tree import Provider, ProviderTree
from node_agent.model.snapshot import Guest
from node_agent.placement.errors import NotFound
from node_agent.placement.reshape_engine import Reshape, Rule
from node_agent.placement.reshape_reads import plan_reshape, resolve_uuids, uuid_of_root
from node_agent.placement.reshape_rules import children_to_root, host_rule, rule_provider_names
from node_agent.placement.reshaper import ReshapeOutcome, ensure_reshaped
from node_agent.policy.child_owner import (
    AGENT_CHILD_TRAIT,
    GPU,
    NUMA,
    ListedChild,
    agent_children,
    candidates,
)

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostReshape:
    """What :func:`ensure_reshaped` needs for one cycle's ``Desired``:
    the tree with uuids for the rule's providers, the rule chain
    (:func:`node_agent.placement.reshape_rules.host_rule`), and the uuids given to children
    Placement does not have yet."""

    tree: ProviderTree
    rule: Rule
    absent: frozenset[str] = frozenset()
    # The agent's own children the desired tree no longer has: in ``tree``
    # with empty inventories, their allocations moved back to the root.
    retired: frozenset[str] = frozenset()


_BACK_HINTS = {
    NUMA: "numa_in_placement is off, or the node is no longer reported",
    GPU: "its GPU is gone or no longer offers a type in [devices] enabled_mdev_types",
}


def _listed_children(client, root_uuid: str, listed) -> list[ListedChild]:
    """The root's tree as a list (``listed``: the syncer's cache, or None
    for one ``GET ?in_tree``)."""
    if listed is not None:
        return [
            ListedChild(p.uuid, p.name, p.parent_uuid, frozenset(p.traits), dict(p.inventories))
            for p in listed
        ]
    found = client.providers_in_tree(root_uuid)
    return [ListedChild(rp["uuid"], rp["name"], rp.get("parent_provider_uuid")) for rp in found]


def _with_details(client, child: ListedChild) -> ListedChild:
    if child.inventories is not None:
        return child
    try:
        traits = client.traits(child.uuid)["traits"]
        inventories = client.inventories(child.uuid)["inventories"]
    except NotFound:
        return replace(child, inventories={})
    return replace(child, traits=frozenset(traits), inventories=inventories)


def retired_children(
    client, tree: ProviderTree, owned: Iterable[str] = (), listed=None
) -> dict[str, tuple[ListedChild, str]]:
    """uuid -> (child, kind) of the agent's NUMA and GPU children that
    ``tree`` (with the root's uuid) no longer has, recognised by name and
    mark or by ``owned`` (:mod:`node_agent.policy.child_owner`). Reads: one GET for
    the tree unless ``listed`` is given, then two per child named like the
    agent's that the tree does not keep."""
    root, root_uuid = tree.root, uuid_of_root(tree)
    children = candidates(
        root.name, root_uuid, _listed_children(client, root_uuid, listed), tree.names()
    )
    detailed = [_with_details(client, c) for c in children]
    mine = agent_children(root.name, root_uuid, detailed, owned)
    for child in detailed:
        if child.uuid not in mine:
            LOG.info(
                "provider %s (%s) is named like the agent's children but bears "
                "neither its mark %s nor a record in the state file: left alone",
                child.name,
                child.uuid,
                AGENT_CHILD_TRAIT,
            )
    return {c.uuid: (c, mine[c.uuid]) for c in detailed if c.uuid in mine}


def _back_rules(
    tree: ProviderTree, retired: Mapping[str, tuple[ListedChild, str]], guests: Iterable[Guest]
) -> list[Rule]:
    rules: list[Rule] = []
    for kind in (NUMA, GPU):
        children = {u: c for u, (c, k) in retired.items() if k == kind}
        if children:
            rules.append(
                children_to_root(
                    uuid_of_root(tree),
                    {u: c.name for u, c in children.items()},
                    tree.root.inventories,
                    {u: set(c.inventories or {}) for u, c in children.items()},
                    guests,
                    _BACK_HINTS[kind],
                )
            )
    return rules


def host_reshape_inputs(
    client,
    desired,
    known_uuids: Optional[Mapping[str, str]] = None,
    owned: Iterable[str] = (),
    listed=None,
) -> Optional[HostReshape]:
    """Resolve the uuids of the root and of the NUMA and GPU children
    (``known_uuids``: name -> uuid, the state file's ``providers``; the
    rest by name, one GET each), find the agent's children going away
    (:func:`retired_children`; ``owned`` and ``listed`` as there) and build
    the rule. None when the root is not in Placement: a host not there yet
    has nothing to reshape."""
    names = rule_provider_names(desired.tree, desired.host)
    tree = resolve_uuids(client, desired.tree, known_uuids, names)
    if not tree.root.uuid:
        return None
    placed = {p.name for p in tree.providers if p.uuid is not None}
    fresh = {name: str(uuidlib.uuid4()) for name in names[1:] if name not in placed}
    tree = tree.with_uuids(fresh)
    retired = retired_children(client, tree, owned, listed)
    back = _back_rules(tree, retired, desired.host.guests)
    tree = ProviderTree(
        tree.providers
        + tuple(Provider(c.name, parent=tree.root.name, uuid=u) for u, (c, _k) in retired.items())
    )
    return HostReshape(
        tree,
        host_rule(tree, desired.host, desired.partition.dedicated, back),
        frozenset(fresh.values()),
        frozenset(retired),
    )


def host_reshape(
    client, desired, known_uuids: Optional[Mapping[str, str]] = None, **kw
) -> ReshapeOutcome:
    """:func:`ensure_reshaped` with the rule chain that fits one cycle's
    ``Desired`` (``cycle.desired_from``)."""
    inputs = host_reshape_inputs(client, desired, known_uuids)
    if inputs is None:
        return ReshapeOutcome(False, Reshape(None))
    return ensure_reshaped(
        client, inputs.tree, desired.host.guests, inputs.rule, absent=inputs.absent, **kw
    )


def plan_host_reshape(client, desired, known_uuids: Optional[Mapping[str, str]] = None) -> Reshape:
    """:func:`plan_reshape` for ``--dry-run``: reads only."""
    inputs = host_reshape_inputs(client, desired, known_uuids)
    if inputs is None:
        return Reshape(None)
    return plan_reshape(client, inputs.tree, desired.host.guests, inputs.rule, inputs.absent)


# The names the first version had; the chain now covers more than VCPU -> PCPU.
pcpu_reshape = host_reshape


plan_pcpu_reshape = plan_host_reshape
