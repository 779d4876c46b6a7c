"""One way through a cycle: a runner per mode, chosen once.

``--once``, ``--dry-run``, the service and node-agent-applier all hand the
host's :class:`~node_agent.cycle.desired.Desired` to a :class:`CycleRunner`
and read back a :class:`CycleReport`; none of them assembles the steps
around the engine itself. :func:`runner_for` picks the runner from
``Settings.cycle_mode`` (:class:`~node_agent.model.settings.CycleMode`), the
one place in the package that branches on the mode:

* :class:`DirectRunner` (``upstream = placement``, and the applier for each
  host it is sent): maintenance Placement keeps, then
  :class:`~node_agent.cycle.reconcile.Reconciler` (reshape, then sync), then
  what the agent keeps in its state file (the syncer's cache, the
  operator-file traits applied, a done ``maintenance off``). A state-file
  failure after Placement was written says what was written, whoever runs
  the cycle (:func:`written`);
* :class:`ViaApplierRunner` (``upstream = messaging``): guests that do not fit
  are refused here, the tree goes to node-agent-applier, the agent's state
  file keeps what the applier answered;
* :class:`CompanionRunner` (``mode = companion``): reads and reports only.

A runner lives as long as one reading of the configuration: the CLI makes
one per run, the service one per loaded config (rebuilt on SIGHUP, taking
over the previous runner's cache and bus connection: ``previous``).

The engine's modules are imported inside the constructors: a dry-run
without Placement never loads them (tests/cli/test_start_cost.py).

Why one module over 500 lines: it is the one composition of a cycle, a
runner per mode and the one choice between them; split, the modes would drift
apart again.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Protocol

from node_agent.cycle.desired import (
    Desired,
    file_traits_to_remember,
    forget_applied_device_offs,
    forget_applied_off,
    numa_stranded,
    with_owner_mark,
    with_placement_maintenance,
)
from node_agent.errors import ConfigError, NodeAgentError, StateError
from node_agent.model.provider_tree import ProviderTree
from node_agent.model.settings import CycleMode, Settings
from node_agent.model.snapshot import Guest
from node_agent.state import APPLIED, FILE_INVENTORIES, StateStore

if TYPE_CHECKING:
    from node_agent.cycle.companion import CompanionReport
    from node_agent.cycle.reconcile import CycleOutcome

LOG = logging.getLogger(__name__)

GuestsNow = Callable[[], Iterable[Guest]]


def _never() -> bool:
    return False


@dataclass(frozen=True)
class Blocked:
    """What a cycle that ran left undone because it was refused: the
    service's problem (``node_agent_problem{kind, reason}``) and the one
    ERROR it logs while the refusal stays the same.

    ``reason``: ``guests_do_not_fit`` (guests the CPU sets leave without
    CPUs, :mod:`node_agent.policy.guest_fit`), ``reshape_refused`` (the
    allocations cannot move to the new layout: a pinned guest outside the
    dedicated set, too few PCPU...), ``changes_refused`` (Placement refused
    some of the tree's changes). A reshape that gave way to a busy host is
    not blocked: the next cycle tries again."""

    kind: str  # the problem kind: config, placement
    reason: str
    text: str


GUESTS_DO_NOT_FIT = "guests_do_not_fit"
RESHAPE_REFUSED = "reshape_refused"
CHANGES_REFUSED = "changes_refused"


def blocked_by(
    errors: list, refusal: Optional[str] = None, guests: bool = False, busy: bool = False
) -> Optional[Blocked]:
    """The :class:`Blocked` of a cycle: ``refusal`` the text of its refused
    CPU sets (``guests``) or reshape, ``errors`` the changes Placement refused."""
    if refusal is not None and not busy:
        reason = GUESTS_DO_NOT_FIT if guests else RESHAPE_REFUSED
        return Blocked("config", reason, refusal)
    others = [e for e in errors if e != refusal]
    if others:
        return Blocked("placement", CHANGES_REFUSED, "\n".join(others))
    return None


@dataclass(frozen=True)
class CycleReport:
    """What one cycle did (``run``) or would do (``plan``), in every mode.

    ``changes`` None: Placement was not consulted (a dry-run without it).
    ``outcome`` is the reconciler's, when one ran (the service's reshape
    notifications read it); ``companion`` the companion check's."""

    desired: Desired  # as the cycle applied it (maintenance Placement keeps)
    tree: ProviderTree  # with the uuids Placement gave
    summary: str
    ok: bool = True
    changes: Optional[list] = None
    reshape: Optional[dict] = None
    capacity: Optional[dict] = None
    errors: list = field(default_factory=list)
    # Capacity cuts published (run) or planned (plan) below usage: written,
    # not refused (:attr:`node_agent.placement.sync.SyncReport.cuts`); None
    # when Placement was not consulted.
    below_usage: Optional[list] = None
    busy: bool = False  # a reshape gave way to a busy host: try again later
    audit: Optional[dict] = None  # an audit this cycle ran
    companion: Optional[CompanionReport] = None  # companion mode's check
    outcome: Optional[CycleOutcome] = None  # the reconciler's, when one ran
    client: Any = None  # the Placement client that was used
    applied: list = field(default_factory=list)  # the requests sent (notifications)
    # Call only when someone is told (they remember what was announced).
    drift_changed: Callable[[], bool] = _never
    audit_changed: Callable[[], bool] = _never
    blocked: Optional[Blocked] = None  # what a run left refused
    # Shared storage as the cycle left it (or would):
    # node_agent.policy.shared_storage.report; None without it.
    shared_storage: Optional[dict] = None


