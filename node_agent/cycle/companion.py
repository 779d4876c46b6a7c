"""Companion mode (``[agent] mode = companion``): the cycle for a host whose
provider someone else writes, nova-compute above all (trait OWNER_NOVA).

It reads and reports; it never writes to Placement. That is structural: it
holds a :class:`~node_agent.placement.readonly.ReadOnlyPlacement`, and so do
the audit and the reshape planner it calls. It never creates a provider
either: a host whose name Placement does not know is reported as such.

What it reports (:class:`CompanionReport`):

* the owner of the root, by its ``OWNER_*`` trait;
* drift (:mod:`node_agent.policy.drift`): inventories and traits that
  differ from what node-agent would publish, each with the option that
  explains it;
* the allocation audit (:mod:`node_agent.cycle.audit`);
* what nova-compute will do at its next restart with this configuration
  (read from nova.conf): the reshape it will send (VCPU -> PCPU for pinned
  guests after a ``cpu_dedicated_set`` change) and the guests that will
  block it.

Cost: Placement is read on the full-verify schedule (``[agent]
full_verify_interval``) or on demand (``--once``, ``node-agent audit``):
one ``GET ?name``, one ``GET ?in_tree``, two reads per provider whose
generation moved, then the audit's and the preview's reads (a read the
audit made is not sent again for the preview). Between them a
cycle sends nothing: the drift is recomputed against what the last read
saw, so a change on the host shows at once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from node_agent.cycle.audit import Auditor
from node_agent.errors import ReshapeError
from node_agent.model.provider_state import ProviderState
from node_agent.placement.readonly import ReadOnlyPlacement
from node_agent.placement.reshape_host import host_reshape_inputs
from node_agent.placement.reshape_reads import plan_reshape
from node_agent.policy import drift as drift_policy
from node_agent.policy.audit import IN_FLIGHT_GRACE
from node_agent.policy.guest_fit import blocks_nova, guests_refused, nova_pinnable
from node_agent.tree.cpu_traits import NOT_DECIDED_BY_NOVA

LOG = logging.getLogger(__name__)

NOTIFIED_KEY = "drift_notified"


@dataclass(frozen=True)
class CompanionReport:
    """One companion check. ``root_uuid`` None: Placement has no provider
    of the host's name (nothing else is then known)."""

    host: str
    root_uuid: Optional[str] = None
    owner: Optional[str] = None
    differences: tuple[drift_policy.Difference, ...] = ()
    audit: Optional[dict] = None  # AuditResult.as_dict()
    next_restart: Optional[dict] = None  # {"reshape", "blocking", "lines"}
    verified: bool = False  # this check read Placement
    requests: int = 0  # ... with this many requests
    read_at: Optional[float] = None  # when Placement was last read (clock)

    @property
    def found(self) -> bool:
        return self.root_uuid is not None

    @property
    def alarms(self) -> int:
        return (self.audit or {}).get("alarms", 0)

    @property
    def in_sync(self) -> bool:
        """Placement matches the host: found, no drift, no audit alarm."""
        return self.found and not self.differences and not self.alarms

    def as_dict(self) -> dict:
        return {
            "host": self.host,
            "root_uuid": self.root_uuid,
            "owner": self.owner,
            "found": self.found,
            "drift": [d.as_dict() for d in self.differences],
            "next_restart": self.next_restart,
            "verified": self.verified,
            "requests": self.requests,
        }

    def summary(self) -> str:
        if not self.found:
            return f"companion: no provider named {self.host} in Placement"
        return (
            f"companion: {len(self.differences)} difference(s) with Placement, "
            f"{self.alarms} audit alarm(s)"
        )


def not_found_message(host: str, endpoint: str) -> str:
    return (
        f"Placement at {endpoint} has no resource provider named {host}. "
        "Companion mode never creates one: start nova-compute (or whatever "
        "owns this host's provider) first, or check [DEFAULT] host against "
        "the provider's name (`openstack resource provider list`)."
    )


