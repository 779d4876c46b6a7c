"""The capacity invariant: what the agent leaves in Placement never overstates the host.

This is the project's safety net, in one place. Pure: it takes the facts
discovery found (:func:`host_limits`) and a tree of inventories as Placement
will hold them (:func:`published`), and returns a :class:`Verdict`. Every
path that writes inventories (the tree sync, the ``POST /reshaper``) checks
the whole tree it is about to leave -- the desired tree after every hold,
merged with what Placement keeps for providers the plan does not touch,
foreign ones included -- before it sends anything.

Schedulable units of one inventory record:

* VCPU, MEMORY_MB, DISK_GB: ``total - reserved``. Their allocation ratios
  are the operator's overcommit policy and are not held against the host.
* every other class checked (PCPU, huge pages, VGPU, SRIOV_NET_VF,
  MEM_ENCRYPTION_CONTEXT):
  ``(total - reserved) * allocation_ratio``. These are exact resources: a
  ratio above 1 promises what does not exist.

A record with ``reserved >= total`` is closed to the scheduler: 0 units.

The rules, over the root and ALL its children:

1. CPUs: units of PCPU + units of VCPU <= the online CPUs of the configured
   sets (``cpu_dedicated_set`` | ``cpu_shared_set``, or ``vcpu_pin_set``, or
   every online CPU in legacy mode), each CPU counted once;
2. MEMORY_MB <= the host's memory (the larger of psutil's total and the sum
   of the NUMA nodes' MemTotal: the flat and the NUMA trees use one each;
   see :func:`host_limits` for why not the smaller);
   2b. MEMORY_MB + each ``CUSTOM_MEMORY_PAGE_<KiB>``'s units x its page size
   <= the host's memory: huge page pools are part of MemTotal, so a
   provider that publishes pages and all of its memory offers the pool
   twice (a 4K guest could take memory a pool holds). The tree builder
   publishes less to keep it: a NUMA child's MEMORY_MB keeps the node's
   memory as ``total`` and adds its pools to ``reserved``
   (:mod:`node_agent.tree.numa`), so the operator sees where it went;
3. DISK_GB <= the size of the instances filesystem; with shared storage
   (``[compute] shared_storage_aggregate``) the filesystem is counted once,
   on the sharing provider: the tree has no DISK_GB, and the sharing
   provider's total is at most the filesystem (:func:`shared_disk_problems`);
4. each ``CUSTOM_MEMORY_PAGE_<KiB>`` <= the pages of that size on the host;
5. VGPU <= per GPU, the most instances any of its mdev types offers, summed;
6. SRIOV_NET_VF <= the VFs the PFs can have (``sriov_totalvfs``), summed;
7. MEM_ENCRYPTION_CONTEXT <= the encrypted guests the firmware has keys
   for: libvirt's SEV ``maxGuests`` plus ``maxESGuests`` (SEV-ES and
   SEV-SNP guests share the second pool); not checked when the domain
   capabilities were not read or do not say;
8. each class has schedulable units on one level only: the root or the
   children, never both (the same CPUs or memory offered twice).

Classes the agent knows nothing about (the operator's ``CUSTOM_`` classes
from provider files, a bare-metal node class) are not checked, nor are PCI
devices' classes (:mod:`node_agent.tree.pci_placement`: the devices counted,
or the usage of a child whose device left; a device spec may not name a
class checked here).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Optional

import os_resource_classes as orc

from node_agent.model.hugepages import PAGE_CLASS_PREFIX, page_class
from node_agent.model.provider_tree import ProviderTree
from node_agent.model.snapshot import HostSnapshot

# Classes whose ratio is the operator's overcommit policy.
OVERCOMMITTABLE = frozenset({orc.VCPU, orc.MEMORY_MB, orc.DISK_GB})
CPU_CLASSES = (orc.PCPU, orc.VCPU)


@dataclass(frozen=True)
class HostLimits:
    """What the host has, from discovered facts (never from a tree)."""

    cpus: int  # online CPUs of the configured sets
    memory_mb: int
    disk_gb: int
    # CUSTOM_MEMORY_PAGE_<KiB> -> pages on the host.
    hugepages: Mapping[str, int] = field(default_factory=dict)
    vgpus: int = 0
    vfs: int = 0
    # Every online CPU: the bound for records kept as Placement holds them,
    # which were published under a previous configuration whose sets are
    # not known any more. None: same as ``cpus``.
    online_cpus: Optional[int] = None
    # AMD SEV guests the firmware has keys for; None: not known, not checked.
    mem_encryption: Optional[int] = None

    def for_kept_records(self) -> "HostLimits":
        return replace(self, cpus=max(self.cpus, self.online_cpus or 0))


@dataclass(frozen=True)
class Published:
    """One provider as Placement will hold it (inventories as Placement spells them)."""

    name: str
    root: bool
    inventories: Mapping[str, Mapping]


@dataclass(frozen=True)
class Violation:
    resource: str  # "CPUs", "MEMORY_MB", ... or the class of a level clash
    classes: tuple[str, ...]  # the classes involved
    where: tuple[str, ...]  # providers publishing them
    published: int  # schedulable units published
    host_has: Optional[int]  # None for a level clash
    rule: str

    def __str__(self) -> str:
        where = ", ".join(self.where)
        if self.host_has is None:
            return f"{self.resource} is offered on the root and on its children ({where})"
        return (
            f"{self.resource}: {self.published} schedulable units published "
            f"({' + '.join(self.classes)} on {where}) but the host has {self.host_has}"
        )


@dataclass(frozen=True)
class Verdict:
    violations: tuple[Violation, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def classes(self) -> frozenset[str]:
        """Every class involved in a violation."""
        return frozenset(rc for v in self.violations for rc in v.classes)

    def lines(self) -> list[str]:
        return [str(v) for v in self.violations]

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "violations": [
                {
                    "resource": v.resource,
                    "classes": list(v.classes),
                    "where": list(v.where),
                    "published": v.published,
                    "host_has": v.host_has,
                    "rule": v.rule,
                }
                for v in self.violations
            ],
        }


def host_limits(host: HostSnapshot, partition) -> HostLimits:
    """The host's limits. ``partition`` is the :class:`CpuPartition` of the
    configuration being applied: its dedicated and shared pools are the
    configured sets.

    Memory is the larger of psutil's total (/proc/meminfo MemTotal, what the
    flat root publishes) and the sum of the nodes' MemTotal (what NUMA
    children publish), not the smaller: the kernel counts the same pages
    in both, and they differ by rounding (each node's kB floored to MiB,
    so the sum is up to a MiB per node smaller) or by memory hot-plugged
    between the two reads. The smaller would refuse a flat tree for those
    few MiB on every host; the larger lets a tree publish at most that
    difference more than its own source, and every tree is built from one
    source only, never from the larger of the two. With file-backed
    memory, the backing size is the limit when it is larger."""
    # The partition has already refused offline CPUs, except dedicated ones
    # under [libvirt] cpu_power_management (nova powers idle ones down):
    # those still back PCPU, each counted once.
    cpus = partition.dedicated | (partition.shared & host.online)
    node_mb = sum((n.memory_kb or 0) // 1024 for n in host.nodes)
    pages: dict[str, int] = {}
    for node in host.nodes:
        for pool in node.hugepages:
            rc = page_class(pool.size_kb)
            pages[rc] = pages.get(rc, 0) + pool.total
    vgpus = sum(
        max((t.available_instances + len(t.mdevs) for t in gpu.mdev_types), default=0)
        for gpu in host.gpus
    )
    return HostLimits(
        cpus=len(cpus),
        # With [libvirt] file_backed_memory guests' memory is the backing
        # files' size, which nova publishes as MEMORY_MB (not RAM).
        memory_mb=max(host.memory_mb, node_mb, host.file_backed_memory_mb),
        disk_gb=host.disk_gb,
        hugepages=pages,
        vgpus=vgpus,
        vfs=sum(pf.total_vfs for pf in host.sriov_pfs),
        online_cpus=len(host.online),
        mem_encryption=_encrypted_guests(host),
    )


def _encrypted_guests(host: HostSnapshot) -> Optional[int]:
    caps = host.hypervisor.domain_caps if host.hypervisor else None
    if caps is None:
        return None
    assert host.hypervisor is not None
    # The kernel's TDX keys; with TDX and no count from the kernel, the
    # operator's num_intel_tdx_guests is the only count there is, so the
    # limit is not known.
    tdx = 0
    if any(cap.arch == "x86_64" and cap.tdx_supported for cap in caps):
        if host.hypervisor.tdx_capacity is None:
            return None
        tdx = host.hypervisor.tdx_capacity
    sev = [cap for cap in caps if cap.arch == "x86_64" and cap.sev_supported]
    if not sev:
        return tdx
    if sev[0].sev_max_guests is None and sev[0].sev_max_es_guests is None:
        return None  # libvirt before 8.0 does not say
    return (sev[0].sev_max_guests or 0) + (sev[0].sev_max_es_guests or 0) + tdx


def limits_of(desired) -> Optional[HostLimits]:
    """The limits of the host of one cycle's ``Desired``: from its facts
    when the host was discovered here; on the central applier, the ones the
    agent sent with the tree (wire 2.1's ``body.limits``,
    :class:`node_agent.remote.wire.RemoteDesired`). None only from a 2.0
    agent, which sends none: the invariant cannot be checked for that host."""
    if isinstance(desired.host, HostSnapshot):
        return host_limits(desired.host, desired.partition)
    return getattr(desired, "limits", None)


def units(rc: str, record: Mapping) -> int:
    """Schedulable units of one Placement inventory record (see module doc)."""
    free = record["total"] - record.get("reserved", 0)
    if free <= 0:
        return 0
    if rc in OVERCOMMITTABLE:
        return free
    return int(free * float(record.get("allocation_ratio", 1.0)))


def published(tree) -> list[Published]:
    """A :class:`~node_agent.model.provider_tree.ProviderTree` as :class:`Published`."""
    return [
        Published(
            p.name, p.parent is None, {rc: inv.as_placement() for rc, inv in p.inventories.items()}
        )
        for p in tree.providers
    ]


def _limit_groups(
    limits: HostLimits, classes: Iterable[str]
) -> list[tuple[str, tuple[str, ...], int]]:
    """(resource, classes, host has) for every resource the tree publishes."""
    groups = [
        ("CPUs", CPU_CLASSES, limits.cpus),
        (orc.MEMORY_MB, (orc.MEMORY_MB,), limits.memory_mb),
        (orc.DISK_GB, (orc.DISK_GB,), limits.disk_gb),
        (orc.VGPU, (orc.VGPU,), limits.vgpus),
        (orc.SRIOV_NET_VF, (orc.SRIOV_NET_VF,), limits.vfs),
    ]
    if limits.mem_encryption is not None:
        groups.append(
            (orc.MEM_ENCRYPTION_CONTEXT, (orc.MEM_ENCRYPTION_CONTEXT,), limits.mem_encryption)
        )
    for rc in sorted(set(classes)):
        if rc.startswith(PAGE_CLASS_PREFIX):
            groups.append((rc, (rc,), limits.hugepages.get(rc, 0)))
    return groups


def checked_classes(classes: Iterable[str]) -> set[str]:
    """The classes of ``classes`` the invariant speaks about."""
    return {
        rc
        for rc in classes
        if rc in OVERCOMMITTABLE
        or rc in (orc.PCPU, orc.VGPU, orc.SRIOV_NET_VF, orc.MEM_ENCRYPTION_CONTEXT)
        or rc.startswith(PAGE_CLASS_PREFIX)
    }


def _page_kb(rc: str) -> int:
    return int(rc[len(PAGE_CLASS_PREFIX) :])


def _memory_with_pages(providers: list[Published], limits: HostLimits) -> Optional[Violation]:
    """Rule 2b: MEMORY_MB + the huge pages' memory <= the host's memory
    (the pools are part of it). Counted in KiB, reported in MiB rounded up."""
    pages = sorted(
        {rc for p in providers for rc in p.inventories if rc.startswith(PAGE_CLASS_PREFIX)}
    )
    if not pages:
        return None  # rule 2 alone
    where, kb = [], 0
    for p in providers:
        n = sum(
            units(rc, p.inventories[rc]) * (1024 if rc == orc.MEMORY_MB else _page_kb(rc))
            for rc in (orc.MEMORY_MB, *pages)
            if rc in p.inventories
        )
        if n:
            where.append(p.name)
            kb += n
    if kb <= limits.memory_mb * 1024:
        return None
    present = tuple(
        rc for rc in (orc.MEMORY_MB, *pages) if any(rc in p.inventories for p in providers)
    )
    return Violation(
        "memory (MEMORY_MB and huge pages, in MiB)",
        present,
        tuple(where),
        -(-kb // 1024),
        limits.memory_mb,
        "never more than the host has",
    )


def check(providers: Iterable[Published], limits: HostLimits) -> Verdict:
    """The verdict on a whole tree as Placement will hold it."""
    providers = list(providers)
    seen = {rc for p in providers for rc in p.inventories}
    violations = []
    for resource, classes, host_has in _limit_groups(limits, seen):
        where, total = [], 0
        for p in providers:
            n = sum(units(rc, p.inventories[rc]) for rc in classes if rc in p.inventories)
            if n:
                where.append(p.name)
                total += n
        if total > host_has:
            present = tuple(rc for rc in classes if rc in seen)
            violations.append(
                Violation(
                    resource, present, tuple(where), total, host_has, "never more than the host has"
                )
            )
    memory = _memory_with_pages(providers, limits)
    if memory is not None:
        violations.append(memory)
    for rc in sorted(checked_classes(seen)):
        on_root = [
            p.name
            for p in providers
            if p.root and rc in p.inventories and units(rc, p.inventories[rc])
        ]
        on_children = [
            p.name
            for p in providers
            if not p.root and rc in p.inventories and units(rc, p.inventories[rc])
        ]
        if on_root and on_children:
            violations.append(
                Violation(rc, (rc,), tuple(on_root + on_children), 0, None, "one level per class")
            )
    return Verdict(tuple(violations))


# ---------------------------------------------------------------- enforcement


@dataclass(frozen=True)
class Enforced:
    """What may be written, and why it differs from what was wanted."""

    inventories: Mapping[str, Mapping[str, Mapping]]  # uuid -> inventories to leave
    wanted: Verdict  # the verdict on the plan as wanted
    left: Verdict  # the verdict on what will be left (ok unless others overstate)
    kept: tuple[str, ...] = ()  # classes kept as Placement holds them
    closed: tuple[str, ...] = ()  # classes published fully reserved

    @property
    def refused(self) -> bool:
        return not self.wanted.ok


def as_published(
    inventories: Mapping[str, Mapping[str, Mapping]],
    names: Mapping[str, str],
    root_uuid: str,
    untouched: Iterable[Published] = (),
) -> list[Published]:
    """uuid -> inventories (plus providers already :class:`Published`) as one tree."""
    return [
        Published(names.get(u, u), u == root_uuid, inv) for u, inv in inventories.items()
    ] + list(untouched)


def _close(record: Mapping) -> dict:
    return {**record, "reserved": record["total"]}


def closed_unchecked(tree: ProviderTree) -> ProviderTree:
    """``tree`` with every class the invariant checks closed (``reserved =
    total``) on every provider: what the applier publishes for a host whose
    limits it does not have (a wire 2.0 message). When in doubt, publish
    less: nothing new lands there until the host sends its limits, and no
    allocation is touched. Other classes (an operator's ``CUSTOM_``) are
    left as they are."""
    return ProviderTree(
        tuple(
            replace(
                p,
                inventories={
                    rc: (replace(inv, reserved=inv.total) if checked_classes((rc,)) else inv)
                    for rc, inv in p.inventories.items()
                },
            )
            for p in tree.providers
        )
    )


def enforce(
    planned: Mapping[str, Mapping[str, Mapping]],
    current: Mapping[str, Mapping[str, Mapping]],
    names: Mapping[str, str],
    root_uuid: str,
    untouched: Iterable[Published],
    limits: HostLimits,
    in_use=lambda classes: set(classes),
) -> Enforced:
    """Make the tree the agent will leave satisfy the invariant, publishing less.

    ``planned``: uuid -> inventories the plan would leave on each provider
    it writes (after the usage guard's holds); ``current``: what Placement
    holds on them now (a provider missing there does not exist yet);
    ``untouched``: the other providers of the tree as Placement holds them.
    ``in_use(classes)`` returns those of ``classes`` some consumer holds.

    1. the plan passes: it is written as planned;
    2. else the classes involved keep Placement's current records on every
       provider (a new provider gets none of them), as nova does on
       InventoryInUse. Those records were published under the previous
       configuration, so from here CPUs are bounded by every online CPU
       rather than by the new sets (:meth:`HostLimits.for_kept_records`);
    3. if that still fails (Placement already overstates), the classes
       involved that nobody uses are published fully reserved, then, if
       still needed, all the classes involved. Nothing is deleted; no
       allocation is touched.
    """
    untouched = list(untouched)
    wanted = check(as_published(planned, names, root_uuid, untouched), limits)
    if wanted.ok:
        return Enforced(planned, wanted, wanted)
    kept = wanted.classes
    held = {
        u: {
            **{rc: rec for rc, rec in inv.items() if rc not in kept},
            **{rc: rec for rc, rec in current.get(u, {}).items() if rc in kept},
        }
        for u, inv in planned.items()
    }
    limits = limits.for_kept_records()
    left = check(as_published(held, names, root_uuid, untouched), limits)
    if left.ok and held == planned:
        # The plan publishes nothing new on those classes: they are already
        # kept as Placement holds them (a refused reshape), within the host.
        return Enforced(planned, left, left)
    closed: set[str] = set()
    if not left.ok:
        involved = left.classes
        idle = involved - set(in_use(involved))
        for step in (idle, involved):
            closed |= step
            held = {
                u: {rc: (_close(rec) if rc in closed else rec) for rc, rec in inv.items()}
                for u, inv in held.items()
            }
            left = check(as_published(held, names, root_uuid, untouched), limits)
            if left.ok:
                break
    return Enforced(held, wanted, left, tuple(sorted(kept)), tuple(sorted(closed)))


def shared_disk_problems(
    tree_classes: Iterable[str], shared_total: int, filesystem_gb: int
) -> list[str]:
    """Rule 3 with shared storage: the filesystem counted once. The host's
    tree (``tree_classes``: every class its providers publish) holds no
    DISK_GB, and the sharing provider holds at most the filesystem."""
    problems = []
    if orc.DISK_GB in set(tree_classes):
        problems.append(
            "DISK_GB is published in the host's tree and on the sharing provider: "
            "the shared filesystem would be offered twice"
        )
    if shared_total > filesystem_gb:
        problems.append(
            f"the sharing provider's DISK_GB total {shared_total} exceeds the "
            f"filesystem's {filesystem_gb} GiB"
        )
    return problems
