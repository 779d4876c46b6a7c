"""Make Placement hold the desired provider tree, with as few requests as we can.

:class:`TreeSyncer` (shell) reads what it must, applies the plan of
:func:`node_agent.placement.planner.plan_changes` (pure) and keeps a cache of
what Placement holds, so a cycle where nothing changed sends no request at
all. A full re-read every ``full_verify_interval`` seconds catches changes
made behind its back; with ``spread`` each host's verifies fall at its own
phase of the interval (:func:`~node_agent.placement.planner.verify_phase`).

Why one module over 400 lines: :class:`TreeSyncer` is one object whose
methods all share its cache, the partial-read marks and the owned
children; reads, writes, the usage guard and the cache export each need
that state. The pure parts are in :mod:`node_agent.placement.planner` and
:mod:`node_agent.policy.capacity`.
"""

from __future__ import annotations

import logging
import math
import time
import uuid as uuidlib
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Optional

import tenacity

from node_agent.errors import ProviderOwned
from node_agent.policy import capacity as cap
from node_agent.policy import root_owner
from node_agent.placement.errors import (DuplicateName, GenerationConflict, InventoryInUse,
                                         NotFound, PlacementError)
from node_agent.model.provider_tree import Inventory, PlacedTree, ProviderTree
from node_agent.placement.planner import (Change, ProviderState, capacity, guarded_capacity,
                                          inventories_equal, inventory_change, merged_traits,
                                          plan_changes, verify_phase)
from node_agent.state import OWNED_CHILDREN, PROVIDERS, ROOT_UUID, Store

LOG = logging.getLogger(__name__)

# Each attempt after a 409 concurrent_update re-reads one provider; the
# scheduler bumping a generation twice in a row is rare, three times is a storm.
CONFLICT_ATTEMPTS = 3

# What an operator can do when a resource class is still in use.
_IN_USE_HINT = {
    "VCPU": "or keep those CPUs in cpu_shared_set",
    "PCPU": "or keep those CPUs in cpu_dedicated_set",
    "MEMORY_MB": "or lower reserved_host_memory_mb / keep the huge pages",
    "MEM_ENCRYPTION_CONTEXT": "or let nova 34 move it to the <host>_amd_sev child "
                              "(nova before 2025.2 left it on the root; the agent does "
                              "not move allocations of it)",
}


# ---------------------------------------------------------------- shell

@dataclass
class SyncReport:
    """What one :meth:`TreeSyncer.sync` did."""

    applied: list[Change] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reads: int = 0
    writes: int = 0
    full_verify: bool = False
    tree: Optional[ProviderTree] = None  # the desired tree with its uuids
    # The capacity invariant's say (node_agent.policy.capacity), None when not
    # checked: {"ok", "violations", "kept", "closed", "blocking"}.
    capacity: Optional[dict] = None

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def requests(self) -> int:
        return self.reads + self.writes

    def summary(self) -> str:
        """The one INFO line of a cycle."""
        if not self.applied and self.ok:
            return f"no change ({self.requests} requests)"
        parts = [c.summary for c in self.applied] + [
            f"ERROR {e}" for e in self.errors]
        return f"{'; '.join(parts)} ({self.requests} requests)"


class _Replan(Exception):
    """Placement's tree is not what the cache says; read it again."""


@dataclass
class _Context:
    tree: PlacedTree              # desired, with uuids
    actual: dict                  # uuid -> ProviderState, as read for this plan
    created: set = field(default_factory=set)
    failed: set = field(default_factory=set)  # names whose changes are skipped
    # Set by TreeSyncer._enforce (only when the host's limits are known):
    planned: Optional[dict[str, dict]] = None  # uuid -> inventories to leave, after every hold
    pre: dict = field(default_factory=dict)      # uuid -> generation of the usages read
    usages: dict = field(default_factory=dict)   # uuid -> usages read this cycle
    grows: set = field(default_factory=set)      # uuids whose PUT grows a class
    closed: set = field(default_factory=set)     # classes published fully reserved
    errors: list = field(default_factory=list)   # holds decided before sending
    capacity: Optional[dict] = None
    shrink_failed: bool = False


def _body(change: Change) -> dict:
    """The request body of a change that has one (all but deletes and definitions)."""
    if change.body is None:
        raise ValueError(f"{change.summary}: the change has no request body")
    return change.body


def _in_use_message(rc: str, provider: str, used: int, new_cap: int) -> str:
    hint = _IN_USE_HINT.get(rc, "or restore that inventory")
    return (f"cannot lower {rc} on {provider} to capacity {new_cap}: "
            f"{used} {rc} in use; migrate or delete instances using "
            f"{used} {rc}, {hint}")


def _as_left(ctx: _Context) -> ProviderTree:
    """The desired tree with the inventories the capacity check let through."""
    if ctx.planned is None:
        return ctx.tree
    return ProviderTree(tuple(
        replace(p, inventories={rc: Inventory.from_placement(rec)
                                for rc, rec in ctx.planned[ctx.tree.uuid(p)].items()})
        for p in ctx.tree.providers))


