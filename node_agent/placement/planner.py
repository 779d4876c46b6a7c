"""The sync planner (pure): what Placement holds, what to send to change it.

:func:`plan_changes` compares the desired :class:`ProviderTree` with what
Placement holds (:class:`~node_agent.model.provider_state.ProviderState`
per provider) and returns the ordered
requests (:class:`Change`) that close the gap: custom resource classes and
traits first, missing providers top-down, inventories, traits, aggregates,
then deletion of children the agent created and no longer wants, bottom-up.
It never removes a trait the agent has no opinion on, nor an aggregate it
did not add (:mod:`node_agent.policy.aggregates`), never deletes a provider
it did not create. The inventory diffs the shell
(:mod:`node_agent.placement.sync`) and the applier share live here too; the
comparisons are :mod:`node_agent.model.provider_state`'s, shared with drift.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from node_agent.model.provider_state import (
    INVENTORY_FIELDS,
    ProviderState,
    inventories_equal,
    inventory_equal,
)
from node_agent.model.provider_tree import PlacedTree, Provider, ProviderTree, placement_inventories
from node_agent.placement import routes
from node_agent.policy import aggregates as aggs

CUSTOM = "CUSTOM_"


@dataclass(frozen=True)
class Change:
    """One request of a plan: ``kind`` (one of
    :data:`node_agent.placement.routes.CHANGE_KINDS`) on ``target``, the
    provider's uuid or the name of the resource class or trait to define;
    ``provider`` is the provider's name."""

    kind: str
    target: str
    summary: str
    body: Optional[dict] = None
    provider: Optional[str] = None

    def __post_init__(self) -> None:
        if self.kind not in routes.CHANGE_KINDS:
            raise ValueError(f"unknown change kind {self.kind!r}")

    @property
    def method(self) -> str:
        return routes.request_of(self.kind, self.target)[0]

    @property
    def path(self) -> str:
        return routes.request_of(self.kind, self.target)[1]


def wanted_inventories(
    provider: Provider, current: Optional[Mapping[str, Mapping]] = None
) -> dict[str, dict]:
    """What to PUT, given what Placement holds (``current``): see
    :func:`node_agent.model.provider_tree.placement_inventories` for the ratio rule."""
    return placement_inventories(provider.inventories, current)


def merged_traits(current: Iterable[str], provider: Provider) -> frozenset:
    """``current`` with the agent's opinions applied; others' traits kept."""
    unwanted = {t for t, on in provider.traits.items() if not on}
    return (frozenset(current) - unwanted) | provider.wanted_traits


def capacity(record: Mapping) -> int:
    """Placement's capacity of an inventory record: (total - reserved) * ratio."""
    return int((record["total"] - record["reserved"]) * float(record["allocation_ratio"]))


