"""The allocation audit from the host's side: what Placement holds against
this host's providers, compared with the guests libvirt really runs here.

Pure: the guests, the allocations as Placement returns them, and the
agent's own observation history go in; findings and the next history come
out. :mod:`node_agent.placement.audit_read` does the reading.

Kinds of finding (``Finding.kind``):

* ``orphan``: a consumer holds resources here and no local guest has its
  uuid (an instance deleted while the host was down, a failed migration's
  leftover). ``consumer_type`` is shown when Placement gave it (1.38+),
  ``orphaned_since`` is when the agent first saw it so, by its own audits.
* ``no_allocation``: a local guest holds nothing here, so the scheduler
  thinks the host is emptier than it is.
* ``size_mismatch``: a guest's allocation here differs from the guest:
  vCPUs against PCPU (pinned guests, when the host offers PCPU) or VCPU
  (floating guests), memory against MEMORY_MB, mdevs against VGPU, and,
  with NUMA reporting on, the NUMA nodes its CPUs and memory are allocated
  on against the nodes libvirt binds its memory to.

Each finding has a ``state``:

* ``alarm``: to be acted on by an operator;
* ``in_flight``: an operation in progress explains it, so it is no alarm:
  a consumer of type MIGRATION, a consumer whose allocations also sit on
  another host's compute providers (a migration's other half, an
  evacuation), or the untyped record nova keeps for a local guest being
  moved off this host (:mod:`node_agent.policy.migrations`). Only providers holding VCPU, PCPU or MEMORY_MB count as
  another host: DISK_GB on a sharing provider (shared storage) is held by
  every instance of the aggregate, wherever it runs. An operation still in
  flight after ``in_flight_grace`` seconds (by the agent's own
  observations) has failed, e.g. a migration that left allocations on two
  hosts: it becomes an alarm;
* ``pending``: its subject (guest or consumer) was seen for the first time
  by this audit; a boot or a migration may be half-way, so it becomes an
  alarm only if the next audit sees it again.

The audit never writes an allocation: the scheduler claims, the host
reports (seed 001). See docs/admin/audit.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

from node_agent.model.snapshot import Guest
from node_agent.policy import migrations
from node_agent.policy.guest_cpu import classify

ORPHAN = "orphan"
NO_ALLOCATION = "no_allocation"
SIZE_MISMATCH = "size_mismatch"
KINDS = (ORPHAN, NO_ALLOCATION, SIZE_MISMATCH)

ALARM = "alarm"
IN_FLIGHT = "in_flight"
PENDING = "pending"
STATES = (ALARM, IN_FLIGHT, PENDING)

MIGRATION = "MIGRATION"
# Classes the audit sizes against the guest; others (DISK_GB on shared
# storage, bandwidth, PCI devices) it cannot see from libvirt alone.
CPU_CLASSES = ("VCPU", "PCPU")
# What only a host's own compute providers hold: a consumer holding one of
# them on a provider outside this tree is held by another host.
COMPUTE_CLASSES = CPU_CLASSES + ("MEMORY_MB",)
IN_FLIGHT_GRACE = 3600.0  # [agent] audit_in_flight_grace's default


@dataclass(frozen=True)
class Finding:
    kind: str
    state: str
    consumer: str
    guest: Optional[str] = None  # libvirt name, when a local guest
    consumer_type: Optional[str] = None  # Placement's, 1.38+; None: not known
    detail: str = ""
    # resource class -> (what the guest has, what is allocated here)
    sizes: tuple[tuple[str, int, int], ...] = ()
    orphaned_since: Optional[float] = None  # epoch seconds, orphans only
    orphaned_for_s: Optional[float] = None
    elsewhere: tuple[str, ...] = ()  # providers outside this host holding it

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "state": self.state,
            "consumer": self.consumer,
            "guest": self.guest,
            "consumer_type": self.consumer_type,
            "detail": self.detail,
            "sizes": [{"resource": rc, "guest": g, "allocated": a} for rc, g, a in self.sizes],
            "orphaned_since": self.orphaned_since,
            "orphaned_for_s": self.orphaned_for_s,
            "elsewhere": list(self.elsewhere),
        }

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.consumer)


@dataclass(frozen=True)
class AuditResult:
    findings: tuple[Finding, ...]
    history: dict = field(default_factory=dict)
    providers: int = 0
    consumers: int = 0

    def count(self, kind: str, state: str = ALARM) -> int:
        return sum(1 for f in self.findings if f.kind == kind and f.state == state)

    @property
    def alarms(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.state == ALARM)

    def as_dict(self) -> dict:
        return {
            "findings": [f.as_dict() for f in self.findings],
            "alarms": len(self.alarms),
            "counts": {
                kind: {state: self.count(kind, state) for state in STATES} for kind in KINDS
            },
            "providers": self.providers,
            "consumers": self.consumers,
        }

    def signature(self) -> tuple:
        """What a notification reports a change of: the alarms and in-flight
        cases, not how long they have lasted."""
        return tuple(
            sorted((f.kind, f.state, f.consumer) for f in self.findings if f.state != PENDING)
        )


def consumers_here(
    allocations_by_provider: Mapping[str, Mapping],
) -> dict[str, dict[str, dict[str, int]]]:
    """consumer -> provider -> {resource class: amount}, from the bodies of
    ``GET /resource_providers/{uuid}/allocations`` keyed by provider uuid."""
    found: dict[str, dict[str, dict[str, int]]] = {}
    for provider, body in allocations_by_provider.items():
        for consumer, record in (body.get("allocations") or {}).items():
            resources = dict(record.get("resources") or {})
            if resources:
                found.setdefault(consumer, {})[provider] = resources
    return found


def to_look_up(
    guests: Iterable[Guest], allocations_by_provider: Mapping[str, Mapping]
) -> list[str]:
    """Consumers whose own record (``GET /allocations/{consumer}``) the
    audit needs: orphan candidates (for consumer_type and the providers
    elsewhere) and guests with nothing here (held elsewhere: migrating).
    A host that matches Placement needs none."""
    here = consumers_here(allocations_by_provider)
    local = {g.uuid for g in guests}
    return sorted((set(here) - local) | (local - set(here)))


def _totals(by_provider: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for resources in by_provider.values():
        for rc, amount in resources.items():
            totals[rc] = totals.get(rc, 0) + int(amount)
    return totals


def _numa_of(
    by_provider: Mapping[str, Mapping[str, int]], numa_nodes: Mapping[str, int]
) -> frozenset[int]:
    return frozenset(
        numa_nodes[p]
        for p, res in by_provider.items()
        if p in numa_nodes and any(rc in res for rc in CPU_CLASSES + ("MEMORY_MB",))
    )


def sizes_of(
    guest: Guest, totals: Mapping[str, int], pcpu_offered: bool
) -> tuple[tuple[str, int, int], ...]:
    """(class, guest has, allocated here) for each class that differs."""
    cpu = classify(guest)
    if pcpu_offered:
        cpus = {"VCPU": cpu.vcpu, "PCPU": cpu.pcpu}
    else:  # before the upgrade's reshape nova claims every vCPU as VCPU
        cpus = {"VCPU": cpu.vcpu + cpu.pcpu, "PCPU": 0}
    if cpus["PCPU"]:  # the class the guest mostly holds is named first
        cpus = {"PCPU": cpus["PCPU"], "VCPU": cpus["VCPU"]}
    wanted = {**cpus, "MEMORY_MB": guest.memory_kb // 1024, "VGPU": len(guest.mdevs)}
    return tuple(
        (rc, want, int(totals.get(rc, 0)))
        for rc, want in wanted.items()
        if int(totals.get(rc, 0)) != want
    )


def _elsewhere(
    details: Mapping[str, Mapping], consumer: str, host_providers: frozenset[str]
) -> tuple[str, ...]:
    """Providers of another host holding ``consumer``: outside this tree and
    holding a compute class (not a sharing provider's DISK_GB)."""
    held = (details.get(consumer) or {}).get("allocations") or {}
    return tuple(
        sorted(
            provider
            for provider, record in held.items()
            if provider not in host_providers
            and any(rc in COMPUTE_CLASSES for rc in ((record or {}).get("resources") or {}))
        )
    )


def _overdue(since: float, now: float, grace: float) -> str:
    """Why an in-flight case is an alarm after all ('' while within grace)."""
    if now - since < grace:
        return ""
    return (
        f"; in flight for {now - since:.0f}s, longer than audit_in_flight_grace "
        f"({grace:g}s): the operation failed and left this behind"
    )


def _consumer_type(details: Mapping[str, Mapping], consumer: str) -> Optional[str]:
    kind = (details.get(consumer) or {}).get("consumer_type")
    return kind if kind else None


def audit(
    guests: Iterable[Guest],
    allocations_by_provider: Mapping[str, Mapping],
    history: Optional[Mapping] = None,
    now: float = 0.0,
    consumer_details: Optional[Mapping[str, Mapping]] = None,
    host_providers: Iterable[str] = (),
    pcpu_offered: bool = False,
    numa_nodes: Optional[Mapping[str, int]] = None,
    in_flight_grace: float = IN_FLIGHT_GRACE,
) -> AuditResult:
    """Compare the local guests with the allocations on this host's providers.

    ``allocations_by_provider``: provider uuid -> body of ``GET
    /resource_providers/{uuid}/allocations``. ``consumer_details``:
    consumer -> body of ``GET /allocations/{consumer}`` for the consumers of
    :func:`to_look_up` (missing ones are treated as unknown, never as in
    flight). ``host_providers``: every provider of this host's tree (the
    keys of ``allocations_by_provider`` are added). ``history``: what the
    previous audit returned as ``AuditResult.history`` (``{"guests":
    {uuid: first seen}, "orphans": {consumer: first seen}, "unallocated":
    {uuid: first seen with nothing here}}``, epoch seconds).
    ``numa_nodes``: NUMA provider uuid -> node id, when NUMA reporting is
    on. ``in_flight_grace``: seconds an in-flight case may last, from its
    first sighting, before it is an alarm.
    """
    guests = list(guests)
    history = history or {}
    details = consumer_details or {}
    numa_nodes = numa_nodes or {}
    providers = frozenset(host_providers) | frozenset(allocations_by_provider)
    here = consumers_here(allocations_by_provider)
    seen_guests = dict(history.get("guests") or {})
    seen_orphans = dict(history.get("orphans") or {})
    seen_unallocated = dict(history.get("unallocated") or {})
    findings: list[Finding] = []
    orphans_now: dict[str, float] = {}
    unallocated_now: dict[str, float] = {}

    local = {g.uuid for g in guests}
    records = {c: details[c] for c in here if c not in local and c in details}
    migrating = migrations.match(guests, records, providers, here)
    resizing = migrations.resize_sources(guests, records, here)
    for consumer, by_provider in sorted(here.items()):
        if consumer in local:
            continue
        ctype = _consumer_type(details, consumer)
        elsewhere = _elsewhere(details, consumer, providers)
        since = float(seen_orphans.get(consumer, now))
        orphans_now[consumer] = since
        if ctype == MIGRATION or elsewhere or consumer in migrating or consumer in resizing:
            if ctype == MIGRATION:
                why = "a migration's allocation (consumer_type MIGRATION)"
            elif consumer in migrating:
                why = (
                    f"the migration record of guest {_names(migrating[consumer])} (its owner "
                    "and size; the guest's own allocation moved): a resize or migration "
                    "in progress"
                )
            elif consumer in resizing:
                why = (
                    f"maybe the old flavor of guest {_names(resizing[consumer])} (its owner; "
                    "the guest holds its new flavor here): a resize on this host not yet "
                    "confirmed"
                )
            else:
                why = (
                    "also allocated on providers of another host: a migration or "
                    "evacuation in progress"
                )
            overdue = _overdue(since, now, in_flight_grace)
            state, why = (ALARM, why + overdue) if overdue else (IN_FLIGHT, why)
        elif consumer not in seen_orphans:
            state, why = PENDING, "first seen by this audit; reported if seen again"
        else:
            state, why = ALARM, "holds resources here and no local guest has this uuid"
        held = " ".join(f"{rc}={n}" for rc, n in sorted(_totals(by_provider).items()))
        findings.append(
            Finding(
                ORPHAN,
                state,
                consumer,
                consumer_type=ctype,
                detail=f"{why} ({held})",
                orphaned_since=since,
                orphaned_for_s=max(0.0, now - since),
                elsewhere=elsewhere,
            )
        )

    for guest in sorted(guests, key=lambda g: g.uuid):
        first_time = guest.uuid not in seen_guests
        guest_held = here.get(guest.uuid)
        if guest_held is None:
            elsewhere = _elsewhere(details, guest.uuid, providers)
            since = float(seen_unallocated.get(guest.uuid, now))
            unallocated_now[guest.uuid] = since
            overdue = _overdue(since, now, in_flight_grace)
            if elsewhere:
                why = "allocated on providers of another host only: a migration in progress"
                state, why = (ALARM, why + overdue) if overdue else (IN_FLIGHT, why)
            elif first_time:
                state, why = PENDING, "first seen by this audit; reported if seen again"
            else:
                state, why = ALARM, "runs here and holds no resources on this host"
            findings.append(
                Finding(
                    NO_ALLOCATION,
                    state,
                    guest.uuid,
                    guest=guest.name,
                    consumer_type=_consumer_type(details, guest.uuid),
                    detail=why,
                    elsewhere=elsewhere,
                )
            )
            continue
        sizes = sizes_of(guest, _totals(guest_held), pcpu_offered)
        why = ", ".join(f"{rc}: guest {g}, allocated {a}" for rc, g, a in sizes)
        if numa_nodes and guest.numa_nodes:
            allocated_on = _numa_of(guest_held, numa_nodes)
            if allocated_on and allocated_on != guest.numa_nodes:
                why = ", ".join(
                    filter(
                        None,
                        [
                            why,
                            (
                                f"NUMA: guest bound to node(s) {sorted(guest.numa_nodes)}, "
                                f"allocated on {sorted(allocated_on)}"
                            ),
                        ],
                    )
                )
        if why:
            findings.append(
                Finding(
                    SIZE_MISMATCH,
                    PENDING if first_time else ALARM,
                    guest.uuid,
                    guest=guest.name,
                    detail=why,
                    sizes=sizes,
                )
            )

    next_history = {
        "guests": {g.uuid: float(seen_guests.get(g.uuid, now)) for g in guests},
        "orphans": orphans_now,
        "unallocated": unallocated_now,
    }
    return AuditResult(
        tuple(findings), next_history, providers=len(allocations_by_provider), consumers=len(here)
    )


def numa_provider_nodes(providers: Iterable[tuple[str, str]], host: str) -> dict[str, int]:
    """NUMA provider uuid -> node id, from (uuid, name) pairs named as
    :func:`node_agent.tree.numa.numa_provider_name` names them."""
    prefix = f"{host}_NUMA_"
    return {
        uuid: int(name[len(prefix) :])
        for uuid, name in providers
        if name.startswith(prefix) and name[len(prefix) :].isdigit()
    }


def summary_line(result: AuditResult) -> str:
    """The one INFO line of an audit."""
    alarms = [f"{result.count(kind)} {kind}" for kind in KINDS if result.count(kind)]
    flight = sum(1 for f in result.findings if f.state == IN_FLIGHT)
    pending = sum(1 for f in result.findings if f.state == PENDING)
    head = "; ".join(alarms) if alarms else "no alarm"
    return (
        f"allocation audit: {head} ({flight} in flight, {pending} pending; "
        f"{result.consumers} consumers on {result.providers} providers)"
    )


def _names(guests: Iterable[Guest]) -> str:
    return ", ".join(g.name for g in guests)
