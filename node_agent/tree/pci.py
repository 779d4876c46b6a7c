"""GPU (VGPU) and SR-IOV PF (SRIOV_NET_VF) children of the root. Pure.

GPU: one child per GPU offering an enabled mdev type, named
``<host>_pci_<domain>_<bus>_<slot>_<function>``. A GPU serves one mdev type
at a time (the types share the same hardware, so their available counts
are not additive): the first enabled type it already has mdevs of, else the
first enabled type it offers. VGPU total = available_instances + mdevs
already created, because ``available_instances`` counts only what is left.
Each GPU child carries the agent's mark
(:data:`node_agent.policy.child_owner.AGENT_CHILD_TRAIT`): nova names its GPU
children the same way, so the name alone does not say whose it is.

SR-IOV: one child per PF matched by a ``[pci] device_spec`` with a
``physical_network``, named ``<host>_<PF address>``, with SRIOV_NET_VF =
``sriov_totalvfs`` (or ``sriov_numvfs`` with ``report_sriov_numvfs``) and
trait ``CUSTOM_PHYSNET_<NAME>``. The first matching spec wins.

NUMA affinity stays in the snapshot (``numa_node``); os-traits has no
trait for it, so none is invented.
"""

from __future__ import annotations

from typing import Optional

import os_resource_classes as orc

from node_agent.model.device_spec import PciDeviceSpec, physnet_trait
from node_agent.model.provider_tree import Inventory, Provider
from node_agent.model.settings import Settings
from node_agent.model.snapshot import HostSnapshot, MdevTypeInfo, PciGpu, SriovPf
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT


def gpu_provider_name(host: str, address: str) -> str:
    """``0000:81:00.0`` -> ``<host>_pci_0000_81_00_0`` (nova's naming)."""
    return f"{host}_pci_{address.replace(':', '_').replace('.', '_')}"


def sriov_provider_name(host: str, address: str) -> str:
    return f"{host}_{address}"


def chosen_mdev_type(gpu: PciGpu, enabled: tuple[str, ...]) -> Optional[MdevTypeInfo]:
    offered = {t.id: t for t in gpu.mdev_types}
    candidates = [offered[name] for name in enabled if name in offered]
    in_use = [t for t in candidates if t.mdevs]
    chosen = in_use or candidates
    return chosen[0] if chosen else None


def gpu_children(settings: Settings, host: HostSnapshot) -> tuple[Provider, ...]:
    children = []
    for gpu in sorted(host.gpus, key=lambda g: g.address):
        mdev_type = chosen_mdev_type(gpu, settings.enabled_mdev_types)
        if mdev_type is None:
            continue
        total = mdev_type.available_instances + len(mdev_type.mdevs)
        children.append(
            Provider(
                name=gpu_provider_name(settings.host, gpu.address),
                parent=settings.host,
                inventories={orc.VGPU: Inventory(total=total)} if total > 0 else {},
                traits={AGENT_CHILD_TRAIT: True},
            )
        )
    return tuple(children)


def matching_spec(pf: SriovPf, specs: tuple[PciDeviceSpec, ...]) -> Optional[PciDeviceSpec]:
    for spec in specs:
        if spec.physical_network and spec.matches(
            pf.address, pf.netdevs, pf.vendor_id, pf.product_id
        ):
            return spec
    return None


def sriov_children(settings: Settings, host: HostSnapshot) -> tuple[Provider, ...]:
    children = []
    for pf in sorted(host.sriov_pfs, key=lambda p: p.address):
        spec = matching_spec(pf, settings.pci_device_specs)
        if spec is None or not spec.physical_network:
            continue
        total = pf.num_vfs if settings.report_sriov_numvfs else pf.total_vfs
        children.append(
            Provider(
                name=sriov_provider_name(settings.host, pf.address),
                parent=settings.host,
                inventories={orc.SRIOV_NET_VF: Inventory(total=total)} if total > 0 else {},
                traits={physnet_trait(spec.physical_network): True},
            )
        )
    return tuple(children)


def _spec_text(spec: PciDeviceSpec) -> str:
    fields = [
        f'"{k}": "{v}"'
        for k, v in (
            ("address", spec.address),
            ("devname", spec.devname),
            ("vendor_id", spec.vendor_id),
            ("product_id", spec.product_id),
            ("physical_network", spec.physical_network),
        )
        if v
    ]
    return "{" + ", ".join(fields) + "}"


def unmatched_device_options(settings: Settings, host: HostSnapshot) -> list[str]:
    """Warnings for device options that match nothing on this host: an
    ``enabled_mdev_types`` name no GPU offers, a ``device_spec`` no SR-IOV PF
    matches. Usually a typo; the tree simply lacks those children."""
    warnings = []
    offered = sorted({t.id for gpu in host.gpus for t in gpu.mdev_types})
    for name in settings.enabled_mdev_types:
        if name not in offered:
            warnings.append(
                f"[devices] enabled_mdev_types names {name}, which no GPU on "
                f"this host offers (offered: {', '.join(offered) or 'none'}); "
                "check the type name (mdevctl types)"
            )
    for spec in settings.pci_device_specs:
        if spec.physical_network and not any(
            spec.matches(pf.address, pf.netdevs, pf.vendor_id, pf.product_id)
            for pf in host.sriov_pfs
        ):
            pfs = ", ".join(pf.address for pf in host.sriov_pfs) or "none"
            warnings.append(
                f"[pci] device_spec {_spec_text(spec)} matches no SR-IOV PF "
                f"on this host (PFs: {pfs}); check address, devname or ids"
            )
    return warnings