def _fmt(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe_inventory_diff(old: Mapping[str, Mapping], new: Mapping[str, Mapping]) -> list[str]:
    """Human phrases such as ``set VCPU total 16→32``, sorted by class."""
    phrases = []
    for rc in sorted(set(old) | set(new)):
        if rc not in old:
            closed = new[rc].get("reserved", 0) >= new[rc]["total"]
            phrases.append(
                f"add {rc} total {new[rc]['total']}" + (" fully reserved" if closed else "")
            )
        elif rc not in new:
            phrases.append(f"remove {rc}")
        elif not inventory_equal(old[rc], new[rc]):
            fields = ", ".join(
                f"{f} {_fmt(old[rc].get(f))}→{_fmt(new[rc][f])}"
                for f in INVENTORY_FIELDS
                if not inventory_equal({**old[rc], f: new[rc][f]}, old[rc])
            )
            phrases.append(f"set {rc} {fields}")
    return phrases


def _ensure_custom_changes(
    desired: ProviderTree,
    actual: Mapping[str, ProviderState],
    known_classes: Iterable[str],
    known_traits: Iterable[str],
) -> list[Change]:
    known_rc = set(known_classes).union(*(s.inventories for s in actual.values()))
    known_tr = set(known_traits).union(*(s.traits for s in actual.values()))
    classes = sorted(
        {rc for p in desired.providers for rc in p.inventories if rc.startswith(CUSTOM)} - known_rc
    )
    traits = sorted(
        {t for p in desired.providers for t in p.wanted_traits if t.startswith(CUSTOM)} - known_tr
    )
    return [Change("resource_class", rc, f"define resource class {rc}") for rc in classes] + [
        Change("trait", t, f"define trait {t}") for t in traits
    ]


def _create_change(desired: PlacedTree, provider: Provider) -> Change:
    uuid, parent = desired.uuid(provider), desired.parent_uuid(provider)
    body = {"name": provider.name, "uuid": uuid}
    if parent is not None:
        body["parent_provider_uuid"] = parent
    where = f" under {provider.parent}" if provider.parent else ""
    return Change("create", uuid, f"create provider {provider.name}{where}", body, provider.name)


def _update_change(
    desired: PlacedTree, provider: Provider, state: ProviderState
) -> Optional[Change]:
    parent = desired.parent_uuid(provider)
    if state.name == provider.name and state.parent_uuid == parent:
        return None
    return Change(
        "update",
        state.uuid,
        f"rename/re-parent provider {state.name} as {provider.name}",
        {"name": provider.name, "parent_provider_uuid": parent},
        provider.name,
    )


def inventory_change(
    provider: Provider, state: ProviderState, generation: int, wanted: Optional[Mapping] = None
) -> Optional[Change]:
    wanted = wanted_inventories(provider, state.inventories) if wanted is None else dict(wanted)
    if inventories_equal(state.inventories, wanted):
        return None
    phrases = describe_inventory_diff(state.inventories, wanted)
    return Change(
        "inventories",
        state.uuid,
        f"{'; '.join(phrases)} on {provider.name}",
        {"resource_provider_generation": generation, "inventories": wanted},
        provider.name,
    )


def _traits_change(provider: Provider, state: ProviderState, generation: int) -> Optional[Change]:
    merged = merged_traits(state.traits, provider)
    if merged == state.traits:
        return None
    added = sorted(merged - state.traits)
    removed = sorted(state.traits - merged)
    what = " ".join([f"+{t}" for t in added] + [f"-{t}" for t in removed])
    return Change(
        "traits",
        state.uuid,
        f"traits {what} on {provider.name}",
        {"resource_provider_generation": generation, "traits": sorted(merged)},
        provider.name,
    )


def aggregates_change(
    provider: Provider,
    state: ProviderState,
    generation: int,
    ours: Optional[frozenset] = None,
) -> Optional[Change]:
    """The aggregates PUT of ``provider``: what Placement holds with the
    agent's wanted aggregates added and the ones it added (``ours``) and no
    longer wants removed. None when nothing changes, or when the agent has
    no aggregates to keep on this provider."""
    if not provider.aggregates and not ours:
        return None
    current = state.aggregates or frozenset()
    new = aggs.merged(current, provider.aggregates, ours)
    if new == current:
        return None
    return Change(
        "aggregates",
        state.uuid,
        f"aggregates {aggs.describe(current, new)} on {provider.name}",
        {"resource_provider_generation": generation, "aggregates": sorted(new)},
        provider.name,
    )


def _depth(uuid: str, actual: Mapping[str, ProviderState]) -> int:
    depth, seen = 0, set()
    while uuid in actual and uuid not in seen:
        parent = actual[uuid].parent_uuid
        if not parent:
            break
        seen.add(uuid)
        uuid, depth = parent, depth + 1
    return depth


def _delete_changes(
    desired: ProviderTree, actual: Mapping[str, ProviderState], owned_children: set[str]
) -> list[Change]:
    keep = {p.uuid for p in desired.providers}
    doomed = {u for u in owned_children if u in actual and u not in keep and actual[u].parent_uuid}
    # A kept provider's parent once the plan's updates (sent before any
    # delete) have moved it: a GPU child leaving a NUMA child goes first.
    placed = PlacedTree.of(desired)
    parent_after = {s.uuid: s.parent_uuid for s in actual.values()}
    parent_after.update({placed.uuid(p): placed.parent_uuid(p) for p in placed.providers})
    # Placement refuses to delete a parent; a doomed provider with a child we
    # keep (a foreign one, say) stays, and so do its ancestors.
    changed = True
    while changed:
        blocked = {
            parent_after[s.uuid]
            for s in actual.values()
            if parent_after[s.uuid] in doomed and s.uuid not in doomed
        }
        changed = bool(blocked)
        doomed -= blocked
    order = sorted(doomed, key=lambda u: (-_depth(u, actual), actual[u].name))
    return [
        Change(
            "delete",
            u,
            f"delete provider {actual[u].name} (no longer on the host)",
            provider=actual[u].name,
        )
        for u in order
    ]


def plan_changes(
    desired: ProviderTree,
    actual: Mapping[str, ProviderState],
    owned_children: set[str],
    *,
    known_resource_classes: Iterable[str] = (),
    known_traits: Iterable[str] = (),
    root_aggregates_ours: Optional[frozenset] = None,
) -> list[Change]:
    """The ordered requests that make Placement hold ``desired``.

    ``desired`` must carry a uuid on every provider, parents before children;
    ``actual`` maps uuid -> what Placement holds for the tree. Custom classes
    and traits are defined unless known (given, or seen in ``actual``).
    Inventory and trait bodies carry the generation ``actual`` shows (0 for a
    provider this plan creates, plus one per earlier write in the plan); the
    shell re-reads and retries when Placement answers 409 concurrent_update.
    Only providers in ``owned_children`` are ever deleted; of the root's
    aggregates only those in ``root_aggregates_ours`` (the ones the agent
    added; None: not known) are ever removed.
    """
    placed = PlacedTree.of(desired)  # raises ValueError naming providers without one
    changes = _ensure_custom_changes(placed, actual, known_resource_classes, known_traits)
    states: dict[str, ProviderState] = {}
    generations: dict[str, int] = {}
    for provider in placed.providers:
        uuid = placed.uuid(provider)
        state = actual.get(uuid)
        if state is None:
            changes.append(_create_change(placed, provider))
            state = ProviderState(uuid, provider.name, 0, placed.parent_uuid(provider))
        else:
            update = _update_change(placed, provider, state)
            changes += [update] if update else []
        states[uuid], generations[uuid] = state, state.generation
    for step in (inventory_change, _traits_change):
        for provider in placed.providers:
            uuid = placed.uuid(provider)
            change = step(provider, states[uuid], generations[uuid])
            if change:
                changes.append(change)
                generations[uuid] += 1
    for provider in placed.providers:
        uuid = placed.uuid(provider)
        ours = root_aggregates_ours if provider.parent is None else None
        change = aggregates_change(provider, states[uuid], generations[uuid], ours)
        if change:
            changes.append(change)
            generations[uuid] += 1
    return changes + _delete_changes(placed, actual, owned_children)


def verify_phase(host: str) -> float:
    """Where in the full-verify interval ``host``'s verifies fall, in (0, 1].

    A hash of the name, not the start time: a fleet started (or restarted)
    together would otherwise verify together, and a short Placement outage
    would catch a large part of it. The same host keeps its phase across
    restarts; different hosts spread evenly over the interval.
    """
    digest = hashlib.sha256(host.encode("utf-8")).digest()
    return 1.0 - int.from_bytes(digest[:8], "big") / 2.0**64
