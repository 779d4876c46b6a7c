"""Prometheus metrics, computed at scrape time from the agent's current
state (a custom collector), never kept as increments that could drift.

Served over HTTP on ``[agent] metrics_port`` (``metrics_host``) and/or
written after each cycle to ``[agent] metrics_textfile`` for
node_exporter's textfile collector. Both are off by default.

Placement request counts come from the client's request log, so they
restart from zero when a SIGHUP builds a new client.

Names follow Prometheus' conventions, as ``promtool check metrics``
checks them: ``_total`` on counters only, base units (seconds), a HELP for
each family (tests/promlint.py restates its checks on the real output). The
endpoint adds the process's own metrics (``process_*``, read from
/proc/self); the textfile does not: node_exporter, which reads it, exports
its own ``process_*`` series, and a file written once a cycle would show
stale CPU and memory figures.
"""

from __future__ import annotations

import errno
import logging
import os
import platform
import time
from collections import Counter
from types import SimpleNamespace
from typing import TYPE_CHECKING, Optional

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    ProcessCollector,
    start_http_server,
    write_to_textfile,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.samples import Sample

from node_agent.errors import ResourceError
from node_agent.version import installed_version

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer
from node_agent.policy.device_maintenance import in_maintenance
from node_agent.policy.maintenance import is_on

LOG = logging.getLogger(__name__)
PREFIX = "node_agent"


# Cycle durations: a cycle with no change takes well under a second, a
# first sync or a reshape several seconds, a hung Placement up to its timeout.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, float("inf"))


def _counter(name, doc, value):
    """A monotonic count: exposed as ``<name>_total`` of type counter."""
    family = CounterMetricFamily(f"{PREFIX}_{name}", doc)
    family.add_metric([], value)
    return family


def _gauge(name, doc, value=None, labels=()):
    family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels) or None)
    if value is not None:
        family.add_metric([], value)
    return family


class BuildInfo:
    """``node_agent_build_info{version, python} 1``: which build runs, for a
    fleet upgrade's dashboard. The version is read once (package metadata)."""

    def __init__(self):
        self.version = installed_version()
        self.python = platform.python_version()

    def collect(self):
        family = GaugeMetricFamily(
            f"{PREFIX}_build_info",
            "Always 1: the node-agent version and the Python that runs it.",
            labels=["version", "python"],
        )
        family.add_metric([self.version, self.python], 1)
        yield family


def endpoint_registry(*collectors) -> CollectorRegistry:
    """What an HTTP endpoint serves: ``collectors``, the build info and the
    process's own metrics (``process_*`` from /proc/self: resident memory,
    CPU seconds, start time, open file descriptors)."""
    registry = CollectorRegistry()
    for collector in (*collectors, BuildInfo()):
        registry.register(collector)
    ProcessCollector(registry=registry)
    return registry


# Problem kinds, each always exported (0 when not current).
PROBLEM_KINDS = ("placement", "host", "config", "state", "internal")


def current_problem(service, agent) -> Optional[tuple[str, str]]:
    """The (kind, reason) ``node_agent_problem`` shows at 1: a cycle that
    failed (the loop's health: its kind, the error's class), else what the
    last cycle left blocked (:class:`node_agent.runner.Blocked`), else None."""
    health = service.health
    if health.kind is not None:
        return health.kind, getattr(health, "reason", "") or health.kind
    blocked = getattr(agent, "blocked", None)
    if blocked is not None:
        return blocked.kind, blocked.reason
    return None


def listen_problem(option: str, host: str, port: int, exc: OSError) -> str:
    """Why the metrics endpoint cannot listen, and the fix for that cause."""
    if exc.errno == errno.EADDRINUSE:
        fix = "Another process holds the port (see `ss -ltnp`); stop it or choose another port."
    elif exc.errno == errno.EACCES and port < 1024:
        fix = (
            "Ports below 1024 need privileges the service user does not have; "
            "choose a port above 1023."
        )
    elif exc.errno == errno.EADDRNOTAVAIL:
        fix = f"{host} is not an address of this machine; choose one it has."
    else:
        fix = "Choose another port or address."
    return f"{option} = {port}: cannot listen on {host}:{port}: {exc.strerror or exc}. {fix}"


