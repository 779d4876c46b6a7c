"""One cycle against Placement: reshape when the tree's shape changed, then sync.

Shared by ``--once``, the service and the central applier, so there is one
order of operations everywhere:

1. if the shape of the desired tree (providers and their classes, and the
   dedicated CPU set) differs from the last one applied -- or this is the
   first cycle of the process -- ask Placement whether allocations must
   move (VCPU -> PCPU for pinned guests, VGPU from the root to GPU children,
   flat -> NUMA children: :func:`node_agent.placement.reshape_rules.host_rule`), and move
   them in one ``POST /reshaper``;
2. sync the tree. The syncer is told the inventories the reshape set, so an
   unchanged tree costs no request; when the reshape had to create children
   it re-reads the tree and adopts them by name.

Before either, guests the new CPU sets leave without CPUs (floating vCPUs
with no cpu_shared_set left, where nova-compute refuses to start:
:mod:`node_agent.policy.guest_fit`) refuse the CPU classes only: VCPU and
PCPU keep what Placement holds, the rest of the tree is written, and the
cycle reports the refusal.

A refused reshape (a pinned guest outside the new dedicated set, too few
PCPU, a guest that cannot be attributed to a GPU or a NUMA node) keeps the
inventories of the classes it would have moved as Placement has them, and
syncs the rest: offering PCPU while pinned guests still hold VCPU (or VGPU
on children while guests hold it on the root) would let the scheduler
double-book the host.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Callable, Generic, Iterable, Mapping, Optional, Protocol, TypeVar

from node_agent.cycle.desired import (
    Desired,
    with_placement_device_maintenance,
    with_placement_maintenance,
)
from node_agent.errors import HostBusy, ReshapeError
from node_agent.model.provider_tree import (
    Inventory,
    PlacedTree,
    Provider,
    ProviderTree,
    with_held_ratios,
)
from node_agent.model.snapshot import Guest
from node_agent.placement.errors import GenerationConflict, NotFound
from node_agent.placement.planner import Change, aggregates_change
from node_agent.placement.reshape_engine import Reshape, Rule, hold_inventories
from node_agent.placement.reshape_host import HostReshape, host_reshape_inputs
from node_agent.placement.reshape_reads import plan_reshape, read_inventories, uuid_of_root
from node_agent.placement.reshape_rules import (
    chain,
    disk_to_sharing_provider,
    guest_names,
    local_disk_moved,
)
from node_agent.placement.reshaper import ReshapeOutcome, ensure_reshaped
from node_agent.placement.shared_storage import (
    ensure_sharing_provider,
    join_sharing_provider,
    write_disk,
)
from node_agent.placement.sync import SyncReport, TreeSyncer
from node_agent.policy import device_maintenance as devmaint
from node_agent.policy import maintenance as maint
from node_agent.policy import shared_storage
from node_agent.policy.capacity import Published, as_published, check, limits_of
from node_agent.policy.child_owner import NUMA, ListedChild, child_kind
from node_agent.policy.guest_cpu import classify
from node_agent.policy.guest_fit import guests_refused
from node_agent.state import PROVIDERS, SHARED_STORAGE
from node_agent.tree.mem_encryption import keep_as_held, undecided

LOG = logging.getLogger(__name__)


def _chain(*hooks):
    present = [h for h in hooks if h is not None]

    def call(body):
        for hook in present:
            hook(body)

    return call


# Per provider (name, parent name, its classes), the dedicated CPU set, and
# the uuids of the dedicated guests.
Shape = tuple[tuple[tuple[str, Optional[str], tuple[str, ...]], ...], str, tuple[str, ...]]


def shape_of(desired: Desired) -> Shape:
    """What decides whether allocations may have to move. A dedicated guest
    that appears counts: while controllers run nova's fallback query a
    pinned guest can be claimed as VCPU on a host that offers PCPU, and the
    check that moves it costs one read."""
    return (
        tuple((p.name, p.parent, tuple(sorted(p.inventories))) for p in desired.tree.providers),
        str(desired.partition.dedicated),
        tuple(sorted(g.uuid for g in desired.host.guests if classify(g).dedicated)),
    )


# What a refusal of the CPU sets keeps as Placement holds it.
CPU_CLASSES = ("VCPU", "PCPU")
CPU_KEPT = "VCPU and PCPU were kept as Placement holds them and the rest of the tree was written"


@dataclass(frozen=True)
class ReshapeRefused:
    """Why this cycle's reshape was not sent, or not sent whole: the classes
    it would have moved keep the inventory Placement holds. A refused reshape
    moved nothing; a busy one (``busy``) that went in stages may have moved
    some consumers, each whole, and left the moved classes closed at what is
    allocated (its reason says how many): the next cycle moves the rest."""

    reason: str
    # Allocations kept changing under it (HostBusy): temporary, the next
    # cycle tries again; --once exits 75 rather than 1.
    busy: bool = False
    # Guests the CPU sets leave without CPUs (policy/guest_fit.py): the CPU
    # classes were refused before any reshape.
    guests: bool = False

    def __str__(self) -> str:
        return self.reason

    def as_record(self) -> dict:
        """The ``reshape`` key of a report, a reply or a notification."""
        return {"refused": [self.reason], "lines": [f"REFUSED: {self.reason}"]}


class CycleReport(Protocol):
    """What the service reads of a cycle's report: a :class:`SyncReport`
    (direct mode) or the applier's ``UpstreamReport`` (``upstream = messaging``)."""

    @property
    def ok(self) -> bool: ...

    @property
    def errors(self) -> list[str]: ...

    @property
    def applied(self) -> list: ...

    def summary(self) -> str: ...


