"""Discovery: read sysfs, libvirt and psutil, return one HostSnapshot.

This is the shell's only entry into the host. sysfs (the kernel) is the
authority on topology; libvirt adds the CPU model, page sizes and guests,
and where the two disagree about topology the kernel wins and the
difference is reported.
"""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path

import psutil

from node_agent.errors import DiscoveryError
from node_agent.host.sysfs_pci import read_pci, with_mdev_parents
from node_agent.model.settings import Settings
from node_agent.host.sysfs import SysFS
from node_agent.host.sysfs_topology import SysfsTopology, read_topology
from node_agent.model.snapshot import HostCpuModel, HostSnapshot

LOG = logging.getLogger(__name__)
GIB = 1024 ** 3


def _existing_ancestor(path: str) -> Path:
    candidate = Path(path).absolute()
    while not candidate.exists() and candidate != candidate.parent:
        candidate = candidate.parent
    return candidate


def disk_gb(instances_path: str) -> tuple[int, list[str]]:
    """Size in whole GiB of the filesystem holding ``instances_path``."""
    where = _existing_ancestor(instances_path)
    warnings = []
    if str(where) != str(Path(instances_path).absolute()):
        warnings.append(f"instances_path '{instances_path}' does not exist; DISK_GB is the "
                        f"size of the filesystem holding '{where}'.")
    try:
        return psutil.disk_usage(str(where)).total // GIB, warnings
    except OSError as exc:
        raise DiscoveryError(f"cannot size the filesystem of '{where}': {exc}") from exc


def memory_mb(topology: SysfsTopology, real_host: bool) -> tuple[int, list[str]]:
    """Host memory in MiB.

    On the real host the kernel's MemTotal (/proc/meminfo, via psutil) is the
    total; the per-node sums only split it. On a fixture root, psutil knows
    nothing of the fixture, so the node sums are used, and psutil only when
    the tree has no node meminfo.
    """
    nodes_mb = topology.memory_kb // 1024 if topology.memory_kb else None
    if nodes_mb is not None and not real_host:
        return nodes_mb, []
    total_mb = psutil.virtual_memory().total // (1024 * 1024)
    if nodes_mb is not None and abs(nodes_mb - total_mb) > total_mb // 10:
        return total_mb, [f"NUMA node meminfo sums to {nodes_mb} MiB but the kernel's "
                          f"MemTotal is {total_mb} MiB; reporting MemTotal."]
    return total_mb, []


_LOGGED: set[str] = set()


def _log_once(warnings: list[str]) -> None:
    """A service runs for months: say each host warning once, not each cycle."""
    for warning in warnings:
        if warning not in _LOGGED:
            _LOGGED.add(warning)
            LOG.warning("%s", warning)


class LibvirtFacts:
    """What one libvirt read gives: CPU model, page sizes, guests, cells."""

    def __init__(self, cpu_model=HostCpuModel(), page_sizes_kb=(), guests=(), cells=()):
        self.cpu_model = cpu_model
        self.page_sizes_kb = tuple(page_sizes_kb)
        self.guests = tuple(guests)
        self.cells = tuple(cells)


def read_libvirt(hypervisor) -> LibvirtFacts:
    from node_agent.host.capabilities import parse_capabilities
    from node_agent.host.domain import parse_domain

    caps = parse_capabilities(hypervisor.capabilities_xml())
    guests = [parse_domain(xml, running) for xml, running in hypervisor.domain_xmls()]
    return LibvirtFacts(expanded_cpu_model(hypervisor, caps), caps.page_sizes_kb,
                        guests, caps.cells)


_EXPANDED: dict[str, frozenset[str]] = {}


def expanded_cpu_model(hypervisor, caps) -> HostCpuModel:
    """The host CPU with the features its model implies (libvirt's cpu_map).

    The host CPU does not change while the agent runs, so libvirt is asked
    once per distinct CPU description, not every cycle.
    """
    from node_agent.host.capabilities import parse_cpu_model_xml

    model = caps.cpu_model
    if not (caps.cpu_xml and model.model):
        return model
    if caps.cpu_xml not in _EXPANDED:
        try:
            expanded = parse_cpu_model_xml(hypervisor.expand_cpu_features(caps.cpu_xml))
        except DiscoveryError as exc:
            _log_once([f"CPU feature traits limited to the features listed on top of "
                       f"model {model.model}: {exc}"])
            return model
        _EXPANDED[caps.cpu_xml] = expanded.features
    return HostCpuModel(model.arch, model.model, model.vendor,
                        model.features | _EXPANDED[caps.cpu_xml])


def topology_differences(topology: SysfsTopology, cells) -> list[str]:
    """Where libvirt's NUMA cells disagree with the kernel's nodes.

    Compares CPU ids: a cell's ``cpus`` are CapsCpu records (with socket,
    core and siblings), its ``cpu_ids`` the set to compare with sysfs.
    """
    if not cells:
        return []
    kernel = {node.id: set(node.cpus) for node in topology.nodes}
    libvirt = {cell.id: set(cell.cpu_ids) for cell in cells}
    if not kernel:
        kernel = {0: set(topology.present)}
    if kernel == libvirt:
        return []
    return [f"libvirt reports NUMA cells {sorted(libvirt)} with CPUs that differ from "
            f"sysfs nodes {sorted(kernel)}; using sysfs (the kernel's view)."]


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
    facts = LibvirtFacts()
    if settings.libvirt_uri:
        own = hypervisor is None
        if own:
            from node_agent.host.hypervisor import Hypervisor
            hypervisor = Hypervisor(settings.libvirt_uri)
        try:
            facts = read_libvirt(hypervisor)
        except DiscoveryError:
            hypervisor.close()
            raise
        finally:
            if own:
                hypervisor.close()
        warnings += topology_differences(topology, facts.cells)
    else:
        warnings.append("[libvirt] connection_uri is empty: no hypervisor, so no guests "
                        "and no CPU model; topology comes from sysfs alone.")
    real_host = os.path.realpath(settings.sysfs_root) == "/sys"
    cpu_model = facts.cpu_model
    if not cpu_model.arch and real_host:
        cpu_model = HostCpuModel(platform.machine(), cpu_model.model,
                                 cpu_model.vendor, cpu_model.features)
    size_gb, disk_warnings = disk_gb(settings.instances_path)
    total_mb, memory_warnings = memory_mb(topology, real_host)
    disk_warnings += memory_warnings
    _log_once(warnings + disk_warnings)
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
        page_sizes_kb=facts.page_sizes_kb,
        guests=with_mdev_parents(facts.guests, gpus),
        warnings=tuple(warnings + disk_warnings),
        gpus=gpus,
        sriov_pfs=sriov_pfs,
    )
