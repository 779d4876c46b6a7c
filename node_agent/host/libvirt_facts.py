"""What discovery reads from libvirt: the host CPU model, page sizes,
NUMA cells, guests, the facts nova's static traits depend on and the guest
CPU models' features, through a :class:`~node_agent.host.hypervisor.Hypervisor`.

Loaded by :func:`node_agent.host.discover.discover` only when ``[libvirt]
connection_uri`` is set: a dry run on sysfs alone never pays for the XML
parsers (tests/cli/test_start_cost.py).
"""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from typing import Optional

from node_agent.errors import ConfigError, CpuExpansionUnsupported, DiscoveryError
from node_agent.host.capabilities import parse_capabilities, parse_cpu_model_xml
from node_agent.host.domain import parse_domain
from node_agent.host.hypervisor_info import hypervisor_info
from node_agent.host.sysfs_topology import SysfsTopology
from node_agent.host.warn_once import log_once
from node_agent.model.settings import Settings
from node_agent.model.snapshot import Guest, HostCpuModel
from node_agent.tree.cpu_traits import X86_ARCHES, split_extra_flags


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
