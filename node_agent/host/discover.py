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
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional

import psutil

from node_agent.errors import ConfigError, CpuExpansionUnsupported, DiscoveryError
from node_agent.host.capabilities import parse_capabilities, parse_cpu_model_xml
from node_agent.host.domain import parse_domain
from node_agent.host.hypervisor_info import hypervisor_info
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
from node_agent.model.snapshot import Guest, HostCpuModel, HostSnapshot
from node_agent.tree.cpu_traits import X86_ARCHES, split_extra_flags

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


class LibvirtFacts:
    """What one libvirt read gives: CPU model, page sizes, guests, cells, the
    static-trait facts and the guest CPU models' features."""

    def __init__(
        self,
        cpu_model=HostCpuModel(),
        page_sizes_kb=(),
        guests=(),
        cells=(),
        hypervisor_info=None,
        guest_cpu_models=(),
    ):
        self.cpu_model = cpu_model
        self.page_sizes_kb = tuple(page_sizes_kb)
        self.guests = tuple(guests)
        self.cells = tuple(cells)
        self.hypervisor_info = hypervisor_info
        self.guest_cpu_models = tuple(guest_cpu_models)


def read_libvirt(hypervisor, settings: Optional[Settings] = None) -> LibvirtFacts:
    caps = parse_capabilities(hypervisor.capabilities_xml())
    guests = [parse_domain(xml, running) for xml, running in hypervisor.domain_xmls()]
    cpu_model = expanded_cpu_model(hypervisor, caps)
    info = models = None
    if settings is not None:
        info = hypervisor_info(hypervisor, caps, settings)
        models = guest_cpu_models(hypervisor, cpu_model, settings)
    return LibvirtFacts(cpu_model, caps.page_sizes_kb, guests, caps.cells, info, models or ())


def read_guests(settings: Settings, hypervisor=None) -> tuple[Guest, ...]:
    """The guests libvirt lists now, read again in the middle of a cycle (a
    reshape that saw a consumer it cannot name); the CPU rules need no more.
    ``hypervisor``: the service's connection, else one is opened."""
    if not settings.libvirt_uri:
        return ()
    own = hypervisor is None
    if own:
        from node_agent.host.hypervisor import Hypervisor

        hypervisor = Hypervisor(settings.libvirt_uri, settings.domain_capabilities)
    try:
        return tuple(parse_domain(xml, running) for xml, running in hypervisor.domain_xmls())
    finally:
        if own:
            hypervisor.close()


# nova's default guest CPU model per architecture for cpu_mode = none
# (nova/virt/libvirt/utils.py get_cpu_model_from_arch).
_DEFAULT_CPU_MODEL = {"i686": "qemu32", "ppc64le": "POWER8", "aarch64": "max"}
# Architectures whose model names nova checks against libvirt's list.
_CHECKED_MODEL_ARCHES = frozenset({"i686", "x86_64", "ppc64", "ppc64le", "ppc"})


def guest_cpu_models(hypervisor, host: HostCpuModel, settings: Settings):
    """``(model, features)`` of the guest CPU models the settings name: the
    ``cpu_models`` of cpu_mode = custom, or the architecture's default for
    cpu_mode = none, expanded with libvirt's cpu_map (baselineCPU), as nova
    does. An unknown model is a ConfigError (exit 78), as in nova."""
    if settings.cpu_mode == "custom":
        names = resolve_cpu_models(hypervisor, host.arch, settings.cpu_models)
        if settings.virt_type == "kvm" and not settings.skip_cpu_compare_at_startup:
            check_cpu_models_run_here(hypervisor, host, names, settings.cpu_model_extra_flags)
    elif settings.cpu_mode == "none":
        names = (_DEFAULT_CPU_MODEL.get(host.arch or "", "qemu64"),)
    else:
        return ()
    if host.arch not in X86_ARCHES:
        return ()  # CPU feature traits are x86's only: nothing to expand
    result = []
    for name in names:
        result.append((name, _model_features(hypervisor, host, name)))
    return tuple(result)


def resolve_cpu_models(hypervisor, arch: Optional[str], models) -> tuple[str, ...]:
    """libvirt's spelling of each configured model (case does not matter)."""
    if arch not in _CHECKED_MODEL_ARCHES:
        return tuple(models)
    known = {name.lower(): name for name in hypervisor.cpu_model_names(arch)}
    unknown = [model for model in models if model.lower() not in known]
    if unknown:
        raise ConfigError(
            f"[libvirt] cpu_models: {', '.join(unknown)} is not a CPU model libvirt "
            f"knows for {arch} (see 'virsh cpu-models {arch}'); nova refuses it too. "
            f"Correct the name."
        )
    return tuple(known[model.lower()] for model in models)


_COMPARED: dict[tuple, Optional[int]] = {}