class CycleRunner(Protocol):
    """One mode's cycle. ``run`` may write; ``plan`` (``--dry-run``) never does."""

    def run(self, desired: Desired, before_post=None) -> CycleReport: ...

    def plan(self, desired: Desired) -> CycleReport: ...

    def close(self) -> None: ...


def written(client, since: int = 0) -> str:
    """What was written to Placement through ``client`` after its
    ``stats.writes`` was ``since``, for an error raised after it."""
    count = client.stats.writes - since
    writes = (
        [
            f"{method} {path} -> {status}"
            for method, path, status in client.stats.log
            if method != "GET"
        ][-count:]
        if count > 0
        else []
    )
    if not writes:
        return "Nothing was written to Placement."
    return (
        f"Placement was already written ({len(writes)} request(s): "
        f"{'; '.join(writes)}); it is the reference, the next run rebuilds "
        "the state from it."
    )


def nova_scheduler_note(client, root_name: str) -> Optional[str]:
    """What owner mode says when nova-compute's roots share this Placement
    (:func:`node_agent.policy.root_owner.unschedulable_by_nova`), from one
    listing of the providers carrying ``OWNER_NOVA``."""
    from node_agent.policy.root_owner import NOVA, unschedulable_by_nova

    nova = [p for p in client.providers_with_trait(NOVA) if p.get("name") != root_name]
    return unschedulable_by_nova(root_name, len(nova))


def tree_only(desired: Desired) -> CycleReport:
    """A plan that consults no Placement: the tree and the capacity verdict
    on the desired tree alone."""
    from node_agent.policy.capacity import check, host_limits, published

    capacity = check(
        published(desired.tree), host_limits(desired.host, desired.partition)
    ).as_dict()
    return CycleReport(desired, desired.tree, "tree only", capacity=capacity)


