"""The agent on the host nova's whole driver saw (area ``whole_driver``).

nova's side (``nova_side.whole_driver``) runs nova 34's ``LibvirtDriver``
on nova's fake libvirt and keeps that fake connection. The agent then runs
on the same host: a sysfs tree written from the fake host's cells
(:func:`write_sysfs`), or for a host of the corpus its own captured tree
(:func:`corpus_sysfs`), the same libvirt answers (:class:`NovaConnection`
hands every libvirt call of the agent's real ``Hypervisor`` gateway to the
fake connection nova used), the same instances filesystem, the same
nova.conf, read by the agent's own config loader as an operator's file is.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Mapping, Optional

import libvirt

from node_agent.config.files import parse_conf, unknown_options
from node_agent.config.settings import load_settings
from node_agent.cycle.desired import desired_from
from node_agent.errors import ConfigError, NodeAgentError
from node_agent.host.discover import discover
from node_agent.host.hypervisor import Hypervisor
from tests.hostdata import copy_tree, follow_placeholder, kernel_cpulist

CAPTURED = Path(__file__).resolve().parents[1] / "data" / "virhostcpu-caps"

ROOT = "fixture"


def _cpulist(ids) -> str:
    return ",".join(str(i) for i in sorted(ids))


def write_sysfs(root: Path, topology: list, memory_mb: int) -> Path:
    """A sysfs root showing the fake host's cells: CPUs with their package,
    core and siblings, nodes with their CPUs and memory. The nodes' MemTotal
    adds up to what libvirt's getInfo tells nova (``memory_mb``)."""
    system = root / "devices" / "system"
    cpu_dir, node_dir = system / "cpu", system / "node"
    cpu_dir.mkdir(parents=True)
    node_dir.mkdir(parents=True)
    every = [cpu["id"] for cell in topology for cpu in cell["cpus"]]
    (cpu_dir / "present").write_text(_cpulist(every) + "\n")
    (cpu_dir / "online").write_text(_cpulist(every) + "\n")
    (node_dir / "online").write_text(_cpulist(c["id"] for c in topology) + "\n")
    left_kb = memory_mb * 1024
    for index, cell in enumerate(topology):
        node = node_dir / f"node{cell['id']}"
        node.mkdir()
        (node / "cpulist").write_text(_cpulist(c["id"] for c in cell["cpus"]) + "\n")
        share = left_kb if index == len(topology) - 1 else memory_mb * 1024 // len(topology)
        left_kb -= share
        (node / "meminfo").write_text(f"Node {cell['id']} MemTotal:  {share} kB\n")
        for cpu in cell["cpus"]:
            topo = cpu_dir / f"cpu{cpu['id']}" / "topology"
            topo.mkdir(parents=True)
            (cpu_dir / f"cpu{cpu['id']}" / "online").write_text("1\n")
            (topo / "physical_package_id").write_text(f"{cpu['socket']}\n")
            (topo / "core_id").write_text(f"{cpu['core']}\n")
            (topo / "thread_siblings_list").write_text(_cpulist(cpu["siblings"]) + "\n")
            (topo / "core_cpus_list").write_text(_cpulist(cpu["siblings"]) + "\n")
    return root


_CPU_DIR = re.compile(r"^cpu(\d+)$")


def _cell_memory_kb(capabilities: str) -> dict[int, int]:
    cells = ET.fromstring(capabilities).findall("host/topology/cells/cell")
    return {int(c.get("id")): int(c.findtext("memory")) for c in cells}


def corpus_libvirt(system_dir: Path, capabilities: Path, with_qemu: bool = False) -> dict:
    """What libvirt answers on a host of the corpus: ``getCapabilities`` is
    the XML libvirt produced from ``system_dir`` (verbatim); ``getCPUMap``
    is the tree's ``cpu/present`` (or its cpuN directories) and
    ``cpu/online``, as virHostCPUGetMap reads them; ``getInfo``'s memory
    (virNodeGetInfo, MiB) is the XML's cells added up, the memory both
    sides see (:func:`corpus_sysfs`). nova reads no other getInfo field
    into its tree; the topology fields are libvirt's fallback (1 node, 1
    socket, a core per online CPU), which nova ignores."""
    xml = capabilities.read_text()
    arch = ET.fromstring(xml).findtext("host/cpu/arch")
    cpu_dir = follow_placeholder(system_dir / "cpu")
    if (cpu_dir / "present").exists():
        present = kernel_cpulist((cpu_dir / "present").read_text())
    else:
        present = [int(m.group(1)) for p in cpu_dir.iterdir() if (m := _CPU_DIR.match(p.name))]
    online = set(kernel_cpulist((cpu_dir / "online").read_text()))
    count = max(present) + 1
    memory_mb = sum(_cell_memory_kb(xml).values()) // 1024
    return {
        "system": str(system_dir),
        "capabilities": xml,
        "arch": arch,
        "cpu_map": [count, [cpu in online for cpu in range(count)], len(online)],
        "info": [arch, memory_mb, len(online), 0, 1, 1, len(online), 1],
        "with_qemu": with_qemu,
        "mocked_cells": True,
    }


