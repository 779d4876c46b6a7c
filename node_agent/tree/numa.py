"""NUMA children (``[compute] numa_in_placement``): one provider per NUMA node.

Pure. A node that has present CPUs or memory becomes ``<host>_NUMA_<id>``
with traits HW_NUMA_ROOT and the agent's mark
(:data:`node_agent.policy.child_owner.AGENT_CHILD_TRAIT`), holding:

* PCPU and VCPU: the node's CPUs in each pool (the same sets the flat root
  would report, split by node);
* MEMORY_MB: the node's MemTotal, with the node's huge page pools added to
  ``reserved``: the pools are part of MemTotal, and published as page
  classes too they would be offered twice (a 4K guest could take memory
  that sits in a pool). ``total`` stays the node's memory, so the operator
  sees where it went;
* ``CUSTOM_MEMORY_PAGE_<KiB>``: each huge page pool with pages, ``reserved``
  from ``[compute] reserved_huge_pages`` for that node and size.

The root keeps DISK_GB, and anything that cannot be attributed to a node:
CPUs in no node's cpulist, and all of MEMORY_MB when any node's memory is
unreadable (reporting a partial split would shrink the host's memory; the
pools' memory is then reserved there).

Host-wide reservations are charged to the lowest node id first; when a
node cannot hold the rest (reserved may not exceed total), the remainder
moves to the next node. So ``reserved_host_memory_mb = 512`` lands on
node 0, which is where the kernel and early boot allocations live.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import os_resource_classes as orc
import os_traits

from node_agent.errors import ConfigError
from node_agent.model.cpuset import CpuSet
from node_agent.model.hugepages import ReservedPages, page_class
from node_agent.model.provider_tree import Inventory, Provider
from node_agent.model.settings import Settings
from node_agent.model.snapshot import HostSnapshot, NumaNode
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT
from node_agent.policy.partition import CpuPartition


def numa_provider_name(host: str, node_id: int) -> str:
    return f"{host}_NUMA_{node_id}"


@dataclass(frozen=True)
class NumaSplit:
    root_inventories: dict[str, Inventory]
    children: tuple[Provider, ...]


def has_memory(node: NumaNode) -> bool:
    """MemTotal above 0, or huge page pools listed: the kernel registers the
    per-node hugetlb attributes only for nodes with memory (N_MEMORY), which
    tells a memory node from an empty one even without ``meminfo``."""
    return bool(node.memory_kb) or bool(node.hugepages)


def reported_nodes(host: HostSnapshot) -> tuple[NumaNode, ...]:
    """Nodes with present CPUs or memory, by id."""
    return tuple(sorted((n for n in host.nodes if n.cpus or has_memory(n)), key=lambda n: n.id))


def spread(amount: int, capacities: list[int]) -> list[int]:
    """Charge ``amount`` to the first buckets, each up to its capacity."""
    shares = []
    for capacity in capacities:
        share = min(amount, capacity)
        shares.append(share)
        amount -= share
    return shares


def check_reserved_pages(settings: Settings, host: HostSnapshot) -> None:
    """Each reservation must name a node and page size this host has, within its pool."""
    pools = {(n.id, p.size_kb): p.total for n in host.nodes for p in n.hugepages}
    problems = []
    for r in settings.reserved_huge_pages:
        have = pools.get((r.node, r.size_kb))
        spec = f"node:{r.node},size:{r.size_kb},count:{r.count}"
        if have is None:
            sizes = sorted({s for (node, s) in pools if node == r.node})
            problems.append(
                f"[compute] reserved_huge_pages = '{spec}': NUMA node {r.node} has no "
                f"{r.size_kb} KiB page pool (its pools: {sizes or 'none'} KiB). "
                "Fix the node or size, or remove the line."
            )
        elif r.count > have:
            problems.append(
                f"[compute] reserved_huge_pages = '{spec}' reserves more pages than the "
                f"{have} allocated on node {r.node}. Lower count to at most {have}, or "
                "allocate more pages (nr_hugepages)."
            )
    if problems:
        raise ConfigError(problems)


def pool_mb(node: NumaNode) -> int:
    """The memory of the node's published huge page pools, in MiB, rounded up."""
    kb = sum(pool.total * pool.size_kb for pool in node.hugepages if pool.total > 0)
    return -(-kb // 1024)


def _page_inventories(
    node: NumaNode, reservations: tuple[ReservedPages, ...]
) -> dict[str, Inventory]:
    reserved = {r.size_kb: r.count for r in reservations if r.node == node.id}
    return {
        page_class(pool.size_kb): Inventory(
            total=pool.total, reserved=reserved.get(pool.size_kb, 0)
        )
        for pool in node.hugepages
        if pool.total > 0
    }


def split_by_numa(
    settings: Settings, host: HostSnapshot, partition: CpuPartition, flat: dict[str, Inventory]
) -> NumaSplit:
    """Move ``flat`` (the root's inventories) onto NUMA children."""
    check_reserved_pages(settings, host)
    nodes = reported_nodes(host)
    in_nodes = CpuSet()
    for node in nodes:
        in_nodes = in_nodes | node.cpus
    memory_known = all(n.memory_kb is not None for n in nodes)
    node_vcpus = [len(partition.shared & n.cpus) for n in nodes]
    leftover_vcpus = len(partition.shared - in_nodes)
    vcpu_reserved = spread(partition.vcpu_reserved, node_vcpus + [leftover_vcpus])
    node_mb = [(n.memory_kb or 0) // 1024 if memory_known else 0 for n in nodes]
    pools = [min(pool_mb(n), mb) for n, mb in zip(nodes, node_mb)]
    # reserved_host_memory_mb is 4K memory for the host: charged to what
    # the pools leave of each node, the pools reserved on top.
    mem_reserved = [
        share + pool
        for share, pool in zip(
            spread(
                settings.reserved_host_memory_mb, [mb - pool for mb, pool in zip(node_mb, pools)]
            ),
            pools,
        )
    ]

    children = []
    for i, node in enumerate(nodes):
        inventories = {
            orc.PCPU: Inventory(total=len(partition.pcpu & node.cpus)),
            orc.VCPU: Inventory(
                total=node_vcpus[i],
                reserved=vcpu_reserved[i],
                allocation_ratio=settings.cpu_allocation_ratio,
                keep_placement_ratio=settings.keeps_placement_ratio("cpu"),
            ),
            orc.MEMORY_MB: Inventory(
                total=node_mb[i],
                reserved=mem_reserved[i],
                allocation_ratio=settings.ram_allocation_ratio,
                keep_placement_ratio=settings.keeps_placement_ratio("ram"),
            ),
        }
        inventories.update(_page_inventories(node, settings.reserved_huge_pages))
        children.append(
            Provider(
                name=numa_provider_name(settings.host, node.id),
                parent=settings.host,
                inventories={rc: inv for rc, inv in inventories.items() if inv.total > 0},
                traits={os_traits.HW_NUMA_ROOT: True, AGENT_CHILD_TRAIT: True},
            )
        )

    root = {rc: inv for rc, inv in flat.items() if rc not in (orc.PCPU, orc.VCPU, orc.MEMORY_MB)}
    leftover = {
        orc.PCPU: Inventory(total=len(partition.pcpu - in_nodes)),
        orc.VCPU: Inventory(
            total=leftover_vcpus,
            reserved=vcpu_reserved[-1],
            allocation_ratio=settings.cpu_allocation_ratio,
            keep_placement_ratio=settings.keeps_placement_ratio("cpu"),
        ),
    }
    root.update({rc: inv for rc, inv in leftover.items() if inv.total > 0})
    if not memory_known and orc.MEMORY_MB in flat:
        memory = flat[orc.MEMORY_MB]
        root[orc.MEMORY_MB] = replace(
            memory, reserved=min(memory.total, memory.reserved + sum(pool_mb(n) for n in nodes))
        )
    return NumaSplit(root_inventories=root, children=tuple(children))
