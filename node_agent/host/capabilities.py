"""Parse libvirt's capabilities XML and standalone host-model ``<cpu>`` XML.

Pure: text in, frozen records out. Only the parts the agent uses are read:
the host CPU model, the page sizes the host supports, and a light NUMA
topology to cross-check what sysfs says.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Optional

from node_agent.errors import ParseError
from node_agent.host.libvirt_xml import cpulist, load, optional_int, text_of, to_int, to_kib
from node_agent.model.cpuset import CpuSet
from node_agent.model.snapshot import HostCpuModel

# Feature policies meaning "the CPU has it" (libvirt formatdomain, <cpu>
# <feature policy=...>): a host-model file lists them with require, or with
# no policy at all as in capabilities; disable and forbid mean absent.
_PRESENT_POLICIES = frozenset({None, "require", "force"})


@dataclass(frozen=True)
class CapsCpu:
    """One ``<cpu>`` of a cell. Old libvirt writes only the id, so the
    topology fields are None when absent."""

    id: int
    socket_id: Optional[int] = None
    die_id: Optional[int] = None
    core_id: Optional[int] = None
    siblings: Optional[CpuSet] = None


@dataclass(frozen=True)
class CapsCell:
    id: int
    cpus: tuple[CapsCpu, ...] = ()
    memory_kb: Optional[int] = None
    # (page size KiB, page count); empty when the cell lists no <pages>.
    pages: tuple[tuple[int, int], ...] = ()

    @property
    def cpu_ids(self) -> CpuSet:
        return CpuSet(cpu.id for cpu in self.cpus)


@dataclass(frozen=True)
class CapsGuestDomain:
    """One way to run guests of an architecture: a domain type (``qemu``,
    ``kvm``), its emulator and its machine-type aliases (``pc`` ->
    ``pc-i440fx-8.2``)."""

    type: str
    emulator: Optional[str] = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class CapsGuest:
    """A ``<guest>`` of the capabilities: an architecture the host can run.

    ``default`` is the domain described by the ``<arch>``'s own children;
    ``domains`` also holds the types with children of their own (libvirt
    writes ``<domain type='kvm'>`` with its emulator and machines inside).
    """

    arch: str
    default: CapsGuestDomain
    domains: tuple[CapsGuestDomain, ...] = ()

    def domain(self, virt_type: str) -> CapsGuestDomain:
        for domain in self.domains:
            if domain.type == virt_type:
                return domain
        return self.default


@dataclass(frozen=True)
class Capabilities:
    cpu_model: HostCpuModel
    # From <host><cpu><pages>: sizes the host can back guests with, ascending.
    page_sizes_kb: tuple[int, ...]
    # Empty when libvirt reports no <topology> (non-NUMA or test driver).
    cells: tuple[CapsCell, ...]
    # The <host><cpu> element as text, for libvirt's baselineCPU expansion.
    cpu_xml: Optional[str] = None
    guests: tuple[CapsGuest, ...] = ()


def parse_capabilities(xml: str) -> Capabilities:
    """Parse ``virConnectGetCapabilities`` output; raises ParseError."""
    root = load(xml, "capabilities", "capabilities XML")
    host = root.find("host")
    if host is None:
        return Capabilities(HostCpuModel(), (), ())
    cpu = host.find("cpu")
    cpu_model = _cpu_model(cpu, "capabilities <host><cpu>") if cpu is not None else HostCpuModel()
    page_sizes = _page_sizes(cpu) if cpu is not None else ()
    cells = tuple(_cell(cell) for cell in host.findall("topology/cells/cell"))
    cpu_xml = ET.tostring(cpu, encoding="unicode") if cpu is not None else None
    guests = tuple(guest for guest in map(_guest, root.findall("guest")) if guest)
    return Capabilities(cpu_model, page_sizes, cells, cpu_xml, guests)


def _guest(guest: ET.Element) -> Optional[CapsGuest]:
    arch = guest.find("arch")
    if arch is None or not arch.get("name"):
        return None
    default_type = "qemu"
    domains = []
    for domain in arch.findall("domain"):
        if len(domain):
            domains.append(_guest_domain(domain.get("type") or "", domain))
        else:
            default_type = domain.get("type") or default_type
    default = _guest_domain(default_type, arch)
    return CapsGuest(arch.get("name") or "", default, tuple(domains) + (default,))


def _guest_domain(domain_type: str, parent: ET.Element) -> CapsGuestDomain:
    aliases = tuple(
        machine.text.strip()
        for machine in parent.findall("machine")
        if machine.get("canonical") and machine.text
    )
    return CapsGuestDomain(domain_type, text_of(parent, "emulator"), aliases)


def parse_cpu_model_xml(xml: str) -> HostCpuModel:
    """Parse a standalone host-model ``<cpu>`` document (as in cputestdata).

    Features with policy ``require`` or ``force``, or without a policy, are
    present; ``disable``, ``forbid`` and ``optional`` ones are not.
    """
    return _cpu_model(load(xml, "cpu", "CPU model XML"), "CPU model XML")


def _cpu_model(cpu: ET.Element, what: str) -> HostCpuModel:
    features = set()
    for feature in cpu.findall("feature"):
        name = feature.get("name")
        if not name:
            raise ParseError(f"{what}: <feature> without a name")
        if feature.get("policy") in _PRESENT_POLICIES:
            features.add(name)
    return HostCpuModel(
        arch=text_of(cpu, "arch"),
        model=text_of(cpu, "model"),
        vendor=text_of(cpu, "vendor"),
        features=frozenset(features),
    )


def _page_sizes(cpu: ET.Element) -> tuple[int, ...]:
    sizes = {
        to_kib(pages.get("size"), pages.get("unit"), "capabilities <host><cpu><pages size>")
        for pages in cpu.findall("pages")
    }
    return tuple(sorted(sizes))


def _cell(cell: ET.Element) -> CapsCell:
    cell_id = to_int(cell.get("id"), "capabilities <cell id>")
    what = f"capabilities cell {cell_id}"
    memory = cell.find("memory")
    memory_kb = None
    if memory is not None:
        memory_kb = to_kib(memory.text, memory.get("unit"), f"{what} <memory>")
    pages = tuple(
        sorted(
            (
                to_kib(p.get("size"), p.get("unit"), f"{what} <pages size>"),
                to_int(p.text, f"{what} <pages> count"),
            )
            for p in cell.findall("pages")
        )
    )
    cpus = tuple(_caps_cpu(cpu, what) for cpu in cell.findall("cpus/cpu"))
    return CapsCell(id=cell_id, cpus=cpus, memory_kb=memory_kb, pages=pages)


def _caps_cpu(cpu: ET.Element, what: str) -> CapsCpu:
    cpu_id = to_int(cpu.get("id"), f"{what} <cpu id>")
    where = f"{what} cpu {cpu_id}"
    siblings = cpu.get("siblings")
    return CapsCpu(
        id=cpu_id,
        socket_id=optional_int(cpu.get("socket_id"), f"{where} socket_id"),
        die_id=optional_int(cpu.get("die_id"), f"{where} die_id"),
        core_id=optional_int(cpu.get("core_id"), f"{where} core_id"),
        siblings=cpulist(siblings, f"{where} siblings") if siblings is not None else None,
    )