def captured_libvirt(name: str) -> dict:
    """What a real libvirtd answered on the sysfs tree ``name`` (a
    virhostcpudata tree, or ``this-machine``: tests/data/realhost/system),
    captured by ``tests/data/virhostcpu-caps/generate.py`` from the same
    copy of the tree the agent reads (:func:`corpus_sysfs`)."""
    answers = json.loads((CAPTURED / "answers.json").read_text())[name]
    # Its <host> as captured; its <guest> elements give way to nova's fake
    # ones (``with_qemu``), the only ones whose domain capabilities the fake
    # connection can answer. They do not depend on the sysfs tree.
    xml = re.sub(r"\s*<guest>.*?</guest>", "", (CAPTURED / f"{name}.xml").read_text(), flags=re.S)
    return {
        "system": str(CAPTURED.parent / answers["tree"]),
        "capabilities": xml,
        "arch": ET.fromstring(xml).findtext("host/cpu/arch"),
        "cpu_map": answers["getCPUMap"]["value"],
        "info": answers["getInfo"]["value"],
        "baseline": answers["baselineCPU"]["value"],
        "with_qemu": True,
        "mocked_cells": False,
    }


def corpus_sysfs(root: Path, corpus: Mapping) -> Path:
    """A sysfs root whose ``devices/system`` is a copy of the corpus tree
    (:func:`tests.hostdata.copy_tree`). When libvirt's test mocked the
    cells' memory ((cell+1) GiB, hostdata README), each NUMA node's
    ``MemTotal`` is set to its cell's memory in the capabilities XML: on a
    real host libvirt takes a cell's memory from that very file, so both
    sides see one figure. Nothing else of the tree changes."""
    system = copy_tree(Path(corpus["system"]), root / "devices" / "system")
    if not corpus["mocked_cells"]:
        return root
    for cell, kb in _cell_memory_kb(corpus["capabilities"]).items():
        meminfo = system / "node" / f"node{cell}" / "meminfo"
        old = meminfo.read_text().splitlines() if meminfo.exists() else []
        kept = [line for line in old if " MemTotal:" not in line]
        meminfo.write_text("\n".join([f"Node {cell} MemTotal:  {kb} kB", *kept]) + "\n")
    return root


def write_pci(root: Path, device_xmls: list) -> None:
    """``bus/pci/devices/<address>/`` for the fake host's PCI node devices:
    ids, NUMA node, SR-IOV counts of a PF (its VFs are all enabled) and the
    mdev types a GPU offers with their available instances."""
    import xml.etree.ElementTree as ET

    for xml in device_xmls:
        cap = ET.fromstring(xml).find("capability[@type='pci']")
        if cap is None:
            continue
        numbers = [int(cap.findtext(tag, "0"), 0) for tag in ("domain", "bus", "slot", "function")]
        address = "{:04x}:{:02x}:{:02x}.{:x}".format(*numbers)
        base = root / "bus" / "pci" / "devices" / address
        base.mkdir(parents=True)
        (base / "vendor").write_text(f"{cap.find('vendor').get('id')}\n")
        (base / "device").write_text(f"{cap.find('product').get('id')}\n")
        numa = cap.find("numa")
        (base / "numa_node").write_text(f"{numa.get('node') if numa is not None else -1}\n")
        vfs = cap.find("capability[@type='virt_functions']")
        if vfs is not None:
            count = len(vfs.findall("address"))
            (base / "sriov_totalvfs").write_text(f"{vfs.get('maxCount') or count}\n")
            (base / "sriov_numvfs").write_text(f"{count}\n")
        for mdev_type in cap.findall("capability[@type='mdev_types']/type"):
            where = base / "mdev_supported_types" / mdev_type.get("id")
            (where / "devices").mkdir(parents=True)
            (where / "available_instances").write_text(
                mdev_type.findtext("availableInstances", "0") + "\n"
            )
            (where / "name").write_text(mdev_type.findtext("name", "") + "\n")
            (where / "device_api").write_text(mdev_type.findtext("deviceAPI", "") + "\n")


def _libvirt_error(code: int, message: str) -> libvirt.libvirtError:
    exc = libvirt.libvirtError(message)
    exc.err = (code, 0, message, 1, None, None, None, 0, 0)
    return exc


class _NodeDevice:
    def __init__(self, conn: "NovaConnection", name: str):
        self._conn, self._name = conn, name

    def XMLDesc(self, _flags: int = 0) -> str:
        return self._conn.ask("nodeDeviceXMLDesc", self._name)


class _Domain:
    def __init__(self, xml: str, active: bool):
        self._xml, self._active = xml, active

    def XMLDesc(self, _flags: int = 0) -> str:
        return self._xml

    def isActive(self) -> bool:
        return self._active


