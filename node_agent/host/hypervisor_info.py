"""The hypervisor facts nova's static traits depend on: libvirt's and QEMU's
versions, the domain capabilities (when ``[libvirt] domain_capabilities``
opens the read-write connection they need), kvm_amd's SEV parameters and
the misc cgroup's Intel TDX capacity.
Read by :func:`node_agent.host.libvirt_facts.read_libvirt`; the traits themselves are
:mod:`node_agent.tree.hypervisor_traits`'s."""

from __future__ import annotations

import logging
from typing import Optional

from node_agent.errors import DomainCapsRefused
from node_agent.host.domain_capabilities import parse_domain_capabilities
from node_agent.host.sysfs import SysFS
from node_agent.host.warn_once import log_once
from node_agent.model.settings import Settings
from node_agent.model.snapshot import DomainCaps, HypervisorInfo
from node_agent.tree.hypervisor_traits import NEEDS_DOMAIN_CAPS


def _version(number: int) -> tuple[int, int, int]:
    """libvirt's ``major * 1,000,000 + minor * 1,000 + micro``."""
    return number // 1_000_000, number // 1000 % 1000, number % 1000


# nova's default machine type per architecture
# (nova/virt/libvirt/utils.py get_default_machine_type); None: libvirt's.
_DEFAULT_MACHINE = {
    "armv7l": "virt",
    "aarch64": "virt",
    "ppc64le": "pseries",
    "s390": "s390-ccw-virtio",
    "s390x": "s390-ccw-virtio",
    "i686": "pc",
    "x86_64": "pc",
}


def hypervisor_info(hypervisor, caps, settings: Settings) -> HypervisorInfo:
    """Versions, and the domain capabilities when ``[libvirt]
    domain_capabilities`` allows the read-write connection they need.

    As nova (``Host.get_domain_capabilities``): for every guest architecture
    of the capabilities, its default machine type and every machine alias,
    with ``[libvirt] virt_type``; an architecture libvirt cannot run that way
    is left out.
    """
    libvirt_version, qemu_version = hypervisor.versions()
    domain_caps = None
    if settings.domain_capabilities:
        try:
            domain_caps = _read_domain_caps(hypervisor, caps, settings.virt_type)
        except DomainCapsRefused as exc:
            # Refused (polkit, a driver without them): report the rest of the
            # host, and leave these traits as Placement has them.
            log_once(
                [
                    f"[libvirt] domain_capabilities is on but {exc}; not reporting "
                    f"{', '.join(NEEDS_DOMAIN_CAPS)}. Check the polkit rule "
                    f"(README) or turn the option off."
                ]
            )
    else:
        log_once(
            [
                f"[libvirt] domain_capabilities is off, so the agent keeps its "
                f"read-only libvirt connection and does not report "
                f"{', '.join(NEEDS_DOMAIN_CAPS)}: libvirt refuses domain "
                f"capabilities on a read-only connection."
            ],
            logging.INFO,
        )
    return HypervisorInfo(
        _version(libvirt_version),
        _version(qemu_version),
        domain_caps,
        kvm_amd_parameters(SysFS(settings.sysfs_root)),
        hv_type=hypervisor.hv_type(),
        tdx_capacity=tdx_capacity(SysFS(settings.sysfs_root)),
    )


# oslo's strutils.bool_from_string true words, which nova reads these with.
_TRUE = frozenset({"1", "t", "true", "on", "y", "yes"})


def kvm_amd_parameters(sysfs: SysFS) -> frozenset[str]:
    """Which of kvm_amd's ``sev``, ``sev_es``, ``sev_snp`` are on; none
    when the module is not loaded (an Intel host)."""
    found = set()
    for name in ("sev", "sev_es", "sev_snp"):
        text = sysfs.read(f"module/kvm_amd/parameters/{name}")
        if text is not None and text.strip().lower() in _TRUE:
            found.add(name)
    return frozenset(found)


def tdx_capacity(sysfs: SysFS) -> Optional[int]:
    """The ``tdx`` line of the kernel misc cgroup's ``misc.capacity``, as
    nova's ``Host._get_cgroup_tdx_capacity`` reads it; None without the
    file, the line or a number on it (nova then takes [libvirt]
    num_intel_tdx_guests alone)."""
    text = sysfs.read("fs/cgroup/misc.capacity")
    if text is None:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "tdx":
            try:
                value = int(parts[1])
            except ValueError:
                break
            return value if value >= 0 else None
    return None


_DOMAIN_CAPS: dict[tuple, Optional[str]] = {}


def _read_domain_caps(hypervisor, caps, virt_type: str) -> tuple[DomainCaps, ...]:
    """Asked once per (emulator, arch, machine, virt type) while the agent
    runs, as nova caches them for its lifetime: they change only when
    libvirt or QEMU is upgraded, after which the agent is restarted too."""

    found: list[DomainCaps] = []
    for guest in caps.guests:
        domain = guest.domain(virt_type)
        machines = sorted(
            {_DEFAULT_MACHINE.get(guest.arch)} | set(domain.aliases), key=lambda m: m or ""
        )
        answers = []
        for machine in machines:
            key = (hypervisor.uri, domain.emulator, guest.arch, machine, virt_type)
            if key not in _DOMAIN_CAPS:
                _DOMAIN_CAPS[key] = hypervisor.domain_capabilities_xml(
                    domain.emulator, guest.arch, machine, virt_type
                )
            answers.append(_DOMAIN_CAPS[key])
        if any(answer is None for answer in answers):
            continue  # nova drops the whole architecture on one failure
        found.extend(parse_domain_capabilities(answer) for answer in answers if answer)
    return tuple(found)