class DirectRunner:
    """Reshape and sync against Placement with this process's syncer.

    ``settings``: the agent's (its host, state file and audit options);
    None in the applier. ``keeps_state``: the agent keeps the syncer's cache,
    the operator-file traits applied and a done ``maintenance off`` in its
    state file; the applier keeps its per-host record itself
    (:mod:`node_agent.applier.service`) and the agent keeps the rest.
    ``auditor`` (the service): an allocation audit after each full verify."""

    def __init__(
        self,
        syncer,
        reconciler,
        settings: Optional[Settings] = None,
        *,
        keeps_state: bool = True,
        auditor=None,
        check_version: bool = True,
        announce_on_run: bool = False,
    ):
        self.syncer = syncer
        self.reconciler = reconciler
        self.client = syncer.client
        self.settings = settings
        self.keeps_state = keeps_state
        self.auditor = auditor
        self._version_checked = not check_version
        # nova 34's scheduler skips roots without OWNER_NOVA
        # (:func:`nova_scheduler_note`): said by every dry run, and by the
        # service's first runner (``announce_on_run``), once per start.
        self._nova_note: Optional[str] = None
        self._nova_checked = settings is None
        self._announce_on_run = announce_on_run

    def same_tree(self, settings: Settings) -> bool:
        """A reload that keeps the host and its state file keeps the cache."""
        mine = self.settings
        return (
            mine is not None
            and mine.host == settings.host
            and mine.state_path == settings.state_path
        )

    def _ready(self) -> None:
        if not self._version_checked:
            self.client.check_version()
            self._version_checked = True

    def _noted(self, desired: Desired) -> Desired:
        """``desired`` with the note that nova's scheduler will not use this
        root, when nova-compute roots share the Placement; asked once."""
        if not self._nova_checked:
            self._nova_checked = True
            self._nova_note = nova_scheduler_note(self.client, desired.tree.root.name)
            if self._nova_note:
                LOG.warning("%s", self._nova_note)
        if self._nova_note is None:
            return desired
        return replace(desired, notes=desired.notes + (self._nova_note,))

    def run(self, desired: Desired, before_post=None) -> CycleReport:
        self._ready()
        if self._announce_on_run:
            desired = self._noted(desired)
        syncer = self.syncer
        syncer.begin_cycle()
        since = self.client.stats.writes
        if self.keeps_state:
            from node_agent.cycle import provider_cache

            provider_cache.follow(syncer)
        verified_at = syncer.verified_at
        desired = self.reconciler.maintained(desired)
        kw = {"before_post": before_post} if before_post is not None else {}
        try:
            before = syncer.traits_by_name(desired.tree) if self.keeps_state else {}
            outcome = self.reconciler.apply(desired, **kw)
            if self.keeps_state:
                from node_agent.cycle import provider_cache

                provider_cache.keep(syncer)
                syncer.remember(
                    APPLIED,
                    file_traits_to_remember(
                        desired, syncer.state.get(APPLIED), before, clean=outcome.ok
                    ),
                )
                if desired.applied_inventories or syncer.state.get(FILE_INVENTORIES):
                    syncer.remember(FILE_INVENTORIES, dict(desired.applied_inventories))
        except StateError as exc:
            raise StateError(f"{exc} {written(self.client, since)}", exc.cause) from None
        audit, changed = None, False
        if self.auditor is not None and syncer.verified_at != verified_at:
            audit, changed = self._audit(desired)  # this cycle read the whole tree
        if outcome.ok and self.keeps_state:
            forget_applied_off(syncer.store, desired.maintenance)
            forget_applied_device_offs(syncer.store, desired.device_maintenance)
        report = outcome.report
        return CycleReport(
            desired,
            report.tree or desired.tree,
            report.summary(),
            ok=outcome.ok,
            changes=report.applied,
            reshape=outcome.reshape_record(),
            capacity=report.capacity,
            errors=outcome.errors,
            below_usage=list(report.cuts),
            busy=outcome.refused is not None and outcome.refused.busy,
            audit=audit,
            outcome=outcome,
            client=self.client,
            applied=report.applied,
            audit_changed=lambda: changed,
            blocked=_blocked(outcome),
            shared_storage=self.reconciler.last_shared,
        )

    def _audit(self, desired: Desired) -> tuple[Optional[dict], bool]:
        """The allocation audit, after a sync that read the whole tree. A
        failed read is logged; the cycle's sync result stands."""
        assert self.settings is not None, "the agent's runner audits"
        try:
            result = self.auditor.run(desired, self.settings.host, self.settings.numa_in_placement)
        except NodeAgentError as exc:
            LOG.warning("allocation audit not done: %s", exc)
            return None, False
        return result.as_dict(), self.auditor.changed()

    def _stranded_with_usage(self, desired: Desired, tree: ProviderTree) -> Desired:
        """The stranded-flavor report counting what Placement holds on the
        NUMA tree now (``--dry-run`` only: one usages read per provider)."""
        settings = self.settings
        if settings is None or not settings.numa_in_placement or desired.stranded is None:
            return desired
        from node_agent.placement.errors import PlacementError

        usage = {}
        held = self.syncer.cached() or {}  # what Placement has of the tree
        try:
            for provider in tree.providers:
                if provider.uuid in held:
                    usage[provider.name] = self.client.usages(provider.uuid)["usages"]
        except PlacementError as exc:
            LOG.debug("usages not read, the report counts none: %s", exc)
            return desired
        if not any(usage.values()):
            return desired
        report = numa_stranded(settings, desired.host, desired.partition, usage)
        return replace(desired, stranded=report)

    def plan(self, desired: Desired) -> CycleReport:
        self._ready()
        desired = self.reconciler.maintained(self._noted(desired))
        tree, changes, reshape = self.reconciler.plan(desired)
        desired = self._stranded_with_usage(desired, tree)
        audit = None
        if self.settings is not None and self.syncer.cached_tree():
            # else nothing is allocated on this host yet
            from node_agent.cycle.audit import Auditor

            settings = self.settings
            audit = (
                Auditor(self.syncer, in_flight_grace=settings.audit_in_flight_grace)
                .run(desired, settings.host, settings.numa_in_placement, save=False)
                .as_dict()
            )
        return CycleReport(
            desired,
            tree,
            "plan",
            changes=changes,
            reshape=reshape,
            capacity=self.syncer.last_capacity,
            audit=audit,
            client=self.client,
            below_usage=self.syncer.last_cuts,
            shared_storage=self.reconciler.last_shared,
        )

    def close(self) -> None:
        pass


