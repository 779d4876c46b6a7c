"""Guests the CPU configuration leaves without the CPUs nova needs. Pure.

nova refuses to start an instance whose CPUs the configuration no longer
provides, so the agent refuses the configuration first, by name, before it
writes anything to Placement:

* a pinned guest (every vCPU pinned, or ``hw:cpu_policy=dedicated``) whose
  pinned CPUs are not all in ``cpu_dedicated_set`` -- in ``cpu_shared_set``
  or in neither -- once a dedicated set is configured;
* a floating guest when ``cpu_dedicated_set`` is set and no
  ``cpu_shared_set`` is left: nova has no CPU to float it on.

Hosts without ``cpu_dedicated_set`` (the legacy layout, transition mode)
report every usable CPU as VCPU and are not judged here. This module is
the one place that decides and words these refusals: the VCPU -> PCPU
reshape rule (:class:`node_agent.placement.reshape_rules.pinned_to_pcpu`) asks it too.
"""

from __future__ import annotations

from typing import Iterable, Optional

from node_agent.model.cpuset import CpuSet
from node_agent.model.snapshot import Guest


def pinned_misfit(guest: Guest, dedicated: CpuSet,
                  shared: Optional[CpuSet] = None) -> Optional[str]:
    """Why a pinned ``guest`` does not fit ``dedicated``, or None."""
    if not dedicated or not guest.pinned:
        return None
    outside = guest.pinned_cpus - dedicated
    if not outside:
        return None
    in_shared = outside & shared if shared else CpuSet()
    where = (f"; CPUs {in_shared} are in cpu_shared_set = '{shared}'" if in_shared else "")
    return (f"pinned guest {guest.name} ({guest.uuid}) runs on CPUs {guest.pinned_cpus}; "
            f"CPUs {outside} are outside cpu_dedicated_set = '{dedicated}'{where}. "
            "Add them to cpu_dedicated_set or migrate the guest first.")


def floating_misfit(guest: Guest, dedicated: CpuSet, shared: CpuSet) -> Optional[str]:
    """Why a floating ``guest`` has no CPU to run on, or None."""
    if not dedicated or shared or guest.pinned:
        return None
    return (f"floating guest {guest.name} ({guest.uuid}) has no pinned CPUs, but "
            f"cpu_dedicated_set = '{dedicated}' is set and cpu_shared_set is empty, so "
            "nova has no CPU to run it on. Set [compute] cpu_shared_set to the CPUs "
            "floating guests may use, or migrate the guest first.")


def misfits(guests: Iterable[Guest], dedicated: CpuSet,
            shared: Optional[CpuSet]) -> list[str]:
    """Every guest the partition leaves without its CPUs, one line each, in
    guest name order. ``shared`` None: not known (the central applier gets
    only the dedicated set), floating guests are not judged."""
    found = []
    for guest in sorted(guests, key=lambda g: (g.name, g.uuid)):
        reason = pinned_misfit(guest, dedicated, shared)
        if reason is None and shared is not None:
            reason = floating_misfit(guest, dedicated, shared)
        if reason:
            found.append(reason)
    return found
