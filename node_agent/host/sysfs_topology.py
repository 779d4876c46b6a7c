"""The kernel's view of CPUs and NUMA nodes, read from ``/sys/devices/system``.

Files read (kernel ABI: Documentation/ABI/stable/sysfs-devices-system-cpu,
Documentation/ABI/stable/sysfs-devices-node and .../testing/sysfs-devices-system-cpu):

* ``cpu/present``, ``cpu/online``, ``cpu/isolated`` and ``cpu/cpuN/online``;
* ``cpu/cpuN/topology/{physical_package_id,die_id,core_id}`` and the SMT
  siblings, ``core_cpus_list`` (kernel 5.6+) or its older name
  ``thread_siblings_list``;
* ``node/nodeN/{cpulist,meminfo,distance}`` (old kernels have no ``cpulist``,
  only ``cpuM`` links) and ``node/nodeN/hugepages/hugepages-<size>kB/``.

Every file goes through SysFS; this module parses the text and names the
file in any ParseError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from node_agent.errors import DiscoveryError, ParseError
from node_agent.host.meminfo import parse_node_meminfo
from node_agent.host.sysfs import SysFS
from node_agent.model.cpuset import CpuSet, CpuSetSyntaxError, parse_cpulist
from node_agent.model.snapshot import Cpu, HugePagePool, NumaNode

CPU_DIR = "devices/system/cpu"
NODE_DIR = "devices/system/node"

_CPU_ENTRY = re.compile(r"^cpu(\d+)$")
_NODE_ENTRY = re.compile(r"^node(\d+)$")
_HUGEPAGE_ENTRY = re.compile(r"^hugepages-(\d+)kB$")
_INT = re.compile(r"^-?\d+$")

T = TypeVar("T")


@dataclass(frozen=True)
class SysfsTopology:
    """What sysfs says about CPUs and NUMA nodes; no libvirt, no config."""

    present: CpuSet
    online: CpuSet
    isolated: CpuSet
    # One per present CPU, sorted by id.
    cpus: tuple[Cpu, ...]
    # Sorted by id; empty when the host has no ``node/`` directory.
    nodes: tuple[NumaNode, ...]
    # Sum of the nodes' MemTotal; None when any node's is unknown or there
    # are no nodes (a partial sum would under-report the host).
    memory_kb: Optional[int]
    warnings: tuple[str, ...] = ()


def read_topology(sysfs: SysFS, default_hugepage_kb: Optional[int] = None) -> SysfsTopology:
    """Read CPUs and NUMA nodes from ``sysfs``.

    ``default_hugepage_kb`` is ``Hugepagesize`` from ``/proc/meminfo``. It is
    needed only on old kernels whose nodes lack ``hugepages/``: their node
    meminfo counts default-size pages without saying the size.

    Raises DiscoveryError when ``devices/system/cpu`` is missing or a file
    cannot be read, and ParseError (naming the file) when one is malformed.
    """
    warnings: list[str] = []
    present = _read_present(sysfs, warnings)
    online = _read_online(sysfs, present, warnings)
    isolated = _read_cpulist(sysfs, f"{CPU_DIR}/isolated") or CpuSet()
    nodes = _read_nodes(sysfs, present, default_hugepage_kb, warnings)
    node_of = _node_of_cpu(sysfs, present, nodes, warnings)
    _check_nodes_complete(sysfs, present, nodes, node_of)
    cpus = tuple(
        _read_cpu(sysfs, cpu, cpu in online, node_of.get(cpu), warnings) for cpu in present
    )
    return SysfsTopology(
        present=present,
        online=online,
        isolated=isolated,
        cpus=cpus,
        nodes=nodes,
        memory_kb=_total_memory(nodes),
        warnings=tuple(warnings),
    )


# CPUs ----------------------------------------------------------------------


def _read_present(sysfs: SysFS, warnings: list[str]) -> CpuSet:
    entries = sysfs.listdir(CPU_DIR)
    if entries is None:
        raise DiscoveryError(
            f"{sysfs.path(CPU_DIR)} does not exist; is [host] sysfs_root "
            f"({sysfs.root}) the sysfs mount point?"
        )
    present = _read_cpulist(sysfs, f"{CPU_DIR}/present")
    if present is None:
        present = CpuSet(int(m.group(1)) for m in map(_CPU_ENTRY.match, entries) if m)
        warnings.append(
            f"{sysfs.path(CPU_DIR + '/present')} is absent; "
            f"taking present CPUs from the cpuN directories: {present}"
        )
    if not present:
        raise ParseError(f"{sysfs.path(CPU_DIR + '/present')}: no present CPUs")
    return present


def _read_online(sysfs: SysFS, present: CpuSet, warnings: list[str]) -> CpuSet:
    # cpu0 often has no cpuN/online (it cannot be taken offline): absent = online.
    flags = {cpu: _read_flag(sysfs, f"{CPU_DIR}/cpu{cpu}/online") for cpu in present}
    by_flag = CpuSet(cpu for cpu, flag in flags.items() if flag is not False)
    online = _read_cpulist(sysfs, f"{CPU_DIR}/online")
    if online is None:
        return by_flag
    path = sysfs.path(f"{CPU_DIR}/online")
    if not online:
        raise ParseError(f"{path}: empty, but a running host has an online CPU")
    disagree = CpuSet(
        cpu for cpu, flag in flags.items() if flag is not None and flag != (cpu in online)
    )
    if disagree:
        # A damaged file on either side must not make CPUs out of nothing:
        # only what both call online is counted (capacity never overstated).
        online = online & by_flag
        warnings.append(
            f"{path} and cpuN/online disagree about CPUs {disagree}; counting as "
            f"online only the CPUs both call online: {online or 'none'}"
        )
        if not online:
            raise ParseError(
                f"{path} and cpuN/online disagree about CPUs {disagree} and agree on "
                "no online CPU, but a running host has one"
            )
    if not online.issubset(present):
        warnings.append(f"{path} lists CPUs {online - present} that are not present; ignoring them")
        online = online & present
    return online


def _read_cpu(
    sysfs: SysFS, cpu: int, online: bool, node_id: Optional[int], warnings: list[str]
) -> Cpu:
    # Offline CPUs usually have no topology/ directory: every read is None.
    topo = f"{CPU_DIR}/cpu{cpu}/topology"
    siblings_file = f"{topo}/core_cpus_list"
    siblings = _read_cpulist(sysfs, siblings_file)
    if siblings is None:
        siblings_file = f"{topo}/thread_siblings_list"
        siblings = _read_cpulist(sysfs, siblings_file)
    if siblings is None:
        siblings = CpuSet([cpu])
    elif cpu not in siblings:
        # The kernel always lists the CPU itself; a list without it cannot be
        # trusted to name the CPU's real siblings either.
        warnings.append(
            f"{sysfs.path(siblings_file)} lists {siblings or 'nothing'}, "
            f"not CPU {cpu} itself; treating CPU {cpu} as having no siblings"
        )
        siblings = CpuSet([cpu])
    return Cpu(
        id=cpu,
        online=online,
        # Kept as the kernel says, -1 included (ARM boards without a package).
        package_id=_read_int(sysfs, f"{topo}/physical_package_id"),
        die_id=_read_int(sysfs, f"{topo}/die_id"),
        core_id=_read_int(sysfs, f"{topo}/core_id"),
        siblings=siblings,
        node_id=node_id,
    )


# NUMA nodes ----------------------------------------------------------------


def _read_nodes(
    sysfs: SysFS, present: CpuSet, default_hugepage_kb: Optional[int], warnings: list[str]
) -> tuple[NumaNode, ...]:
    entries = sysfs.listdir(NODE_DIR)
    if entries is None:
        return ()
    node_ids = sorted(int(m.group(1)) for m in map(_NODE_ENTRY.match, entries) if m)
    return tuple(
        _read_node(sysfs, node, node_ids, present, default_hugepage_kb, warnings)
        for node in node_ids
    )


def _read_node(
    sysfs: SysFS,
    node: int,
    node_ids: list[int],
    present: CpuSet,
    default_hugepage_kb: Optional[int],
    warnings: list[str],
) -> NumaNode:
    base = f"{NODE_DIR}/node{node}"
    meminfo = _read_meminfo(sysfs, f"{base}/meminfo")
    memory_kb = None
    if meminfo is not None:
        if "MemTotal" not in meminfo:
            raise ParseError(f"{sysfs.path(base + '/meminfo')}: no MemTotal field")
        memory_kb = meminfo["MemTotal"]
    hugepages = _read_hugepages(sysfs, base)
    if hugepages is None:
        hugepages = _hugepages_from_meminfo(
            sysfs.path(base), meminfo, default_hugepage_kb, warnings
        )
    return NumaNode(
        id=node,
        # The kernel lists possible-but-absent CPUs too (ppc64 deconfigured cores).
        cpus=_node_cpus(sysfs, base) & present,
        memory_kb=memory_kb,
        hugepages=hugepages,
        distances=_read_distances(sysfs, f"{base}/distance", node_ids, warnings),
    )


def _node_cpus(sysfs: SysFS, base: str) -> CpuSet:
    listed = _read_cpulist(sysfs, f"{base}/cpulist")
    if listed is not None:
        return listed
    # Kernels before cpulist existed show each CPU as a cpuM link instead.
    entries = sysfs.listdir(base) or []
    return CpuSet(int(m.group(1)) for m in map(_CPU_ENTRY.match, entries) if m)


def _read_hugepages(sysfs: SysFS, base: str) -> Optional[tuple[HugePagePool, ...]]:
    entries = sysfs.listdir(f"{base}/hugepages")
    if entries is None:
        return None
    pools = []
    for entry in entries:
        match = _HUGEPAGE_ENTRY.match(entry)
        if not match:
            continue
        pool = f"{base}/hugepages/{entry}"
        pools.append(
            HugePagePool(
                size_kb=int(match.group(1)),
                total=_require(sysfs, f"{pool}/nr_hugepages", _read_int),
                free=_require(sysfs, f"{pool}/free_hugepages", _read_int),
            )
        )
    return tuple(sorted(pools, key=lambda p: p.size_kb))


def _hugepages_from_meminfo(
    node_path: str,
    meminfo: Optional[dict[str, int]],
    default_hugepage_kb: Optional[int],
    warnings: list[str],
) -> tuple[HugePagePool, ...]:
    if not meminfo or "HugePages_Total" not in meminfo:
        return ()
    total = meminfo["HugePages_Total"]
    free = meminfo.get("HugePages_Free", 0)
    if default_hugepage_kb is not None:
        return (HugePagePool(size_kb=default_hugepage_kb, total=total, free=free),)
    if total:
        warnings.append(
            f"{node_path}/meminfo counts {total} huge pages but the node has no "
            f"hugepages/ directory and the default page size is unknown; "
            f"they are not reported"
        )
    return ()


def _read_distances(
    sysfs: SysFS, relpath: str, node_ids: list[int], warnings: list[str]
) -> tuple[tuple[int, int], ...]:
    values = _read_parsed(sysfs, relpath, _parse_int_row)
    if values is None:
        return ()
    # The kernel prints one distance per online node, in node-id order.
    if len(values) != len(node_ids):
        warnings.append(
            f"{sysfs.path(relpath)} has {len(values)} distances for "
            f"{len(node_ids)} nodes; distances not reported"
        )
        return ()
    return tuple(zip(node_ids, values))


def _node_of_cpu(
    sysfs: SysFS, present: CpuSet, nodes: tuple[NumaNode, ...], warnings: list[str]
) -> dict[int, int]:
    node_of: dict[int, int] = {}
    for node in nodes:
        for cpu in node.cpus:
            if cpu in node_of:
                warnings.append(
                    f"CPU {cpu} is listed by node {node_of[cpu]} and "
                    f"node {node.id}; using node {node_of[cpu]}"
                )
                continue
            node_of[cpu] = node.id
    if not nodes:
        return node_of
    # A CPU missing from every node list may still carry a cpuN/nodeM link.
    for cpu in present - CpuSet(node_of):
        entries = sysfs.listdir(f"{CPU_DIR}/cpu{cpu}") or []
        linked = [int(m.group(1)) for m in map(_NODE_ENTRY.match, entries) if m]
        if linked:
            node_of[cpu] = linked[0]
    return node_of


def _check_nodes_complete(
    sysfs: SysFS, present: CpuSet, nodes: tuple[NumaNode, ...], node_of: dict[int, int]
) -> None:
    """A node whose directory or meminfo is missing would silently drop its
    CPUs or memory from the report; a kernel never shows such a tree, so it
    is a read failure (never shrink inventory because a read failed)."""
    if not nodes:
        return
    listed = _read_cpulist(sysfs, f"{NODE_DIR}/online")
    missing = (listed or CpuSet()) - CpuSet(node.id for node in nodes)
    if missing:
        raise DiscoveryError(
            f"{sysfs.path(NODE_DIR)}/online lists nodes {missing} but "
            f"{sysfs.path(NODE_DIR)}/node{missing.to_list()[0]} is missing"
        )
    # Old kernels (linux-test1) list no CPUs in any node: nothing to check.
    orphans = present - CpuSet(node_of) if any(node.cpus for node in nodes) else CpuSet()
    if orphans:
        raise DiscoveryError(
            f"CPUs {orphans} are present but in no NUMA node under "
            f"{sysfs.path(NODE_DIR)}: a node directory is missing or "
            "unreadable"
        )
    without = [node.id for node in nodes if node.memory_kb is None]
    if without and len(without) < len(nodes):
        raise DiscoveryError(
            f"{sysfs.path(NODE_DIR)}/node{without[0]}/meminfo is missing while other nodes have one"
        )


def _total_memory(nodes: tuple[NumaNode, ...]) -> Optional[int]:
    sizes = [node.memory_kb for node in nodes if node.memory_kb is not None]
    if not nodes or len(sizes) != len(nodes):
        return None
    return sum(sizes)


# Reading and parsing one file ------------------------------------------------


def _read_parsed(sysfs: SysFS, relpath: str, parse: Callable[[str], T]) -> Optional[T]:
    """Parse the file at ``relpath``; None if absent; ParseError names the file."""
    text = sysfs.read(relpath)
    if text is None:
        return None
    try:
        return parse(text)
    except (ParseError, CpuSetSyntaxError) as exc:
        raise ParseError(f"{sysfs.path(relpath)}: {exc}") from exc


def _require(sysfs: SysFS, relpath: str, reader: Callable[[SysFS, str], Optional[T]]) -> T:
    value = reader(sysfs, relpath)
    if value is None:
        raise DiscoveryError(f"{sysfs.path(relpath)} is missing")
    return value


def _read_cpulist(sysfs: SysFS, relpath: str) -> Optional[CpuSet]:
    return _read_parsed(sysfs, relpath, parse_cpulist)


def _read_int(sysfs: SysFS, relpath: str) -> Optional[int]:
    return _read_parsed(sysfs, relpath, _parse_int)


def _read_flag(sysfs: SysFS, relpath: str) -> Optional[bool]:
    return _read_parsed(sysfs, relpath, _parse_flag)


def _read_meminfo(sysfs: SysFS, relpath: str) -> Optional[dict[str, int]]:
    return _read_parsed(sysfs, relpath, parse_node_meminfo)


def _parse_int(text: str) -> int:
    body = text.strip()
    if not _INT.match(body):
        raise ParseError(f"{body!r} is not an integer")
    return int(body)


def _parse_flag(text: str) -> bool:
    body = text.strip()
    if body not in ("0", "1"):
        raise ParseError(f"{body!r} is not 0 or 1")
    return body == "1"


def _parse_int_row(text: str) -> list[int]:
    tokens = text.split()
    if not tokens or not all(_INT.match(token) for token in tokens):
        raise ParseError(f"{text.strip()!r} is not a row of integers")
    return [int(token) for token in tokens]