def _capacity_message(result: cap.Enforced, blocking: list[dict]) -> str:
    """Why a plan was not sent whole, who blocks it, and what to do."""
    parts = [f"capacity: the planned tree was not sent, it would overstate the host "
             f"({'; '.join(result.wanted.lines())})"]
    if result.kept:
        parts.append(f"kept {', '.join(result.kept)} as Placement holds them")
    if result.closed:
        parts.append(f"published {', '.join(result.closed)} fully reserved "
                     "(Placement already overstated the host)")
    if not result.left.ok:
        parts.append(f"Placement still overstates the host through providers the agent "
                     f"does not write ({'; '.join(result.left.lines())})")
    if blocking:
        who = ", ".join(
            f"{b['consumer']}" + (f" (guest {b['guest']})" if b.get("guest") else
                                  " (not a guest of this host)")
            + f" holds {' '.join(f'{rc}={n}' for rc, n in sorted(b['resources'].items()))}"
            f" on {b['provider']}" for b in blocking)
        parts.append(f"blocked by {who}; migrate or delete them and the change applies at "
                     "the next cycle, or restore the previous configuration")
    else:
        parts.append("restore the previous configuration, or retry after the providers "
                     "the agent could not delete are gone")
    return "; ".join(parts)


class TreeSyncer:
    """Keeps one provider tree in Placement equal to the desired one.

    The state store keeps the uuids (the root's above all: it must never
    change) and the children the agent created; the in-memory cache keeps
    what Placement held after the last write. :meth:`sync` raises
    :class:`~node_agent.placement.client.Unavailable` or ``AuthError`` when Placement
    cannot be used; the state file is then left as it was and the next cycle
    verifies the tree (the listing, then only providers whose generation moved). Refusals that concern one provider (inventory in use,
    a delete refused) are reported in :attr:`SyncReport.errors` and the rest
    of the tree is still synced.
    """

    def __init__(self, client, store: Store,
                 full_verify_interval: float = 300,
                 clock: Callable[[], float] = time.monotonic,
                 spread: bool = False, owner: Optional[root_owner.Identity] = None):
        """``spread``: the first verify after the first read is due at this
        host's phase of the interval (:func:`verify_phase` of the root's
        name), and the later ones on that grid, every interval; without it
        every verify is due one interval after the previous one.

        ``owner``: this machine's identity. Every plan and sync then judges
        the root as Placement holds it (:func:`node_agent.policy.root_owner.judge`)
        and raises :class:`~node_agent.errors.ProviderOwned` before any write
        when nova-compute or another machine manages it."""
        self.client = client
        self.owner = owner
        self._judged: Optional[str] = None  # the last verdict's owner, logged on change
        self.store = store
        self.full_verify_interval = full_verify_interval
        self.clock = clock
        self.spread = spread
        self._state = store.load_or_empty(LOG)
        self._cache: Optional[dict[str, ProviderState]] = None
        # Providers whose cached generation came from a read of one part of
        # the record (traits, inventories or usages) after someone else
        # changed it: the other part may be stale, so the next full verify
        # reads them whatever their generation.
        self._partial: set[str] = set()
        self._verified_at: Optional[float] = None
        self._due_at: Optional[float] = None   # None: verify at the next sync
        self._anchor: Optional[float] = None   # a point of the spread grid
        self._last_capacity: Optional[dict] = None
        self._last_errors: list[str] = []
        self._known_classes: set[str] = set()
        self._known_traits: set[str] = set()

    # -- reading

    def _verify_due(self) -> bool:
        # An interval of 0 means every sync verifies, also when it was set
        # after the last verify scheduled the next one.
        return (self._cache is None or self._due_at is None or self.full_verify_interval <= 0
                or self.clock() >= self._due_at)

    def _next_due(self, now: float, host: str) -> float:
        interval = self.full_verify_interval
        if not self.spread or interval <= 0:
            return now + interval
        if self._anchor is None:
            self._anchor = now - interval * (1.0 - verify_phase(host))
        return self._anchor + (math.floor((now - self._anchor) / interval) + 1) * interval

    @property
    def next_verify_at(self) -> Optional[float]:
        """When (on :attr:`clock`) the next full verify is due; None: the
        next sync verifies."""
        return None if self._cache is None else self._due_at

    def _lookup_by_name(self, name: str) -> Optional[dict]:
        found = self.client.providers_named(name)
        return found[0] if found else None

    def _read_provider(self, rp: dict) -> ProviderState:
        inventories = self.client.inventories(rp["uuid"])
        traits = self.client.traits(rp["uuid"])
        self._note_generation(rp["uuid"], inventories["resource_provider_generation"],
                              traits["resource_provider_generation"])
        return ProviderState(rp["uuid"], rp["name"],
                             traits["resource_provider_generation"],
                             rp.get("parent_provider_uuid"),
                             inventories["inventories"],
                             frozenset(traits["traits"]))

    def _full_read(self, root_uuid: str) -> dict[str, ProviderState]:
        """GET the tree; inventories and traits only of providers whose
        generation moved since we last saw them."""
        listing = self.client.providers_in_tree(root_uuid)
        old = self._cache or {}
        actual = {}
        for rp in listing:
            known = old.get(rp["uuid"])
            if (known is not None and known.generation == rp["generation"]
                    and rp["uuid"] not in self._partial):
                actual[rp["uuid"]] = replace(
                    known, name=rp["name"],
                    parent_uuid=rp.get("parent_provider_uuid"))
            else:
                actual[rp["uuid"]] = self._read_provider(rp)
        return actual

    def _root_uuid(self, desired: ProviderTree) -> Optional[str]:
        if self._state.get(ROOT_UUID):
            return self._state[ROOT_UUID]
        if self._cache is not None and not self._verify_due():
            # Read this verify period (the owner check just before a sync,
            # say): the cache answers, found or not, without a second lookup.
            return next((s.uuid for s in self._cache.values()
                         if s.name == desired.root.name and s.parent_uuid is None), None)
        found = self._lookup_by_name(desired.root.name)
        return found["uuid"] if found else None

    def _actual(self, root_uuid: Optional[str], host: str) -> dict[str, ProviderState]:
        if self._cache is not None and not self._verify_due():
            return dict(self._cache)
        actual = self._full_read(root_uuid) if root_uuid else {}
        now = self.clock()
        self._cache, self._verified_at = dict(actual), now
        self._due_at = self._next_due(now, host)
        return actual

    def _prepare(self, desired: ProviderTree) -> _Context:
        root_uuid = self._root_uuid(desired)
        actual = self._actual(root_uuid, desired.root.name)
        by_name = {s.name: s.uuid for s in actual.values()}
        saved = self._state.get(PROVIDERS, {})
        uuids = {p.name: by_name.get(p.name) or saved.get(p.name)
                 or str(uuidlib.uuid4()) for p in desired.providers}
        if root_uuid:
            uuids[desired.root.name] = root_uuid
        if self.owner is not None:
            desired = self._claimed(desired, actual.get(root_uuid) if root_uuid else None,
                                    self.owner)
        return _Context(desired.placed(uuids), actual)

    def _claimed(self, desired: ProviderTree, root: Optional[ProviderState],
                 owner: root_owner.Identity) -> ProviderTree:
        verdict = root_owner.judge(None if root is None else root.traits, owner)
        # judge() lets the agent write a root that Placement does not hold yet.
        if root is not None and not verdict.may_write:
            raise ProviderOwned(root_owner.refusal(verdict, desired.root.name, root.uuid))
        if verdict.owner != self._judged and root is not None:
            if verdict.owner in (root_owner.OWNED_BY_NOVA, root_owner.OTHER_MACHINE):
                LOG.warning("taking over provider %s (%s) from %s ([agent] "
                            "take_over_provider)", desired.root.name, root.uuid, verdict.owner)
            elif verdict.owner == root_owner.UNMARKED:
                LOG.info("adopting provider %s (%s), which no machine has marked",
                         desired.root.name, root.uuid)
        self._judged = verdict.owner
        return root_owner.claimed(desired, verdict)

    def traits_by_name(self, desired: ProviderTree) -> dict[str, frozenset]:
        """Provider name -> traits, as Placement holds this host's tree now
        (read as :meth:`plan` does; the sync that follows costs no more)."""
        return {s.name: s.traits for s in self._prepare(desired).actual.values()}

    def check_owner(self, desired: ProviderTree) -> None:
        """Raise ProviderOwned when this host's root is not this agent's to
        write. Reads as :meth:`plan` does, so the sync that follows costs no
        extra request."""
        self._prepare(desired)

    def _owned(self, ctx: _Context) -> set[str]:
        """Children we created, plus children in the tree bearing a name we
        want (ours even if the state file was lost)."""
        wanted = {ctx.tree.uuid(p) for p in ctx.tree.providers[1:]}
        found = {u for u in wanted if u in ctx.actual}
        return set(self._state.get(OWNED_CHILDREN, [])) | found

    def _plan(self, ctx: _Context) -> list[Change]:
        return plan_changes(ctx.tree, ctx.actual, self._owned(ctx),
                            known_resource_classes=self._known_classes,
                            known_traits=self._known_traits)

    def plan(self, desired: ProviderTree) -> list[Change]:
        """The changes :meth:`sync` would apply now. Reads, never writes.

        Providers unknown to the state and to Placement get a fresh uuid4 in
        the plan; it is not saved.
        """
        return self.plan_with_tree(desired)[1]

    def root_traits(self, desired: ProviderTree) -> Optional[frozenset]:
        """The traits Placement holds on this host's root (None: no root
        yet). Reads as :meth:`plan` does, so the sync that follows costs no
        extra request."""
        ctx = self._prepare(desired)
        root = ctx.actual.get(ctx.tree.root_uuid)
        return None if root is None else root.traits

    def held_children(self, desired: ProviderTree) -> tuple[Optional[str], list[ProviderState]]:
        """The root's uuid (None: no root yet) and its children as Placement
        holds them. Reads as :meth:`plan` does: the sync that follows costs
        no extra request."""
        ctx = self._prepare(desired)
        root = ctx.tree.root_uuid
        return root, [s for s in ctx.actual.values() if root and s.parent_uuid == root]

    def plan_with_tree(self, desired: ProviderTree,
                       limits: Optional[cap.HostLimits] = None,
                       consumer_names: Optional[Mapping[str, str]] = None
                       ) -> tuple[PlacedTree, list[Change]]:
        """Like :meth:`plan`, also returning the tree with the uuids it would use.

        With ``limits`` the plan is the one :meth:`sync` would send after
        the capacity invariant's holds; :meth:`last_capacity` then tells
        the verdict."""
        ctx = self._prepare(desired)
        changes = self._plan(ctx)
        if limits is not None:
            changes = self._enforce(ctx, changes, limits, consumer_names or {})
        self._last_capacity = ctx.capacity
        return ctx.tree, changes

    @property
    def last_capacity(self) -> Optional[dict]:
        """The capacity verdict of the last plan or sync (None: not checked)."""
        return self._last_capacity

    # -- the capacity invariant

    def _enforce(self, ctx: _Context, changes: list[Change], limits: cap.HostLimits,
                 consumer_names: Mapping[str, str]) -> list[Change]:
        """The plan, changed so that the tree it leaves never overstates the host.

        Shrinks read their provider's usages first (the read the usage
        guard always needed, moved before the decision): classes in use
        keep their record. Then :func:`node_agent.policy.capacity.enforce` checks
        the whole tree as it will be left -- every desired provider after
        those holds, and every other provider of the tree as Placement holds
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
            wanted = _body(change)["inventories"]
            if state is not None:
                wanted, errors, generation = self._guard_usage(change, state, wanted,
                                                               usages_into=ctx.usages)
                ctx.pre[uuid] = generation
                ctx.errors += errors
            planned[uuid] = wanted
        names = {ctx.tree.uuid(p): p.name for p in ctx.tree.providers}
        current = {u: dict(ctx.actual[u].inventories) for u in planned if u in ctx.actual}
        untouched = [cap.Published(s.name, s.parent_uuid is None, s.inventories)
                     for u, s in ctx.actual.items() if u not in planned]
        result = cap.enforce(planned, current, names, ctx.tree.root_uuid, untouched,
                             limits, lambda classes: self._classes_in_use(ctx, classes))
        ctx.planned = planned = {u: dict(inv) for u, inv in result.inventories.items()}
        ctx.closed = set(result.closed)
        ctx.capacity = {**result.wanted.as_dict(), "kept": list(result.kept),
                        "closed": list(result.closed), "blocking": [],
                        "left_ok": result.left.ok}
        if result.refused:
            blocking = self._blocking_consumers(ctx, result.wanted.classes, consumer_names)
            ctx.capacity["blocking"] = blocking
            ctx.errors.append(_capacity_message(result, blocking))
        return self._rewrite_inventory_changes(ctx, changes, planned)

    def _rewrite_inventory_changes(self, ctx: _Context, changes: list[Change],
                                   planned: Mapping[str, dict]) -> list[Change]:
        """``changes`` with inventory PUTs that leave ``planned``;
        shrinks before grows."""
        puts = []
        for provider in ctx.tree.providers:
            uuid = ctx.tree.uuid(provider)
            state = ctx.actual.get(uuid) or ProviderState(
                uuid, provider.name, 0, ctx.tree.parent_uuid(provider))
            change = inventory_change(provider, state, state.generation, planned[uuid])
            if change is None:
                continue
            if any(cap.units(rc, rec) > cap.units(rc, state.inventories[rc])
                   if rc in state.inventories else cap.units(rc, rec) > 0
                   for rc, rec in planned[uuid].items()):
                ctx.grows.add(uuid)
            puts.append(change)
        puts.sort(key=lambda c: c.target in ctx.grows)
        others = [c for c in changes if c.kind != "inventories"]
        at = next((i for i, c in enumerate(others) if c.kind in ("traits", "delete")),
                  len(others))
        return others[:at] + puts + others[at:]

    def _usages_of(self, ctx: _Context, uuid: str) -> dict[str, int]:
        if uuid not in ctx.usages:
            ctx.usages[uuid] = self._usages(uuid)[0]
        return ctx.usages[uuid]

    def _classes_in_use(self, ctx: _Context, classes) -> set[str]:
        used = set()
        for uuid, state in ctx.actual.items():
            if set(classes) & set(state.inventories):
                used |= {rc for rc, n in self._usages_of(ctx, uuid).items()
                         if n and rc in classes}
        return used

    def _blocking_consumers(self, ctx: _Context, classes,
                            consumer_names: Mapping[str, str]) -> list[dict]:
        """Who holds the classes a refused plan touches (read only on refusal)."""
        found = []
        for uuid, state in sorted(ctx.actual.items(), key=lambda kv: kv[1].name):
            if not set(classes) & set(state.inventories):
                continue
            if not any(self._usages_of(ctx, uuid).get(rc) for rc in classes):
                continue
            body = self.client.provider_allocations(uuid)
            for consumer, alloc in sorted(body.get("allocations", {}).items()):
                held = {rc: n for rc, n in alloc.get("resources", {}).items()
                        if rc in classes}
                if held:
                    found.append({"consumer": consumer, "guest": consumer_names.get(consumer),
                                  "provider": state.name, "resources": held})
        return found

    # -- writing

    def sync(self, desired: ProviderTree, limits: Optional[cap.HostLimits] = None,
             consumer_names: Optional[Mapping[str, str]] = None) -> SyncReport:
        """Apply the plan; see the class docstring for the failure contract.

        With ``limits`` (the host's, :func:`node_agent.policy.capacity.host_limits`)
        nothing is sent that would leave Placement overstating the host: see
        :meth:`_enforce`. ``consumer_names`` (consumer uuid -> guest name)
        lets a refusal name the guests that block it.
        """
        start_reads, start_writes = self.client.stats.reads, self.client.stats.writes
        report = SyncReport(full_verify=self._verify_due())
        again = limits is not None
        try:
            attempt = 0
            while attempt < 2:
                ctx = self._prepare(desired)
                changes = self._plan(ctx)
                if limits is not None:
                    changes = self._enforce(ctx, changes, limits, consumer_names or {})
                before = len(report.applied)
                try:
                    self._apply(ctx, changes, report, attempt)
                except _Replan:
                    self._suspect()
                    attempt += 1
                    continue
                self._save_state(ctx)
                report.tree = _as_left(ctx)
                deleted = any(c.kind == "delete" for c in report.applied[before:])
                if again and ctx.capacity and ctx.capacity["kept"] and deleted:
                    # Children went away: what was held for them may fit now.
                    again = False
                    continue
                report.errors += [e for e in ctx.errors if e not in report.errors]
                report.capacity = ctx.capacity
                break
            else:
                report.errors.append(
                    "the tree changed in Placement while it was being synced; "
                    "it will be read again next cycle")
        except BaseException:
            self._suspect()  # unknown how far we got: verify next time
            raise
        finally:
            report.reads = self.client.stats.reads - start_reads
            report.writes = self.client.stats.writes - start_writes
        # A refusal that stays (a guest blocks a change for days) is logged
        # as a WARNING when it appears or changes, then once per cycle at INFO;
        # a steady cycle (nothing to change) is DEBUG: silent at INFO.
        if report.errors:
            log = LOG.warning if report.errors != self._last_errors else LOG.info
        else:
            log = LOG.info if report.applied else LOG.debug
        self._last_errors = list(report.errors)
        log("placement sync: %s", report.summary())
        return report

    def _save_state(self, ctx: _Context) -> None:
        held = self._held
        uuids = {p.name: ctx.tree.uuid(p) for p in ctx.tree.providers}
        created_or_found = {uuids[p.name] for p in ctx.tree.providers[1:]
                            if uuids[p.name] in held}
        owned = (set(self._state.get(OWNED_CHILDREN, [])) | created_or_found)
        owned &= set(held)
        root = ctx.tree.root_uuid
        new = {ROOT_UUID: root if root in held else
               self._state.get(ROOT_UUID),
               PROVIDERS: {name: uuid for name, uuid in uuids.items() if uuid in held},
               OWNED_CHILDREN: sorted(owned)}
        if any(self._state.get(key) != value for key, value in new.items()):
            # Other writers (the maintenance command, the cycle's remembered
            # operator traits) own the other keys.
            self._state = self.store.update(lambda saved: saved.update(new))

    @property
    def _held(self) -> dict[str, ProviderState]:
        """The cache, while a sync writes: :meth:`_prepare` always leaves one."""
        if self._cache is None:
            raise RuntimeError("no provider cache: the tree is read before it is written")
        return self._cache

    def cached(self) -> Optional[dict[str, ProviderState]]:
        """What the cache says Placement holds (uuid -> state), None without one."""
        return None if self._cache is None else dict(self._cache)

    def _suspect(self) -> None:
        """Unknown how far the last requests got: the next sync verifies.

        The cache stays. It only ever holds what Placement answered, each
        provider at the generation of that answer, so the verify's listing
        tells which providers moved (a write that landed but whose answer
        was lost, or someone else's) and only those are read again: a
        recovery costs what a verify costs, not a re-read of the tree.
        """
        self._verified_at = self._due_at = None

    def invalidate(self) -> None:
        """Forget the cache: the next sync re-reads the whole tree."""
        self._cache = None
        self._partial.clear()

    def _note_generation(self, uuid: str, inventories_at: int, traits_at: int) -> None:
        """A full read is consistent only if both parts were read at one
        generation; otherwise the next verify reads the provider again."""
        if inventories_at != traits_at:
            self._partial.add(uuid)
        else:
            self._partial.discard(uuid)

    def export_cache(self) -> Optional[dict]:
        """The cache as JSON-able data (each provider's uuid, name,
        generation, parent, inventories and traits) with ``verified_at``,
        this syncer's clock at its last full read; None when it has none.

        Another syncer of the same tree may :meth:`import_cache` it, in
        another process when both clocks are the wall clock (``time.time``).
        """
        if self._cache is None or self._verified_at is None:
            return None
        return {"verified_at": self._verified_at,
                # A partly known provider is exported with no usable
                # generation, so the importer reads it at its next verify.
                "providers": [{"uuid": s.uuid, "name": s.name,
                               "generation": -1 if s.uuid in self._partial else s.generation,
                               "parent_uuid": s.parent_uuid,
                               "inventories": {rc: dict(inv)
                                               for rc, inv in s.inventories.items()},
                               "traits": sorted(s.traits)}
                              for s in self._cache.values()]}

    def import_cache(self, data: Optional[Mapping], verify_now: bool = False) -> bool:
        """Take over a cache from :meth:`export_cache`; False (and no cache:
        the next sync reads the tree) when ``data`` is None or malformed.

        It stays a hint, as our own cache is: a generation that moved since
        turns into a 409 and a re-read of that provider, and the full verify
        is due ``full_verify_interval`` after ``verified_at`` (a time ahead
        of this clock counts as now), or at the next read with
        ``verify_now`` (a cache from another clock, a previous process's):
        the listing, then only the providers whose generation moved.
        """
        self._cache = self._verified_at = self._due_at = None
        self._partial.clear()
        if data is None:
            return False
        try:
            cache = {p["uuid"]: ProviderState(
                str(p["uuid"]), str(p["name"]), int(p["generation"]), p["parent_uuid"],
                {rc: dict(inv) for rc, inv in p["inventories"].items()},
                frozenset(p["traits"])) for p in data["providers"]}
            verified_at = min(float(data["verified_at"]), self.clock())
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            LOG.warning("ignoring a malformed provider cache (%s); the tree will be read",
                        exc)
            return False
        self._cache, self._verified_at = cache, verified_at
        self._due_at = None if verify_now else verified_at + self.full_verify_interval
        return True

    def note_inventories(self, inventories_by_uuid: Mapping[str, Mapping]) -> None:
        """Someone else (the reshape) set these providers' inventories.

        The cache takes them, so an unchanged tree costs nothing next sync.
        The cached generations are now old: a later write gets a 409 and
        re-reads that provider, as after any concurrent change.
        """
        if self._cache is None:
            return
        for uuid, inventories in inventories_by_uuid.items():
            if uuid in self._cache:
                self._cache[uuid] = replace(self._cache[uuid], inventories=dict(inventories))

    @property
    def verified_at(self) -> Optional[float]:
        """When the whole tree was last read (``clock`` time), None before:
        a caller sees a full verify happen when this moves."""
        return self._verified_at

    def cached_tree(self) -> Optional[list[ProviderState]]:
        """The tree as the cache holds it, or None before the first read."""
        return None if self._cache is None else list(self._cache.values())

    @property
    def owned_children(self) -> list[str]:
        return list(self._state.get(OWNED_CHILDREN, []))

    def claim_children(self, uuids: Iterable[str]) -> None:
        """These children are the agent's (found by name and mark after a
        lost state file): the next sync deletes them if the tree dropped them."""
        self._state = {**self._state, OWNED_CHILDREN: sorted(
            set(self._state.get(OWNED_CHILDREN, [])) | set(uuids))}

    def remember(self, key: str, value) -> None:
        """Keep ``value`` under ``key`` in the state file (saved only on change)."""
        if self._state.get(key) == value:
            return
        self._state = self.store.put(key, value)

    @property
    def state(self) -> dict:
        return dict(self._state)

    def _apply(self, ctx: _Context, changes: list[Change], report: SyncReport,
               attempt: int) -> None:
        handlers = {"resource_class": self._define, "trait": self._define,
                    "create": self._create, "update": self._update,
                    "inventories": self._put_inventories,
                    "traits": self._put_traits, "delete": self._delete}
        for change in changes:
            if self._blocked(ctx, change):
                report.errors.append(f"skipped ({change.summary}): its "
                                     "provider or parent could not be created")
                continue
            if (change.kind == "inventories" and ctx.shrink_failed
                    and change.target in ctx.grows):
                report.errors.append(f"skipped ({change.summary}): an earlier inventory "
                                     "change failed, and growing now could overstate "
                                     "the host")
                continue
            try:
                applied, errors = handlers[change.kind](ctx, change, attempt)
            except NotFound:
                raise _Replan() from None
            except (GenerationConflict, InventoryInUse, DuplicateName) as exc:
                applied, errors = False, [f"{change.summary}: {exc}"]
            except PlacementError as exc:
                status = getattr(exc, "status", None)
                if status is None or status >= 500 or status in (401, 403):
                    raise
                applied, errors = False, [f"{change.summary}: {exc}"]
            if applied:
                report.applied.append(change)
            elif errors and change.kind == "inventories":
                ctx.shrink_failed = True
            if errors and change.kind == "create":
                ctx.failed.add(change.provider)
            report.errors += errors

    def _blocked(self, ctx: _Context, change: Change) -> bool:
        if change.provider is None:
            return False
        if change.provider in ctx.failed:
            return True
        provider = ctx.tree.by_name(change.provider)
        if provider is not None and provider.parent in ctx.failed:
            ctx.failed.add(change.provider)
            return True
        return False

    def _define(self, ctx: _Context, change: Change, attempt: int) -> tuple[bool, list[str]]:
        self.client.send(change)
        (self._known_classes if change.kind == "resource_class"
         else self._known_traits).add(change.target)
        return True, []

    def _create(self, ctx: _Context, change: Change, attempt: int) -> tuple[bool, list[str]]:
        """POST the provider. 409 duplicate name: adopt the provider of that
        name if it is our root or in our tree, then re-plan; else an error."""
        try:
            created = self.client.send(change) or {}
        except DuplicateName:
            return False, self._adopt(ctx, change, attempt)
        body = _body(change)
        self._held[body["uuid"]] = ProviderState(
            body["uuid"], body["name"], created.get("generation", 0),
            body.get("parent_provider_uuid"))
        ctx.created.add(body["uuid"])
        return True, []

    def _adopt(self, ctx: _Context, change: Change, attempt: int) -> list[str]:
        name = _body(change)["name"]
        found = self._lookup_by_name(name)
        root = ctx.tree.root
        if found is not None and attempt == 0 and (
                name == root.name or found.get("root_provider_uuid") == ctx.tree.root_uuid):
            if name == root.name:
                self._state = {**self._state, ROOT_UUID: found["uuid"]}
            self._state = {**self._state, PROVIDERS: {
                **self._state.get(PROVIDERS, {}), name: found["uuid"]}}
            LOG.info("adopting existing provider %s (%s)", name, found["uuid"])
            raise _Replan()
        where = (f"uuid {found['uuid']}, tree {found.get('root_provider_uuid')}"
                 if found else f"uuid {_body(change)['uuid']} is taken")
        return [f"cannot create provider {name}: a provider with that name or "
                f"uuid already exists outside this host's tree ({where}); "
                "rename or delete it"]

    def _update(self, ctx: _Context, change: Change, attempt: int) -> tuple[bool, list[str]]:
        result = self.client.send(change) or {}
        uuid = change.target
        self._held[uuid] = replace(
            self._held[uuid], name=_body(change)["name"],
            parent_uuid=_body(change)["parent_provider_uuid"],
            generation=result.get("generation", self._held[uuid].generation))
        return True, []

    def _delete(self, ctx: _Context, change: Change, attempt: int) -> tuple[bool, list[str]]:
        """DELETE an owned child. 409 (allocations, or children): an error
        naming the provider; it stays owned and is retried next cycle."""
        uuid = change.target
        try:
            self.client.send(change)
        except PlacementError as exc:
            if getattr(exc, "status", None) != 409:
                raise
            return False, [f"cannot delete provider {change.provider}: "
                           f"{exc}; move or delete what uses it"]
        self._held.pop(uuid, None)
        self._state = {**self._state, OWNED_CHILDREN: [
            u for u in self._state.get(OWNED_CHILDREN, []) if u != uuid]}
        return True, []

    # -- inventories

    def _retrying(self):
        return tenacity.Retrying(
            stop=tenacity.stop_after_attempt(CONFLICT_ATTEMPTS),
            retry=tenacity.retry_if_exception_type(GenerationConflict),
            reraise=True)

    def _reread_inventories(self, uuid: str) -> ProviderState:
        got = self.client.inventories(uuid)
        self._mark_if_moved(uuid, got["resource_provider_generation"])
        state = replace(self._held[uuid],
                        generation=got["resource_provider_generation"],
                        inventories=got["inventories"])
        self._held[uuid] = state
        return state

    def _mark_if_moved(self, uuid: str, generation: int) -> None:
        """A part of the record read at ``generation``: partial if it moved."""
        if generation != self._held[uuid].generation:
            self._partial.add(uuid)

    def _put_inventories(self, ctx: _Context, change: Change, attempt: int) -> tuple[bool, list[str]]:
        """PUT the whole inventory with the cached generation.

        409 concurrent_update: re-read this provider's inventories and retry
        (bounded). Classes whose usage exceeds the new capacity (409
        inventory.inuse, or a shrink below usage that Placement would only
        log) keep their current record and are reported; the others apply.
        """
        uuid = change.target
        wanted_all = _body(change)["inventories"]
        errors: list[str] = []
        for try_ in self._retrying():
            with try_:
                state = self._held[uuid]
                if try_.retry_state.attempt_number > 1:
                    state = self._reread_inventories(uuid)
                if ctx.planned is not None and try_.retry_state.attempt_number == 1:
                    # Guarded and checked by _enforce before anything was sent.
                    wanted, errors = wanted_all, []
                    generation = ctx.pre.get(uuid, state.generation)
                else:
                    wanted, errors, generation = self._guard_usage(change, state, wanted_all,
                                                                   closed=ctx.closed)
                    if errors and ctx.planned is not None:
                        # Usage grew since the check: holding one class while
                        # the others change was never checked. Next cycle.
                        return False, errors
                self._mark_if_moved(uuid, generation)
                if inventories_equal(state.inventories, wanted):
                    return False, errors
                try:
                    result = self.client.put_inventories(uuid, {
                        "resource_provider_generation": generation,
                        "inventories": wanted})
                except InventoryInUse:
                    return False, self._in_use_errors(change, state, wanted_all)
        self._held[uuid] = replace(
            state, generation=result["resource_provider_generation"],
            inventories=result["inventories"])
        return True, errors

    def _shrinks(self, old: Mapping, new: Mapping) -> bool:
        return any(rc not in new or guarded_capacity(old[rc], new[rc]) < capacity(old[rc])
                   for rc in old)

    def _usages(self, uuid: str) -> tuple[dict[str, int], int]:
        """Usages and the provider generation they were read at."""
        body = self.client.usages(uuid)
        return body["usages"], body["resource_provider_generation"]

    def _over_used(self, usages: Mapping[str, int], wanted: Mapping[str, Mapping],
                   current: Mapping[str, Mapping]) -> dict[str, tuple[int, int]]:
        """rc -> (used, new capacity) for classes the change would starve."""
        over = {}
        for rc, used in usages.items():
            new_cap = guarded_capacity(current.get(rc), wanted[rc]) if rc in wanted else 0
            if used and used > new_cap:
                over[rc] = (used, new_cap)
        return over

    def _guard_usage(self, change, state, wanted_all, closed=(), usages_into=None):
        """(inventories to PUT, errors, generation to PUT with). A shrink reads
        the usages first; that read also gives a fresh generation, so an
        allocation made since the last cycle costs no 409. Classes in
        ``closed`` are fully reserved on purpose (capacity invariant) and
        not held back."""
        if not self._shrinks(state.inventories, wanted_all):
            return wanted_all, [], state.generation
        usages, generation = self._usages(state.uuid)
        if usages_into is not None:
            usages_into[state.uuid] = usages
        over = {rc: v for rc, v in self._over_used(usages, wanted_all,
                                                   state.inventories).items()
                if rc not in closed}
        wanted = dict(wanted_all)
        for rc in over:
            if rc in state.inventories:
                wanted[rc] = state.inventories[rc]
        return wanted, [_in_use_message(rc, change.provider, used, cap)
                        for rc, (used, cap) in sorted(over.items())], generation

    def _in_use_errors(self, change, state, wanted_all) -> list[str]:
        over = self._over_used(self._usages(state.uuid)[0], wanted_all, state.inventories)
        return [_in_use_message(rc, change.provider, used, cap)
                for rc, (used, cap) in sorted(over.items())] or [
            f"{change.summary}: Placement reports inventory in use"]

    # -- traits

    def _put_traits(self, ctx: _Context, change: Change, attempt: int) -> tuple[bool, list[str]]:
        """GET the provider's traits, then PUT them with the agent's traits
        merged in; traits the agent has no opinion on are kept. 409
        concurrent_update: GET again and retry (bounded). A provider created
        in this cycle has no traits yet, so its GET is skipped."""
        uuid = change.target
        provider = ctx.tree.by_name(change.provider) if change.provider else None
        if provider is None:
            raise ValueError(f"{change.summary}: its provider is not in the desired tree")
        for try_ in self._retrying():
            with try_:
                state = self._held[uuid]
                if uuid not in ctx.created or try_.retry_state.attempt_number > 1:
                    got = self.client.traits(uuid)
                    self._mark_if_moved(uuid, got["resource_provider_generation"])
                    state = replace(state, traits=frozenset(got["traits"]),
                                    generation=got["resource_provider_generation"])
                    self._held[uuid] = state
                merged = merged_traits(state.traits, provider)
                if merged == state.traits:
                    return False, []
                result = self.client.put_traits(uuid, {
                    "resource_provider_generation": state.generation,
                    "traits": sorted(merged)})
        self._held[uuid] = replace(
            state, generation=result["resource_provider_generation"],
            traits=frozenset(result["traits"]))
        return True, []
