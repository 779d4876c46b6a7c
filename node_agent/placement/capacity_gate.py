"""The capacity invariant on the syncer's path: a plan is changed so that
the tree it leaves never overstates the host
(:func:`node_agent.policy.capacity.enforce`, pure), before anything is sent.

Changes that lower capacity read their provider's usages first
(:mod:`node_agent.placement.usage_guard`): a class removed while in use is
held, a cut below usage goes through and is reported with who holds it. A
refused plan reads who holds the classes it touches, so its message names
the guests to move.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping

from node_agent.model.provider_state import ProviderState
from node_agent.model.provider_tree import Inventory, ProviderTree
from node_agent.placement.planner import Change, inventory_change
from node_agent.placement.sync_context import SyncContext, body_of
from node_agent.placement.usage_guard import Cut, UsageGuard, cuts
from node_agent.policy import capacity as cap


def as_left(ctx: SyncContext) -> ProviderTree:
    """The desired tree with the inventories the capacity check let through."""
    if ctx.planned is None:
        return ctx.tree
    return ProviderTree(
        tuple(
            replace(
                p,
                inventories={
                    rc: Inventory.from_placement(rec)
                    for rc, rec in ctx.planned[ctx.tree.uuid(p)].items()
                },
            )
            for p in ctx.tree.providers
        )
    )


def _capacity_message(result: cap.Enforced, blocking: list[dict]) -> str:
    """Why a plan was not sent whole, who blocks it, and what to do."""
    parts = [
        f"capacity: the planned tree was not sent, it would overstate the host "
        f"({'; '.join(result.wanted.lines())})"
    ]
    if result.kept:
        parts.append(f"kept {', '.join(result.kept)} as Placement holds them")
    if result.closed:
        parts.append(
            f"published {', '.join(result.closed)} fully reserved "
            "(Placement already overstated the host)"
        )
    if not result.left.ok:
        parts.append(
            f"Placement still overstates the host through providers the agent "
            f"does not write ({'; '.join(result.left.lines())})"
        )
    if blocking:
        who = ", ".join(
            f"{b['consumer']}"
            + (f" (guest {b['guest']})" if b.get("guest") else " (not a guest of this host)")
            + f" holds {' '.join(f'{rc}={n}' for rc, n in sorted(b['resources'].items()))}"
            f" on {b['provider']}"
            for b in blocking
        )
        parts.append(
            f"blocked by {who}; migrate or delete them and the change applies at "
            "the next cycle, or restore the previous configuration"
        )
    else:
        parts.append(
            "restore the previous configuration, or retry after the providers "
            "the agent could not delete are gone"
        )
    return "; ".join(parts)


class CapacityGate:
    """The invariant over one Placement client (usages and, on a refusal,
    the providers' allocations)."""

    def __init__(self, client, guard: UsageGuard):
        self.client = client
        self._guard = guard

    def enforce(
        self,
        ctx: SyncContext,
        changes: list[Change],
        limits: cap.HostLimits,
        consumer_names: Mapping[str, str],
    ) -> list[Change]:
        """The plan, changed so that the tree it leaves never overstates the host.

        Changes that lower capacity read their provider's usages first
        (the read the usage guard always needed, moved before the
        decision): a class removed while in use keeps its record; a cut
        below usage is planned as wanted (``ctx.cuts`` lists it): it only
        lowers, so it never makes the invariant fail. Then
        :func:`node_agent.policy.capacity.enforce` checks the whole tree as
        it will be left -- every desired provider after those holds, and
        every other provider of the tree as Placement holds
        it (foreign ones, and children being deleted, whose delete may be
        refused) -- and holds or closes the classes involved. Inventory
        PUTs that grow nothing go first. A steady cycle reads nothing here.
        """
        planned: dict[str, dict] = {}
        by_uuid = {c.target: c for c in changes if c.kind == "inventories"}
        for provider in ctx.tree.providers:
            uuid = ctx.tree.uuid(provider)
            state = ctx.actual.get(uuid)
            change = by_uuid.get(uuid)
            if change is None:
                planned[uuid] = dict(state.inventories) if state else {}
                continue
            wanted = body_of(change)["inventories"]
            if state is not None:
                guarded = self._guard.guard(change, state, wanted, usages_into=ctx.usages)
                wanted = guarded.inventories
                ctx.pre[uuid] = guarded.generation
                ctx.errors += guarded.errors
            planned[uuid] = wanted
        names = {ctx.tree.uuid(p): p.name for p in ctx.tree.providers}
        current = {u: dict(ctx.actual[u].inventories) for u in planned if u in ctx.actual}
        untouched = [
            cap.Published(s.name, s.parent_uuid is None, s.inventories)
            for u, s in ctx.actual.items()
            if u not in planned
        ]
        result = cap.enforce(
            planned,
            current,
            names,
            ctx.tree.root_uuid,
            untouched,
            limits,
            lambda classes: self._classes_in_use(ctx, classes),
        )
        ctx.planned = planned = {u: dict(inv) for u, inv in result.inventories.items()}
        ctx.closed = set(result.closed)
        ctx.capacity = {
            **result.wanted.as_dict(),
            "kept": list(result.kept),
            "closed": list(result.closed),
            "blocking": [],
            "left_ok": result.left.ok,
        }
        if result.refused:
            blocking = self._blocking_consumers(ctx, result.wanted.classes, consumer_names)
            ctx.capacity["blocking"] = blocking
            ctx.errors.append(_capacity_message(result, blocking))
        # What the plan publishes below usage, as it will be sent (after the
        # invariant's holds and closings): the dry run shows it, the writer
        # reports what it actually wrote.
        ctx.cuts = [
            cut
            for provider in ctx.tree.providers
            for cut in self._planned_cuts(ctx, ctx.tree.uuid(provider), provider.name)
        ]
        return self._rewrite_inventory_changes(ctx, changes, planned)

    @staticmethod
    def _planned_cuts(ctx: SyncContext, uuid: str, name: str) -> list[Cut]:
        state = ctx.actual.get(uuid)
        if state is None or ctx.planned is None:
            return []
        return cuts(name, uuid, state.inventories, ctx.planned[uuid], ctx.usages.get(uuid))

    def with_holders(
        self, ctx: SyncContext, found: Iterable[Cut], consumer_names: Mapping[str, str]
    ) -> list[Cut]:
        """``found`` with the consumers holding each cut class on its
        provider (one allocations read per provider with a cut)."""
        found = list(found)
        if not found:
            return []
        blocking = self._blocking_consumers(ctx, {c.rc for c in found}, consumer_names)
        return [
            replace(
                c,
                holders=tuple(
                    (b["consumer"], b.get("guest"), b["resources"][c.rc])
                    for b in blocking
                    if b["provider"] == c.provider and c.rc in b["resources"]
                ),
            )
            for c in found
        ]

    def _rewrite_inventory_changes(
        self, ctx: SyncContext, changes: list[Change], planned: Mapping[str, dict]
    ) -> list[Change]:
        """``changes`` with inventory PUTs that leave ``planned``;
        shrinks before grows."""
        puts = []
        for provider in ctx.tree.providers:
            uuid = ctx.tree.uuid(provider)
            state = ctx.actual.get(uuid) or ProviderState(
                uuid, provider.name, 0, ctx.tree.parent_uuid(provider)
            )
            change = inventory_change(provider, state, state.generation, planned[uuid])
            if change is None:
                continue
            if any(
                cap.units(rc, rec) > cap.units(rc, state.inventories[rc])
                if rc in state.inventories
                else cap.units(rc, rec) > 0
                for rc, rec in planned[uuid].items()
            ):
                ctx.grows.add(uuid)
            puts.append(change)
        puts.sort(key=lambda c: c.target in ctx.grows)
        others = [c for c in changes if c.kind != "inventories"]
        at = next((i for i, c in enumerate(others) if c.kind in ("traits", "delete")), len(others))
        return others[:at] + puts + others[at:]

    def _usages_of(self, ctx: SyncContext, uuid: str) -> dict[str, int]:
        if uuid not in ctx.usages:
            ctx.usages[uuid] = self._guard.usages(uuid)
        return ctx.usages[uuid]

    def _classes_in_use(self, ctx: SyncContext, classes) -> set[str]:
        used = set()
        for uuid, state in ctx.actual.items():
            if set(classes) & set(state.inventories):
                used |= {rc for rc, n in self._usages_of(ctx, uuid).items() if n and rc in classes}
        return used

    def _blocking_consumers(
        self, ctx: SyncContext, classes, consumer_names: Mapping[str, str]
    ) -> list[dict]:
        """Who holds the classes a refused plan touches (read only on refusal)."""
        found = []
        for uuid, state in sorted(ctx.actual.items(), key=lambda kv: kv[1].name):
            if not set(classes) & set(state.inventories):
                continue
            if not any(self._usages_of(ctx, uuid).get(rc) for rc in classes):
                continue
            body = self.client.provider_allocations(uuid)
            for consumer, alloc in sorted(body.get("allocations", {}).items()):
                held = {rc: n for rc, n in alloc.get("resources", {}).items() if rc in classes}
                if held:
                    found.append(
                        {
                            "consumer": consumer,
                            "guest": consumer_names.get(consumer),
                            "provider": state.name,
                            "resources": held,
                        }
                    )
        return found
