"""Desired provider tree from a host snapshot, its CPU partition and settings.

Pure: the same inputs always give the same tree. Classes whose total is 0
are left out, as Placement has no use for an empty inventory.

The tree: the root (CPUs, memory, disk, or one unit in whole-node mode),
then NUMA children (:mod:`node_agent.tree.numa`), GPU and SR-IOV children
(:mod:`node_agent.tree.pci`; under the NUMA child of their device's node
when there are NUMA children), PCI devices in Placement
(:mod:`node_agent.tree.pci_placement`, under the root as nova puts them),
memory-encryption children
(:mod:`node_agent.tree.mem_encryption`), and finally the operator's provider files
(:mod:`node_agent.policy.provider_config`) layered on top.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping, Optional, Sequence, Set

import os_resource_classes as orc
import os_traits

from node_agent.errors import ConfigError
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.model.settings import Settings
from node_agent.model.snapshot import HostSnapshot
from node_agent.policy.partition import CpuPartition
from node_agent.policy.provider_config import ProviderConfig, apply_provider_configs
from node_agent.tree.capability_traits import CapabilitySettings, capability_traits
from node_agent.tree.cpu_traits import guest_cpu_traits
from node_agent.tree.hypervisor_traits import TraitSettings, hypervisor_traits
from node_agent.tree.mem_encryption import (
    MemEncryption,
    TdxSettings,
    host_mem_encryption,
    mem_encryption_children,
)
from node_agent.tree.numa import numa_provider_name, split_by_numa
from node_agent.tree.pci import (
    gpu_children,
    gpu_provider_name,
    sriov_children,
    sriov_provider_name,
)
from node_agent.tree.pci_placement import pci_tree


def arch_trait(arch: str | None) -> str | None:
    """nova's rule (``_get_cpu_arch_traits``): ``HW_ARCH_`` + libvirt's arch
    upper-cased, when os-traits has it. libvirt says ``armv7l``, and
    os-traits has no HW_ARCH_ARMV7L, so a 32-bit ARM host gets no arch trait
    from nova; a scheduler filter on HW_ARCH_ARMV7 never matched nova's
    hosts either, so the agent adds none."""
    if not arch:
        return None
    name = "HW_ARCH_" + arch.upper()
    return name if hasattr(os_traits, name) else None


def check_reserved(settings: Settings, host: HostSnapshot) -> None:
    """Reserved memory and disk must leave something for guests."""
    problems = []
    if host.memory_mb and settings.reserved_host_memory_mb >= host.memory_mb:
        problems.append(
            f"[compute] reserved_host_memory_mb = {settings.reserved_host_memory_mb} is not "
            f"below the host's {host.memory_mb} MiB of memory. Lower it."
        )
    reserved_gb = disk_reserved_gb(settings)
    if host.disk_gb and reserved_gb >= host.disk_gb:
        problems.append(
            f"[compute] reserved_host_disk_mb = {settings.reserved_host_disk_mb} "
            f"({reserved_gb} GiB) is not below the {host.disk_gb} GiB of the filesystem "
            f"holding instances_path = '{settings.instances_path}'. Lower it."
        )
    if problems:
        raise ConfigError(problems)


def disk_reserved_gb(settings: Settings, image_cache_bytes: int = 0) -> int:
    """``reserved_host_disk_mb`` in GiB rounded up, plus, with
    ``[workarounds] reserve_disk_resource_for_image_cache``, the image
    cache's disk in GiB rounded up (nova's two roundings, added)."""
    reserved = math.ceil(settings.reserved_host_disk_mb / 1024)
    if settings.reserve_disk_for_image_cache:
        reserved += math.ceil(image_cache_bytes / 1024**3)
    return reserved


def root_inventories(
    settings: Settings, host: HostSnapshot, partition: CpuPartition
) -> dict[str, Inventory]:
    candidates = {
        orc.VCPU: Inventory(
            total=len(partition.shared),
            reserved=partition.vcpu_reserved,
            allocation_ratio=settings.cpu_allocation_ratio,
            keep_placement_ratio=settings.keeps_placement_ratio("cpu"),
        ),
        orc.PCPU: Inventory(total=len(partition.pcpu)),
        orc.MEMORY_MB: Inventory(
            # nova's Host.get_memory_mb_total: the backing files' size.
            total=settings.file_backed_memory or host.memory_mb,
            reserved=settings.reserved_host_memory_mb,
            allocation_ratio=settings.ram_allocation_ratio,
            keep_placement_ratio=settings.keeps_placement_ratio("ram"),
        ),
        orc.DISK_GB: Inventory(
            total=host.disk_gb,
            reserved=disk_reserved_gb(settings, host.image_cache_bytes),
            allocation_ratio=settings.disk_allocation_ratio,
            keep_placement_ratio=settings.keeps_placement_ratio("disk"),
        ),
    }
    candidates.update(pmem_inventories(settings, host))
    return {rc: inv for rc, inv in candidates.items() if inv.total > 0}


def pmem_inventories(settings: Settings, host: HostSnapshot) -> dict[str, Inventory]:
    """nova's ``_update_provider_tree_for_vpmems``: one
    CUSTOM_PMEM_NAMESPACE_<LABEL> per label, a unit per namespace. A
    configured namespace the host lacks is refused, as nova refuses to
    start (PMEMNamespaceConfigInvalid)."""
    missing = [
        name
        for _label, names in settings.pmem_namespaces
        for name in names
        if name not in host.pmem_namespaces
    ]
    if missing:
        raise ConfigError(
            f"[libvirt] pmem_namespaces names {', '.join(missing)}, which this host "
            f"does not have (its namespaces: {', '.join(sorted(host.pmem_namespaces)) or 'none'}; "
            "see 'ndctl list'); nova refuses to start too. Correct the names."
        )
    counts: dict[str, int] = {}
    for label, names in settings.pmem_namespaces:
        rc = orc.normalize_name(f"PMEM_NAMESPACE_{label}")
        counts[rc] = counts.get(rc, 0) + len(names)
    return {rc: Inventory(total=n) for rc, n in counts.items()}


def root_traits(host: HostSnapshot, settings: Optional[Settings] = None) -> dict[str, bool]:
    """Traits the agent decides about on the root: {trait: present?}.

    CPU feature traits come from :mod:`node_agent.tree.cpu_traits`: every trait
    of its table is decided (absent features are False) once libvirt has
    described the CPU; they follow the guest CPU ``[libvirt] cpu_mode``
    describes. The static hypervisor traits come from
    :mod:`node_agent.tree.hypervisor_traits`, nova's capability traits from
    :mod:`node_agent.tree.capability_traits`.
    """
    traits = {os_traits.COMPUTE_NODE: True, os_traits.HW_CPU_HYPERTHREADING: host.has_smt}
    arch = arch_trait(host.cpu_model.arch)
    if arch:
        traits[arch] = True
    if settings is None:
        traits.update(guest_cpu_traits(None, host.cpu_model, ()))
        return traits
    traits.update(
        guest_cpu_traits(
            settings.cpu_mode, host.cpu_model, host.guest_cpu_models, settings.cpu_model_extra_flags
        )
    )
    traits.update(hypervisor_traits(host.hypervisor, trait_settings(settings), host.cpu_model.arch))
    traits.update(
        capability_traits(host.hypervisor, capability_settings(settings), host.cpu_model.arch)
    )
    return traits


def capability_settings(settings: Settings) -> CapabilitySettings:
    return CapabilitySettings(
        virt_type=settings.virt_type,
        images_type=settings.images_type,
        force_raw_images=settings.force_raw_images,
        image_type_exclude_list=settings.image_type_exclude_list,
        file_backed_memory=settings.file_backed_memory,
    )


def trait_settings(settings: Settings) -> TraitSettings:
    return TraitSettings(
        settings.virt_type, settings.swtpm_enabled, settings.supported_tpm_secret_security
    )


def mem_encryption(settings: Settings, host: HostSnapshot) -> Optional[MemEncryption]:
    """The AMD SEV and Intel TDX guests the host offers
    (:mod:`node_agent.tree.mem_encryption`)."""
    return host_mem_encryption(
        host.hypervisor,
        host.cpu_model.arch,
        settings.num_memory_encrypted_guests,
        TdxSettings(settings.cpu_mode, settings.num_intel_tdx_guests),
    )


def whole_node_inventories(resource_class: str) -> dict[str, Inventory]:
    """Bare-metal (Ironic) model: one node, one unit, nothing else."""
    return {resource_class: Inventory(total=1, max_unit=1)}


def build_tree(
    settings: Settings,
    host: HostSnapshot,
    partition: CpuPartition,
    operator: Sequence[ProviderConfig] = (),
    previously_applied: Optional[Mapping[str, Set[str]]] = None,
) -> ProviderTree:
    """The desired tree. ``operator`` are the parsed provider config files
    (:func:`node_agent.config.provider_files.load_provider_configs`);
    ``previously_applied`` is what those files added last time, by provider
    name, so traits dropped from a file are removed (see
    :func:`node_agent.policy.provider_config.apply_provider_configs`)."""
    if settings.node_resource_class:
        root = Provider(
            name=settings.host,
            inventories=whole_node_inventories(settings.node_resource_class),
            traits=root_traits(host, settings),
        )
        tree = ProviderTree((root,))
    else:
        tree = _resource_tree(settings, host, partition)
    return apply_provider_configs(tree, operator, previously_applied or {})


def under_their_nodes(
    name: str, host: HostSnapshot, devices: tuple[Provider, ...], nodes: Set[str]
) -> tuple[Provider, ...]:
    """GPU and SR-IOV PF children moved under the NUMA child of the node
    their device is attached to (sysfs ``numa_node``), when that node has a
    child (``nodes``: the NUMA children's names), so one ``same_subtree``
    request can take CPUs and a device of the same node. A device with no
    affinity, or on a node without a child, stays under the root."""
    node_of = {gpu_provider_name(name, g.address): g.numa_node for g in host.gpus}
    node_of.update({sriov_provider_name(name, p.address): p.numa_node for p in host.sriov_pfs})
    moved = []
    for device in devices:
        node = node_of.get(device.name)
        parent = numa_provider_name(name, node) if node is not None else None
        moved.append(replace(device, parent=parent) if parent in nodes else device)
    return tuple(moved)


def _resource_tree(settings: Settings, host: HostSnapshot, partition: CpuPartition) -> ProviderTree:
    check_reserved(settings, host)
    inventories = root_inventories(settings, host, partition)
    children: tuple[Provider, ...] = ()
    if settings.numa_in_placement and host.nodes:
        split = split_by_numa(settings, host, partition, inventories)
        inventories, children = split.root_inventories, split.children
    root = Provider(name=settings.host, inventories=inventories, traits=root_traits(host, settings))
    pci, claimed = pci_tree(settings, host)
    devices = gpu_children(settings, host) + sriov_children(settings, host, claimed)
    children += under_their_nodes(settings.host, host, devices, {c.name for c in children})
    children += pci
    children += mem_encryption_children(settings.host, mem_encryption(settings, host))
    return ProviderTree((root,) + children)