Report = TypeVar("Report", bound=CycleReport, covariant=True)


@dataclass
class CycleOutcome(Generic[Report]):
    """What one cycle did: the sync's report, the reshape when one was
    checked, and its refusal when it was refused (then ``reshape`` is None)."""

    report: Report
    reshape: Optional[ReshapeOutcome] = None
    refused: Optional[ReshapeRefused] = None

    @property
    def ok(self) -> bool:
        return self.report.ok and self.refused is None

    @property
    def errors(self) -> list[str]:
        refused = [self.refused.reason] if self.refused is not None else []
        return refused + list(self.report.errors)

    def reshape_record(self) -> Optional[dict]:
        """What was moved (with the request id), or why not; None when no
        reshape was sent."""
        if self.refused is not None:
            return self.refused.as_record()
        outcome = self.reshape
        if outcome is None or not outcome.reshaped:
            return None
        record = outcome.reshape.as_dict()
        record["request_id"] = outcome.request_id
        record["response_lost"] = outcome.response_lost
        if outcome.response_lost:
            record["lines"] = record["lines"] + [
                "POST /reshaper was committed but its answer was lost; the moves above "
                "were read back from Placement"
            ]
        return record


class Reconciler:
    """Keeps one host's tree in Placement, reshaping first when needed."""

    def __init__(
        self,
        client,
        syncer: TreeSyncer,
        applied_shape: Optional[Shape] = None,
        guests_now: Optional[Callable[[], Iterable[Guest]]] = None,
    ):
        """``applied_shape``: the shape (:func:`shape_of`) a previous process
        applied and checked the allocations for, when the caller kept it (the
        applier, in its per-host record); its reshape check is then skipped
        while the shape stays. None (the default): the first cycle checks.
        ``guests_now``: reads the host's guests again, for a reshape that must
        retry or re-check (:func:`~node_agent.placement.reshaper.ensure_reshaped`);
        None where no libvirt is at hand (the applier)."""
        self.client = client
        self.syncer = syncer
        self._applied_shape = applied_shape
        self._guests_now = guests_now
        # Shared storage as the last cycle (or plan) left it
        # (policy/shared_storage.py: report); None without it.
        self.last_shared: Optional[dict] = None

    def _known_uuids(self) -> Mapping[str, str]:
        return self.syncer.state.get(PROVIDERS, {})

    def _held_tree(
        self, inputs: HostReshape, apart: frozenset = frozenset(), keep: frozenset = frozenset()
    ) -> ProviderTree:
        """The tree the sync writes after a refused reshape; ``apart``: the
        sharing providers, no part of the host's tree (the sync must never
        take one for a child of its own); ``keep``: aggregates the root
        stays in (those of sharing providers its DISK_GB has not left)."""
        rule = inputs.rule
        held = sorted(set(getattr(rule, "providers", ())) - inputs.absent - apart)
        current = read_inventories(self.client, held)
        providers = tuple(p for p in inputs.tree.providers if p.uuid not in apart)
        if keep:
            root = providers[0]
            providers = (replace(root, aggregates=root.aggregates | keep),) + providers[1:]
        tree = ProviderTree(providers)
        return hold_inventories(
            tree, current, getattr(rule, "classes", ()), getattr(rule, "providers", None)
        )

    def _inputs(self, desired: Desired) -> Optional[HostReshape]:
        known = dict(self._known_uuids())
        cached = self.syncer.cached()
        if cached is not None:
            # The syncer read the tree this cycle (the owner check) or
            # within its verify period: its names answer without a lookup.
            known = {**{s.name: u for u, s in cached.items()}, **known}
        # The providers as the sync will find them: a renamed root (and its
        # children) or one found by the machine's mark keeps its uuid.
        held = self.syncer.held_uuids(desired.tree)
        known = {**known, **held}
        if desired.tree.root.name not in held:
            return None  # no root in Placement: nothing to reshape
        return host_reshape_inputs(
            self.client, desired, known, self.syncer.owned_children, self.syncer.cached_tree()
        )

    def _former_shares(self, desired: Desired, root: str) -> dict[str, str]:
        """uuid -> aggregate of the sharing providers, other than the one the
        option names, that may hold this host's DISK_GB: the state file's
        record, and those Placement shows (:func:`~node_agent.policy.shared_storage.former_providers`:
        the root's aggregates, the derived uuid, the trait), so a lost
        state file loses no way back. The root's aggregates are read when
        the option is set (the sync reads them then anyway) or when the root
        offers no DISK_GB in Placement while this host has some to offer;
        then one listing when the root is in an aggregate other than the
        option's."""
        wanted = None if desired.shared is None else str(desired.shared.uuid)
        record = self.syncer.state.get(SHARED_STORAGE)
        found = {}
        if record and record["uuid"] != wanted:
            found[record["uuid"]] = record["aggregate"]
        if wanted is None and not self._disk_missing_on_root(desired, root):
            return found
        candidates = shared_storage.former_providers(self.syncer.root_aggregates(root), wanted)
        candidates = {u: a for u, a in candidates.items() if u not in found}
        if candidates:
            listed = self.client.sharing_providers(candidates.values(), shared_storage.TRAIT)
            found.update(
                {rp["uuid"]: candidates[rp["uuid"]] for rp in listed if rp["uuid"] in candidates}
            )
        return found

    def _disk_missing_on_root(self, desired: Desired, root: str) -> bool:
        """This host has DISK_GB to offer and Placement's root offers none:
        what a host whose DISK_GB went to a sharing provider looks like."""
        if shared_storage.DISK_GB not in desired.tree.root.inventories:
            return False
        return not self._root_offers_disk(root)

    def _root_offers_disk(self, root: str) -> bool:
        """Placement's root has DISK_GB (the syncer's cache; one GET without)."""
        held = (self.syncer.cached() or {}).get(root)
        inventories = None if held is None else held.inventories
        if inventories is None:
            inventories = self.client.inventories(root)["inventories"]
        return shared_storage.DISK_GB in inventories

    def _with_shared(
        self, desired: Desired, inputs: HostReshape, former: Mapping[str, str], write: bool = True
    ) -> tuple[HostReshape, SharedMove]:
        """The reshape inputs with the sharing provider of a shared
        ``instances_path`` (:mod:`node_agent.placement.shared_storage`),
        made to hold the filesystem first, and the rule that moves the root's
        DISK_GB to it; and with the ``former`` sharing providers
        (:meth:`_former_shares`), the rule that moves this host's DISK_GB
        from them to the one the option names, or back to the root.
        ``write`` False (``--dry-run``): reads only; a sharing provider not
        there yet is planned as one to create, with this host's measure."""
        root = uuid_of_root(inputs.tree)
        providers: list[Provider] = []
        rules: list[Rule] = [inputs.rule]
        absent = inputs.absent
        wanted = desired.shared
        if wanted is not None and not write:
            share = wanted
            try:
                held = self.client.inventories(str(share.uuid))["inventories"]
                if shared_storage.DISK_GB in held:
                    share = replace(
                        share,
                        inventories={rc: Inventory.from_placement(r) for rc, r in held.items()},
                    )
            except NotFound:
                absent = absent | {str(share.uuid)}
            providers.append(share)
        elif wanted is not None:
            classes = {rc for p in desired.tree.providers for rc in p.inventories}
            held = join_sharing_provider(self.client, wanted, classes, desired.host.disk_gb)
            # The record this host would leave: the reshape body writes it
            # with the moves (write_disk after, when nothing moves).
            measured = wanted.inventories[shared_storage.DISK_GB].as_placement()
            merged = shared_storage.record_to_write(measured, held.get(shared_storage.DISK_GB))
            providers.append(
                replace(
                    wanted,
                    inventories={
                        **{rc: Inventory.from_placement(r) for rc, r in held.items()},
                        shared_storage.DISK_GB: Inventory.from_placement(merged),
                    },
                )
            )
            if not former:
                self._remember_shared(wanted)
        if wanted is not None:
            rules.append(disk_to_sharing_provider(root, str(wanted.uuid)))
        target = root if wanted is None else str(wanted.uuid)
        left: dict[str, str] = {}
        local: Optional[set[str]] = None
        for uuid, aggregate in sorted(former.items()):
            try:
                held = self.client.inventories(uuid)["inventories"]
            except NotFound:
                continue  # gone: nothing to move from it
            if local is None:
                local = set(self.client.provider_allocations(root)["allocations"])
                local |= {g.uuid for g in desired.host.guests}
            providers.append(
                Provider(
                    shared_storage.provider_name(aggregate),
                    uuid=uuid,
                    inventories={rc: Inventory.from_placement(r) for rc, r in held.items()},
                )
            )
            rules.append(local_disk_moved(uuid, target, local))
            left[uuid] = aggregate
        if not providers:
            if write and self.syncer.state.get(SHARED_STORAGE):
                self.syncer.remember(SHARED_STORAGE, None)  # gone: nothing to move back
            return inputs, SharedMove()
        tree = ProviderTree(inputs.tree.providers + tuple(providers))
        planned = replace(inputs, tree=tree, rule=chain(*rules), absent=absent)
        return planned, SharedMove(frozenset(str(p.uuid) for p in providers), left)

    def _remember_shared(self, shared: Provider) -> None:
        """Which sharing provider this host's DISK_GB goes to: the way back
        (the option removed) moves it from there."""
        aggregate = sorted(shared.aggregates)[0]
        self.syncer.remember(SHARED_STORAGE, {"aggregate": aggregate, "uuid": shared.uuid})

    def _shared_done(self, desired: Desired, root: str, move: SharedMove) -> None:
        """After the reshape went through: the root leaves the aggregates of
        the sharing providers its DISK_GB left, and the state file names the
        one it is on now (none without the option)."""
        if move.left:
            self.syncer.release_aggregates(root, move.left.values())
        if desired.shared is not None:
            self._remember_shared(desired.shared)
        elif move.apart:
            self.syncer.remember(SHARED_STORAGE, None)  # moved back: done

    def _refresh_shared(self, shared: Provider) -> bool:
        """Each cycle the reshape check skips: the sharing provider's DISK_GB
        as this host measures it now, merged (one GET; a PUT when another
        writer or a smaller measure moved it). Gone (an operator deleted
        it): the next cycle checks the reshape again, which recreates it."""
        aggregate = _aggregate_of(shared)
        try:
            held = write_disk(self.client, shared)
        except NotFound:
            LOG.warning("shared storage: sharing provider %s is gone", shared.name)
            self.last_shared = shared_storage.report(aggregate, None, False)
            return False
        self.last_shared = shared_storage.report(aggregate, _disk_total(held), True)
        return True

    def _reshape(
        self, desired: Desired, before_post=None
    ) -> tuple[Optional[ReshapeOutcome], Optional[ReshapeRefused], ProviderTree]:
        aggregate = _aggregate_of(desired.shared)
        inputs = self._inputs(desired)
        if inputs is None:
            if desired.shared is not None:
                # A new host: nothing to move, the sharing provider to join.
                try:
                    classes = {rc for p in desired.tree.providers for rc in p.inventories}
                    held = ensure_sharing_provider(
                        self.client, desired.shared, classes, desired.host.disk_gb
                    )
                except ReshapeError as exc:
                    self.last_shared = shared_storage.report(aggregate, None, False)
                    return None, ReshapeRefused(str(exc)), desired.tree
                self._remember_shared(desired.shared)
                self.last_shared = shared_storage.report(aggregate, _disk_total(held), True)
            return ReshapeOutcome(False, Reshape(None)), None, desired.tree
        root = uuid_of_root(inputs.tree)
        former = self._former_shares(desired, root)
        # Until the move is done the root stays in the aggregates its DISK_GB
        # is to leave: Placement keeps the way there, state file or not.
        keep = frozenset(former.values())
        not_moved = shared_storage.report(aggregate, None, False, former)
        try:
            self.syncer.mark_before_reshape(desired.tree)
        except GenerationConflict as exc:
            refused = ReshapeRefused(f"reshape not sent this cycle: {exc}", busy=True)
            self.last_shared = not_moved
            return None, refused, self._held_tree(inputs, keep=keep)
        try:
            inputs, move = self._with_shared(desired, inputs, former)
        except ReshapeError as exc:
            LOG.debug("shared storage refused: %s", exc)
            self.last_shared = not_moved
            return None, ReshapeRefused(str(exc)), self._held_tree(inputs, keep=keep)
        guard = self._capacity_guard(desired, inputs.tree, move.apart)
        kw = {"before_post": _chain(guard, before_post)} if guard or before_post else {}
        try:
            outcome = ensure_reshaped(
                self.client,
                inputs.tree,
                desired.host.guests,
                inputs.rule,
                absent=inputs.absent,
                known=self.syncer.known_inventories(),
                guests_now=self._guests_now,
                **kw,
            )
        except ReshapeError as exc:
            # Logged at DEBUG: the caller reports it (the service once while
            # it stays the same, --once on stderr, the applier per message).
            LOG.debug("reshape refused, the inventory it would move is kept as it is: %s", exc)
            self.last_shared = shared_storage.report(aggregate, None, False, move.left)
            return (
                None,
                ReshapeRefused(str(exc), busy=isinstance(exc, HostBusy)),
                self._held_tree(inputs, move.apart, keep),
            )
        if outcome.created:
            self.syncer.invalidate()  # the sync re-reads the tree and adopts them
        elif outcome.reshaped:
            self.syncer.note_inventories(outcome.inventories)
        disk = None
        if desired.shared is not None:
            # One GET when the body wrote it.
            disk = _disk_total(write_disk(self.client, desired.shared))
        # Emptied (or empty already): the sync deletes them, state file or not.
        self.syncer.claim_children(inputs.retired)
        self._shared_done(desired, root, move)
        self.last_shared = shared_storage.report(aggregate, disk, True, move.left)
        return outcome, None, desired.tree

    def _flat_now(self, desired: Desired) -> bool:
        """Placement's tree (the syncer's cache) has no NUMA child offering
        CPUs or memory: turning NUMA on is what was refused. A host already
        nested keeps its layout; its refusal holds the moved classes."""
        cached = self.syncer.cached()
        if cached is None:
            return False
        return not any(
            child_kind(desired.tree.root.name, s.name) == NUMA
            and set(s.inventories or {}) & {"VCPU", "PCPU", "MEMORY_MB"}
            for s in cached.values()
        )

    def _flat(self, desired: Desired, flat: ProviderTree) -> Desired:
        """``desired`` with ``flat`` (its tree without NUMA children) under
        the same host and per-device maintenance."""
        tree, _notes = maint.apply(flat, desired.maintenance)
        tree, _notes = devmaint.apply(tree, getattr(desired, "device_maintenance", None))
        tree, _notes = devmaint.held_by_placement(tree, self.syncer.traits_by_name(tree))
        return replace(desired, tree=tree, without_numa=None)

    def _without_numa(self, desired: Desired, before_post, refused: tuple) -> tuple:
        """After a refused reshape that turns NUMA children on: the reshape
        of the same host without them (:attr:`Desired.without_numa`). When
        that one goes through, the cycle writes the flat tree -- the other
        changes of the cycle (pinned guests to PCPU, VGPU to GPU children...)
        are not held back by what only NUMA children refuse -- and still
        reports the NUMA refusal, so the next cycle tries again. Else the
        first refusal stands."""
        flat = getattr(desired, "without_numa", None)
        if flat is None or not self._flat_now(desired):
            return refused
        outcome, refusal, held = self._reshape(self._flat(desired, flat), before_post)
        if refusal is not None:
            return refused
        reason = (
            f"{refused[1].reason}\nNUMA children were not reported; the rest of the "
            "tree was written as with [compute] numa_in_placement off"
        )
        return outcome, ReshapeRefused(reason), held

    def maintained(self, desired: Desired) -> Desired:
        """``desired`` kept in maintenance when Placement's root says so and
        the state file does not say otherwise (a lost or corrupt state file
        cannot end maintenance). Reads what the sync reads next, from the
        syncer's cache between full verifications. Children carrying the
        disabled trait with no record stay closed the same way
        (:mod:`node_agent.policy.device_maintenance`)."""
        if not desired.maintenance:  # else the state file decides
            desired = with_placement_maintenance(desired, self.syncer.root_traits(desired.tree))
        return with_placement_device_maintenance(desired, self.syncer.traits_by_name(desired.tree))

    def _capacity_guard(self, desired: Desired, tree: ProviderTree, apart: frozenset = frozenset()):
        """A check of the ``POST /reshaper`` body, called just before it is
        sent: the inventories it sets (a reshape keeps a class on the root
        for consumers it does not move, while the children get theirs), with
        the other providers of the tree as the syncer's cache knows them,
        must not overstate the host; else the reshape is refused
        (ReshapeError) and its classes are held as they are. It costs no
        request: without a cache (a process's first cycle) only the body is
        checked, and the sync that follows checks the whole tree."""
        limits = limits_of(desired)
        if limits is None:
            return None

        def guard(body: dict) -> None:
            # A sharing provider is checked apart: it is no provider of the
            # host's tree (node_agent.placement.shared_storage).
            planned = {
                u: e["inventories"] for u, e in body["inventories"].items() if u not in apart
            }
            untouched = [
                Published(s.name, s.parent_uuid is None, s.inventories)
                for u, s in (self.syncer.cached() or {}).items()
                if u not in planned
            ]
            names = {p.uuid: p.name for p in tree.providers if p.uuid is not None}
            verdict = check(as_published(planned, names, uuid_of_root(tree), untouched), limits)
            if not verdict.ok:
                raise ReshapeError(
                    "reshape not sent: the tree it would leave overstates the host ("
                    + "; ".join(verdict.lines())
                    + "); the classes it would move are kept "
                    "as Placement holds them"
                )

        return guard

    def _undecided_kept(self, desired: Desired) -> Desired:
        """Without domain capabilities this cycle, the memory-encryption
        children stay as Placement holds them (:func:`keep_as_held`)."""
        if not undecided(desired.host):
            return desired
        root, held = self.syncer.held_children(desired.tree)
        listed = [ListedChild(s.uuid, s.name, s.parent_uuid, s.traits, s.inventories) for s in held]
        tree = keep_as_held(desired.tree, root, listed)
        return desired if tree is desired.tree else replace(desired, tree=tree)

    def apply(self, desired: Desired, before_post=None) -> CycleOutcome[SyncReport]:
        # Before the reshape, which writes too: a root nova-compute or another
        # machine manages raises ProviderOwned here, and nothing is written.
        self.syncer.check_owner(desired.tree)
        desired = self._undecided_kept(desired)
        refused = guests_refused(desired, CPU_KEPT)
        if refused is not None:
            LOG.debug("%s", refused)  # the caller reports it, as a reshape refused
            with self.client.deadline("the tree sync"):
                report = self.syncer.sync(
                    self._cpu_held(desired), limits_of(desired), guest_names(desired.host.guests)
                )
            return CycleOutcome(report, refused=ReshapeRefused(str(refused), guests=True))
        shape = shape_of(desired)
        tree, outcome, refusal = desired.tree, None, None
        shared_held = True
        if shape != self._applied_shape:
            with self.client.deadline("the reshape"):
                outcome, refusal, tree = self._reshape(desired, before_post)
                if refusal is not None and not refusal.busy:
                    outcome, refusal, tree = self._without_numa(
                        desired, before_post, (outcome, refusal, tree)
                    )
        elif desired.shared is not None:
            with self.client.deadline("the sharing provider"):
                shared_held = self._refresh_shared(desired.shared)
        else:
            self.last_shared = None  # checked with the shape: nothing left to move back
        with self.client.deadline("the tree sync"):
            report = self.syncer.sync(tree, limits_of(desired), guest_names(desired.host.guests))
        result = CycleOutcome(report, outcome, refusal)
        if result.ok:
            self._applied_shape = shape if shared_held else None
        return result

    def _cpu_held(self, desired: Desired) -> ProviderTree:
        """``desired`` with VCPU and PCPU as Placement holds them on the root
        and the agent's children (none where nothing is published yet): the
        CPU sets are refused, every other change is written. Maintenance
        closes what is held too (:func:`hold_inventories`)."""
        root_uuid, children = self.syncer.held_children(desired.tree)
        held = [u for u in [root_uuid, *(c.uuid for c in children)] if u]
        tree = ProviderTree(
            tuple(
                replace(p, uuid=root_uuid) if p.parent is None and root_uuid else p
                for p in desired.tree.providers
            )
        )
        # Every provider: a child Placement does not have yet gets no CPU class.
        return hold_inventories(
            tree, read_inventories(self.client, held) if held else {}, CPU_CLASSES
        )

    def plan(self, desired: Desired) -> tuple[ProviderTree, list[Change], Optional[dict]]:
        """For ``--dry-run``: the tree with uuids, the sync's requests, the reshape plan.
        :attr:`TreeSyncer.last_capacity` then holds the capacity verdict.
        Guests that do not fit: no request would be sent, the refusal is the plan."""
        desired = self._undecided_kept(desired)
        aggregate = _aggregate_of(desired.shared)
        self.last_shared = shared_storage.report(aggregate, None, False)
        refused = guests_refused(desired)
        if refused is not None:
            desired = replace(desired, tree=self._cpu_held(desired))
        tree, changes = self.syncer.plan_with_tree(
            desired.tree, limits_of(desired), guest_names(desired.host.guests)
        )
        # Shown with the ratios nova's rule keeps from Placement, as they would be published.
        held = {u: s.inventories for u, s in (self.syncer.cached() or {}).items()}
        tree = PlacedTree(
            tuple(
                replace(p, inventories=with_held_ratios(p.inventories, held.get(p.uuid or "")))
                for p in tree.providers
            )
        )
        if refused is not None:
            return (
                tree,
                changes,
                {
                    "refused": list(refused.reasons),
                    "lines": [f"REFUSED: {r}" for r in refused.reasons]
                    + [
                        "VCPU and PCPU would be kept as Placement holds them; the requests "
                        "above would write the rest of the tree"
                    ],
                },
            )
        inputs = self._inputs(desired)
        if inputs is None:
            return tree, changes, None
        root = uuid_of_root(inputs.tree)
        former = self._former_shares(desired, root)
        inputs, move = self._with_shared(desired, inputs, former, write=False)
        reshape = plan_reshape(
            self.client,
            inputs.tree,
            desired.host.guests,
            inputs.rule,
            inputs.absent,
            self.syncer.known_inventories(),
        )
        self.last_shared = self._planned_shared(desired, inputs, move, reshape)
        if not reshape.refusals:
            changes = changes + _retired_deletes(inputs, changes)
            changes = self._released(tree, changes, move.left)
        flat = getattr(desired, "without_numa", None)
        if reshape.refusals and flat is not None and self._flat_now(desired):
            return self._plan_without_numa(desired, flat, reshape.as_dict())
        return tree, changes, (reshape.as_dict() if reshape.needed or reshape.refusals else None)

    def _released(self, tree: PlacedTree, changes: list[Change], left: Mapping) -> list[Change]:
        """The dry run's aggregates change of the root as the sync would send
        it after the reshape: without the aggregates of the sharing
        providers this host's DISK_GB leaves (:meth:`_shared_done`)."""
        root = tree.root
        state = (self.syncer.cached() or {}).get(str(root.uuid))
        if not left or state is None or state.aggregates is None:
            return changes
        ours = self.syncer.aggregates_ours(state.uuid) | frozenset(left.values())
        change = aggregates_change(root, state, state.generation, ours)
        kept = [c for c in changes if not (c.kind == "aggregates" and c.target == state.uuid)]
        return kept + ([change] if change is not None else [])

    def _planned_shared(
        self, desired: Desired, inputs: HostReshape, move: SharedMove, reshape
    ) -> Optional[dict]:
        """The dry run's shared-storage report: moved when nothing is left
        to move, the sharing provider exists and the root offers no DISK_GB."""
        aggregate = _aggregate_of(desired.shared)
        share = desired.shared
        disk = None
        if share is not None:
            planned = next(p for p in inputs.tree.providers if p.uuid == share.uuid)
            record = planned.inventories.get(shared_storage.DISK_GB)
            disk = None if record is None else record.total
        moved = not (reshape.needed or reshape.refusals or move.left)
        if share is not None:
            root = uuid_of_root(inputs.tree)
            moved = moved and share.uuid not in inputs.absent
            moved = moved and not self._root_offers_disk(root)
        return shared_storage.report(aggregate, disk, moved, move.left)

    def _plan_without_numa(
        self, desired: Desired, flat: ProviderTree, refused: dict
    ) -> tuple[ProviderTree, list[Change], Optional[dict]]:
        """The dry run of :meth:`_without_numa`: the host's plan without NUMA
        children when that plan is not refused too; its reshape lines follow
        the NUMA refusal."""
        plan = self.plan(self._flat(desired, flat))
        if plan[2] is not None and plan[2].get("refused"):
            return self.plan(replace(desired, without_numa=None))
        note = (
            "NUMA children would not be reported; the rest of the tree would be "
            "written as with [compute] numa_in_placement off:"
        )
        after = plan[2] or {"lines": ["nothing to move without NUMA children"]}
        return (
            plan[0],
            plan[1],
            {
                **after,
                "refused": refused["refused"],
                "lines": [f"REFUSED: {r}" for r in refused["refused"]] + [note] + after["lines"],
            },
        )


@dataclass(frozen=True)
class SharedMove:
    """The sharing providers a reshape works on (``apart``: the capacity
    guard checks them apart from the host's tree) and, of those, the ones
    this host's DISK_GB leaves (``left``: uuid -> aggregate)."""

    apart: frozenset[str] = frozenset()
    left: Mapping[str, str] = field(default_factory=dict)


def _aggregate_of(shared: Optional[Provider]) -> Optional[str]:
    return None if shared is None else sorted(shared.aggregates)[0]


def _disk_total(inventories: Mapping) -> Optional[int]:
    record = inventories.get(shared_storage.DISK_GB)
    return None if record is None else int(record["total"])


def _retired_deletes(inputs: HostReshape, planned: list[Change]) -> list[Change]:
    """The deletes the sync sends after a way-back reshape for children the
    state file does not list (so the sync's own plan does not show them)."""
    # An update or a delete of that provider is already planned.
    deleted = {c.target for c in planned if c.kind in ("update", "delete")}
    return [
        Change(
            "delete", p.uuid, f"delete provider {p.name} (no longer on the host)", provider=p.name
        )
        for p in inputs.tree.providers
        if p.uuid and p.uuid in inputs.retired and p.uuid not in deleted
    ]
