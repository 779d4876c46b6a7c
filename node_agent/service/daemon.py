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

from node_agent.cycle.desired import Desired, compute_desired
from node_agent.errors import NodeAgentError, PlacementError
from node_agent.host.libvirt_facts import read_guests
from node_agent.model.settings import Settings
from node_agent.remote import messaging
from node_agent.runner import Blocked, CycleReport, CycleRunner, runner_for
from node_agent.service.control import Control, Maintenance, utc_now
from node_agent.service.loop import CycleResult, Service, systemd_notifier
from node_agent.service.restart_only import changed_restart_only, parsed_files
from node_agent.startup import validate
from node_agent.state import StateStore

if TYPE_CHECKING:
    from node_agent.placement.client import PlacementClient

# Imported inside the functions that use them, and only there: what a mode
# needs (node_agent.runner loads it for the mode it runs),
# node_agent.host.hypervisor (libvirt), and node_agent.service.metrics
# (prometheus_client), which the CLI, importing this module, never uses.
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
    """Parse and validate the config files (:func:`node_agent.startup.validate`,
    the same checks as ``--check-config``); raises ConfigError."""

    valid = validate(args, lenient_files=True)
    # With upstream = messaging the client is None: node-agent-applier holds Placement.
    # Validated.client is typed object; it is validate()'s PlacementClient or None.
    return Loaded(valid.conf, valid.settings, cast("Optional[PlacementClient]", valid.client))


def tree_summary(desired: Optional[Desired]) -> list[dict]:
    if desired is None:
        return []
    return [
        {
            "name": p.name,
            "uuid": p.uuid,
            "parent": p.parent,
            "inventories": {rc: inv.total for rc, inv in sorted(p.inventories.items())},
        }
        for p in desired.tree.providers
    ]


