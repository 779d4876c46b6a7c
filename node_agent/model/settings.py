"""The frozen settings the pure core receives: plain data, no oslo.config.

:func:`node_agent.config.settings.load_settings` builds it from a parsed
``ConfigOpts``; tests and the decisions (partition, tree) take it as a value.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from node_agent.model.cpuset import CpuSet
from node_agent.model.device_spec import PciDeviceSpec
from node_agent.model.hugepages import ReservedPages


class CycleMode(enum.Enum):
    """How a cycle reaches Placement: the one choice behind ``[agent] mode``
    and ``[agent] upstream`` (their option values stay as they are).
    :func:`node_agent.runner.runner_for` picks the cycle from it."""

    DIRECT = "direct"  # mode = writer, upstream = placement
    VIA_APPLIER = "via_applier"  # mode = writer, upstream = messaging
    COMPANION = "companion"  # mode = companion: reads only

    @classmethod
    def of(cls, mode: str, upstream: str) -> "CycleMode":
        """From the two options' values. Companion wins over messaging:
        validation refuses the pair where the mode is needed, and
        ``--dry-run`` (which does not need it) shows the companion view."""
        if mode == "companion":
            return cls.COMPANION
        return cls.VIA_APPLIER if upstream == "messaging" else cls.DIRECT


@dataclass(frozen=True)
class MdevTypeSettings:
    """One ``[mdev_<type>]`` section of nova's, for a type of
    ``[devices] enabled_mdev_types``."""

    name: str
    # GPUs (PCI addresses) given this type; none: the default type.
    device_addresses: tuple[str, ...] = ()
    # The most mdevs of this type over all GPUs; None: no limit.
    max_instances: Optional[int] = None
    # VGPU, or the CUSTOM_* class the GPUs of device_addresses report.
    mdev_class: str = "VGPU"


@dataclass(frozen=True)
class Settings:
    host: str
    state_path: str
    sysfs_root: str
    libvirt_uri: str
    cpu_dedicated_set: Optional[CpuSet]
    cpu_shared_set: Optional[CpuSet]
    vcpu_pin_set: Optional[CpuSet]
    reserved_host_cpus: int
    reserved_host_memory_mb: int
    reserved_host_disk_mb: int
    cpu_allocation_ratio: float
    ram_allocation_ratio: float
    disk_allocation_ratio: float
    instances_path: str
    pcpu_transition_mode: bool = False
    report_interval: int = 60
    full_verify_interval: int = 300
    startup_splay: int = 30
    interval_jitter: float = 0.1
    retry_max_interval: int = 300
    audit_in_flight_grace: int = 3600
    # Nested providers (numa_tree, pci_tree, provider_config, whole-node mode).
    numa_in_placement: bool = False
    reserved_huge_pages: tuple[ReservedPages, ...] = ()
    provider_config_location: str = "/etc/node-agent/provider_config/"
    enabled_mdev_types: tuple[str, ...] = ()
    # The [mdev_<type>] sections of enabled_mdev_types, in order; empty:
    # every enabled type with its defaults.
    mdev_types: tuple[MdevTypeSettings, ...] = ()
    pci_device_specs: tuple[PciDeviceSpec, ...] = ()
    report_sriov_numvfs: bool = True
    # [pci] report_in_placement (nova's): matched devices become children.
    pci_in_placement: bool = False
    node_resource_class: Optional[str] = None
    # [agent] mode and upstream, as one typed choice.
    cycle_mode: CycleMode = CycleMode.DIRECT
    upstream_timeout: float = 60.0
    upstream_topic: str = "node-agent-applier"
    # Who this machine is (node_agent.policy.root_owner), and whether it may
    # take over a root another writer manages.
    machine_id_path: str = "/etc/machine-id"
    take_over_provider: bool = False
    # [placement] aggregates: uuids the root joins (canonical, sorted).
    placement_aggregates: tuple[str, ...] = ()
    # [compute] shared_storage_aggregate: instances_path is shared by the
    # hosts of this aggregate (uuid); None: the filesystem is this host's.
    shared_storage_aggregate: Optional[str] = None
    upstream_key_file: str = ""
    # [libvirt] cpu_power_management: dedicated CPUs may be offline.
    cpu_power_management: bool = False
    # [libvirt] guest CPU (nova's): the CPU feature traits follow it.
    cpu_mode: Optional[str] = None
    cpu_models: tuple[str, ...] = ()
    cpu_model_extra_flags: tuple[str, ...] = ()
    # [libvirt] static hypervisor traits (tree/hypervisor_traits.py).
    virt_type: str = "kvm"
    swtpm_enabled: bool = False
    supported_tpm_secret_security: tuple[str, ...] = ("user", "host", "deployment")
    domain_capabilities: bool = False
    # [libvirt] num_memory_encrypted_guests: caps each memory-encryption total.
    num_memory_encrypted_guests: Optional[int] = None
    # [libvirt] num_intel_tdx_guests (nova's): the TDX guests when the misc
    # cgroup does not say; the lower of the two when it does.
    num_intel_tdx_guests: Optional[int] = None
    # [libvirt] pmem_namespaces (nova's): (label, namespace names), in order.
    pmem_namespaces: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # [libvirt] file_backed_memory (nova's): MEMORY_MB total in MiB, 0 = RAM.
    file_backed_memory: int = 0
    # [workarounds] (nova's): the image cache in DISK_GB reserved; no
    # compareHypervisorCPU of the configured CPU models at start.
    reserve_disk_for_image_cache: bool = False
    skip_cpu_compare_at_startup: bool = False
    # [image_cache] subdirectory_name (nova's), under instances_path.
    image_cache_subdirectory: str = "_base"
    # [libvirt] images_type (nova's): lvm and rbd disks are not in instances_path.
    images_type: str = "default"
    # Capability traits (tree/capability_traits.py), nova's options.
    force_raw_images: bool = True
    image_type_exclude_list: tuple[str, ...] = ()
    # Kinds ("cpu", "ram", "disk") whose *_allocation_ratio is set: those
    # ratios are asserted every cycle; the others are initial_* ratios that
    # apply only when the class is new in Placement (nova's rule).
    explicit_ratios: frozenset[str] = frozenset({"cpu", "ram", "disk"})

    def keeps_placement_ratio(self, kind: str) -> bool:
        """nova's rule: without ``{kind}_allocation_ratio`` the initial ratio
        applies to a new class only; Placement's ratio is kept after that."""
        return kind not in self.explicit_ratios