class Companion:
    """Reads the host's provider tree, audits it and compares it with the
    desired one. Quacks like a syncer for :class:`Auditor` (``client``,
    ``cached_tree``, ``state``, ``remember``), with a read-only client."""

    def __init__(
        self,
        client,
        store,
        full_verify_interval: float = 300,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        in_flight_grace: float = IN_FLIGHT_GRACE,
    ):
        self.client = ReadOnlyPlacement(client)
        self.store = store
        self.full_verify_interval = full_verify_interval
        self.clock = clock
        self._state = store.load_or_empty(LOG)
        self._held: Optional[dict[str, ProviderState]] = None  # uuid -> state
        self._root_uuid: Optional[str] = None
        self._due_at: Optional[float] = None
        self._read_at: Optional[float] = None
        self.auditor = Auditor(self, clock=wall_clock, in_flight_grace=in_flight_grace)
        self._audit: Optional[dict] = None
        self._next_restart: Optional[dict] = None
        self.last: Optional[CompanionReport] = None

    # -- what the Auditor needs

    def cached_tree(self) -> Optional[list[ProviderState]]:
        return None if self._held is None else list(self._held.values())

    @property
    def state(self) -> dict:
        return dict(self._state)

    def remember(self, key: str, value) -> None:
        """Keep ``value`` in the local state file (never in Placement)."""
        if self._state.get(key) == value:
            return
        self._state = self.store.put(key, value)

    # -- reading

    def verify_due(self) -> bool:
        return (
            self._held is None
            or self._due_at is None
            or self.full_verify_interval <= 0
            or self.clock() >= self._due_at
        )

    def _read(self, host: str) -> None:
        """The root by name, its tree, and the inventories and traits of
        each provider whose generation moved since the last read."""
        listed = self.client.providers_named(host)
        if not listed:
            self._root_uuid, self._held = None, {}
            return
        root = listed[0]["uuid"]
        tree = self.client.providers_in_tree(root)
        old = self._held or {}
        held = {}
        for rp in tree:
            known = old.get(rp["uuid"])
            if known is not None and known.generation == rp["generation"]:
                held[rp["uuid"]] = replace(
                    known, name=rp["name"], parent_uuid=rp.get("parent_provider_uuid")
                )
                continue
            inventories = self.client.inventories(rp["uuid"])
            traits = self.client.traits(rp["uuid"])
            held[rp["uuid"]] = ProviderState(
                rp["uuid"],
                rp["name"],
                traits["resource_provider_generation"],
                rp.get("parent_provider_uuid"),
                inventories["inventories"],
                frozenset(traits["traits"]),
            )
        self._root_uuid, self._held = root, held

    def check(self, desired, settings, force: bool = False, save: bool = True) -> CompanionReport:
        """Compare ``desired`` (a cycle's :class:`~node_agent.cycle.desired.Desired`)
        with Placement. Reads Placement when ``force`` or a verify is due;
        else compares with the last read (no request). ``save``: keep the
        audit's observations in the state file (not for ``--dry-run``)."""
        with self.client.one_view():
            return self._check(desired, settings, force, save)

    def _check(self, desired, settings, force: bool, save: bool) -> CompanionReport:
        start = self.client.stats.total
        verified = force or self.verify_due()
        if verified:
            self._read(settings.host)
            now = self.clock()
            self._read_at, self._due_at = now, now + self.full_verify_interval
        report = CompanionReport(settings.host, verified=verified, read_at=self._read_at)
        if self._root_uuid is not None:
            tree = desired.tree.with_uuids({desired.tree.root.name: self._root_uuid})
            by_name = {s.name: s for s in (self._held or {}).values()}
            if verified:
                self._audit = self.auditor.run(
                    desired, settings.host, settings.numa_in_placement, save=save
                ).as_dict()
                self._next_restart = self._preview(desired, by_name, settings)
            owner = drift_policy.owner_of((self._held or {})[self._root_uuid].traits)
            ignored = NOT_DECIDED_BY_NOVA if owner == "nova-compute" else frozenset()
            report = replace(
                report,
                root_uuid=self._root_uuid,
                owner=owner,
                differences=drift_policy.drift(tree, by_name, settings, ignored),
                audit=self._audit,
                next_restart=self._next_restart,
            )
        report = replace(report, requests=self.client.stats.total - start)
        self.last = report
        LOG.info("%s (%d requests)", report.summary(), report.requests)
        return report

    def _preview(self, desired, by_name: dict, settings) -> dict:
        """What nova-compute does at its next restart with these CPU sets:
        the reshape it sends, or the guests that stop it: a floating guest
        with no shared CPU (nova-compute refuses to start), a guest of nova's
        pinned outside cpu_dedicated_set (it starts, but its resource updates
        fail, so it never reshapes). Reads only, through the read-only client."""

        blocking: list[str] = []
        reshape = None
        refused = guests_refused(desired)
        if refused is not None:
            blocking += refused.reasons
        siblings = {cpu.id: cpu.siblings for cpu in desired.host.cpus}
        pinnable = nova_pinnable(
            desired.partition.dedicated, settings.cpu_shared_set, settings.vcpu_pin_set
        )
        if pinnable is not None:
            cpus, where = pinnable
            blocking += blocks_nova(desired.host.guests, cpus, siblings, where)
        if not blocking:
            known = {name: s.uuid for name, s in by_name.items()}
            try:
                inputs = host_reshape_inputs(self.client, desired, known, listed=self.cached_tree())
                held = {u: (s.generation, s.inventories) for u, s in (self._held or {}).items()}
                plan = (
                    plan_reshape(
                        self.client,
                        inputs.tree,
                        desired.host.guests,
                        inputs.rule,
                        inputs.absent,
                        held,
                    )
                    if inputs is not None
                    else None
                )
            except ReshapeError as exc:
                plan, blocking = None, [str(exc)]
            if plan is not None and (plan.needed or plan.refusals):
                reshape = plan.as_dict()
                blocking += plan.refusals
        lines = [f"BLOCKED: {reason}" for reason in blocking]
        if reshape and reshape["consumers"]:
            lines += [line for line in reshape["lines"] if not line.startswith("REFUSED: ")]
        if not lines:
            lines = ["no reshape: every allocation already fits these CPU sets"]
        return {"reshape": reshape, "blocking": blocking, "lines": lines}

    def changed(self) -> bool:
        """True once per new set of differences (the caller notifies);
        remembered in the state file, so a restart does not re-announce."""
        if self.last is None or not self.last.found:
            return False
        signature = drift_policy.signature(self.last.differences)
        if self._state.get(NOTIFIED_KEY) == signature:
            return False
        self.remember(NOTIFIED_KEY, signature)
        return True