class Agent:
    """The cycle of the service and what it remembers between cycles.

    A failed discovery raises before anything is sent, so Placement keeps
    the last reported inventory: a host read that fails never shrinks it.
    """

    def __init__(self, messenger=None):
        self.messenger = messenger
        self._hypervisor = None  # one libvirt connection for the service's life
        self.last_desired: Optional[Desired] = None
        self.last_sync: Optional[dict] = None  # last sync that ran
        self.last_error: Optional[dict] = None  # last cycle that raised
        # Shared storage as the last cycle left it (policy/shared_storage.py: report).
        self.last_shared: Optional[dict] = None
        self.reshapes = 0
        self.reshape_errors = 0
        self._runner: Optional[CycleRunner] = None  # one per loaded config
        self._runner_for: Optional[Loaded] = None
        self._refused_files: tuple = ()
        self.last_audit: Optional[dict] = None
        self.last_companion: Optional[dict] = None
        # What the last cycle that ran left refused (the metrics' problem);
        # kept through a failed cycle, so a refusal that outlasts an outage
        # is not announced again.
        self.blocked: Optional[Blocked] = None
        self._lock = threading.Lock()

    def _runner_of(self, loaded: Loaded) -> CycleRunner:
        """The runner of this config (:func:`node_agent.runner.runner_for`),
        built at its first cycle; a reload's takes over the last one's cache
        and bus connection."""
        if self._runner_for is not loaded:  # first cycle, or a reload
            settings = loaded.settings
            self._runner = runner_for(
                loaded.conf,
                settings,
                loaded.client,
                service=True,
                previous=self._runner,
                guests_now=lambda: read_guests(
                    settings,
                    self._hypervisor_for(settings.libvirt_uri, settings.domain_capabilities),
                ),
            )
            self._runner_for = loaded
        assert self._runner is not None
        return self._runner

    # What tests reach into: the mode's own objects, when the runner has them.
    @property
    def _syncer(self):
        return getattr(self._runner, "syncer", None)

    @property
    def _auditor(self):
        return getattr(self._runner, "auditor", None)

    @property
    def _companion(self):
        return getattr(self._runner, "companion", None)

    def __call__(self, loaded: Loaded) -> CycleResult:
        started = utc_now()
        settings = loaded.settings
        try:
            state = StateStore(Path(settings.state_path)).load_or_empty(LOG)
            desired = compute_desired(
                settings,
                self._hypervisor_for(settings.libvirt_uri, settings.domain_capabilities),
                state=state,
                lenient_files=True,
            )
            self._note_refused_files(desired.refused_files)
            report = self._runner_of(loaded).run(desired, **self._reshape_hooks(loaded))
            self._note_findings(loaded, report)
            self._note_reshape(loaded, report.outcome)
            self._note_blocked(report)
        except NodeAgentError as exc:
            with self._lock:
                self.last_error = {"time": started, "error": str(exc)}
            if isinstance(exc, PlacementError) and self.messenger:
                self.messenger.sync_error(loaded.settings.host, [str(exc)])
            raise
        desired = report.desired
        with self._lock:
            self.last_desired = desired
            self.last_error = None
            self.last_shared = report.shared_storage
            self.last_sync = {
                "time": started,
                "ok": report.ok,
                "summary": report.summary,
                "errors": report.errors,
            }
        if self.messenger:
            if report.applied:
                self.messenger.inventory_update(
                    loaded.settings.host, report.applied, tree_summary(desired)
                )
            if report.errors:
                self.messenger.sync_error(loaded.settings.host, report.errors)
        return CycleResult(report.ok, report.summary)

    def _note_refused_files(self, refused: tuple) -> None:
        """Log bad provider files when the set changes, not every cycle."""
        if refused == self._refused_files:
            return
        if refused:
            LOG.error(
                "operator provider files refused; the other files and the rest "
                "of the tree are still reported:\n%s",
                "\n".join(f"  - {problem}" for problem in refused),
            )
        else:
            LOG.info("operator provider files are all valid again")
        self._refused_files = refused

    def _note_blocked(self, report: CycleReport) -> None:
        """One ERROR when a refusal appears or changes, DEBUG while it stays,
        one INFO when it clears: a refusal can last for days."""
        blocked = report.blocked
        if report.busy:
            LOG.warning("%s; the next cycle tries again", "; ".join(report.errors))
        if blocked == self.blocked:
            if blocked is not None:
                LOG.debug("still refused (%s): %s", blocked.reason, blocked.text)
        elif blocked is not None:
            LOG.error(
                "%s; logged again when this changes, the metric node_agent_problem"
                '{reason="%s"} stays 1 until then',
                blocked.text,
                blocked.reason,
            )
        else:
            assert self.blocked is not None
            LOG.info("the refusal (%s) is over: the tree is applied whole", self.blocked.reason)
        with self._lock:
            self.blocked = blocked

    def _note_findings(self, loaded: Loaded, report: CycleReport) -> None:
        """Keep the audit and the companion check, and announce what is new."""
        host = loaded.settings.host
        with self._lock:
            if report.companion is not None:
                self.last_companion = report.companion.as_dict()
            if report.audit is not None:
                self.last_audit = report.audit
        if self.messenger and report.drift_changed():
            self.messenger.drift(host, self.last_companion)
        if self.messenger and report.audit_changed():
            self.messenger.audit(host, self.last_audit)

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
        if self._hypervisor is not None:
            self._hypervisor.close()

    def _hypervisor_for(self, uri: str, read_write: bool = False):
        """The service's libvirt connection (reopened after a failed read or
        a reload that changed the URI or the connection kind); None without
        a hypervisor."""
        if not uri:
            return None
        if (
            self._hypervisor is None
            or self._hypervisor.uri != uri
            or self._hypervisor.read_write != read_write
        ):
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
            self.messenger.reshape(
                "start", loaded.settings.host, {"consumers": len(body.get("allocations", {}))}
            )

        return {"before_post": before_post}

    def _note_reshape(self, loaded: Loaded, outcome) -> None:
        if outcome is None:  # no reconciler ran here
            return
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
                self.messenger.reshape(
                    "end",
                    host,
                    {"consumers_moved": reshape.consumers_moved, "request_id": reshape.request_id},
                )

    def status(self, service: Service) -> dict:
        """What ``get_status`` answers: a JSON-able summary."""
        with self._lock:
            desired = self.last_desired
            health = service.health
            return {
                "host": service.config.settings.host,
                "cycles": service.cycles,
                "problem": None
                if health.kind is None
                else {
                    "kind": health.kind,
                    "message": health.message,
                    "failed_cycles": health.failures,
                },
                "last_sync": self.last_sync,
                "last_error": self.last_error,
                "audit": self.last_audit,
                "companion": self.last_companion,
                "maintenance": Maintenance(service.config.settings.state_path).get(desired),
                "device_maintenance": Maintenance(service.config.settings.state_path).devices(
                    desired
                ),
                "tree": tree_summary(desired),
                "shared_storage": self.last_shared,
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
    service = Service(
        agent,
        lambda: load(args),
        loaded,
        notifier=systemd_notifier(),
        after_cycle=collector.cycle_done if collector else None,
        unapplied=lambda old, new: changed_restart_only(
            parsed_files(old.conf), parsed_files(new.conf)
        ),
    )
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
