"""Memory-encryption child providers (AMD SEV, SEV-ES, SEV-SNP, Intel TDX),
as nova 34 reports them. Pure.

nova 34's libvirt driver (``_update_provider_tree_for_memory_encryption``,
``Host.get_mem_encryption_inventories``) puts one child per encryption model
under the root, named ``<root>_<model>`` (``<root>_amd_sev``,
``<root>_amd_sev_es``, ``<root>_amd_sev_snp``, ``<root>_intel_tdx``), with ``MEM_ENCRYPTION_CONTEXT``
inventory (total = the guests the firmware has keys for, one per guest:
min_unit = max_unit = step_size = 1, ratio 1.0) and the model's trait. nova
adds ``OWNER_NOVA``; the agent marks them as its own instead
(:data:`~node_agent.policy.child_owner.AGENT_CHILD_TRAIT`): ``OWNER_NOVA`` says
nova-compute writes a provider (:mod:`node_agent.policy.root_owner`), and
nova's scheduler requires it on the root and PCI providers only. A model
whose total is 0 has no child.

When a model counts as supported, in nova's order (``Host.supports_amd_sev*``):

* SEV: an x86_64 host, the kernel's ``kvm_amd`` ``sev`` parameter on, and the
  first x86_64 machine type whose domain capabilities say ``<sev
  supported='yes'>``; its ``maxGuests`` and ``maxESGuests`` are the totals.
* SEV-ES: SEV, ``sev_es`` on, QEMU 8.0 or later, and ``sev_snp`` off (nova
  ignores SEV-ES when SEV-SNP is on). Total: ``maxESGuests``.
* SEV-SNP: SEV, ``sev_snp`` on, and the first x86_64 machine type with a
  ``<launchSecurity>`` listing ``sev-snp``. Total: ``maxESGuests``.

* Intel TDX (``Host.supports_intel_tdx``): an x86_64 host, ``[libvirt]
  cpu_mode = host-passthrough`` as configured, and any x86_64 machine type
  whose domain capabilities say ``<tdx supported='yes'>``. Total: the misc
  cgroup's ``tdx`` capacity; ``[libvirt] num_intel_tdx_guests`` where the
  cgroup does not say, the lower of the two where both do (nova takes the
  option even above the cgroup's count: `mem-encryption-tdx-above-cgroup`
  in docs/design/nova-differences.md).

``[libvirt] num_memory_encrypted_guests`` (older nova's upper bound, which
nova 34 no longer reads) caps each AMD total; it never raises one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional

import os_resource_classes as orc
import os_traits

from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.model.snapshot import DomainCaps, HypervisorInfo
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT, ListedChild

Version = tuple[int, int, int]

# nova/virt/libvirt/host.py MIN_QEMU_SEV_ES_VERSION
MIN_QEMU_SEV_ES: Version = (8, 0, 0)

AMD_SEV = "amd_sev"
AMD_SEV_ES = "amd_sev_es"
AMD_SEV_SNP = "amd_sev_snp"
INTEL_TDX = "intel_tdx"
# nova's MemEncryptionModel order, with the trait each child carries.
MODEL_TRAITS = {
    AMD_SEV: os_traits.HW_CPU_X86_AMD_SEV,
    AMD_SEV_ES: os_traits.HW_CPU_X86_AMD_SEV_ES,
    AMD_SEV_SNP: os_traits.HW_CPU_X86_AMD_SEV_SNP,
    INTEL_TDX: os_traits.HW_CPU_X86_INTEL_TDX,
}


@dataclass(frozen=True)
class MemEncryption:
    """What the host offers: guests per model (only models with a total),
    and why a supported model is not counted (for one warning)."""

    totals: dict[str, int]
    warnings: tuple[str, ...] = ()


def _first_sev(caps: tuple[DomainCaps, ...]) -> Optional[DomainCaps]:
    return next((cap for cap in caps if cap.arch == "x86_64" and cap.sev_supported), None)


def _snp_machine(caps: tuple[DomainCaps, ...]) -> bool:
    # nova stops at a machine type's <launchSecurity> without sev-snp but
    # goes on to the next machine type: any one listing it will do.
    return any("sev-snp" in cap.launch_security for cap in caps if cap.arch == "x86_64")


@dataclass(frozen=True)
class TdxSettings:
    """``[libvirt] cpu_mode`` as configured and ``num_intel_tdx_guests``."""

    cpu_mode: Optional[str] = None
    guests: Optional[int] = None


def host_mem_encryption(
    info: Optional[HypervisorInfo],
    host_arch: Optional[str],
    limit: Optional[int] = None,
    tdx: Optional[TdxSettings] = None,
) -> Optional[MemEncryption]:
    """The memory-encryption guests the host offers, per model; None when
    domain capabilities were not read (the children are then not decided)."""
    if info is None or info.domain_caps is None:
        return None
    amd = _amd(info, host_arch, limit)
    intel = _intel_tdx(info, host_arch, tdx or TdxSettings())
    return MemEncryption({**amd.totals, **intel.totals}, amd.warnings + intel.warnings)


def _intel_tdx(info: HypervisorInfo, host_arch: Optional[str], tdx: TdxSettings) -> MemEncryption:
    assert info.domain_caps is not None
    supported = any(cap.arch == "x86_64" and cap.tdx_supported for cap in info.domain_caps)
    if host_arch != "x86_64" or tdx.cpu_mode != "host-passthrough" or not supported:
        return MemEncryption({})
    kernel = info.tdx_capacity
    if kernel is None and tdx.guests is None:
        return MemEncryption(
            {},
            (
                "libvirt says the host supports Intel TDX but the kernel's misc "
                "cgroup (fs/cgroup/misc.capacity, line tdx) does not say for how "
                "many guests: not reporting intel_tdx. Set [libvirt] "
                "num_intel_tdx_guests (nova needs it too).",
            ),
        )
    total = min(n for n in (kernel, tdx.guests) if n is not None)
    warnings: tuple[str, ...] = ()
    if kernel is not None and tdx.guests is not None and tdx.guests > kernel:
        warnings = (
            f"[libvirt] num_intel_tdx_guests = {tdx.guests} is above the {kernel} TDX "
            f"guests the kernel's misc cgroup allows: reporting {kernel} (nova "
            f"would report {tdx.guests}).",
        )
    return MemEncryption({INTEL_TDX: total} if total > 0 else {}, warnings)


def _amd(info: HypervisorInfo, host_arch: Optional[str], limit: Optional[int]) -> MemEncryption:
    assert info.domain_caps is not None
    if host_arch != "x86_64" or "sev" not in info.kvm_amd:
        return MemEncryption({})
    sev = _first_sev(info.domain_caps)
    if sev is None:
        return MemEncryption({})
    snp_on = "sev_snp" in info.kvm_amd
    found: dict[str, Optional[int]] = {AMD_SEV: sev.sev_max_guests}
    if (
        "sev_es" in info.kvm_amd
        and not snp_on
        and info.qemu_version is not None
        and info.qemu_version >= MIN_QEMU_SEV_ES
    ):
        found[AMD_SEV_ES] = sev.sev_max_es_guests
    if snp_on and _snp_machine(info.domain_caps):
        found[AMD_SEV_SNP] = sev.sev_max_es_guests
    totals, warnings = {}, []
    for model, total in found.items():
        if total is None:
            total = limit
            if total is None:
                warnings.append(
                    f"libvirt says the host supports {model} but not how many guests "
                    f"(no <maxGuests>/<maxESGuests>, libvirt before 8.0): not reporting "
                    f"{model}. Set [libvirt] num_memory_encrypted_guests to the number "
                    "of guests the firmware allows."
                )
                continue
        elif limit is not None:
            total = min(total, limit)
        if total > 0:
            totals[model] = total
    return MemEncryption(totals, tuple(warnings))


def child_name(host: str, model: str) -> str:
    return f"{host}_{model}"


def mem_encryption_children(host: str, offered: Optional[MemEncryption]) -> tuple[Provider, ...]:
    """nova's ``<host>_<model>`` children, marked as the agent's."""
    if offered is None:
        return ()
    return tuple(
        Provider(
            name=child_name(host, model),
            parent=host,
            inventories={orc.MEM_ENCRYPTION_CONTEXT: Inventory(total=total, max_unit=1)},
            traits={MODEL_TRAITS[model]: True, AGENT_CHILD_TRAIT: True},
        )
        for model, total in offered.totals.items()
    )


def undecided(host) -> bool:
    """True when this cycle could not decide the children: no libvirt, or
    no domain capabilities (option off, or refused). The central applier's
    host (no ``hypervisor``) has the agent's decision in its tree."""
    if not hasattr(host, "hypervisor"):
        return False
    return host.hypervisor is None or host.hypervisor.domain_caps is None


def keep_as_held(
    tree: ProviderTree, root_uuid: Optional[str], held: Iterable[ListedChild]
) -> ProviderTree:
    """``tree`` plus the memory-encryption children Placement holds under
    its root, as Placement holds them (no trait opinion), for a cycle that
    could not decide them: a failed or disallowed read never deletes a
    child guests may hold."""
    root = tree.root
    pattern = re.compile(re.escape(root.name) + "_(" + "|".join(MODEL_TRAITS) + ")")
    names = set(tree.names())
    kept = tuple(
        Provider(
            name=child.name,
            parent=root.name,
            uuid=child.uuid,
            inventories={
                rc: Inventory.from_placement(record)
                for rc, record in (child.inventories or {}).items()
            },
        )
        for child in held
        if root_uuid
        and child.parent_uuid == root_uuid
        and child.name not in names
        and pattern.fullmatch(child.name)
    )
    return ProviderTree(tree.providers + kept) if kept else tree