class ViaApplierRunner:
    """``upstream = messaging``: node-agent-applier applies the tree. One
    connection to the bus for the runner's life; a reload's runner keeps
    the previous one's (messaging options are read at start only)."""

    def __init__(self, conf, settings: Settings, previous: Optional[ViaApplierRunner] = None):
        self.conf, self.settings = conf, settings
        self.store = StateStore(Path(settings.state_path))
        self._sender: Any = previous._sender if previous is not None else None
        self._applier_maintenance: Optional[dict] = (
            previous._applier_maintenance if previous is not None else None
        )

    def _upstream(self):
        if self._sender is None:
            from node_agent.remote import keys, upstream

            settings = self.settings
            self._sender = upstream.MessagingUpstream(
                self.conf,
                settings.host,
                settings.upstream_topic,
                settings.upstream_timeout,
                key=keys.read_host_key(settings.upstream_key_file),
            )
        return self._sender

    def run(self, desired: Desired, before_post=None) -> CycleReport:
        from node_agent.policy import maintenance as maint
        from node_agent.remote import upstream

        settings = self.settings
        # The tree as sent, with this machine's owner mark: the direct mode's
        # report shows the mark it wrote too.
        desired = with_owner_mark(desired, settings)
        report = self._upstream().send(desired, timeout=settings.upstream_timeout)
        upstream.remember(self.store, report, desired)
        if report.maintenance is not None:  # a heartbeat's reply does not say
            self._applier_maintenance = report.maintenance
        if (self._applier_maintenance or {}).get("kept_by_placement"):
            # No record here (a lost state file), and the applier kept the
            # host closed from Placement's root trait: say so, as direct mode does.
            desired = with_placement_maintenance(desired, [maint.TRAIT])
        if report.ok:
            forget_applied_off(self.store, desired.maintenance)
            forget_applied_device_offs(self.store, desired.device_maintenance)
        return CycleReport(
            desired,
            desired.tree.with_uuids(report.uuids),
            report.summary(),
            ok=report.ok,
            changes=report.applied,
            reshape=report.reshape,
            errors=list(report.errors),
            applied=report.applied,
            blocked=blocked_by(
                report.errors,
                "\n".join((report.reshape or {}).get("refused") or []) or None,
                guests=report.guests_refused,
            )
            if not report.ok
            else None,
        )

    def plan(self, desired: Desired) -> CycleReport:
        # The tree only: a dry-run works without the bus, and the applier,
        # not this host, is the one that reads Placement.
        return tree_only(desired)

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()


class CompanionRunner:
    """``mode = companion``: reads Placement, reports drift, the audit and
    nova-compute's next restart; never writes to Placement. ``on_demand``
    (the CLI): every run reads Placement; else (the service) on the verify
    schedule."""

    def __init__(
        self,
        client,
        settings: Settings,
        on_demand: bool,
        previous: Optional[CompanionRunner] = None,
    ):
        from node_agent.cycle.companion import Companion

        self.settings = settings
        # Whether the last check found the provider (a reload's runner
        # carries it on, so a missing provider is logged once).
        self._was_found: bool = previous._was_found if previous is not None else True
        self.on_demand = on_demand
        self.companion = Companion(
            client,
            StateStore(Path(settings.state_path)),
            full_verify_interval=settings.full_verify_interval,
            in_flight_grace=settings.audit_in_flight_grace,
        )
        self.client = self.companion.client
        self._client = client
        self._version_checked = False

    def _check(self, desired: Desired, save: bool) -> CycleReport:
        from node_agent.cycle.companion import not_found_message

        if not self._version_checked:
            self._client.check_version()
            self._version_checked = True
        companion = self.companion
        found = companion.check(desired, self.settings, force=self.on_demand, save=save)
        if not found.found and self._was_found and not self.on_demand:
            LOG.warning("%s", not_found_message(self.settings.host, self.client.endpoint))
        self._was_found = found.found
        tree = desired.tree
        if found.root_uuid is not None:
            tree = tree.with_uuids({tree.root.name: found.root_uuid})
        return CycleReport(
            desired,
            tree,
            found.summary(),
            changes=[],
            companion=found,
            audit=found.audit if found.verified else None,
            client=self.client,
            drift_changed=companion.changed,
            audit_changed=lambda: found.verified and found.found and companion.auditor.changed(),
        )

    def run(self, desired: Desired, before_post=None) -> CycleReport:
        return self._check(desired, save=True)

    def plan(self, desired: Desired) -> CycleReport:
        return self._check(desired, save=False)

    def close(self) -> None:
        pass


