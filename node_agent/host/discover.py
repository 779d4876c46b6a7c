"""Discovery: read sysfs, libvirt and psutil, return one HostSnapshot.

This is the shell's only entry into the host. sysfs (the kernel) is the
authority on topology; libvirt adds the CPU model, page sizes and guests
(:mod:`node_agent.host.libvirt_facts`, loaded only when ``[libvirt]
connection_uri`` is set), and where the two disagree about topology the
kernel wins and the difference is reported.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import psutil

from node_agent.errors import DiscoveryError
from node_agent.host.sysfs import SysFS
from node_agent.host.sysfs_pci import (
    read_pci,
    read_pci_functions,
    read_pmem_namespace_names,
    with_mdev_parents,
)
from node_agent.host.sysfs_topology import SysfsTopology, read_topology
from node_agent.host.warn_once import log_once
from node_agent.model.settings import Settings
from node_agent.model.snapshot import HostCpuModel, HostSnapshot

if TYPE_CHECKING:
    from node_agent.host.libvirt_facts import LibvirtFacts

GIB = 1024**3


def _existing_ancestor(path: str) -> Path:
    candidate = Path(path).absolute()
    while not candidate.exists() and candidate != candidate.parent:
        candidate = candidate.parent
    return candidate


# nova's [libvirt] images_type values whose disks are not under instances_path.
_POOL_SIZED = {
    "lvm": "the volume group's ([libvirt] images_volume_group)",
    "rbd": "the Ceph pool's ([libvirt] images_rbd_pool)",
}


def disk_gb(instances_path: str, images_type: str = "default") -> tuple[int, list[str]]:
    """Size in whole GiB of the filesystem holding ``instances_path``."""
    where = _existing_ancestor(instances_path)
    warnings = []
    if images_type in _POOL_SIZED:
        warnings.append(
            f"[libvirt] images_type = {images_type}: nova reports "
            f"{_POOL_SIZED[images_type]} size as DISK_GB; the agent does not "
            "read it and reports the size of the filesystem holding "
            f"instances_path '{instances_path}'. Correct it with [compute] "
            "reserved_host_disk_mb or a provider file."
        )
    if str(where) != str(Path(instances_path).absolute()):
        warnings.append(
            f"instances_path '{instances_path}' does not exist; DISK_GB is the "
            f"size of the filesystem holding '{where}'."
        )

    try:
        return psutil.disk_usage(str(where)).total // GIB, warnings
    except OSError as exc:
        raise DiscoveryError(f"cannot size the filesystem of '{where}': {exc}") from exc


def image_cache_bytes(instances_path: str, subdirectory: str) -> int:
    """The disk the image cache's files occupy (their blocks: cached images
    are sparse), as nova's libvirt ImageCacheManager.get_disk_usage counts
    it: 0 when the cache is on another filesystem than instances_path (it
    takes nothing from DISK_GB then) or cannot be read (not created yet)."""
    cache = os.path.join(instances_path, subdirectory)
    try:
        if os.stat(instances_path).st_dev != os.stat(cache).st_dev:
            return 0
        total = 0
        with os.scandir(cache) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=True):
                    total += entry.stat().st_blocks * 512
        return total
    except OSError:
        return 0


def memory_mb(
    topology: SysfsTopology, real_host: bool, libvirt_mb: Optional[int] = None
) -> tuple[int, list[str]]:
    """Host memory in MiB.

    On the real host with libvirt, libvirt's virNodeGetInfo figure
    (``libvirt_mb``), as nova reports it: otherwise the agent and
    nova-compute publish two totals for one host. Without libvirt, the
    kernel's MemTotal (/proc/meminfo, via psutil); the per-node sums only
    split it. On a fixture root, psutil knows nothing of the fixture, so
    the node sums are used, and psutil only when the tree has no node
    meminfo.
    """
    nodes_mb = topology.memory_kb // 1024 if topology.memory_kb else None
    if nodes_mb is not None and not real_host:
        return nodes_mb, []

    total_mb = psutil.virtual_memory().total // (1024 * 1024)
    if libvirt_mb is not None and libvirt_mb > total_mb:
        # Never more than the kernel has: nova would publish it, the agent
        # does not (a guest placed on memory that is not there fails).
        return total_mb, [
            f"libvirt reports {libvirt_mb} MiB of memory (virNodeGetInfo) but the "
            f"kernel's MemTotal is {total_mb} MiB; reporting the kernel's figure, "
            "nova-compute would report libvirt's."
        ]
    if libvirt_mb is not None:
        if abs(libvirt_mb - total_mb) > total_mb // 10:
            return libvirt_mb, [
                f"libvirt reports {libvirt_mb} MiB of memory (virNodeGetInfo: the "
                f"NUMA nodes' MemTotal) but the kernel's MemTotal is {total_mb} MiB; "
                "reporting libvirt's figure, as nova-compute does."
            ]
        return libvirt_mb, []
    if nodes_mb is not None and abs(nodes_mb - total_mb) > total_mb // 10:
        return total_mb, [
            f"NUMA node meminfo sums to {nodes_mb} MiB but the kernel's "
            f"MemTotal is {total_mb} MiB; reporting MemTotal."
        ]
    return total_mb, []


def _read_devices(settings: Settings):
    """GPUs and SR-IOV PFs, read only when an option asks for them."""
    if not settings.enabled_mdev_types and not settings.pci_device_specs:
        return (), ()
    return read_pci(SysFS(settings.sysfs_root))


def discover(settings: Settings, hypervisor=None) -> HostSnapshot:
    """Read the host once. Raises DiscoveryError when a required source fails.

    ``hypervisor``: a long-lived :class:`~node_agent.host.hypervisor.Hypervisor`
    (the service keeps one connection); it is closed on a failed read, so the
    next cycle reconnects. Without one, a connection is opened for this read.
    """
    topology = read_topology(SysFS(settings.sysfs_root))
    gpus, sriov_pfs = _read_devices(settings)
    warnings = list(topology.warnings)
    facts: Optional[LibvirtFacts] = None
    real_host = os.path.realpath(settings.sysfs_root) == "/sys"
    libvirt_mb = None
    if settings.libvirt_uri:
        # The libvirt XML parsers (and xml.etree) load only when libvirt is read.
        from node_agent.host.libvirt_facts import read_libvirt, topology_differences

        own = hypervisor is None
        if own:
            # libvirt is loaded only when discovery opens its own connection.
            from node_agent.host.hypervisor import Hypervisor

            hypervisor = Hypervisor(settings.libvirt_uri, settings.domain_capabilities)
        try:
            facts = read_libvirt(hypervisor, settings)
            if real_host and not hypervisor.is_test_driver:
                libvirt_mb = hypervisor.memory_mb_total()
        except DiscoveryError:
            hypervisor.close()
            raise
        finally:
            if own:
                hypervisor.close()
        warnings += topology_differences(topology, facts.cells)
    else:
        warnings.append(
            "[libvirt] connection_uri is empty: no hypervisor, so no guests "
            "and no CPU model; topology comes from sysfs alone."
        )
    cpu_model = facts.cpu_model if facts else HostCpuModel()
    if not cpu_model.arch and real_host:
        import platform

        cpu_model = HostCpuModel(
            platform.machine(), cpu_model.model, cpu_model.vendor, cpu_model.features
        )
    size_gb, disk_warnings = disk_gb(settings.instances_path, settings.images_type)
    total_mb, memory_warnings = memory_mb(topology, real_host, libvirt_mb)
    disk_warnings += memory_warnings
    log_once(warnings + disk_warnings)
    return HostSnapshot(
        hostname=settings.host,
        present=topology.present,
        online=topology.online,
        isolated=topology.isolated,
        cpus=topology.cpus,
        nodes=topology.nodes,
        memory_mb=total_mb,
        disk_gb=size_gb,
        cpu_model=cpu_model,
        page_sizes_kb=facts.page_sizes_kb if facts else (),
        guests=with_mdev_parents(facts.guests if facts else (), gpus),
        warnings=tuple(warnings + disk_warnings),
        gpus=gpus,
        sriov_pfs=sriov_pfs,
        hypervisor=facts.hypervisor_info if facts else None,
        guest_cpu_models=facts.guest_cpu_models if facts else (),
        file_backed_memory_mb=settings.file_backed_memory,
        pci_devices=(
            read_pci_functions(SysFS(settings.sysfs_root))
            if settings.pci_in_placement and settings.pci_device_specs
            else ()
        ),
        pmem_namespaces=(
            read_pmem_namespace_names(SysFS(settings.sysfs_root))
            if settings.pmem_namespaces
            else frozenset()
        ),
        image_cache_bytes=(
            image_cache_bytes(settings.instances_path, settings.image_cache_subdirectory)
            if settings.reserve_disk_for_image_cache
            else 0
        ),
    )