def check_cpu_models_run_here(hypervisor, host: HostCpuModel, models, flags) -> None:
    """nova refuses to start when a configured model, with the extra flags,
    is not one KVM can give guests on this host (``_check_cpu_compatibility``
    with libvirt's compareHypervisorCPU); so does the agent (exit 78),
    rather than report traits guests cannot have. Asked once per model."""
    if host.arch == "aarch64":
        return  # nova compares the host CPU with itself there
    enabled, disabled = split_extra_flags(flags)
    for model in models:
        key = (hypervisor.uri, model, enabled, disabled)
        if key not in _COMPARED:
            cpu = ET.Element("cpu", match="exact")
            ET.SubElement(cpu, "model").text = model
            for name, policy in [(f, "require") for f in sorted(enabled)] + [
                (f, "disable") for f in sorted(disabled)
            ]:
                ET.SubElement(cpu, "feature", policy=policy, name=name)
            _COMPARED[key] = hypervisor.compare_cpu(ET.tostring(cpu, encoding="unicode"))
        result = _COMPARED[key]
        if result is None and not getattr(hypervisor, "read_write", True):
            log_once(
                [
                    f"[libvirt] cpu_models = {','.join(models)} not checked against "
                    f"this host's CPU: libvirt refuses compareHypervisorCPU on a "
                    f"read-only connection ([libvirt] domain_capabilities = true "
                    f"opens a read-write one)."
                ],
                logging.INFO,
            )
        if result is not None and result <= 0:
            with_flags = f" with cpu_model_extra_flags = {','.join(flags)}" if flags else ""
            raise ConfigError(
                f"[libvirt] cpu_models: {model}{with_flags} is not a CPU KVM can give "
                f"guests on this host (libvirt compareHypervisorCPU: incompatible); "
                f"nova refuses to start too. Choose a model 'virsh domcapabilities' "
                f"lists as usable='yes', or drop the flag."
            )


_MODEL_FEATURES: dict[tuple, frozenset[str]] = {}


def _model_features(hypervisor, host: HostCpuModel, model: str) -> frozenset[str]:
    key = (hypervisor.uri, host.arch, host.vendor, model)
    if key not in _MODEL_FEATURES:
        cpu_xml = cpu_model_xml(host.arch, model, host.vendor)
        try:
            expanded = hypervisor.expand_cpu_features(cpu_xml)
        except CpuExpansionUnsupported as exc:
            # nova's _get_guest_baseline_cpu_features: no features, so no
            # CPU feature traits, and the service runs.
            log_once([f"CPU feature traits of guest CPU model {model} not reported: {exc}"])
            return frozenset()
        _MODEL_FEATURES[key] = parse_cpu_model_xml(expanded).features
    return _MODEL_FEATURES[key]


def cpu_model_xml(arch: Optional[str], model: str, vendor: Optional[str]) -> str:
    """The ``<cpu>`` nova hands baselineCPU for a model: the host's arch and
    vendor, the model, no features."""
    cpu = ET.Element("cpu")
    for tag, text in (("arch", arch), ("model", model), ("vendor", vendor)):
        if text:
            ET.SubElement(cpu, tag).text = text
    return ET.tostring(cpu, encoding="unicode")


_EXPANDED: dict[str, frozenset[str]] = {}


def expanded_cpu_model(hypervisor, caps) -> HostCpuModel:
    """The host CPU with the features its model implies (libvirt's cpu_map).

    The host CPU does not change while the agent runs, so libvirt is asked
    once per distinct CPU description, not every cycle.
    """

    model = caps.cpu_model
    if not (caps.cpu_xml and model.model):
        return model
    if caps.cpu_xml not in _EXPANDED:
        try:
            expanded = parse_cpu_model_xml(hypervisor.expand_cpu_features(caps.cpu_xml))
        except DiscoveryError as exc:
            log_once(
                [
                    f"CPU feature traits limited to the features listed on top of "
                    f"model {model.model}: {exc}"
                ]
            )
            return model
        _EXPANDED[caps.cpu_xml] = expanded.features
    return HostCpuModel(
        model.arch, model.model, model.vendor, model.features | _EXPANDED[caps.cpu_xml]
    )


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
    return [
        f"libvirt reports NUMA cells {sorted(libvirt)} with CPUs that differ from "
        f"sysfs nodes {sorted(kernel)}; using sysfs (the kernel's view)."
    ]


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
    real_host = os.path.realpath(settings.sysfs_root) == "/sys"
    libvirt_mb = None
    if settings.libvirt_uri:
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
    cpu_model = facts.cpu_model
    if not cpu_model.arch and real_host:
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
        page_sizes_kb=facts.page_sizes_kb,
        guests=with_mdev_parents(facts.guests, gpus),
        warnings=tuple(warnings + disk_warnings),
        gpus=gpus,
        sriov_pfs=sriov_pfs,
        hypervisor=facts.hypervisor_info,
        guest_cpu_models=facts.guest_cpu_models,
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