class TreeOnlyRunner:
    """Direct mode with no ``[placement]``: only ``--dry-run`` can run."""

    def run(self, desired: Desired, before_post=None) -> CycleReport:
        raise NodeAgentError(
            "no Placement is configured ([placement] auth_type); "
            "use --dry-run to only show the tree"
        )

    def plan(self, desired: Desired) -> CycleReport:
        return tree_only(desired)

    def close(self) -> None:
        pass


def _blocked(outcome: CycleOutcome) -> Optional[Blocked]:
    refused = outcome.refused
    return blocked_by(
        outcome.errors,
        None if refused is None else refused.reason,
        guests=refused is not None and refused.guests,
        busy=refused is not None and refused.busy,
    )


def applier_runner(client, syncer, applied_shape=None) -> DirectRunner:
    """The direct cycle the applier runs for one host's message: its syncer
    is built from the host's record, which the applier keeps itself."""
    from node_agent.cycle.reconcile import Reconciler

    return DirectRunner(
        syncer,
        Reconciler(client, syncer, applied_shape=applied_shape),
        keeps_state=False,
        check_version=False,
    )


def _agent_syncer(client, settings: Settings, service: bool, previous: Optional[DirectRunner]):
    """This host's syncer, with the cache the last one kept: a reload's
    (same host and state file) as it is, else the state file's, verified
    on its first read. ``service``: spread the verifies over the fleet."""
    from node_agent.cycle import provider_cache
    from node_agent.host.machine_id import identity
    from node_agent.placement.sync import TreeSyncer

    syncer = TreeSyncer(
        client,
        StateStore(Path(settings.state_path)),
        full_verify_interval=settings.full_verify_interval,
        spread=service,
        owner=identity(settings),
        # The name earlier releases gave the root when [DEFAULT] host was
        # unset, before the agent named it by libvirt's hostname as nova.
        former_names=(socket.gethostname(),),
    )
    if previous is not None and previous.same_tree(settings):
        provider_cache.carry_over(previous.syncer, syncer)
    else:
        provider_cache.restore(syncer)
    return syncer


def runner_for(
    conf,
    settings: Settings,
    client=None,
    *,
    guests_now: Optional[GuestsNow] = None,
    service: bool = False,
    previous=None,
    placement: Optional[bool] = None,
) -> CycleRunner:
    """The runner of ``settings.cycle_mode``: the only branch on the mode.

    ``client``: the Placement client validation built (not yet contacted),
    else one is built from ``conf``. ``guests_now`` reads the host's guests
    again (a reshape's retry). ``service``: a long-lived runner (verifies
    spread over the fleet, an audit after each full verify, companion reads
    on the verify schedule); else each run reads now (``--once``).
    ``previous``: the runner this one replaces (a SIGHUP), whose cache and
    bus connection carry over. ``placement``: whether ``[placement]`` is
    configured (read from ``conf`` when None)."""
    mode = settings.cycle_mode
    if mode is CycleMode.VIA_APPLIER:
        return ViaApplierRunner(
            conf, settings, previous if isinstance(previous, ViaApplierRunner) else None
        )
    if placement is None:  # a client validation built means [placement] is there
        from node_agent.config.files import placement_configured

        placement = client is not None or placement_configured(conf)
    if mode is CycleMode.COMPANION:
        if not placement:
            raise ConfigError(
                "[agent] mode = companion reads Placement, and none is "
                "configured: set [placement] auth_type (or endpoint_override); "
                "read access is enough."
            )
        return CompanionRunner(
            _client(conf, client),
            settings,
            on_demand=not service,
            previous=previous if isinstance(previous, CompanionRunner) else None,
        )
    if not placement:
        return TreeOnlyRunner()
    client = _client(conf, client)
    syncer = _agent_syncer(
        client, settings, service, previous if isinstance(previous, DirectRunner) else None
    )
    auditor = None
    if service:
        from node_agent.cycle.audit import Auditor

        auditor = Auditor(syncer, in_flight_grace=settings.audit_in_flight_grace)
    from node_agent.cycle.reconcile import Reconciler

    return DirectRunner(
        syncer,
        Reconciler(client, syncer, guests_now=guests_now),
        settings,
        auditor=auditor,
        announce_on_run=service and previous is None,
    )


def _client(conf, client):
    if client is not None:
        return client
    from node_agent.placement.client import PlacementClient

    return PlacementClient.from_conf(conf)
