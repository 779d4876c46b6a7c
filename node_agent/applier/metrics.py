"""``node-agent-applier``'s Prometheus metrics, read from the
:class:`~node_agent.applier.applier.Applier`'s counters at scrape time.
Served on ``[applier] metrics_port`` (0: none), as the agent's are.

Counts are per process since its start: sum them over the processes.
The endpoint adds ``node_agent_build_info`` and the process's own
``process_*`` metrics, as the agent's does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from node_agent.errors import ResourceError
from node_agent.remote import signing
from node_agent.service.metrics import endpoint_registry, listen_problem

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

LOG = logging.getLogger(__name__)
PREFIX = "node_agent_applier"
# Always exported, 0 until seen: an alert on "forged" needs the series.
REFUSAL_REASONS = ("format", "tree", "owner", *signing.REASONS, "replayed")


class ApplierCollector:
    def __init__(self, applier):
        self.applier = applier

    def collect(self):
        applier = self.applier
        with applier._counting:
            outcomes = dict(applier.outcomes)
            refused = dict(applier.refused)
            lock_waits, requests = applier.lock_waits, applier.placement_requests
        closed, closes, reopens, dead_requests = applier.dead.snapshot()
        requests += dead_requests
        messages = CounterMetricFamily(
            f"{PREFIX}_messages",
            "Agent messages handled, by the status of the reply "
            "(applied, unchanged, stale: not above the last applied sequence number "
            "and never applied, i.e. out of order; refused, busy, error, unknown_digest).",
            labels=["status"],
        )
        for status in (
            "applied",
            "unchanged",
            "stale",
            "refused",
            "busy",
            "error",
            "unknown_digest",
        ):
            messages.add_metric([status], outcomes.get(status, 0))
        yield messages
        refusals = CounterMetricFamily(
            f"{PREFIX}_refused",
            "Messages refused, by reason: format (wire schema, "
            "version, digest), tree (another host's providers), owner (a root another "
            "machine or nova-compute manages), unsigned, forged "
            "(signature does not verify for the named host), expired_key (previous "
            "master after its overlap), replayed (a copy of a message already "
            "applied).",
            labels=["reason"],
        )
        for reason in sorted(set(REFUSAL_REASONS) | set(refused)):
            refusals.add_metric([reason], refused.get(reason, 0))
        yield refusals
        waits = CounterMetricFamily(
            f"{PREFIX}_lock_waits",
            "Messages that found their host locked by another "
            "message (this process or another applier).",
        )
        waits.add_metric([], lock_waits)
        yield waits
        sent = CounterMetricFamily(
            f"{PREFIX}_placement_requests", "Requests sent to Placement while handling messages."
        )
        sent.add_metric([], requests)
        yield sent
        hosts = GaugeMetricFamily(
            f"{PREFIX}_hosts_closed_dead",
            "Hosts closed as dead (no message for [applier] dead_after seconds: "
            "COMPUTE_STATUS_DISABLED on the root), as this process's last sweep "
            "read the shared records: every process reports the same set.",
        )
        hosts.add_metric([], len(closed))
        yield hosts
        since = GaugeMetricFamily(
            f"{PREFIX}_dead_host_closed_timestamp_seconds",
            "Per host closed as dead: when it was closed (seconds since the epoch).",
            labels=["host"],
        )
        for host, at in sorted(closed.items()):
            since.add_metric([host], at)
        yield since
        for name, value, text in (
            ("closes", closes, "Hosts this process closed as dead."),
            ("reopens", reopens, "Hosts closed as dead that this process reopened."),
        ):
            family = CounterMetricFamily(f"{PREFIX}_dead_host_{name}", text)
            family.add_metric([], value)
            yield family


def serve(applier, port: int, host: str) -> Optional[WSGIServer]:
    """Start the HTTP endpoint (None when ``port`` is 0); raises
    ResourceError (exit 69) when the port is taken."""
    if not port:
        return None
    registry = endpoint_registry(ApplierCollector(applier))
    try:
        server, _thread = start_http_server(port, host, registry=registry)
    except OSError as exc:
        raise ResourceError(listen_problem("[applier] metrics_port", host, port, exc)) from None
    LOG.info("metrics on http://%s:%d/metrics", host, port)
    return server
