"""A large synthetic host as a sysfs tree in a directory, for the benchmarks.

The layout is the one node_agent's readers expect (host/sysfs_topology.py
and host/sysfs_pci.py): ``devices/system/cpu``, ``devices/system/node`` and
``bus/pci/devices``. CPU numbering follows what x86 Linux does on a
two-socket SMT machine: the first thread of every core first, then the
sibling threads, so CPU ``c`` and ``c + cores`` share a core.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from node_agent.model.cpuset import CpuSet

NODE_MEMORY_KB = 64 * 1024 * 1024  # 64 GiB per NUMA node
HUGEPAGES_2M = 1024
GPU_VENDOR, GPU_DEVICE = "0x10de", "0x2236"
NIC_VENDOR, NIC_DEVICE, VF_DEVICE = "0x8086", "0x1593", "0x1889"
MDEV_TYPES = (("nvidia-1001", 16), ("nvidia-1002", 8), ("nvidia-1003", 4), ("nvidia-1004", 2))


@dataclass(frozen=True)
class Shape:
    sockets: int = 2
    cores_per_socket: int = 96
    threads: int = 2
    nodes: int = 8
    gpus: int = 16
    mdev_types: int = 4
    pfs: int = 4
    vfs_per_pf: int = 128

    @property
    def cpus(self) -> int:
        return self.sockets * self.cores_per_socket * self.threads

    @property
    def cores(self) -> int:
        return self.sockets * self.cores_per_socket


def scaled(factor: int) -> Shape:
    """1x = 96 CPUs, 2x = 192, 4x = 384 (the full host), devices unchanged."""
    return Shape(cores_per_socket=24 * factor, nodes=2 * factor)


def gpu_address(i: int) -> str:
    return f"0000:{0x10 + i:02x}:00.0"


def pf_address(i: int) -> str:
    return f"0000:{0x60 + i:02x}:00.0"


def vf_address(pf: int, vf: int) -> str:
    return f"0000:{0x60 + pf:02x}:{vf // 8 + 1:02x}.{vf % 8}"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _cpus(root: Path, shape: Shape) -> None:
    cpu_dir = root / "devices/system/cpu"
    last = shape.cpus - 1
    _write(cpu_dir / "present", f"0-{last}\n")
    _write(cpu_dir / "online", f"0-{last}\n")
    _write(cpu_dir / "possible", f"0-{last}\n")
    for cpu in range(shape.cpus):
        core = cpu % shape.cores
        socket, core_id = divmod(core, shape.cores_per_socket)
        siblings = str(CpuSet(core + t * shape.cores for t in range(shape.threads)))
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        if cpu:
            _write(cpu_dir / f"cpu{cpu}" / "online", "1\n")
        _write(topo / "physical_package_id", f"{socket}\n")
        _write(topo / "die_id", "0\n")
        _write(topo / "core_id", f"{core_id}\n")
        _write(topo / "core_cpus_list", f"{siblings}\n")
        _write(topo / "thread_siblings_list", f"{siblings}\n")


def node_cpus(shape: Shape, node: int) -> CpuSet:
    per_node = shape.cores // shape.nodes
    first = node * per_node
    return CpuSet(
        first + core + t * shape.cores for core in range(per_node) for t in range(shape.threads)
    )


def _nodes(root: Path, shape: Shape) -> None:
    node_dir = root / "devices/system/node"
    _write(node_dir / "online", f"0-{shape.nodes - 1}\n")
    per_socket = max(1, shape.nodes // shape.sockets)
    for node in range(shape.nodes):
        base = node_dir / f"node{node}"
        _write(base / "cpulist", f"{node_cpus(shape, node)}\n")
        free = NODE_MEMORY_KB - 2 * 1024 * 1024
        _write(
            base / "meminfo",
            f"Node {node} MemTotal:       {NODE_MEMORY_KB} kB\n"
            f"Node {node} MemFree:        {free} kB\n"
            f"Node {node} HugePages_Total:  {HUGEPAGES_2M}\n"
            f"Node {node} HugePages_Free:   {HUGEPAGES_2M}\n",
        )
        distances = [
            10 if other == node else (12 if other // per_socket == node // per_socket else 32)
            for other in range(shape.nodes)
        ]
        _write(base / "distance", " ".join(map(str, distances)) + "\n")
        pool = base / "hugepages/hugepages-2048kB"
        _write(pool / "nr_hugepages", f"{HUGEPAGES_2M}\n")
        _write(pool / "free_hugepages", f"{HUGEPAGES_2M}\n")


def _device(base: Path, vendor: str, device: str, numa: int) -> None:
    _write(base / "vendor", f"{vendor}\n")
    _write(base / "device", f"{device}\n")
    _write(base / "numa_node", f"{numa}\n")


def _gpus(root: Path, shape: Shape) -> None:
    devices = root / "bus/pci/devices"
    for i in range(shape.gpus):
        base = devices / gpu_address(i)
        _device(base, GPU_VENDOR, GPU_DEVICE, i % shape.nodes)
        for type_id, available in MDEV_TYPES[: shape.mdev_types]:
            mdev = base / "mdev_supported_types" / type_id
            _write(mdev / "available_instances", f"{available}\n")
            _write(mdev / "name", f"GRID {type_id}\n")
            _write(mdev / "device_api", "vfio-pci\n")
            (mdev / "devices").mkdir(parents=True, exist_ok=True)


def _sriov(root: Path, shape: Shape) -> None:
    devices = root / "bus/pci/devices"
    for i in range(shape.pfs):
        base = devices / pf_address(i)
        numa = (i * shape.nodes) // max(1, shape.pfs)
        _device(base, NIC_VENDOR, NIC_DEVICE, numa)
        _write(base / "sriov_totalvfs", f"{shape.vfs_per_pf}\n")
        _write(base / "sriov_numvfs", f"{shape.vfs_per_pf}\n")
        (base / "net" / f"ens{i}f0").mkdir(parents=True, exist_ok=True)
        for vf in range(shape.vfs_per_pf):
            vf_base = devices / vf_address(i, vf)
            _device(vf_base, NIC_VENDOR, VF_DEVICE, numa)
            (vf_base / "physfn").symlink_to(base)


def build(root: Path, shape: Shape = Shape()) -> Path:
    """Write the tree under ``root`` (created); returns ``root``."""
    root = Path(root)
    _cpus(root, shape)
    _nodes(root, shape)
    _gpus(root, shape)
    _sriov(root, shape)
    return root


def device_specs(shape: Shape) -> tuple[str, ...]:
    """``[pci] device_spec`` values: every PF on physnet ``bench``."""
    return tuple(
        f'{{"address": "{pf_address(i)}", "physical_network": "bench"}}' for i in range(shape.pfs)
    )


def pci_in_placement_specs(shape: Shape) -> tuple[str, ...]:
    """``[pci] device_spec`` with ``report_in_placement``: the first half of
    the PFs stay on physnet ``bench`` (SR-IOV children), the VFs of the
    other half become PCI children, one per PF (nova's model)."""
    half = shape.pfs // 2
    physnet = tuple(
        f'{{"address": "{pf_address(i)}", "physical_network": "bench"}}' for i in range(half)
    )
    vendor, vf = NIC_VENDOR[2:], VF_DEVICE[2:]
    return physnet + tuple(
        f'{{"vendor_id": "{vendor}", "product_id": "{vf}", '
        f'"address": "0000:{0x60 + i:02x}:*.*", "traits": "bench_vf"}}'
        for i in range(half, shape.pfs)
    )


def enabled_mdev_types(shape: Shape) -> tuple[str, ...]:
    return tuple(t for t, _ in MDEV_TYPES[: shape.mdev_types][:1])
