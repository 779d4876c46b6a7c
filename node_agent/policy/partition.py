"""CPU policy: which host CPUs back PCPU, which back VCPU.

The pools, named once:

* DEDICATED -- ``cpu_dedicated_set``: one guest vCPU per host CPU, pinned.
  Reported as PCPU, ratio 1.0, nothing reserved.
* SHARED -- ``vcpu_pin_set`` when set (legacy, as nova: it keeps defining
  VCPU even next to ``cpu_shared_set``, which then only means nova's
  emulator-thread pool), else ``cpu_shared_set``, else every online CPU
  when no set is given: floating guests. Reported as VCPU with
  the CPU allocation ratio; ``reserved_host_cpus`` is only meaningful here.
* UNUSED -- online CPUs in neither pool: left to the host.

Checks, all reported together so one edit fixes them all:

1. vcpu_pin_set cannot be combined with cpu_dedicated_set;
2. reserved_host_cpus cannot be combined with either new set (unless
   vcpu_pin_set is set: nova then skips this check too);
3. the dedicated and shared sets must not overlap;
4. every configured CPU must be present on the host;
5. every configured CPU must be online, except dedicated CPUs under
   ``[libvirt] cpu_power_management`` (nova powers idle ones down; each
   still counts once in PCPU);
6. reserved_host_cpus must be below the VCPU total;
7. pcpu_transition_mode is refused (it counted CPUs twice).

Isolated CPUs (``isolcpus``) in the shared pool only warn: floating guests
will not be balanced onto them by the kernel scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from node_agent.errors import ConfigError
from node_agent.model.cpuset import CpuSet
from node_agent.model.settings import Settings
from node_agent.model.snapshot import HostSnapshot


@dataclass(frozen=True)
class CpuPartition:
    dedicated: CpuSet
    shared: CpuSet
    unused: CpuSet
    # CPUs reported as PCPU: always ``dedicated`` (pcpu_transition_mode,
    # which reported CPUs as both, is refused: each CPU is counted once).
    pcpu: CpuSet
    vcpu_reserved: int
    warnings: tuple[str, ...] = ()


def _configured_sets(settings: Settings) -> list[tuple[str, CpuSet]]:
    named = [
        ("cpu_dedicated_set", settings.cpu_dedicated_set),
        ("cpu_shared_set", settings.cpu_shared_set),
        ("vcpu_pin_set", settings.vcpu_pin_set),
    ]
    return [(name, cpus) for name, cpus in named if cpus is not None]


def _combination_problems(settings: Settings) -> list[str]:
    problems = []
    if settings.vcpu_pin_set is not None and settings.cpu_dedicated_set is not None:
        problems.append(
            f"[compute] vcpu_pin_set = '{settings.vcpu_pin_set}' cannot be combined with "
            f"cpu_dedicated_set = '{settings.cpu_dedicated_set}'. Move the vcpu_pin_set "
            "CPUs to cpu_shared_set and remove vcpu_pin_set."
        )
    # nova's _check_cpu_set_configuration: with vcpu_pin_set set, only its
    # combination with cpu_dedicated_set is an error.
    uses_new_sets = settings.vcpu_pin_set is None and (
        settings.cpu_dedicated_set is not None or settings.cpu_shared_set is not None
    )
    if settings.reserved_host_cpus and uses_new_sets:
        problems.append(
            f"[compute] reserved_host_cpus = {settings.reserved_host_cpus} cannot be "
            "combined with cpu_dedicated_set or cpu_shared_set. Leave the host's CPUs "
            "out of both sets instead, and set reserved_host_cpus = 0."
        )
    if settings.cpu_dedicated_set is not None and settings.cpu_shared_set is not None:
        both = settings.cpu_dedicated_set & settings.cpu_shared_set
        if both:
            problems.append(
                f"[compute] cpu_dedicated_set = '{settings.cpu_dedicated_set}' and "
                f"cpu_shared_set = '{settings.cpu_shared_set}' overlap on CPUs {both}. "
                "A CPU is either dedicated or shared: remove them from one set."
            )
    return problems


def _host_problems(settings: Settings, host: HostSnapshot) -> list[str]:
    problems = []
    for name, cpus in _configured_sets(settings):
        absent = cpus - host.present
        if absent:
            problems.append(
                f"[compute] {name} = '{cpus}' names CPUs {absent} that this host does "
                f"not have (present: {host.present or 'none'}). Remove them from {name}."
            )
        offline = (cpus & host.present) - host.online
        if name == "cpu_dedicated_set" and settings.cpu_power_management:
            offline = CpuSet()  # nova's _get_pcpu_available: present is enough
        if offline:
            problems.append(
                f"[compute] {name} = '{cpus}' names offline CPUs {offline} "
                f"(online: {host.online or 'none'}). Bring them online "
                f"(echo 1 > /sys/devices/system/cpu/cpuN/online) or remove them from {name}."
            )
    return problems


def _shared_pool(settings: Settings, host: HostSnapshot) -> CpuSet:
    """nova's ``_get_vcpu_available``: vcpu_pin_set, cpu_shared_set, none
    when only cpu_dedicated_set is given, else every online CPU."""
    if settings.vcpu_pin_set is not None:
        return settings.vcpu_pin_set
    if settings.cpu_shared_set is not None:
        return settings.cpu_shared_set
    if settings.cpu_dedicated_set is not None:
        return CpuSet()
    return host.online


def partition_cpus(settings: Settings, host: HostSnapshot) -> CpuPartition:
    """Split the host's CPUs into pools. Raises ConfigError with every problem."""
    problems = _combination_problems(settings) + _host_problems(settings, host)
    dedicated = settings.cpu_dedicated_set or CpuSet()
    shared = _shared_pool(settings, host)
    reserved = settings.reserved_host_cpus
    legacy = settings.vcpu_pin_set is not None or (
        settings.cpu_dedicated_set is None and settings.cpu_shared_set is None
    )
    if legacy and reserved and shared and reserved >= len(shared):
        problems.append(
            f"[compute] reserved_host_cpus = {reserved} is not below the {len(shared)} "
            f"CPUs reported as VCPU ({shared}). Lower it so guests can run."
        )
    if legacy and reserved and not shared:
        problems.append(
            f"[compute] reserved_host_cpus = {reserved} but the host has no online CPU."
        )
    if settings.pcpu_transition_mode:
        problems.append(
            "[compute] pcpu_transition_mode = true is no longer supported: it reports the "
            "same CPUs as both VCPU and PCPU, so the scheduler could book each CPU twice "
            "and the agent never publishes more than the host has. Remove the option and "
            "set cpu_dedicated_set (CPUs for pinned guests) and cpu_shared_set (the rest); "
            "the agent moves pinned guests from VCPU to PCPU in one reshape."
        )
    if problems:
        raise ConfigError(problems)
    warnings = []
    if settings.vcpu_pin_set is not None and settings.cpu_shared_set is not None:
        warnings.append(
            f"vcpu_pin_set = '{settings.vcpu_pin_set}' and cpu_shared_set = "
            f"'{settings.cpu_shared_set}' are both set: as in nova, VCPU comes from "
            "vcpu_pin_set and cpu_shared_set only names the emulator-thread CPUs. "
            "Move vcpu_pin_set to cpu_shared_set and remove vcpu_pin_set."
        )
    isolated_shared = shared & host.isolated
    if isolated_shared:
        warnings.append(
            f"cpu_shared_set includes isolated CPUs {isolated_shared} (isolcpus): floating "
            "guests are not load-balanced onto them. Consider moving them to cpu_dedicated_set."
        )
    pcpu = dedicated
    unused = host.online - dedicated - shared
    return CpuPartition(
        dedicated=dedicated,
        shared=shared,
        unused=unused,
        pcpu=pcpu,
        vcpu_reserved=reserved,
        warnings=tuple(warnings),
    )


def node_split(partition: CpuPartition, host: HostSnapshot) -> list[dict]:
    """Per NUMA node: which of its online CPUs are dedicated, shared, unused."""
    rows = []
    nodes = host.nodes or ()
    if not nodes:
        return [_row(None, host.online, partition)]
    for node in nodes:
        rows.append(_row(node.id, node.cpus & host.online, partition))
    return rows


def _row(node_id: Optional[int], online: CpuSet, partition: CpuPartition) -> dict:
    return {
        "node": node_id,
        "dedicated": str(online & partition.dedicated),
        "shared": str(online & partition.shared),
        "unused": str(online & partition.unused),
    }
