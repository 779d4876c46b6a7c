"""Make Placement hold the desired provider tree, with as few requests as we can.

:class:`TreeSyncer` (shell) reads what it must, applies the plan of
:func:`node_agent.placement.planner.plan_changes` (pure) and keeps a cache of
what Placement holds, so a cycle where nothing changed sends no request at
all. A full re-read every ``full_verify_interval`` seconds catches changes
made behind its back; with ``spread`` each host's verifies fall at its own
phase of the interval (:func:`~node_agent.placement.planner.verify_phase`).

The syncer reads, plans and keeps the state file's uuids; it delegates:

* :mod:`~node_agent.placement.tree_cache`: what Placement holds, at which
  generations, which providers were read only in part, when the next verify
  is due, and the cache as plain data for the state file and the applier;
* :mod:`~node_agent.placement.root_claim`: whose root this is, before any write;
* :mod:`~node_agent.placement.capacity_gate`: the plan changed so that it
  never overstates the host, and :mod:`~node_agent.placement.usage_guard`:
  no class is removed while allocations hold it (Placement would refuse);
  a capacity cut below usage is written, as nova does, and reported
  (:attr:`SyncReport.cuts`);
* :mod:`~node_agent.placement.tree_writer`: the requests, with their 409 cases.
"""

from __future__ import annotations

import logging
import time
import uuid as uuidlib
from dataclasses import replace
from typing import Callable, Iterable, Mapping, Optional

from node_agent.errors import ProviderOwned
from node_agent.model.provider_state import ProviderState
from node_agent.model.provider_tree import PlacedTree, Provider, ProviderTree
from node_agent.placement.capacity_gate import CapacityGate, as_left
from node_agent.placement.errors import PlacementError
from node_agent.placement.planner import Change, plan_changes
from node_agent.placement.root_claim import RootClaim
from node_agent.placement.sync_context import Replan, SyncContext, SyncReport
from node_agent.placement.tree_cache import TreeCache
from node_agent.placement.tree_writer import TreeWriter
from node_agent.placement.usage_guard import UsageGuard
from node_agent.policy import aggregates as aggs
from node_agent.policy import capacity as cap
from node_agent.policy import root_owner
from node_agent.state import AGGREGATES, OWNED_CHILDREN, PROVIDERS, ROOT_UUID, Store
from node_agent.tree import pci_placement
from node_agent.tree.child_names import child_suffix

LOG = logging.getLogger(__name__)


