"""What Placement must hold, computed without the agent's code (pure).

The agent's inputs are known to the soak because it wrote them: the online
CPUs of the fixture tree, the node memory of that tree, the size of the
filesystem of ``instances_path``, and the running configuration. The
expectation follows nova's rules for a host without CPU sets:

* VCPU: every online CPU; ``reserved = reserved_host_cpus``, ratio
  ``cpu_allocation_ratio``;
* MEMORY_MB: the nodes' MemTotal; ``reserved_host_memory_mb``,
  ``ram_allocation_ratio``;
* DISK_GB: the filesystem's size in whole GiB; ``reserved_host_disk_mb``
  rounded up to GiB, ``disk_allocation_ratio``.

A configuration that does not fit the host (reserved >= total) makes the
cycle fail: Placement keeps what it had. A class whose allocations exceed
its new capacity gets its new record all the same, as nova writes it
(Placement takes a capacity below usage and refuses new claims until usage
falls); the cycle is ok and reports the cut. The soak's classes are never
removed, so nothing is held back for being in use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Optional

Record = Mapping[str, object]


@dataclass(frozen=True)
class Config:
    """The options the soak varies; everything else stays at its default."""

    reserved_host_cpus: int = 0
    reserved_host_memory_mb: int = 512
    reserved_host_disk_mb: int = 0
    cpu_allocation_ratio: float = 4.0
    ram_allocation_ratio: float = 1.0
    disk_allocation_ratio: float = 1.0

    def with_value(self, name: str, value) -> "Config":
        return replace(self, **{name: value})


@dataclass(frozen=True)
class HostFacts:
    online_cpus: int
    memory_mb: int
    disk_gb: int


class Unfit(Exception):
    """The configuration does not fit the host: the cycle must fail."""


def capacity(record: Record) -> int:
    """Placement's rule: (total - reserved) * allocation_ratio, truncated."""
    return int((record["total"] - record["reserved"]) * float(record["allocation_ratio"]))


def _record(total: int, reserved: int, ratio: float) -> dict:
    return {
        "total": total,
        "reserved": reserved,
        "min_unit": 1,
        "max_unit": total,
        "step_size": 1,
        "allocation_ratio": float(ratio),
    }


def wanted(host: HostFacts, config: Config) -> dict[str, dict]:
    """The records the agent should want; raises Unfit."""
    problems = []
    if config.reserved_host_cpus and config.reserved_host_cpus >= host.online_cpus:
        problems.append(
            f"reserved_host_cpus {config.reserved_host_cpus} >= {host.online_cpus} online CPUs"
        )
    if config.reserved_host_memory_mb >= host.memory_mb:
        problems.append(
            f"reserved_host_memory_mb {config.reserved_host_memory_mb} >= {host.memory_mb}"
        )
    disk_reserved = math.ceil(config.reserved_host_disk_mb / 1024)
    if disk_reserved >= host.disk_gb:
        problems.append(f"reserved disk {disk_reserved} GiB >= {host.disk_gb} GiB")
    if problems:
        raise Unfit("; ".join(problems))
    return {
        "VCPU": _record(host.online_cpus, config.reserved_host_cpus, config.cpu_allocation_ratio),
        "MEMORY_MB": _record(
            host.memory_mb, config.reserved_host_memory_mb, config.ram_allocation_ratio
        ),
        "DISK_GB": _record(host.disk_gb, disk_reserved, config.disk_allocation_ratio),
    }


@dataclass(frozen=True)
class Expected:
    records: Mapping[str, Record]
    outcome: str  # "ok" or "unfit"
    kept: tuple[str, ...] = ()  # classes held back because they are in use (none here)
    why: str = ""
    cut: tuple[str, ...] = ()  # classes published below their usage


def after_cycle(
    previous: Optional[Mapping[str, Record]],
    host: HostFacts,
    config: Config,
    usages: Mapping[str, int],
) -> Expected:
    """What Placement holds after one cycle, given what it held before."""
    try:
        new = wanted(host, config)
    except Unfit as exc:
        if previous is None:
            raise
        return Expected(previous, "unfit", why=str(exc))
    cut = [
        rc
        for rc, record in new.items()
        if previous is not None
        and rc in previous
        and record["reserved"] < record["total"]
        and usages.get(rc, 0) > capacity(record) < capacity(previous[rc])
    ]
    return Expected(new, "ok", cut=tuple(sorted(cut)))


def fits(
    records: Mapping[str, Record], usages: Mapping[str, int], request: Mapping[str, int]
) -> bool:
    """Would the scheduler place ``request`` on a provider holding ``records``?"""
    for rc, amount in request.items():
        record = records.get(rc)
        if record is None or amount > record["max_unit"]:
            return False
        if usages.get(rc, 0) + amount > capacity(record):
            return False
    return True


def same_record(held: Record, expected: Record) -> bool:
    """Placement stores ratios as FLOAT: 1.1 may come back as 1.10000002."""
    return (
        all(held[key] == expected[key] for key in expected if key != "allocation_ratio")
        and abs(float(held["allocation_ratio"]) - float(expected["allocation_ratio"])) < 1e-6
    )


def cpulist(cpus) -> str:
    """The kernel's cpulist format: '0-3,8,10-11'."""
    ranges, ordered = [], sorted(cpus)
    for cpu in ordered:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def trend(samples: list[tuple[int, float]]) -> float:
    """Least-squares slope of (cycle, value) pairs, per 1,000 cycles."""
    if len(samples) < 2:
        return 0.0
    xs = [x for x, _ in samples]
    ys = [y for _, y in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if not var:
        return 0.0
    return 1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var
