"""Flavors NUMA children strand: what finds a candidate flat and not nested. Pure.

Placement takes each resource class of one request group from a single
provider: it never splits ``VCPU:8`` over two NUMA nodes of 6. So once
``numa_in_placement`` moves CPUs and memory onto one child per node, a
flavor larger than the largest node finds no candidate on a host that, flat,
would have taken it. nova's approved NUMA-in-Placement spec
(nova-specs, ussuri, numa-topology-with-rps) names this -- no ``can_split``
in Placement -- as the reason NUMA reporting is a per-host opt-in.

For three kinds of flavor, this computes the largest amount of each class
one request finds on the flat tree and on the tree with NUMA children, from
the published inventories as Placement counts them: per provider and class,
``(total - reserved) * allocation_ratio - used``, no more than ``max_unit``
in one allocation, in steps of ``step_size``:

* floating: ``resources=VCPU:v,MEMORY_MB:m``, one unnumbered group (what
  nova 34 asks for any flavor): each class from any one provider of the tree;
* pinned: the same with PCPU;
* ``hw:numa_nodes=N``: the spec's request shape, one numbered group per
  guest node, each needing ``HW_NUMA_ROOT`` and holding ``v/N`` VCPU and
  ``m/N`` MEMORY_MB (nova refuses flavors that do not divide evenly). Our
  NUMA children hold their memory themselves (the spec puts it on a page-size
  grandchild, which it then joins with ``same_subtree``), so one group per
  node suffices. The spec sends ``group_policy=none`` and has the
  NUMATopologyFilter drop candidates that put two guest nodes on one host
  node; the candidates that survive are exactly those of
  ``group_policy=isolate``, which is what is computed and printed here. On
  the flat tree the spec's fallback asks for the whole flavor in one
  unnumbered group. nova 34 forms none of these NUMA requests itself (it
  has no NUMA in Placement); the report follows the approved spec.

A class whose maxima differ is stranded: amounts above the nested maximum,
up to the flat one, find a candidate flat and none with NUMA children.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from node_agent.model.provider_tree import Inventory, ProviderTree

HW_NUMA_ROOT = "HW_NUMA_ROOT"
MEMORY = "MEMORY_MB"

# provider name -> resource class -> amount allocated
Usage = Mapping[str, Mapping[str, int]]


def largest_allocation(inventory: Inventory, used: int = 0) -> int:
    """The largest amount of one allocation Placement accepts now."""
    capacity = int((inventory.total - inventory.reserved) * inventory.allocation_ratio) - used
    max_unit = inventory.total if inventory.max_unit is None else inventory.max_unit
    amount = min(capacity, max_unit)
    if amount < inventory.min_unit:
        return 0
    return amount - amount % max(inventory.step_size, 1)


def _largest(tree: ProviderTree, usage: Usage, rc: str, numa_only: bool = False) -> list[int]:
    """Per provider (NUMA nodes only with ``numa_only``), the largest ``rc``."""
    found = []
    for provider in tree.providers:
        if numa_only and not provider.traits.get(HW_NUMA_ROOT):
            continue
        inventory = provider.inventories.get(rc)
        used = usage.get(provider.name, {}).get(rc, 0)
        found.append(largest_allocation(inventory, used) if inventory is not None else 0)
    return found


@dataclass(frozen=True)
class Shape:
    """One kind of flavor: the largest amount per class that finds a
    candidate flat and with NUMA children, as the flavor's total."""

    kind: str  # "floating", "pinned", "hw:numa_nodes=N"
    cpu_class: str  # VCPU or PCPU
    nodes: int  # 0: one unnumbered group; N: N groups, one per host node
    flat: Mapping[str, int]
    numa: Mapping[str, int]
    # With N groups: the nested maxima hold on the same N nodes at once.
    together: bool = True

    @property
    def step(self) -> int:
        return max(self.nodes, 1)

    def stranded(self) -> dict[str, tuple[int, int]]:
        """class -> (smallest, largest) flavor amount stranded."""
        return {
            rc: (self.numa[rc] + self.step, self.flat[rc])
            for rc in (self.cpu_class, MEMORY)
            if self.flat[rc] >= self.numa[rc] + self.step
        }

    def request(self, cpu: int, memory: int) -> str:
        """The ``GET /allocation_candidates`` query for a flavor of this
        kind with ``cpu`` and ``memory`` in total, on the NUMA tree."""
        if not self.nodes:
            return f"resources={self.cpu_class}:{cpu},{MEMORY}:{memory}"
        groups = [
            f"resources{n}={self.cpu_class}:{cpu // self.nodes},{MEMORY}:{memory // self.nodes}"
            f"&required{n}={HW_NUMA_ROOT}"
            for n in range(1, self.nodes + 1)
        ]
        return "&".join(groups) + ("&group_policy=isolate" if self.nodes > 1 else "")

    def flat_request(self, cpu: int, memory: int) -> str:
        """The same flavor's query on the flat tree (the spec's fallback)."""
        return f"resources={self.cpu_class}:{cpu},{MEMORY}:{memory}"

    def probes(self) -> list[tuple[str, str, str]]:
        """(what, request on the NUMA tree, the same flavor's flat request):
        per stranded class, its smallest stranded flavor (the other class
        at its smallest) and the largest that still fits."""
        found = []
        small = self.step
        for rc, (low, _high) in sorted(self.stranded().items()):
            fits = self.numa[rc]
            if rc == MEMORY:
                found.append(("stranded", self.request(small, low), self.flat_request(small, low)))
                if fits:
                    found.append(
                        ("fits", self.request(small, fits), self.flat_request(small, fits))
                    )
            else:
                found.append(("stranded", self.request(low, small), self.flat_request(low, small)))
                if fits:
                    found.append(
                        ("fits", self.request(fits, small), self.flat_request(fits, small))
                    )
        return found

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "flat": dict(self.flat),
            "numa": dict(self.numa),
            "together": self.together,
            "stranded": {rc: list(r) for rc, r in sorted(self.stranded().items())},
            "request": self.request(self.numa[self.cpu_class], self.numa[MEMORY])
            if self.numa[self.cpu_class] and self.numa[MEMORY]
            else None,
            "probes": [
                {"what": what, "request": request, "flat_request": flat}
                for what, request, flat in self.probes()
            ],
        }

    def line(self) -> str:
        stranded = self.stranded()
        largest = f"{self.cpu_class}:{self.numa[self.cpu_class]}, {MEMORY}:{self.numa[MEMORY]}"
        if not (self.numa[self.cpu_class] and self.numa[MEMORY]):
            largest = "none"
        elif not self.together:
            largest += " (not both on the same nodes)"
        if not stranded:
            return f"{self.kind}: nothing stranded (largest with NUMA children: {largest})"
        parts = [
            f"{rc} {low}..{high}" if low < high else f"{rc} {low}"
            for rc, (low, high) in sorted(stranded.items(), key=lambda i: i[0] != self.cpu_class)
        ]
        return (
            f"{self.kind}: flavors with {' or '.join(parts)} find a candidate flat but "
            f"none with NUMA children; the largest that still does: {largest}"
        )