class TreeSyncer:
    """Keeps one provider tree in Placement equal to the desired one.

    The state store keeps the uuids (the root's above all: it must never
    change) and the children the agent created; the in-memory cache keeps
    what Placement held after the last write. :meth:`sync` raises
    :class:`~node_agent.placement.client.Unavailable` or ``AuthError`` when Placement
    cannot be used; the state file is then left as it was and the next cycle
    verifies the tree (the listing, then only providers whose generation
    moved). Refusals that concern one provider (removing a class in use, a
    delete refused) are reported in :attr:`SyncReport.errors` and the rest
    of the tree is still synced. Capacity cuts written below usage are not
    errors: :attr:`SyncReport.cuts`.
    """

    def __init__(
        self,
        client,
        store: Store,
        full_verify_interval: float = 300,
        clock: Callable[[], float] = time.monotonic,
        spread: bool = False,
        owner: Optional[root_owner.Identity] = None,
        former_names: Iterable[str] = (),
    ):
        """``spread``: the first verify after the first read is due at this
        host's phase of the interval (:func:`verify_phase` of the root's
        name), and the later ones on that grid, every interval; without it
        every verify is due one interval after the previous one.

        ``owner``: this machine's identity. Every plan and sync then judges
        the root as Placement holds it (:func:`node_agent.policy.root_owner.judge`)
        and raises :class:`~node_agent.errors.ProviderOwned` before any write
        when nova-compute or another machine manages it.

        ``former_names``: names this host's root may still have from an
        earlier release (the machine's hostname, before the agent took
        libvirt's). A root of such a name carrying this machine's mark is
        renamed when the state file that kept its uuid is lost, rather than
        a second root created."""
        self.client = client
        self._former = frozenset(former_names)
        self.owner = owner
        self._claim = (
            None if owner is None else RootClaim(owner, str(getattr(store, "path", "") or ""))
        )
        self.store = store
        self.full_verify_interval = full_verify_interval
        self.clock = clock
        self.spread = spread
        self._state = store.load_or_empty(LOG)
        # The provider cache as this syncer last kept or took it from the
        # state file (JSON text; node_agent.cycle.provider_cache), so a cycle
        # can tell another run of the host wrote the file since.
        self.cache_seen: Optional[str] = None
        self._cache = TreeCache()
        # What _pci_at_usage read of PCI children this cycle (_read_once):
        # (what, uuid) -> ((generation, holders), the answer).
        self._pci_reads: dict[tuple[str, str], tuple[tuple, dict]] = {}
        self._holds_told: tuple = ()
        self._guard = UsageGuard(client)
        self._gate = CapacityGate(client, self._guard)
        self._writer = TreeWriter(
            client,
            self._cache,
            self._guard,
            self._adopted,
            self._deleted,
            self._claim,
            aggregates_ours=self._aggregates_ours,
            aggregates_written=self._aggregates_written,
        )
        self._warned_aggregates: set[str] = set()
        self._last_capacity: Optional[dict] = None
        self._last_cuts: list = []
        self._last_errors: list[str] = []

    # -- reading

    def _verify_due(self) -> bool:
        return self._cache.verify_due(self.clock, self.full_verify_interval)

    @property
    def next_verify_at(self) -> Optional[float]:
        """When (on :attr:`clock`) the next full verify is due; None: the
        next sync verifies."""
        return self._cache.next_verify_at

    def _lookup_by_name(self, name: str) -> Optional[dict]:
        found = self.client.providers_named(name)
        return found[0] if found else None

    def _read_provider(self, rp: dict) -> ProviderState:
        inventories = self.client.inventories(rp["uuid"])
        traits = self.client.traits(rp["uuid"])
        self._cache.note_generation(
            rp["uuid"],
            inventories["resource_provider_generation"],
            traits["resource_provider_generation"],
        )
        return ProviderState(
            rp["uuid"],
            rp["name"],
            traits["resource_provider_generation"],
            rp.get("parent_provider_uuid"),
            inventories["inventories"],
            frozenset(traits["traits"]),
        )

    def _full_read(self, root_uuid: str) -> dict[str, ProviderState]:
        """GET the tree; inventories and traits only of providers whose
        generation moved since we last saw them."""
        listing = self.client.providers_in_tree(root_uuid)
        actual = {}
        for rp in listing:
            known = self._cache.fresh(rp["uuid"], rp["generation"])
            if known is not None:
                actual[rp["uuid"]] = replace(
                    known, name=rp["name"], parent_uuid=rp.get("parent_provider_uuid")
                )
            else:
                actual[rp["uuid"]] = self._read_provider(rp)
        return actual

    def _root_uuid(self, desired: ProviderTree) -> Optional[str]:
        if self._state.get(ROOT_UUID):
            return self._state[ROOT_UUID]
        cached = self._cache.providers
        if cached is not None and not self._verify_due():
            # Read this verify period (the owner check just before a sync,
            # say): the cache answers, found or not, without a second lookup.
            roots = [s for s in cached.values() if s.parent_uuid is None]
            named = [s.uuid for s in roots if s.name == desired.root.name]
            mark = self._claim.owner.mark if self._claim is not None else None
            marked = [s.uuid for s in roots if s.name in self._former and mark in s.traits]
            return named[0] if named else marked[0] if len(marked) == 1 else None
        found = self._lookup_by_name(desired.root.name)
        mine = self._marked_roots()
        if found is None and self._former:
            # This machine's root under a former name (see ``former_names``):
            # the state file that kept its uuid is gone; renaming it beats a
            # second root for the same machine.
            former = [rp for rp in mine if rp["name"] in self._former]
            found = former[0] if len(former) == 1 else None
        uuid = found["uuid"] if found else None
        others = [(rp["name"], rp["uuid"]) for rp in mine if rp["uuid"] != uuid]
        if others:
            # A rename with a lost state file, or a clone that kept
            # /etc/machine-id: another root carries this machine's mark.
            raise ProviderOwned(
                root_owner.second_root_refusal(desired.root.name, others, self._mark() or "", uuid)
            )
        return uuid

    def _mark(self) -> Optional[str]:
        return self.owner.mark if self.owner is not None else None

    def _marked_roots(self) -> list[dict]:
        """The roots carrying this machine's mark: one GET, made only when
        the state file does not name the root."""
        mark = self._mark()
        if not mark:
            return []
        try:
            marked = self.client.providers_with_trait(mark)
        except PlacementError as exc:
            if getattr(exc, "status", None) != 400:
                raise
            return []  # the trait is not defined yet: no provider carries it
        return [rp for rp in marked if not rp.get("parent_provider_uuid")]

    def _actual(
        self, root_uuid: Optional[str], host: str, aggregates: bool = False
    ) -> dict[str, ProviderState]:
        """What Placement holds of the tree; ``aggregates``: the root's
        aggregates too (read once, then kept in the cache like the rest)."""
        cached = self._cache.providers
        if cached is not None and not self._verify_due():
            actual = dict(cached)
        else:
            actual = self._full_read(root_uuid) if root_uuid else {}
            now = self.clock()
            self._cache.read_whole(
                actual, now, self._cache.next_due(now, host, self.full_verify_interval, self.spread)
            )
        if aggregates and root_uuid in actual and actual[root_uuid].aggregates is None:
            actual[root_uuid] = self._read_aggregates(actual[root_uuid])
        return actual

    def _read_aggregates(self, state: ProviderState) -> ProviderState:
        got = self.client.aggregates(state.uuid)
        held = self._cache.held
        if state.uuid in held:
            self._cache.mark_if_moved(state.uuid, got["resource_provider_generation"])
        state = replace(state, aggregates=frozenset(got["aggregates"]))
        if state.uuid in held:
            held[state.uuid] = replace(held[state.uuid], aggregates=state.aggregates)
        return state

    def root_aggregates(self, root_uuid: str) -> frozenset:
        """The root's aggregates as Placement holds them: from the cache, or
        one GET kept in the cache (the sync that follows, which reads them
        when it has aggregates to keep, then reads them no more)."""
        held = (self._cache.providers or {}).get(root_uuid)
        if held is not None and held.aggregates is not None:
            return held.aggregates
        if held is not None:
            return self._read_aggregates(held).aggregates or frozenset()
        return frozenset(self.client.aggregates(root_uuid)["aggregates"])

    def aggregates_ours(self, root_uuid: str) -> frozenset:
        """The root's aggregates the state file says the agent added."""
        return self._aggregates_ours(root_uuid) or frozenset()

    def release_aggregates(self, root_uuid: str, aggregates: Iterable[str]) -> None:
        """Count ``aggregates`` as the agent's on the root: the next sync
        removes them unless the tree still wants them. For the aggregate of
        a sharing provider this host's DISK_GB left, whoever added it: a
        root in it would be offered the filesystem again on top of its own
        DISK_GB (:mod:`node_agent.policy.shared_storage`)."""
        ours = self.aggregates_ours(root_uuid) | frozenset(aggregates)
        record = {"root_uuid": root_uuid, "ours": sorted(ours)}
        if self._state.get(AGGREGATES) != record:
            self._state = self.store.put(AGGREGATES, record)

    def _aggregates_ours(self, root_uuid: Optional[str]) -> Optional[frozenset]:
        """The root's aggregates the agent added (the state file's record);
        None when it has no record for this root."""
        record = self._state.get(AGGREGATES)
        if not record or not root_uuid or record.get("root_uuid") != root_uuid:
            return None
        return frozenset(record.get("ours") or ())

    def _aggregates_written(self, root_uuid: str, before: frozenset, after: frozenset) -> None:
        """Record at once which of the root's aggregates are the agent's: a
        crash after this write cannot make the next run remove an
        operator's aggregate (:func:`node_agent.policy.aggregates.owned_after`)."""
        ours = aggs.owned_after(self._aggregates_ours(root_uuid), before, after)
        record = {"root_uuid": root_uuid, "ours": sorted(ours)}
        if self._state.get(AGGREGATES) != record:
            self._state = self.store.put(AGGREGATES, record)

    def _warn_unknown_aggregates(self, ctx: SyncContext) -> None:
        root = ctx.actual.get(ctx.tree.root_uuid)
        if root is None or root.aggregates is None:
            return
        names = aggs.unknown_owner(
            self._aggregates_ours(root.uuid), root.aggregates, ctx.tree.root.aggregates
        )
        new = [n for n in names if n not in self._warned_aggregates]
        if new:
            self._warned_aggregates.update(new)
            LOG.warning("%s", aggs.unknown_owner_warning(ctx.tree.root.name, new))

    def _prepare(self, desired: ProviderTree) -> SyncContext:
        from_state = bool(self._state.get(ROOT_UUID))
        root_uuid = self._root_uuid(desired)
        keeps_aggregates = bool(desired.root.aggregates or self._aggregates_ours(root_uuid))
        actual = self._actual(root_uuid, desired.root.name, keeps_aggregates)
        desired = self._pci_at_usage(desired, actual, root_uuid)
        by_name = {s.name: s.uuid for s in actual.values()}
        saved = self._state.get(PROVIDERS, {})
        held_root = actual.get(root_uuid) if root_uuid else None
        renamed = _renamed(held_root.name if held_root else None, desired.root.name)
        by_suffix = _children_by_suffix(actual.values(), root_uuid, set(desired.names()))
        uuids = {
            p.name: by_name.get(p.name)
            or by_name.get(renamed(p.name))
            or by_suffix.get(p.name[len(desired.root.name) + 1 :] if p.parent else "")
            or saved.get(p.name)
            or str(uuidlib.uuid4())
            for p in desired.providers
        }
        if root_uuid:
            uuids[desired.root.name] = root_uuid
        unclaimed = False
        if self._claim is not None:
            root = actual.get(root_uuid) if root_uuid else None
            desired = self._claim.claimed(desired, root, from_state)
            unclaimed = self._claim.needs_mark(root)
        return SyncContext(desired.placed(uuids), actual, unclaimed=unclaimed)

    def _pci_at_usage(self, desired: ProviderTree, actual, root_uuid) -> ProviderTree:
        """The PCI children as their usage requires
        (:func:`node_agent.tree.pci_placement.at_usage`): usages are read only
        for children that vanish, shrink or are one-time-use and unreserved.
        Then the devices running guests hold without an allocation are
        reserved (:func:`~node_agent.tree.pci_placement.at_guest_holds`):
        the allocations are read only for children a guest holds."""
        held = [
            s for s in actual.values() if root_uuid and pci_placement.is_pci_child(s, root_uuid)
        ]
        if held:
            need = [s for s in held if pci_placement.needs_usage(desired, s)]
            usages = {s.name: self._read_once("usages", s, (), self._guard.usages) for s in need}
            desired = pci_placement.at_usage(desired, held, usages)
        holding = pci_placement.held_by_guests(desired)
        if not holding:
            self._tell_holds(())
            return desired
        # A child Placement does not hold yet has no allocation: all its
        # devices guests hold are reserved from its first write.
        states = {s.name: s for s in held}
        allocations = {
            p.name: self._allocations_held(states[p.name], p)
            for p in desired.providers
            if p.name in holding and p.name in states
        }
        self._tell_holds(pci_placement.holds_without_allocation(desired, allocations))
        return pci_placement.at_guest_holds(desired, allocations)

    def _tell_holds(self, holds: tuple) -> None:
        """A WARNING when the devices held without an allocation appear or
        change; an INFO when none are left."""
        if holds == self._holds_told:
            return
        if holds:
            LOG.warning("%s", pci_placement.holds_message(holds))
        else:
            LOG.info("no PCI device is held by a guest without a Placement allocation any more")
        self._holds_told = holds

    def _allocations_held(self, state: ProviderState, wanted: Provider) -> dict:
        """A held PCI child's allocations by consumer (:meth:`_read_once`)."""
        holders = sorted((rc, inv.guest_held) for rc, inv in wanted.inventories.items())
        return self._read_once(
            "allocations",
            state,
            tuple(holders),
            lambda uuid: pci_placement.allocated_by_consumer(
                self.client.provider_allocations(uuid)
            ),
        )

    def _read_once(self, what: str, state: ProviderState, holders: tuple, read):
        """``read(uuid)`` of a PCI child, once a cycle: every plan, check and
        sync of a cycle prepares the tree, and says the same. Read again
        sooner only when the child's generation (or ``holders``) changes;
        forgotten when a sync ends and when a cycle begins
        (:meth:`begin_cycle`)."""
        key = (what, state.uuid)
        memo = self._pci_reads.get(key)
        if memo is not None and memo[0] == (state.generation, holders):
            return memo[1]
        got = read(state.uuid)
        self._pci_reads[key] = ((state.generation, holders), got)
        return got

    def held_uuids(self, desired: ProviderTree) -> dict[str, str]:
        """Name -> uuid of the desired providers Placement holds, found as
        :meth:`plan` finds them (the state file's root, a renamed root and
        its children, the machine's mark); read as :meth:`check_owner` does."""
        ctx = self._prepare(desired)
        return {p.name: p.uuid for p in ctx.tree.providers if p.uuid and p.uuid in ctx.actual}

    def traits_by_name(self, desired: ProviderTree) -> dict[str, frozenset]:
        """Provider name -> traits, as Placement holds this host's tree now
        (read as :meth:`plan` does; the sync that follows costs no more)."""
        return {s.name: s.traits for s in self._prepare(desired).actual.values()}

    def mark_before_reshape(self, desired: ProviderTree) -> None:
        """This machine's mark on a root Placement holds without it (one
        being adopted or taken over), before a reshape moves anything on it,
        as the sync marks it before its first write: a machine adopting the
        same root at the same moment is refused (ProviderOwned) before
        either moves an allocation. The sync that follows writes it no more."""
        ctx = self._prepare(desired)
        if not ctx.unclaimed or ctx.tree.root_uuid not in ctx.actual:
            return
        self._writer.mark_root(ctx, [c for c in self._plan(ctx) if c.kind == "trait"])

    def check_owner(self, desired: ProviderTree) -> None:
        """Raise ProviderOwned when this host's root is not this agent's to
        write. Reads as :meth:`plan` does, so the sync that follows costs no
        extra request."""
        self._prepare(desired)

    def _owned(self, ctx: SyncContext) -> set[str]:
        """Children we created, plus children in the tree bearing a name we
        want (ours even if the state file was lost)."""
        wanted = {ctx.tree.uuid(p) for p in ctx.tree.providers[1:]}
        found = {u for u in wanted if u in ctx.actual}
        return set(self._state.get(OWNED_CHILDREN, [])) | found

    def _plan(self, ctx: SyncContext) -> list[Change]:
        self._warn_unknown_aggregates(ctx)
        return plan_changes(
            ctx.tree,
            ctx.actual,
            self._owned(ctx),
            known_resource_classes=self._writer.known_classes,
            known_traits=self._writer.known_traits,
            root_aggregates_ours=self._aggregates_ours(ctx.tree.root_uuid),
        )

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

    def plan_with_tree(
        self,
        desired: ProviderTree,
        limits: Optional[cap.HostLimits] = None,
        consumer_names: Optional[Mapping[str, str]] = None,
    ) -> tuple[PlacedTree, list[Change]]:
        """Like :meth:`plan`, also returning the tree with the uuids it would use.

        With ``limits`` the plan is the one :meth:`sync` would send after
        the capacity invariant's holds; :meth:`last_capacity` then tells
        the verdict."""
        ctx = self._prepare(desired)
        changes = self._plan(ctx)
        if limits is not None:
            changes = self._gate.enforce(ctx, changes, limits, consumer_names or {})
        self._last_capacity = ctx.capacity
        self._last_cuts = self._gate.with_holders(ctx, ctx.cuts, consumer_names or {})
        return ctx.tree, changes

    @property
    def last_capacity(self) -> Optional[dict]:
        """The capacity verdict of the last plan or sync (None: not checked)."""
        return self._last_capacity

    @property
    def last_cuts(self) -> list:
        """The capacity cuts below usage the last plan would publish
        (:class:`~node_agent.placement.usage_guard.Cut`, with who holds
        them); known only with ``limits``, when the plan is the gate's."""
        return list(self._last_cuts)

    # -- writing

    def sync(
        self,
        desired: ProviderTree,
        limits: Optional[cap.HostLimits] = None,
        consumer_names: Optional[Mapping[str, str]] = None,
    ) -> SyncReport:
        """Apply the plan; see the class docstring for the failure contract.

        With ``limits`` (the host's, :func:`node_agent.policy.capacity.host_limits`)
        nothing is sent that would leave Placement overstating the host: see
        :meth:`node_agent.placement.capacity_gate.CapacityGate.enforce`.
        ``consumer_names`` (consumer uuid -> guest name) lets a refusal name
        the guests that block it.
        """
        start_reads, start_writes = self.client.stats.reads, self.client.stats.writes
        report = SyncReport(full_verify=self._verify_due())
        again = limits is not None
        written_cuts: list = []
        try:
            attempt = 0
            while attempt < 2:
                ctx = self._prepare(desired)
                changes = self._plan(ctx)
                if limits is not None:
                    changes = self._gate.enforce(ctx, changes, limits, consumer_names or {})
                before = len(report.applied)
                try:
                    self._writer.apply(ctx, changes, report, attempt)
                except Replan:
                    self._suspect()
                    attempt += 1
                    continue
                finally:
                    written_cuts += ctx.written_cuts
                self._save_state(ctx)
                report.tree = as_left(ctx)
                deleted = any(c.kind == "delete" for c in report.applied[before:])
                if again and ctx.capacity and ctx.capacity["kept"] and deleted:
                    # Children went away: what was held for them may fit now.
                    again = False
                    continue
                report.errors += [e for e in ctx.errors if e not in report.errors]
                report.capacity = ctx.capacity
                report.cuts = self._gate.with_holders(ctx, written_cuts, consumer_names or {})
                break
            else:
                report.errors.append(
                    "the tree changed in Placement while it was being synced; "
                    "it will be read again next cycle"
                )
        except BaseException:
            self._suspect()  # unknown how far we got: verify next time
            raise
        finally:
            report.reads = self.client.stats.reads - start_reads
            report.writes = self.client.stats.writes - start_writes
            self._pci_reads.clear()  # the next cycle reads them again
        # A refusal that stays (a guest blocks a change for days) is logged
        # as a WARNING when it appears or changes, then once per cycle at INFO;
        # a steady cycle (nothing to change) is DEBUG: silent at INFO.
        if report.errors:
            log = LOG.warning if report.errors != self._last_errors else LOG.info
        else:
            log = LOG.info if report.applied else LOG.debug
        self._last_errors = list(report.errors)
        log("placement sync: %s", report.summary())
        for cut in report.cuts:
            # Logged once, by the cycle that writes the cut: later cycles
            # have nothing to change, and Placement shows the usage.
            LOG.warning("capacity cut published below usage: %s", cut)
        return report

    def _save_state(self, ctx: SyncContext) -> None:
        held = self._held
        uuids = {p.name: ctx.tree.uuid(p) for p in ctx.tree.providers}
        created_or_found = {uuids[p.name] for p in ctx.tree.providers[1:] if uuids[p.name] in held}
        owned = set(self._state.get(OWNED_CHILDREN, [])) | created_or_found
        owned &= set(held)
        root = ctx.tree.root_uuid
        new = {
            ROOT_UUID: root if root in held else self._state.get(ROOT_UUID),
            PROVIDERS: {name: uuid for name, uuid in uuids.items() if uuid in held},
            OWNED_CHILDREN: sorted(owned),
        }
        if any(self._state.get(key) != value for key, value in new.items()):
            # Other writers (the maintenance command, the cycle's remembered
            # operator traits) own the other keys.
            self._state = self.store.update(lambda saved: saved.update(new))

    @property
    def _held(self) -> dict[str, ProviderState]:
        return self._cache.held

    def cached(self) -> Optional[dict[str, ProviderState]]:
        """What the cache says Placement holds (uuid -> state), None without one."""
        return self._cache.copy()

    def _suspect(self) -> None:
        self._cache.suspect()

    def invalidate(self) -> None:
        """Forget the cache: the next sync re-reads the whole tree."""
        self._cache.invalidate()

    def export_cache(self) -> Optional[dict]:
        """The cache as JSON-able data (:meth:`TreeCache.export`); None when
        it has none.

        Another syncer of the same tree may :meth:`import_cache` it, in
        another process when both clocks are the wall clock (``time.time``).
        """
        return self._cache.export()

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
        return self._cache.load(data, self.clock, self.full_verify_interval, verify_now)

    def known_inventories(self) -> dict[str, tuple[int, dict]]:
        """What the cache knows of each provider's inventories, with the
        generation it was read at (:meth:`TreeCache.known_inventories`)."""
        return self._cache.known_inventories()

    def note_inventories(self, inventories_by_uuid: Mapping[str, Mapping]) -> None:
        """Someone else (the reshape) set these providers' inventories:
        :meth:`TreeCache.note_inventories`."""
        self._cache.note_inventories(inventories_by_uuid)

    def begin_cycle(self) -> None:
        """Forget what this syncer read of PCI children for the last cycle,
        even one that ended before its sync (an error, a refusal): a cycle
        never writes from another cycle's allocations or usages."""
        self._pci_reads.clear()

    @property
    def verified_at(self) -> Optional[float]:
        """When the whole tree was last read (``clock`` time), None before:
        a caller sees a full verify happen when this moves."""
        return self._cache.verified_at

    def cached_tree(self) -> Optional[list[ProviderState]]:
        """The tree as the cache holds it, or None before the first read."""
        providers = self._cache.providers
        return None if providers is None else list(providers.values())

    @property
    def owned_children(self) -> list[str]:
        return list(self._state.get(OWNED_CHILDREN, []))

    def claim_children(self, uuids: Iterable[str]) -> None:
        """These children are the agent's (found by name and mark after a
        lost state file): the next sync deletes them if the tree dropped them."""
        self._state = {
            **self._state,
            OWNED_CHILDREN: sorted(set(self._state.get(OWNED_CHILDREN, [])) | set(uuids)),
        }

    def remember(self, key: str, value) -> None:
        """Keep ``value`` under ``key`` in the state file (saved only on change)."""
        if self._state.get(key) == value:
            return
        self._state = self.store.put(key, value)

    @property
    def state(self) -> dict:
        return dict(self._state)

    def follow_state(self, saved: dict) -> None:
        """The state file as another run of this host left it
        (:func:`node_agent.cycle.provider_cache.follow`): the root, the
        providers and children it found replace what this syncer kept."""
        self._state = dict(saved)

    def _adopted(self, name: str, uuid: str, is_root: bool) -> None:
        """The writer adopted an existing provider: the next plan uses its uuid."""
        if is_root:
            self._state = {**self._state, ROOT_UUID: uuid}
        self._state = {**self._state, PROVIDERS: {**self._state.get(PROVIDERS, {}), name: uuid}}

    def _deleted(self, uuid: str) -> None:
        """The writer deleted an owned child: no longer owned."""
        self._state = {
            **self._state,
            OWNED_CHILDREN: [u for u in self._state.get(OWNED_CHILDREN, []) if u != uuid],
        }


def _children_by_suffix(
    held: Iterable[ProviderState], root_uuid: Optional[str], wanted: set[str]
) -> dict[str, str]:
    """suffix -> uuid of the root's children named as the agent names them
    but after another host name (``old_NUMA_0``), none of them a name the
    tree wants: a root the operator renamed while the state file was lost
    keeps its children's uuids, and their allocations, as a rename the
    agent makes does (:func:`_renamed`)."""
    found = {}
    for provider in held:
        if root_uuid and provider.parent_uuid == root_uuid and provider.name not in wanted:
            suffix = child_suffix(provider.name)
            if suffix is not None:
                found[suffix] = provider.uuid
    return found


def _renamed(held: Optional[str], wanted: str):
    """name -> the name it had under the root's held name: the children
    named after the root (``<root>_NUMA_0``, ``<root>_pci_...``) keep their
    uuids, and their allocations, when the root is renamed."""

    def old_name(name: str) -> Optional[str]:
        if held is None or held == wanted or not name.startswith(wanted):
            return None
        return held + name[len(wanted) :]

    return old_name
