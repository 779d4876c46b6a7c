"""The agent as a service: the cycle (discover, then sync), the status it
keeps, and the wiring of loop, systemd, messaging and metrics.

The service needs Placement: without ``[placement]`` it refuses to start
(exit 78), as ``--once`` does; ``--dry-run`` is the way to look without it.
Placement being *unreachable* is different: that is a state the service
waits out (see :mod:`node_agent.service.loop`).

Messaging options (``transport_url``...) are read at start only; a SIGHUP
reloads everything else.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, cast

from node_agent.cycle import provider_cache
from node_agent.startup import validate
from node_agent.cycle.audit import Auditor
from node_agent.cycle.reconcile import CycleOutcome, CycleReport, Reconciler
from node_agent.host.discover import read_guests
from node_agent.host.machine_id import identity
from node_agent.placement.sync import TreeSyncer
from node_agent.remote import keys, messaging
from node_agent.cycle.desired import (Desired, compute_desired, file_traits_to_remember,
                                      forget_applied_off, with_owner_mark,
                                      with_placement_maintenance)
from node_agent.errors import NodeAgentError, PlacementError
from node_agent.model.settings import Settings
from node_agent.policy import maintenance as maint
from node_agent.state import APPLIED, StateStore
from node_agent.service.control import Control, Maintenance, utc_now
from node_agent.service.loop import CycleResult, Service, systemd_notifier

if TYPE_CHECKING:
    from node_agent.cycle.companion import Companion
    from node_agent.placement.client import PlacementClient
    from node_agent.remote.upstream import UpstreamReport

# Imported inside the functions that use them, and only there: the ones a
# mode or an option needs (node_agent.cycle.companion loads the HTTP gateway,
# node_agent.remote.upstream jsonschema, node_agent.host.hypervisor libvirt),
# and node_agent.service.metrics (prometheus_client), which the CLI, importing
# this module, never uses.
LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loaded:
    """One validated reading of the config files."""

    conf: object
    settings: Settings
    # Not yet contacted. None with upstream = messaging (the applier holds
    # Placement); validation refuses the other modes without one.
    client: Optional[PlacementClient]

    def __getattr__(self, name):
        # The loop reads its timing (report_interval...) from the settings.
        return getattr(self.settings, name)


def load(args: Sequence[str]) -> Loaded:
    """Parse and validate the config files (:func:`node_agent.config.validation.validate`,
    the same checks as ``--check-config``); raises ConfigError."""

    valid = validate(args, lenient_files=True)
    # With upstream = messaging the client is None: node-agent-applier holds Placement.
    # Validated.client is typed object; it is validate()'s PlacementClient or None.
    return Loaded(valid.conf, valid.settings,
                  cast("Optional[PlacementClient]", valid.client))


def _same_tree(old: Settings, new: Settings) -> bool:
    """A reload that keeps the host and its state file keeps the syncer's cache."""
    return old.host == new.host and old.state_path == new.state_path


def tree_summary(desired: Optional[Desired]) -> list[dict]:
    if desired is None:
        return []
    return [{"name": p.name, "uuid": p.uuid, "parent": p.parent,
             "inventories": {rc: inv.total for rc, inv in sorted(p.inventories.items())}}
            for p in desired.tree.providers]


