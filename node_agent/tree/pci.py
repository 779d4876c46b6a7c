"""GPU (VGPU) and SR-IOV PF (SRIOV_NET_VF) children of the root. Pure.

GPU: nova's model (libvirt driver ``_get_supported_vgpu_types`` and
``_get_gpu_inventories``). A GPU serves one mdev type (the types share the
same hardware, so their available counts are not additive): the type whose
``[mdev_<type>] device_addresses`` names it, else the default type, the
first enabled type without device_addresses (later ones are not used).
Total = mdevs of that type already created + its available_instances
(which counts only what is left); ``max_instances`` caps a type over all
GPUs, and a GPU whose available instances would pass it gets total 0. A
GPU with total 0 (or not offering its type) has no child, named otherwise
``<host>_pci_<domain>_<bus>_<slot>_<function>``, with class VGPU or the
type's ``mdev_class`` for GPUs of its device_addresses (nova gives the
default type's GPUs VGPU).
Each GPU child carries the agent's mark
(:data:`node_agent.policy.child_owner.AGENT_CHILD_TRAIT`): nova names its GPU
children the same way, so the name alone does not say whose it is.

SR-IOV: one child per PF matched by a ``[pci] device_spec`` with a
``physical_network``, named ``<host>_<PF address>``, with SRIOV_NET_VF =
``sriov_totalvfs`` (or ``sriov_numvfs`` with ``report_sriov_numvfs``) and
trait ``CUSTOM_PHYSNET_<NAME>``. The first matching spec wins.

NUMA affinity: os-traits has no trait for it, so none is invented; with
NUMA children the tree puts each device's child under its node's child
(:func:`node_agent.tree.build.under_their_nodes`).
"""

from __future__ import annotations

import json
from typing import Mapping, Optional

import os_resource_classes as orc

from node_agent.model.device_spec import PciDeviceSpec, physnet_trait
from node_agent.model.provider_tree import Inventory, Provider
from node_agent.model.settings import MdevTypeSettings, Settings
from node_agent.model.snapshot import HostSnapshot, MdevTypeInfo, PciGpu, SriovPf
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT


def gpu_provider_name(host: str, address: str) -> str:
    """``0000:81:00.0`` -> ``<host>_pci_0000_81_00_0`` (nova's naming)."""
    return f"{host}_pci_{address.replace(':', '_').replace('.', '_')}"


def sriov_provider_name(host: str, address: str) -> str:
    return f"{host}_{address}"


def mdev_type_settings(settings: Settings) -> tuple[MdevTypeSettings, ...]:
    """The enabled types' sections; a type without one has the defaults."""
    given = {t.name: t for t in settings.mdev_types}
    return tuple(given.get(name, MdevTypeSettings(name)) for name in settings.enabled_mdev_types)


def gpu_type_choice(types: tuple[MdevTypeSettings, ...]) -> tuple[dict, Optional[str]]:
    """(address -> type, the default type): nova's ``_get_supported_vgpu_types``."""
    by_address: dict[str, MdevTypeSettings] = {}
    default = None
    for mdev_type in types:
        if not mdev_type.device_addresses:
            default = default or mdev_type.name
        for address in mdev_type.device_addresses:
            by_address.setdefault(address.lower(), mdev_type)
    return by_address, default


def chosen_mdev_type(gpu: PciGpu, types: tuple[MdevTypeSettings, ...]) -> Optional[MdevTypeInfo]:
    """The type ``gpu`` serves, as it offers it; None when it serves none
    or does not offer the type it is given."""
    by_address, default = gpu_type_choice(types)
    given = by_address.get(gpu.address.lower())
    name = given.name if given else default
    return next((t for t in gpu.mdev_types if t.id == name), None)


def gpu_totals(settings: Settings, gpus) -> dict[str, tuple[str, int]]:
    """GPU address -> (resource class, total), nova's two passes: mdevs
    already created count first, then the instances left, GPU by GPU in
    address order, against each type's max_instances."""
    types = mdev_type_settings(settings)
    by_address, _default = gpu_type_choice(types)
    limits = {t.name: t.max_instances for t in types}
    used: dict[str, int] = {}
    totals: dict[str, int] = {}
    chosen = {gpu.address: chosen_mdev_type(gpu, types) for gpu in gpus}
    for gpu in gpus:
        offered = chosen[gpu.address]
        if offered is not None and offered.mdevs:
            used[offered.id] = used.get(offered.id, 0) + len(offered.mdevs)
            totals[gpu.address] = len(offered.mdevs)
    for gpu in gpus:
        offered = chosen[gpu.address]
        if offered is None:
            continue
        count, limit = offered.available_instances, limits.get(offered.id)
        if limit and used.get(offered.id, 0) + count > limit:
            totals[gpu.address] = 0  # nova removes this GPU's provider
            continue
        used[offered.id] = used.get(offered.id, 0) + count
        totals[gpu.address] = totals.get(gpu.address, 0) + count
    result = {}
    for address, total in totals.items():
        given = by_address.get(address.lower())
        result[address] = (given.mdev_class if given else orc.VGPU, total)
    return result


def gpu_children(settings: Settings, host: HostSnapshot) -> tuple[Provider, ...]:
    children = []
    gpus = sorted(host.gpus, key=lambda g: g.address)
    totals = gpu_totals(settings, gpus)
    for gpu in gpus:
        if gpu.address not in totals:
            continue
        resource_class, total = totals[gpu.address]
        if total <= 0:
            continue
        children.append(
            Provider(
                name=gpu_provider_name(settings.host, gpu.address),
                parent=settings.host,
                inventories={resource_class: Inventory(total=total)},
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


def sriov_children(
    settings: Settings, host: HostSnapshot, claimed: Optional[Mapping[str, Optional[int]]] = None
) -> tuple[Provider, ...]:
    """``claimed``: PF address -> VFs already counted on a PCI child, None
    when the PF itself is one (:func:`node_agent.tree.pci_placement.claimed_vfs`);
    those VFs are not counted again."""
    children = []
    claimed = claimed or {}
    for pf in sorted(host.sriov_pfs, key=lambda p: p.address):
        spec = matching_spec(pf, settings.pci_device_specs)
        if spec is None or not spec.physical_network:
            continue
        total = pf.num_vfs if settings.report_sriov_numvfs else pf.total_vfs
        if pf.address in claimed:
            taken = claimed[pf.address]
            total = 0 if taken is None else max(0, total - taken)
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
    fields = {
        "address": dict(zip(("domain", "bus", "slot", "function"), spec.address_regex))
        if spec.address_regex
        else spec.address,
        "devname": spec.devname,
        "vendor_id": spec.vendor_id,
        "product_id": spec.product_id,
        "physical_network": spec.physical_network,
    }
    return json.dumps({k: v for k, v in fields.items() if v})


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