def _nth_largest(values: list[int], n: int) -> int:
    ranked = sorted(values, reverse=True)
    return ranked[n - 1] if len(ranked) >= n else 0


def _grouped(
    numa: ProviderTree,
    flat: ProviderTree,
    usage: Usage,
    flat_usage: Usage,
    cpu_class: str,
    nodes: int,
) -> Shape:
    """``hw:numa_nodes=nodes``: each group on its own host node."""
    cpu = _largest(numa, usage, cpu_class, numa_only=True)
    memory = _largest(numa, usage, MEMORY, numa_only=True)
    per_cpu, per_memory = _nth_largest(cpu, nodes), _nth_largest(memory, nodes)
    together = sum(1 for c, m in zip(cpu, memory) if c >= per_cpu and m >= per_memory) >= nodes
    flat_max = {rc: max(_largest(flat, flat_usage, rc), default=0) for rc in (cpu_class, MEMORY)}
    return Shape(
        f"hw:numa_nodes={nodes}",
        cpu_class,
        nodes,
        {rc: amount - amount % nodes for rc, amount in flat_max.items()},
        {cpu_class: per_cpu * nodes, MEMORY: per_memory * nodes},
        together,
    )


def stranded_shapes(
    numa: ProviderTree, flat: ProviderTree, usage: Optional[Usage] = None
) -> list[Shape]:
    """The shapes of :mod:`this module <node_agent.policy.stranded>` for a
    host's tree with NUMA children (``numa``) and the same host flat
    (``flat``). ``usage``: what is allocated on the NUMA tree's providers,
    by provider name and class, where known; the flat root holds their sum."""
    usage = usage or {}
    summed: dict[str, int] = {}
    for held in usage.values():
        for rc, amount in held.items():
            summed[rc] = summed.get(rc, 0) + amount
    flat_usage = {flat.root.name: summed}
    shapes = []
    for kind, cpu_class in (("floating", "VCPU"), ("pinned", "PCPU")):
        flat_max = {
            rc: max(_largest(flat, flat_usage, rc), default=0) for rc in (cpu_class, MEMORY)
        }
        if not flat_max[cpu_class]:
            continue
        numa_max = {rc: max(_largest(numa, usage, rc), default=0) for rc in (cpu_class, MEMORY)}
        shapes.append(Shape(kind, cpu_class, 0, flat_max, numa_max))
    nodes = sum(1 for p in numa.providers if p.traits.get(HW_NUMA_ROOT))
    cpu_class = "VCPU" if any(s.cpu_class == "VCPU" for s in shapes) else "PCPU"
    for n in range(2, nodes + 1):
        shapes.append(_grouped(numa, flat, usage, flat_usage, cpu_class, n))
    return shapes


def report(shapes: list[Shape], enabled: bool, usage_counted: bool = False) -> dict:
    """The ``numa_stranded`` key of ``--dry-run`` and ``--check-config``."""
    state = "on" if enabled else "off (what turning it on would strand)"
    state += (
        ", with the usage Placement holds now"
        if usage_counted
        else ", for the host empty (usage not counted)"
    )
    return {
        "numa_in_placement": enabled,
        "usage_counted": usage_counted,
        "shapes": [s.as_dict() for s in shapes],
        "lines": [f"[compute] numa_in_placement is {state}:"] + [f"  {s.line()}" for s in shapes],
    }
