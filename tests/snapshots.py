"""Host snapshots and settings built from real fixture trees, for pure-core tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from node_agent.config.settings import Settings
from node_agent.host.sysfs import SysFS
from node_agent.host.sysfs_topology import read_topology
from node_agent.model.snapshot import HostCpuModel, HostSnapshot
from tests.hostdata import HOSTDATA, sysfs_root_for
from tests.machine_id import machine_id_file_of_host


def snapshot(
    tree: str, tmp_path: Path, memory_mb: int = 65536, disk_gb: int = 500, **changes
) -> HostSnapshot:
    """A HostSnapshot of the fixture tree ``tree`` (relative to hostdata)."""
    system = HOSTDATA / tree
    topo = read_topology(SysFS(str(sysfs_root_for(system, tmp_path))))
    host = HostSnapshot(
        hostname="fixture",
        present=topo.present,
        online=topo.online,
        isolated=topo.isolated,
        cpus=topo.cpus,
        nodes=topo.nodes,
        memory_mb=(topo.memory_kb // 1024) if topo.memory_kb else memory_mb,
        disk_gb=disk_gb,
        cpu_model=HostCpuModel(arch="x86_64"),
        warnings=topo.warnings,
    )
    return dataclasses.replace(host, **changes)


def settings(**overrides) -> Settings:
    values = dict(
        host="fixture",
        state_path="/nonexistent",
        sysfs_root="/nonexistent",
        libvirt_uri="",
        cpu_dedicated_set=None,
        cpu_shared_set=None,
        vcpu_pin_set=None,
        reserved_host_cpus=0,
        reserved_host_memory_mb=512,
        reserved_host_disk_mb=0,
        cpu_allocation_ratio=4.0,
        ram_allocation_ratio=1.0,
        disk_allocation_ratio=1.0,
        instances_path="/nonexistent",
    )
    values.update(overrides)
    values.setdefault("machine_id_path", str(machine_id_file_of_host(values["host"])))
    return Settings(**values)


def bare_host(pci_devices=()) -> HostSnapshot:
    """A host with no CPUs or NUMA nodes, only the given PCI devices."""
    from node_agent.model.cpuset import CpuSet

    return HostSnapshot(
        hostname="compute1",
        present=CpuSet(),
        online=CpuSet(),
        isolated=CpuSet(),
        cpus=(),
        nodes=(),
        memory_mb=1024,
        disk_gb=10,
        pci_devices=tuple(pci_devices),
    )
