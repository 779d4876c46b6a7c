"""Guests the CPU configuration leaves without the CPUs nova needs. Pure.

The guests' policies are nova's (:mod:`node_agent.policy.guest_cpu`), and so
are the verdicts (``LibvirtDriver._validate_pinning_configuration``):

* a guest with floating vCPUs (shared or mixed) when ``cpu_dedicated_set``
  is set and no ``cpu_shared_set`` is left: nova has no CPU to float it on
  and nova-compute refuses to start. The agent refuses to change the CPU
  classes (:func:`misfits`); the rest of the tree is still written;
* a guest with dedicated vCPUs on CPUs outside ``cpu_dedicated_set``: nova
  warns and counts it as PCPU all the same (stale pins after a live
  migration), so the agent warns (:func:`warnings`) and reshapes it too.

Hosts without ``cpu_dedicated_set`` (the legacy layout, transition mode)
report every usable CPU as VCPU and are not judged here.
"""

from __future__ import annotations

from typing import Iterable, Optional

from node_agent.errors import GuestsDoNotFit
from node_agent.model.cpuset import CpuSet
from node_agent.model.snapshot import Guest
from node_agent.policy.guest_cpu import by_nova, classify


def pinned_misfit(
    guest: Guest, dedicated: CpuSet, shared: Optional[CpuSet] = None
) -> Optional[str]:
    """Why a guest with dedicated vCPUs runs outside ``dedicated``, or None.

    nova warns and carries on (``_validate_pinning_configuration``: a live
    migration may leave stale pins), so this is a warning, not a refusal."""
    cpu = classify(guest)
    if not dedicated or not cpu.pins:
        return None
    outside = cpu.dedicated_cpus - dedicated
    if not outside:
        return None
    in_shared = outside & shared if shared else CpuSet()
    where = f"; CPUs {in_shared} are in cpu_shared_set = '{shared}'" if in_shared else ""
    return (
        f"{cpu.policy} guest {guest.name} ({guest.uuid}) has dedicated vCPUs on CPUs "
        f"{cpu.dedicated_cpus}; CPUs {outside} are outside cpu_dedicated_set = "
        f"'{dedicated}'{where}. nova starts and counts it as PCPU all the same; "
        "add them to cpu_dedicated_set or migrate the guest."
    )


def floating_misfit(guest: Guest, dedicated: CpuSet, shared: CpuSet) -> Optional[str]:
    """Why a guest with floating vCPUs has no CPU to run on, or None: the
    guest, the host CPUs it runs on, why its vCPUs count as floating, and
    whether nova-compute refuses to start for it (only for its own guests)."""
    cpu = classify(guest)
    if not dedicated or shared or cpu.vcpu == 0:
        return None
    where = (
        f"runs on host CPUs {guest.pinned_cpus}"
        if guest.pinned_cpus
        else "has no pinned CPU (it may run on any)"
    )
    if by_nova(guest):
        origin = ""
        verdict = (
            "nova has no CPU to run them on and nova-compute refuses to start. "
            "Set [compute] cpu_shared_set to the CPUs floating guests may use, "
            "or migrate the guest first."
        )
    else:
        origin = ", not started by nova (no nova metadata),"
        verdict = (
            "no VCPU is published for them while they use host CPUs (nova-compute "
            "does not know this guest). Set [compute] cpu_shared_set to the CPUs "
            "it runs on, pin each of its vCPUs to a CPU of its own, or stop it."
        )
    return (
        f"{cpu.policy} guest {guest.name} ({guest.uuid}){origin} {where}; nova counts "
        f"{cpu.vcpu} of its vCPUs as floating ({cpu.rule}): VCPU {cpu.vcpu}. "
        f"cpu_dedicated_set = '{dedicated}' is set and cpu_shared_set is empty, so "
        f"{verdict}"
    )


def warnings(guests: Iterable[Guest], dedicated: CpuSet, shared: Optional[CpuSet]) -> list[str]:
    """Guests nova runs, with a warning, on CPUs outside the dedicated set."""
    found = []
    for guest in sorted(guests, key=lambda g: (g.name, g.uuid)):
        reason = pinned_misfit(guest, dedicated, shared)
        if reason:
            found.append(reason)
    return found


def misfits(guests: Iterable[Guest], dedicated: CpuSet, shared: Optional[CpuSet]) -> list[str]:
    """Every guest the partition leaves without its CPUs, one line each, in
    guest name order. ``shared`` None: not known (the central applier gets
    only the dedicated set), floating guests are not judged."""
    found: list[str] = []
    if shared is None:
        return found
    for guest in sorted(guests, key=lambda g: (g.name, g.uuid)):
        reason = floating_misfit(guest, dedicated, shared)
        if reason:
            found.append(reason)
    return found


def guests_refused(desired, kept: Optional[str] = None) -> Optional[GuestsDoNotFit]:
    """The refusal when guests do not fit ``desired``'s CPU sets (a cycle's
    ``Desired``: its host's guests and its partition; :func:`misfits`), else
    None. The central applier's partition carries only the dedicated set:
    floating guests are judged on the agent's side alone."""
    partition = desired.partition
    reasons = misfits(desired.host.guests, partition.dedicated, getattr(partition, "shared", None))
    if not reasons:
        return None
    return GuestsDoNotFit(reasons, kept) if kept else GuestsDoNotFit(reasons)