class AgentCollector:
    """Reads the agent and the loop when scraped."""

    def __init__(self, agent, service):
        self.agent = agent
        self.service = service

    def collect(self):
        service, agent = self.service, self.agent
        yield _gauge(
            "last_cycle_duration_seconds",
            "Duration of the last cycle.",
            service.last_duration or 0.0,
        )
        yield _gauge(
            "last_success_timestamp_seconds",
            "Unix time of the last cycle after which Placement held everything "
            "this host should publish (0: none yet); a cycle that failed or that "
            "left a change refused does not move it.",
            service.last_success or 0.0,
        )
        yield _counter("cycles", "Cycles run since the agent started.", service.cycles)
        yield _gauge(
            "failed_cycles", "Failed cycles in a row (0 when healthy).", service.health.failures
        )
        problem = _gauge(
            "problem",
            "1 for the current problem: its kind (placement, host, config, "
            "state, internal) and reason (the error's class, e.g. placement_error, "
            "provider_owned; or what the last cycle refused: guests_do_not_fit, "
            "reshape_refused, changes_refused); 0 for every other kind.",
            labels=["kind", "reason"],
        )
        current = current_problem(service, agent)
        for kind in PROBLEM_KINDS:
            if current is not None and current[0] == kind:
                problem.add_metric([kind, current[1]], 1)
            else:  # no reason label: the series the kind had before reasons
                problem.samples.append(Sample(problem.name, {"kind": kind}, 0))
        yield problem
        last = agent.last_sync or {}
        yield _gauge(
            "sync_errors", "Changes the last sync could not apply.", len(last.get("errors", []))
        )
        yield _counter("reshapes", "Reshapes done since the agent started.", agent.reshapes)
        yield _counter(
            "reshape_errors",
            "Reshapes refused or failed since the agent started.",
            agent.reshape_errors,
        )
        desired = agent.last_desired
        maintenance = bool(desired and is_on(desired.maintenance))
        yield _gauge(
            "maintenance", "1 while the reported tree is in maintenance.", 1 if maintenance else 0
        )
        devices = _gauge(
            "device_maintenance",
            "1 for each child provider in maintenance on its own (maintenance "
            "--provider); absent when none is.",
            labels=("provider",),
        )
        for name in in_maintenance(desired.tree) if desired else ():
            devices.add_metric([name], 1)
        yield devices
        yield self._inventories()
        yield self._shared_storage()
        yield self._requests()
        yield self._audit()
        yield self._drift()

    def _drift(self):
        """Companion mode only, absent until its first check."""
        family = _gauge(
            "drift_differences",
            "Differences between Placement and "
            "this host found by companion mode, per kind (inventory, "
            "trait, provider); -1 when Placement has no provider of "
            "the host's name.",
            labels=["kind"],
        )
        last = getattr(self.agent, "last_companion", None)
        if last is not None:
            counts = Counter(d["kind"] for d in last["drift"])
            for kind in ("inventory", "trait", "provider"):
                family.add_metric([kind], counts[kind] if last["found"] else -1)
        return family

    def _audit(self):
        """Absent until the first audit ran: no audit is not "no finding"."""
        family = _gauge(
            "audit_findings",
            "Findings of the last allocation audit, "
            "per kind (orphan, no_allocation, size_mismatch) and state "
            "(alarm, in_flight, pending).",
            labels=["kind", "state"],
        )
        last = getattr(self.agent, "last_audit", None)
        for kind, states in sorted(((last or {}).get("counts") or {}).items()):
            for state, count in sorted(states.items()):
                family.add_metric([kind, state], count)
        return family

    def _inventories(self):
        # Formerly node_agent_inventory_total, a counter's suffix on a gauge
        # (promtool refuses it); docs/admin/metrics.md keeps the old name.
        family = _gauge(
            "inventory",
            "Inventory total reported, per provider and resource class.",
            labels=["provider", "resource_class"],
        )
        desired = self.agent.last_desired
        for provider in desired.tree.providers if desired else ():
            for rc, inventory in sorted(provider.inventories.items()):
                family.add_metric([provider.name, rc], inventory.total)
        # The sharing provider, as Placement holds it after the cycle.
        shared = getattr(self.agent, "last_shared", None)
        if shared and shared.get("provider") and shared.get("disk_gb") is not None:
            family.add_metric([shared["provider"], "DISK_GB"], shared["disk_gb"])
        return family

    def _shared_storage(self):
        """Absent without [compute] shared_storage_aggregate."""
        family = _gauge(
            "shared_storage_moved",
            "1 when this host's DISK_GB is on the sharing provider of its "
            "[compute] shared_storage_aggregate and its root offers none, 0 "
            "while the move is pending or refused; per aggregate and provider.",
            labels=["aggregate", "provider"],
        )
        shared = getattr(self.agent, "last_shared", None)
        if shared and shared.get("aggregate"):
            family.add_metric([shared["aggregate"], shared["provider"]], int(bool(shared["moved"])))
        return family

    def _requests(self):
        family = CounterMetricFamily(
            f"{PREFIX}_placement_requests",
            "HTTP requests sent to Placement by method and status (0: no response).",
            labels=["method", "status"],
        )
        client = getattr(self.service.config, "client", None)
        counts = getattr(getattr(client, "stats", None), "by_status", Counter())
        for (method, status), count in sorted(counts.items()):
            family.add_metric([method, str(status)], count)
        return family


