"""Guests the CPU configuration leaves without the CPUs nova needs. Pure.

The guests' policies are nova's (:mod:`node_agent.policy.guest_cpu`), and so
are the verdicts (``LibvirtDriver._validate_pinning_configuration``):

* a guest with floating vCPUs (shared or mixed) when ``cpu_dedicated_set``
  is set and no ``cpu_shared_set`` is left: nova has no CPU to float it on
  and nova-compute refuses to start. The agent refuses to change the CPU
  classes (:func:`misfits`); the rest of the tree is still written;
* a guest with dedicated vCPUs on CPUs outside ``cpu_dedicated_set``: nova
  only warns at start (stale pins after a live migration), so the agent
  warns (:func:`warnings`). But nova's resource tracker pins every guest of
  its own again at each update, and a CPU outside the set stops it
  (:func:`pinning_unknown`): nova-compute then neither reports the host nor
  reshapes, which companion mode's preview says.

Hosts without ``cpu_dedicated_set`` (the legacy layout, transition mode)
report every usable CPU as VCPU and are not judged here.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional

from node_agent.errors import GuestsDoNotFit
from node_agent.model.cpuset import CpuSet
from node_agent.model.snapshot import Guest
from node_agent.policy.guest_cpu import by_nova, classify, extra_specs


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
    verdict = (
        "nova-compute starts, but its resource updates fail while it is pinned there"
        if by_nova(guest)
        else "Not started by nova (no nova metadata), so nova-compute does not count it"
    )
    where = f"; CPUs {in_shared} are in cpu_shared_set = '{shared}'" if in_shared else ""
    return (
        f"{cpu.policy} guest {guest.name} ({guest.uuid}) has dedicated vCPUs on CPUs "
        f"{cpu.dedicated_cpus}; CPUs {outside} are outside cpu_dedicated_set = "
        f"'{dedicated}'{where}. {verdict}; add them to cpu_dedicated_set or migrate "
        "the guest."
    )


def nova_pinnable(
    dedicated: Optional[CpuSet],
    shared: Optional[CpuSet],
    vcpu_pin_set: Optional[CpuSet],
) -> Optional[tuple[CpuSet, str]]:
    """The host CPUs nova-compute pins its guests' dedicated vCPUs on, with
    the words naming where they come from, the option to add CPUs to first;
    None when that is every online CPU (nothing to judge). As nova's ``_get_host_numa_topology``:
    ``cpu_dedicated_set``; without it, ``vcpu_pin_set`` (legacy: its CPUs
    serve pinned and floating guests alike); ``cpu_shared_set`` alone
    leaves none."""
    if dedicated:
        return dedicated, f"cpu_dedicated_set = '{dedicated}'"
    if vcpu_pin_set:
        return vcpu_pin_set, f"vcpu_pin_set = '{vcpu_pin_set}' (no cpu_dedicated_set)"
    if shared:
        return CpuSet(), (
            f"cpu_dedicated_set (unset: with cpu_shared_set = '{shared}' alone nova "
            "has no CPU to pin on)"
        )
    return None


def pinning_unknown(
    guest: Guest,
    dedicated: CpuSet,
    siblings: Optional[Mapping[int, CpuSet]] = None,
    where: Optional[str] = None,
) -> Optional[str]:
    """Why nova-compute cannot count ``guest`` under ``dedicated``, or None.

    At every resource update (the first one at start, before any reshape)
    nova's resource tracker pins each of its instances' dedicated vCPUs, and
    an isolated emulator thread, on its NUMA cell's dedicated CPUs again
    (``hardware.numa_usage_from_instance_numa`` -> ``NUMACell.pin_cpus``;
    with ``hw:cpu_thread_policy=isolate`` their SMT siblings too). A CPU
    outside ``cpu_dedicated_set`` raises ``CPUPinningUnknown``, which
    ``ComputeManager._update_available_resource_for_node`` only logs: the
    service runs, but it reports nothing and never reshapes until the guest
    is gone or its CPUs are dedicated again. Guests nova did not start are
    not its instances and do not count. ``siblings``: host CPU -> its SMT
    siblings (itself included), for the isolate thread policy. ``where``
    names ``dedicated`` (:func:`nova_pinnable`); None: it is
    ``cpu_dedicated_set``, and empty means nothing is judged."""
    if (where is None and not dedicated) or not by_nova(guest):
        return None
    cpu = classify(guest)
    if not cpu.pins:
        return None
    needed = cpu.dedicated_cpus
    isolate = extra_specs(guest).get("hw:cpu_thread_policy") == "isolate"
    if isolate and siblings:
        needed = CpuSet(set(needed).union(*(siblings.get(c, CpuSet([c])) for c in needed)))
    outside = needed - dedicated
    if not outside:
        return None
    pinned = f"pinned to host CPUs {cpu.dedicated_cpus}"
    if needed != cpu.dedicated_cpus:
        pinned += f" (with their SMT siblings, thread policy isolate: {needed})"
    where = where or f"cpu_dedicated_set = '{dedicated}'"
    return (
        f"{cpu.policy} guest {guest.name} ({guest.uuid}) is {pinned}; CPUs {outside} "
        f"are outside {where}. nova-compute starts but every "
        "resource update fails (CPUPinningUnknown: nova pins its guests' dedicated "
        "vCPUs on these CPUs only), so it reports nothing and does not reshape. "
        f"Add CPUs {outside} to {where.split(' ', 1)[0]}, or migrate or delete the guest "
        "before restarting nova-compute."
    )


def blocks_nova(
    guests: Iterable[Guest],
    dedicated: CpuSet,
    siblings: Optional[Mapping[int, CpuSet]] = None,
    where: Optional[str] = None,
) -> list[str]:
    """nova's own guests that stop nova-compute's resource updates under
    ``dedicated`` (:func:`pinning_unknown`), one line each, in name order."""
    found = []
    for guest in sorted(guests, key=lambda g: (g.name, g.uuid)):
        reason = pinning_unknown(guest, dedicated, siblings, where)
        if reason:
            found.append(reason)
    return found


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
