"""The allocation audit in the agent's cycle: when it runs, what it reads,
what it remembers.

It runs after a sync that did a full verify (``[agent]
full_verify_interval``: the syncer has just read the whole tree), and on
demand (``node-agent audit``, ``--dry-run``); a steady cycle sends no
request for it. What it remembers between audits (when each guest and each
orphan was first seen, and the last set of findings notified) lives in the
state file under ``audit``, so a restart neither forgets how long a
consumer has been orphaned nor re-announces the same findings.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from node_agent.placement import audit_read
from node_agent.policy import audit as policy
from node_agent.state import AUDIT

LOG = logging.getLogger(__name__)

STATE_KEY = AUDIT


def holding_providers(states) -> list[str]:
    """Providers of the tree that can hold allocations: those with inventory."""
    return sorted(s.uuid for s in states if s.inventories)


def valid_history(record) -> bool:
    """``{"guests": {uuid: seconds}, "orphans": {uuid: seconds},
    "unallocated": {uuid: seconds}, "notified": ...}``."""
    if not isinstance(record, dict):
        return False
    for key in ("guests", "orphans", "unallocated"):
        seen = record.get(key, {})
        if not isinstance(seen, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
            for k, v in seen.items()
        ):
            return False
    notified = record.get("notified")
    return notified is None or isinstance(notified, list)


class Auditor:
    """Reads the allocations on the host's providers and audits them."""

    def __init__(
        self,
        syncer,
        clock: Callable[[], float] = time.time,
        in_flight_grace: float = policy.IN_FLIGHT_GRACE,
    ):
        self.syncer = syncer
        self.clock = clock
        self.in_flight_grace = in_flight_grace  # [agent] audit_in_flight_grace
        self.last: Optional[policy.AuditResult] = None
        self.requests = 0  # of the last audit

    def _history(self) -> dict:
        """The state file's ``audit`` record; one not of the shape this
        version writes (hand-edited, another version's) is logged and
        started afresh: it only delays alarms by one audit."""
        record = self.syncer.state.get(STATE_KEY)
        if record is None:
            return {}
        if valid_history(record):
            return dict(record)
        LOG.warning(
            "state file: the '%s' record is not as expected (%.80r); the audit's "
            "observations start again (alarms wait for a second audit)",
            STATE_KEY,
            record,
        )
        return {}

    def run(self, desired, host: str, numa: bool, save: bool = True) -> policy.AuditResult:
        """Audit against the syncer's view of the tree (read it first: a
        sync or a plan). ``save`` keeps the observations in the state file
        (not for ``--dry-run``, which writes nothing)."""
        client = self.syncer.client
        states = self.syncer.cached_tree() or []
        start = client.stats.total
        allocations = audit_read.read_provider_allocations(client, holding_providers(states))
        guests = desired.host.guests
        details = audit_read.read_consumers(client, policy.to_look_up(guests, allocations))
        history = self._history()
        result = policy.audit(
            guests,
            allocations,
            history,
            self.clock(),
            details,
            host_providers=[s.uuid for s in states],
            pcpu_offered=any("PCPU" in s.inventories for s in states),
            numa_nodes=policy.numa_provider_nodes(((s.uuid, s.name) for s in states), host)
            if numa
            else None,
            in_flight_grace=self.in_flight_grace,
        )
        self.requests = client.stats.total - start
        if save:
            self.syncer.remember(STATE_KEY, {**result.history, "notified": history.get("notified")})
        self.last = result
        LOG.info("%s (%d requests)", policy.summary_line(result), self.requests)
        return result

    def changed(self) -> bool:
        """True once per new set of findings (alarms and in-flight cases):
        the caller sends a notification. Remembered in the state file."""
        if self.last is None:
            return False
        signature = [list(s) for s in self.last.signature()]
        history = self._history()
        if (history.get("notified") or []) == signature:
            return False
        self.syncer.remember(STATE_KEY, {**history, "notified": signature})
        return True
