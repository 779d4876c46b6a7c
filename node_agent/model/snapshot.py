"""The host as discovered: one immutable snapshot, built by discovery, read by the core.

Nothing here reads the world. Discovery fills these records; the CPU policy
and the tree builder only read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from node_agent.model.cpuset import CpuSet


@dataclass(frozen=True)
class Cpu:
    """One logical CPU. Topology ids are None when the kernel hides them
    (offline CPUs have no ``topology/`` directory)."""

    id: int
    online: bool
    package_id: Optional[int] = None
    die_id: Optional[int] = None
    core_id: Optional[int] = None
    # SMT siblings including this CPU itself; a lone CPU lists only itself.
    siblings: CpuSet = field(default_factory=CpuSet)
    node_id: Optional[int] = None


@dataclass(frozen=True)
class HugePagePool:
    size_kb: int
    total: int
    free: int


@dataclass(frozen=True)
class NumaNode:
    id: int
    # Present CPUs of this node (the kernel's cpulist can name absent ones).
    cpus: CpuSet
    memory_kb: Optional[int]  # MemTotal from node meminfo, None if unreadable
    hugepages: tuple[HugePagePool, ...] = ()
    # NUMA distances to other nodes, by node id.
    distances: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class HostCpuModel:
    """libvirt's view of the host CPU (capabilities ``<host><cpu>``)."""

    arch: Optional[str] = None
    model: Optional[str] = None
    vendor: Optional[str] = None
    features: frozenset[str] = frozenset()


@dataclass(frozen=True)
class DomainCaps:
    """What nova's traits read from one ``virConnectGetDomainCapabilities``
    answer (one emulator, architecture and machine type)."""

    arch: str
    machine: Optional[str] = None
    disk_buses: frozenset[str] = frozenset()
    video_models: frozenset[str] = frozenset()
    tpm_supported: bool = False
    tpm_models: tuple[str, ...] = ()
    tpm_backend_models: tuple[str, ...] = ()
    # None: libvirt older than 8.6 does not list backend versions.
    tpm_versions: Optional[tuple[str, ...]] = None
    sev_supported: bool = False
    # <sev><maxGuests>/<maxESGuests>: the SEV and SEV-ES guests the firmware
    # has keys for; None when libvirt does not say (before 8.0).
    sev_max_guests: Optional[int] = None
    sev_max_es_guests: Optional[int] = None
    # <launchSecurity supported='yes'> sectypes (sev, sev-snp, tdx, s390-pv).
    launch_security: frozenset[str] = frozenset()
    # <features><tdx supported='yes'/>: Intel TDX, as nova reads it.
    tdx_supported: bool = False
    # <os><loader><enum name='secure'> offers 'yes': UEFI secure boot.
    secure_boot: bool = False


@dataclass(frozen=True)
class HypervisorInfo:
    """The hypervisor facts the static traits need.

    ``domain_caps`` is None when they were not read (the read-only
    connection is refused them), so the traits they decide are left alone.
    Versions are ``(major, minor, micro)``.
    """

    libvirt_version: Optional[tuple[int, int, int]] = None
    qemu_version: Optional[tuple[int, int, int]] = None
    domain_caps: Optional[tuple[DomainCaps, ...]] = None
    # kvm_amd's module parameters that are on, of ``sev``, ``sev_es`` and
    # ``sev_snp`` (/sys/module/kvm_amd/parameters): the kernel's half of
    # memory encryption, as nova's ``Host._kernel_supports_amd_sev`` reads it.
    kvm_amd: frozenset[str] = frozenset()
    # The kernel misc cgroup's ``tdx`` capacity (/sys/fs/cgroup/misc.capacity):
    # the TDX guests the host has keys for; None when the file or its line
    # is missing or unreadable (nova then needs [libvirt] num_intel_tdx_guests).
    tdx_capacity: Optional[int] = None
    # virConnectGetType: "QEMU" for qemu:///system (nova checks it for the
    # address-space traits); None when not read.
    hv_type: Optional[str] = None


@dataclass(frozen=True)
class GuestMdev:
    uuid: str
    # PCI address of the parent GPU when known, as ``0000:00:02.0``.
    parent: Optional[str] = None


