"""GPU (VGPU) and SR-IOV PF (SRIOV_NET_VF) children of the root. Pure.

GPU: one child per GPU offering an enabled mdev type, named
``<host>_pci_<domain>_<bus>_<slot>_<function>``. A GPU serves one mdev type
at a time (the types share the same hardware, so their available counts
are not additive): the first enabled type it already has mdevs of, else the
first enabled type it offers. VGPU total = available_instances + mdevs
already created, because ``available_instances`` counts only what is left.

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

from node_agent.device_spec import PciDeviceSpec, physnet_trait
from node_agent.provider_tree import Inventory, Provider
from node_agent.settings import Settings
from node_agent.topology import HostSnapshot, MdevTypeInfo, PciGpu, SriovPf


def gpu_provider_name(host: str, address: str) -> str:
    """``0000:81:00.0`` -> ``<host>_pci_0000_81_00_0`` (nova's naming)."""
    return f"{host}_pci_{address.replace(':', '_').replace('.', '_')}"


def sriov_provider_name(host: str, address: str) -> str:
    return f"{host}_{address}"


def chosen_mdev_type(gpu: PciGpu, enabled: tuple[str, ...]) -> Optional[MdevTypeInfo]:
    offered = {t.id: t for t in gpu.mdev_types}
    candidates = [offered[name] for name in enabled if name in offered]
    in_use = [t for t in candidates if t.mdevs]
    return (in_use or candidates or [None])[0]


def gpu_children(settings: Settings, host: HostSnapshot) -> tuple[Provider, ...]:
    children = []
    for gpu in sorted(host.gpus, key=lambda g: g.address):
        mdev_type = chosen_mdev_type(gpu, settings.enabled_mdev_types)
        if mdev_type is None:
            continue
        total = mdev_type.available_instances + len(mdev_type.mdevs)
        children.append(Provider(
            name=gpu_provider_name(settings.host, gpu.address),
            parent=settings.host,
            inventories={orc.VGPU: Inventory(total=total)} if total > 0 else {},
        ))
    return tuple(children)


def matching_spec(pf: SriovPf, specs: tuple[PciDeviceSpec, ...]) -> Optional[PciDeviceSpec]:
    for spec in specs:
        if spec.physical_network and spec.matches(pf.address, pf.netdevs,
                                                  pf.vendor_id, pf.product_id):
            return spec
    return None


def sriov_children(settings: Settings, host: HostSnapshot) -> tuple[Provider, ...]:
    children = []
    for pf in sorted(host.sriov_pfs, key=lambda p: p.address):
        spec = matching_spec(pf, settings.pci_device_specs)
        if spec is None:
            continue
        total = pf.num_vfs if settings.report_sriov_numvfs else pf.total_vfs
        children.append(Provider(
            name=sriov_provider_name(settings.host, pf.address),
            parent=settings.host,
            inventories={orc.SRIOV_NET_VF: Inventory(total=total)} if total > 0 else {},
            traits={physnet_trait(spec.physical_network): True},
        ))
    return tuple(children)