# systemd/node-agent.service's ReadWritePaths=: the textfile directory of
# Debian's prometheus-node-exporter (--collector.textfile.directory).
UNIT_TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"


def textfile_fix(exc: OSError, path: str) -> str:
    """What to do when ``[agent] metrics_textfile`` cannot be written."""
    directory = os.path.dirname(os.path.abspath(path))
    if exc.errno == errno.EROFS:
        return (
            f"{directory} is read-only to the agent: the shipped unit "
            f"(ProtectSystem=strict) allows {UNIT_TEXTFILE_DIR}, node_exporter's "
            "textfile directory on Debian; for another, add ReadWritePaths="
            f"{directory} with `systemctl edit node-agent`, then restart"
        )
    if exc.errno == errno.EACCES:
        return (
            "the service user may not write into the directory: "
            f"`setfacl -m u:node-agent:rwx {directory}` (keeps its owner)"
        )
    if exc.errno == errno.ENOENT:
        return f"{directory} does not exist: point it at node_exporter's textfile directory"
    return "the file is tried again after each cycle"


class Metrics:
    def __init__(self, port: int = 0, host: str = "127.0.0.1", textfile: Optional[str] = None):
        self.port = port
        self.host = host
        self.textfile = textfile
        self.registry = CollectorRegistry()
        self._server: Optional[WSGIServer] = None
        self.durations = Histogram(
            f"{PREFIX}_cycle_duration_seconds",
            "Duration of each cycle.",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self._service = None
        self._textfile_problem: object = None  # the errno of the last failure

    def start(self, agent, service) -> None:
        self._service = service
        collector = AgentCollector(agent, service)
        self.registry.register(collector)
        self.registry.register(BuildInfo())
        if self.port:
            served = endpoint_registry(collector, self.durations)
            try:
                self._server, _thread = start_http_server(self.port, self.host, registry=served)
            except OSError as exc:
                raise ResourceError(
                    listen_problem("[agent] metrics_port", self.host, self.port, exc)
                ) from None
            LOG.info("metrics on http://%s:%d/metrics", self.host, self.port)

    def cycle_done(self) -> None:
        if self._service is not None and self._service.last_duration is not None:
            self.durations.observe(self._service.last_duration)
        self.write_textfile()

    def write_textfile(self) -> None:
        """Write the file; a failure is logged once per cause, not every
        cycle, and its end once."""
        if not self.textfile:
            return
        try:
            write_to_textfile(self.textfile, self.registry)
        except OSError as exc:
            cause = exc.errno or str(exc)
            if cause != self._textfile_problem:
                self._textfile_problem = cause
                LOG.warning(
                    "cannot write metrics to %s: %s. %s",
                    self.textfile,
                    exc.strerror or exc,
                    textfile_fix(exc, self.textfile),
                )
            return
        if self._textfile_problem is not None:
            self._textfile_problem = None
            LOG.info("metrics written to %s again", self.textfile)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def from_conf(conf) -> Optional[Metrics]:
    agent = conf.agent
    if not agent.metrics_port and not agent.metrics_textfile:
        return None
    return Metrics(agent.metrics_port, agent.metrics_host, agent.metrics_textfile)


def write_once(
    conf,
    desired,
    client,
    duration: float,
    errors: list,
    companion: Optional[dict] = None,
    audit: Optional[dict] = None,
    blocked=None,
    shared_storage: Optional[dict] = None,
) -> None:
    """``--once``: the service's metrics for this one cycle, written to
    ``[agent] metrics_textfile`` when it is set, so node_exporter's textfile
    collector shows hosts synced by a timer too. ``companion`` and ``audit``:
    companion mode's check, for the drift and audit gauges; ``blocked``: what
    the cycle left refused (:class:`node_agent.runner.Blocked`), the problem;
    ``shared_storage``: the cycle's shared-storage report."""

    if not conf.agent.metrics_textfile:
        return
    metrics = Metrics(textfile=conf.agent.metrics_textfile)
    service = SimpleNamespace(
        last_duration=duration,
        last_success=None if errors else time.time(),
        cycles=1,
        health=SimpleNamespace(failures=0, kind=None),
        config=SimpleNamespace(client=client),
    )
    agent = SimpleNamespace(
        last_sync={"errors": list(errors)},
        reshapes=0,
        reshape_errors=0,
        last_desired=desired,
        last_companion=companion,
        last_audit=audit,
        blocked=blocked,
        last_shared=shared_storage,
    )
    metrics.start(agent, service)
    metrics.cycle_done()