@dataclass(frozen=True)
class Guest:
    """A libvirt domain, as far as resource accounting needs it."""

    uuid: str
    name: str
    vcpus: int
    running: bool
    memory_kb: int
    # vCPU number -> host CPUs it may run on, from <cputune><vcpupin>.
    vcpupin: tuple[tuple[int, CpuSet], ...] = ()
    # Host NUMA nodes from <numatune><memory nodeset=...>.
    numa_nodes: frozenset[int] = frozenset()
    hugepages: bool = False
    mdevs: tuple[GuestMdev, ...] = ()
    # Host PCI functions passed through (<hostdev mode='subsystem'
    # type='pci'>), as ``0000:81:00.1``, sorted.
    pci_devices: tuple[str, ...] = ()
    # nova-style metadata: flavor extra specs, image properties, the owner,
    # the instance name (keys: host/domain.py; read by policy/guest_cpu.py).
    metadata: tuple[tuple[str, str], ...] = ()

    @property
    def pinned_cpus(self) -> CpuSet:
        cpus = CpuSet()
        for _vcpu, host in self.vcpupin:
            cpus = cpus | host
        return cpus


@dataclass(frozen=True)
class MdevTypeInfo:
    """One mdev type a PCI device offers, from sysfs ``mdev_supported_types/<id>``."""

    id: str
    available_instances: int
    name: Optional[str] = None
    device_api: Optional[str] = None
    # uuids of the mdevs of this type already created on the device.
    mdevs: tuple[str, ...] = ()


@dataclass(frozen=True)
class PciGpu:
    """A PCI device that offers mdev types (a vGPU-capable GPU)."""

    address: str  # 0000:81:00.0
    mdev_types: tuple[MdevTypeInfo, ...]
    numa_node: Optional[int] = None  # None: the kernel reports no affinity
    vendor_id: Optional[str] = None
    product_id: Optional[str] = None


@dataclass(frozen=True)
class SriovPf:
    """An SR-IOV physical function."""

    address: str
    total_vfs: int
    num_vfs: int
    numa_node: Optional[int] = None
    vendor_id: Optional[str] = None
    product_id: Optional[str] = None
    # Network interface names of the PF (``net/``), empty for non-NICs.
    netdevs: tuple[str, ...] = ()


# nova's PCI device types (nova.objects.fields.PciDeviceType).
PCI_STANDARD, PCI_PF, PCI_VF = "type-PCI", "type-PF", "type-VF"


@dataclass(frozen=True)
class PciDevice:
    """A PCI function, typed as nova types it: a PF has ``sriov_totalvfs``
    (libvirt's ``virt_functions`` capability), a VF a ``physfn`` (its PF's
    address is ``parent_addr``), any other is standard."""

    address: str
    vendor_id: str
    product_id: str
    dev_type: str = PCI_STANDARD
    parent_addr: Optional[str] = None
    numa_node: Optional[int] = None


@dataclass(frozen=True)
class HostSnapshot:
    """Everything one discovery cycle learnt about the host."""

    hostname: str
    present: CpuSet
    online: CpuSet
    isolated: CpuSet
    cpus: tuple[Cpu, ...]
    # Empty when the host has no ``node/`` directory (non-NUMA).
    nodes: tuple[NumaNode, ...]
    memory_mb: int
    disk_gb: int
    cpu_model: HostCpuModel = HostCpuModel()
    page_sizes_kb: tuple[int, ...] = ()
    guests: tuple[Guest, ...] = ()
    # Non-fatal findings a person should see (sysfs vs libvirt disagreement...).
    warnings: tuple[str, ...] = ()
    gpus: tuple[PciGpu, ...] = ()
    sriov_pfs: tuple[SriovPf, ...] = ()
    # None without libvirt: the static hypervisor traits are then left alone.
    hypervisor: Optional[HypervisorInfo] = None
    # [libvirt] cpu_models (or cpu_mode = none's default model) with the
    # features libvirt's cpu_map gives each: (model, features), in order.
    guest_cpu_models: tuple[tuple[str, frozenset[str]], ...] = ()
    # Bytes the image cache occupies on instances_path's filesystem, read
    # only with [workarounds] reserve_disk_resource_for_image_cache.
    image_cache_bytes: int = 0
    # [libvirt] file_backed_memory (MiB): guest memory lives in files of
    # this size in all, not in RAM; 0 when guests use RAM.
    file_backed_memory_mb: int = 0
    # Names of the host's persistent-memory namespaces (sysfs alt_name),
    # read only with [libvirt] pmem_namespaces.
    pmem_namespaces: frozenset[str] = frozenset()
    # Every PCI function, read only with [pci] report_in_placement.
    pci_devices: tuple[PciDevice, ...] = ()

    def node_of(self, cpu_id: int) -> Optional[int]:
        for node in self.nodes:
            if cpu_id in node.cpus:
                return node.id
        return None

    @property
    def has_smt(self) -> bool:
        """True when any online CPU has an online sibling."""
        for cpu in self.cpus:
            if cpu.online and len(cpu.siblings & self.online) > 1:
                return True
        return False