class NovaConnection:
    """A ``virConnect`` whose every answer is the fake libvirt's nova used."""

    def __init__(self, nova, host: str):
        self._nova, self._host = nova, host

    def ask(self, method: str, *args):
        answer = self._nova.call("libvirt_call", host=self._host, method=method, args=list(args))
        if "libvirt_error" in answer:
            raise _libvirt_error(*answer["libvirt_error"])
        return answer["value"]

    def getCapabilities(self):
        return self.ask("getCapabilities")

    def baselineCPU(self, xmls, flags):
        return self.ask("baselineCPU", xmls, flags)

    def getCPUModelNames(self, arch, flags):
        return self.ask("getCPUModelNames", arch)

    def compareHypervisorCPU(self, *args):
        return self.ask("compareHypervisorCPU", *args)

    def getLibVersion(self):
        return self.ask("getLibVersion")

    def getVersion(self):
        return self.ask("getVersion")

    def getType(self):
        return self.ask("getType")

    def getHostname(self):
        return self.ask("getHostname")

    def getDomainCapabilities(self, *args):
        return self.ask("getDomainCapabilities", *args)

    def listAllDomains(self, flags=0):
        return [_Domain(xml, active) for xml, active in self.ask("listAllDomains", flags)]

    def listDevices(self, cap, flags):
        return self.ask("listDevices", cap, flags)

    def nodeDeviceLookupByName(self, name):
        return _NodeDevice(self, name)

    def isAlive(self):
        return True

    def close(self):
        return 0


def _value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def nova_conf_text(conf: Mapping[str, Mapping], instances_path: str) -> str:
    """The case's nova.conf, as an operator's file."""
    sections = {"DEFAULT": {"instances_path": instances_path}}
    for group, values in conf.items():
        sections.setdefault(group, {}).update(values)
    lines = []
    for group, values in sections.items():
        lines.append(f"[{group}]")
        for name, value in values.items():
            if isinstance(value, list) and group == "pci":
                lines += [f"{name} = {v}" for v in value]
            else:
                lines.append(f"{name} = {_value(value)}")
    return "\n".join(lines) + "\n"


def agent_tree(nova, case: Mapping, nova_answer: Mapping, work: Path) -> dict:
    """The agent's answer on the same host: ``{"value": {providers,
    warnings}}`` or ``{"refused": "ErrorClass(exit N): message"}``."""
    if "corpus" in case:
        sysfs = corpus_sysfs(work / "sys", case["corpus"])
    else:
        sysfs = write_sysfs(work / "sys", nova_answer["topology"], nova_answer["memory_kb"])
    connection = NovaConnection(nova, case["name"])
    write_pci(
        sysfs, [connection.ask("nodeDeviceXMLDesc", n) for n in connection.listDevices("pci", 0)]
    )
    for index, name in enumerate(case.get("pmem", ())):
        namespace = sysfs / "bus" / "nd" / "devices" / f"namespace0.{index}"
        namespace.mkdir(parents=True)
        (namespace / "alt_name").write_text(name + "\n")
    nova_conf = work / "nova.conf"
    nova_conf.write_text(nova_conf_text(case["conf"], case["instances_path"]))
    agent_conf = work / "node-agent.conf"
    agent_conf.write_text(
        f"[DEFAULT]\nhost = {ROOT}\n[host]\nsysfs_root = {sysfs}\n"
        f"[libvirt]\nconnection_uri = qemu:///system\ndomain_capabilities = true\n"
        f"[agent]\nstate_path = {work / 'state'}\n"
    )
    hypervisor = Hypervisor("qemu:///system", read_write=True)
    hypervisor._conn = connection  # type: ignore[assignment]
    try:
        conf = parse_conf(["--config-file", str(nova_conf), "--config-file", str(agent_conf)])
        problems = unknown_options(conf)
        if problems:
            raise ConfigError(problems)
        settings = load_settings(conf)
        desired = desired_from(settings, discover(settings, hypervisor))
    except NodeAgentError as exc:
        return {"refused": f"{type(exc).__name__}(exit {exc.exit_code}): {exc}"}
    providers = []
    for p in desired.tree.providers:
        providers.append(
            {
                "name": p.name,
                "parent": p.parent,
                "inventories": {rc: _inventory(inv) for rc, inv in p.inventories.items()},
                "traits": sorted(t for t, on in p.traits.items() if on),
            }
        )
    return {"value": {"providers": providers, "warnings": list(desired.warnings)}}


def _inventory(inv) -> dict:
    return {
        "total": inv.total,
        "reserved": inv.reserved,
        "min_unit": inv.min_unit,
        "max_unit": inv.max_unit if inv.max_unit is not None else inv.total,
        "step_size": inv.step_size,
        "allocation_ratio": inv.allocation_ratio,
    }


def provider(answer: Mapping, name: str) -> Optional[Mapping]:
    for p in answer["providers"]:
        if p["name"] == name:
            return p
    return None