class Agent:
    """The cycle of the service and what it remembers between cycles.

    A failed discovery raises before anything is sent, so Placement keeps
    the last reported inventory: a host read that fails never shrinks it.
    """

    def __init__(self, messenger=None):
        self.messenger = messenger
        self._hypervisor = None  # one libvirt connection for the service's life
        self._version_checked = False
        self.last_desired: Optional[Desired] = None
        self.last_sync: Optional[dict] = None      # last sync that ran
        self.last_error: Optional[dict] = None     # last cycle that raised
        self.reshapes = 0
        self.reshape_errors = 0
        self._reconciler: Optional[Reconciler] = None  # set with the syncer
        self._upstream = None  # upstream = messaging: node_agent.remote.upstream
        self._applier_maintenance: Optional[dict] = None  # the applier's last say
        self._syncer: Optional[TreeSyncer] = None
        self._syncer_for: Optional[Loaded] = None
        self._refused_files: tuple = ()
        self._auditor: Optional[Auditor] = None  # on full verifies; set with the syncer
        self.last_audit: Optional[dict] = None
        self._companion: Optional[Companion] = None  # [agent] mode = companion
        self._companion_for: Optional[Loaded] = None
        self.last_companion: Optional[dict] = None
        self._lock = threading.Lock()

    def _syncer_of(self, loaded: Loaded) -> tuple[TreeSyncer, Reconciler, Auditor]:
        """The direct mode's syncer, and the reconciler and auditor made with
        it; new ones on the first cycle and after a reload."""
        syncer, reconciler, auditor = self._syncer, self._reconciler, self._auditor
        if (self._syncer_for is not loaded  # first cycle, or a reload
                or syncer is None or reconciler is None or auditor is None):
            # spread: a fleet started together does not verify together.
            syncer = TreeSyncer(loaded.client, StateStore(Path(loaded.settings.state_path)),
                                full_verify_interval=loaded.settings.full_verify_interval,
                                spread=True, owner=identity(loaded.settings))
            before = self._syncer_for
            if before is not None and _same_tree(before.settings, loaded.settings):
                provider_cache.carry_over(self._syncer, syncer)
            else:
                provider_cache.restore(syncer)
            self._syncer, self._syncer_for = syncer, loaded
            self._version_checked = False
            settings = loaded.settings
            reconciler = self._reconciler = Reconciler(
                loaded.client, syncer, guests_now=lambda: read_guests(
                    settings, self._hypervisor_for(settings.libvirt_uri,
                                                   settings.domain_capabilities)))
            auditor = self._auditor = Auditor(
                syncer, in_flight_grace=loaded.settings.audit_in_flight_grace)
        if not self._version_checked:
            assert loaded.client is not None, "direct mode has a Placement client"
            loaded.client.check_version()
            self._version_checked = True
        return syncer, reconciler, auditor

    def __call__(self, loaded: Loaded) -> CycleResult:
        started = utc_now()
        settings = loaded.settings
        try:
            state = StateStore(Path(settings.state_path)).load_or_empty(LOG)
            desired = compute_desired(settings, self._hypervisor_for(
                settings.libvirt_uri, settings.domain_capabilities),
                                      state=state, lenient_files=True)
            self._note_refused_files(desired.refused_files)
            if settings.companion:
                return self._companion_cycle(loaded, desired, started)
            outcome: CycleOutcome[CycleReport]
            if settings.upstream == "messaging":
                outcome, desired = self._via_applier(loaded, desired)
            else:
                syncer, reconciler, auditor = self._syncer_of(loaded)
                verified_at = syncer.verified_at
                desired = reconciler.maintained(desired)
                before = syncer.traits_by_name(desired.tree)
                outcome = reconciler.apply(desired, **self._reshape_hooks(loaded))
                provider_cache.keep(syncer)
                syncer.remember(APPLIED, file_traits_to_remember(
                    desired, syncer.state.get(APPLIED), before, clean=outcome.ok))
                if syncer.verified_at != verified_at:  # this cycle read the whole tree
                    self._audit(auditor, loaded, desired)
            if outcome.ok:
                forget_applied_off(StateStore(Path(settings.state_path)), desired.maintenance)
            report = outcome.report
            self._note_reshape(loaded, outcome)
        except NodeAgentError as exc:
            with self._lock:
                self.last_error = {"time": started, "error": str(exc)}
            if isinstance(exc, PlacementError) and self.messenger:
                self.messenger.sync_error(loaded.settings.host, [str(exc)])
            raise
        with self._lock:
            self.last_desired = desired
            self.last_error = None
            self.last_sync = {"time": started, "ok": outcome.ok,
                              "summary": report.summary(),
                              "errors": outcome.errors}
        if self.messenger:
            if report.applied:
                self.messenger.inventory_update(loaded.settings.host, report.applied,
                                                tree_summary(desired))
            if outcome.errors:
                self.messenger.sync_error(loaded.settings.host, outcome.errors)
        return CycleResult(outcome.ok, report.summary())

    def _note_refused_files(self, refused: tuple) -> None:
        """Log bad provider files when the set changes, not every cycle."""
        if refused == self._refused_files:
            return
        if refused:
            LOG.error("operator provider files refused; the other files and the rest "
                      "of the tree are still reported:\n%s",
                      "\n".join(f"  - {problem}" for problem in refused))
        else:
            LOG.info("operator provider files are all valid again")
        self._refused_files = refused

    def _audit(self, auditor: Auditor, loaded: Loaded, desired: Desired) -> None:
        """The allocation audit, after a sync that verified the whole tree.
        A failed read is logged; the cycle's sync result stands."""
        settings = loaded.settings
        try:
            result = auditor.run(desired, settings.host, settings.numa_in_placement)
        except NodeAgentError as exc:
            LOG.warning("allocation audit not done: %s", exc)
            return
        with self._lock:
            self.last_audit = result.as_dict()
        if auditor.changed() and self.messenger:
            self.messenger.audit(settings.host, self.last_audit)

    def _companion_cycle(self, loaded: Loaded, desired: Desired, started: str) -> CycleResult:
        """Companion mode: read (on the verify schedule), report, notify.
        Nothing is written to Placement; the cycle fails only when a read does."""
        from node_agent.cycle.companion import Companion, not_found_message

        settings = loaded.settings
        companion = self._companion
        if self._companion_for is not loaded or companion is None:  # first cycle, or a reload
            assert loaded.client is not None, "companion mode has a Placement client"
            loaded.client.check_version()
            companion = self._companion = Companion(
                loaded.client, StateStore(Path(settings.state_path)),
                full_verify_interval=settings.full_verify_interval,
                in_flight_grace=settings.audit_in_flight_grace)
            self._companion_for = loaded
        was_found = (self.last_companion or {}).get("found", True)
        report = companion.check(desired, settings)
        record = report.as_dict()
        if not report.found and was_found:
            LOG.warning("%s", not_found_message(settings.host, companion.client.endpoint))
        with self._lock:
            self.last_desired = desired
            self.last_error = None
            self.last_companion = record
            if report.verified and report.audit is not None:
                self.last_audit = report.audit
            self.last_sync = {"time": started, "ok": True, "summary": report.summary(),
                              "errors": []}
        if self.messenger:
            if companion.changed():
                self.messenger.drift(settings.host, record)
            if report.verified and report.found and companion.auditor.changed():
                self.messenger.audit(settings.host, report.audit)
        return CycleResult(True, report.summary())

    def _via_applier(self, loaded: Loaded,
                     desired: Desired) -> tuple[CycleOutcome[UpstreamReport], Desired]:
        """``[agent] upstream = messaging``: node-agent-applier applies it."""
        from node_agent.remote import upstream

        settings = loaded.settings
        if self._upstream is None:  # messaging options are read at start only
            self._upstream = upstream.MessagingUpstream(
                loaded.conf, settings.host, settings.upstream_topic,
                settings.upstream_timeout, key=keys.read_host_key(settings.upstream_key_file))
        report = self._upstream.send(with_owner_mark(desired, settings),
                                     timeout=settings.upstream_timeout)
        upstream.remember(StateStore(Path(settings.state_path)), report, desired)
        if report.maintenance is not None:   # a heartbeat's reply does not say
            self._applier_maintenance = report.maintenance
        if (self._applier_maintenance or {}).get("kept_by_placement"):
            # No record here (a lost state file), and the applier kept the
            # host closed from Placement's root trait: say so, as direct mode does.
            desired = with_placement_maintenance(desired, [maint.TRAIT])
        return CycleOutcome(report), desired

    def close(self) -> None:
        if self._upstream is not None:
            self._upstream.close()
        if self._hypervisor is not None:
            self._hypervisor.close()

    def _hypervisor_for(self, uri: str, read_write: bool = False):
        """The service's libvirt connection (reopened after a failed read or
        a reload that changed the URI or the connection kind); None without
        a hypervisor."""
        if not uri:
            return None
        if (self._hypervisor is None or self._hypervisor.uri != uri
                or self._hypervisor.read_write != read_write):
            from node_agent.host.hypervisor import Hypervisor
            if self._hypervisor is not None:
                self._hypervisor.close()
            self._hypervisor = Hypervisor(uri, read_write)
        return self._hypervisor

    def _reshape_hooks(self, loaded: Loaded) -> dict:
        """Announce a reshape just before its POST (reshape.start)."""
        if not self.messenger:
            return {}

        def before_post(body):
            self.messenger.reshape("start", loaded.settings.host,
                                   {"consumers": len(body.get("allocations", {}))})
        return {"before_post": before_post}

    def _note_reshape(self, loaded: Loaded, outcome) -> None:
        reshape = outcome.reshape
        host = loaded.settings.host
        if outcome.refused is not None:
            with self._lock:
                self.reshape_errors += 1
            if self.messenger:
                self.messenger.reshape("error", host, {"error": outcome.refused.reason})
        elif reshape is not None and reshape.reshaped:
            with self._lock:
                self.reshapes += 1
            if self.messenger:
                self.messenger.reshape("end", host, {
                    "consumers_moved": reshape.consumers_moved,
                    "request_id": reshape.request_id})

    def status(self, service: Service) -> dict:
        """What ``get_status`` answers: a JSON-able summary."""
        with self._lock:
            desired = self.last_desired
            health = service.health
            return {
                "host": service.config.settings.host,
                "cycles": service.cycles,
                "problem": None if health.kind is None else {
                    "kind": health.kind, "message": health.message,
                    "failed_cycles": health.failures},
                "last_sync": self.last_sync,
                "last_error": self.last_error,
                "audit": self.last_audit,
                "companion": self.last_companion,
                "maintenance": Maintenance(service.config.settings.state_path).get(desired),
                "tree": tree_summary(desired),
                "warnings": list(desired.warnings) if desired else [],
            }


def run(args: Sequence[str], loaded: Optional[Loaded] = None) -> int:
    """Run as a service until SIGTERM/SIGINT; returns the exit code.

    Raises ConfigError (exit 78) when the configuration cannot start.
    """
    loaded = loaded or load(args)
    from node_agent.service import metrics

    messenger = messaging.from_conf(loaded.conf, loaded.settings.host)
    collector = metrics.from_conf(loaded.conf)
    agent = Agent(messenger=messenger)
    service = Service(agent, lambda: load(args), loaded, notifier=systemd_notifier(),
                      after_cycle=collector.cycle_done if collector else None)
    service.install_signal_handlers()
    control = Control(agent, service)
    try:
        if collector:
            collector.start(agent, service)  # a busy port stops here, before READY=1
        if messenger:
            messenger.start_rpc(control)
        return service.run()
    finally:
        agent.close()
        if messenger:
            messenger.stop()
        if collector:
            collector.stop()
