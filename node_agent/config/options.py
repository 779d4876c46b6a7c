"""Every oslo.config option of the agent, registered on a ConfigOpts passed in.

Nothing registers on a global object: callers build a ``cfg.ConfigOpts()``,
call :func:`register_opts`, parse, then turn it once into the frozen
``Settings`` of :mod:`node_agent.config.settings`. ``list_opts`` feeds
oslo-config-generator, which writes ``etc/node-agent.conf.sample``.

Why one module over 400 lines: it is a table, one declaration per option
with its help text, and the sample file and the docs are generated from it
in this order.
"""

from __future__ import annotations

import copy
import socket
from typing import Optional

from oslo_config import cfg

from node_agent import logs
from node_agent.tree.cpu_traits import CPU_MODES

DEFAULT_OPTS = [
    cfg.StrOpt(
        "host",
        default=socket.gethostname(),
        sample_default="<libvirt's hostname>",
        help="Name of this compute node. It names the root resource provider "
        "in Placement, so it must be unique in the cloud and must not "
        "change while instances run here. Unset: libvirt's hostname "
        "(virConnectGetHostname, fully qualified when the resolver knows "
        "the domain) when [libvirt] connection_uri is set, which is how "
        "nova-compute names its compute node and provider (nova uses its "
        "own [DEFAULT] host only for the service); without libvirt, the "
        "machine's hostname. Set, it wins over libvirt's (nova would still "
        "use libvirt's: the agent warns when they differ).",
    ),
    cfg.StrOpt(
        "state_path",
        help="nova's option: nova's own directory (/var/lib/nova). The agent "
        "reads it only as nova does, for the default instances_path "
        "($state_path/instances), and never keeps its state there: that "
        "is [agent] state_path.",
    ),
    cfg.BoolOpt(
        "force_raw_images",
        default=True,
        help="nova's option: nova converts every image to raw. Off with "
        "[libvirt] images_type = lvm or rbd, the host takes raw images "
        "only and COMPUTE_IMAGE_TYPE_QCOW2 is removed, as nova does.",
    ),
]

# nova's legacy options live in [DEFAULT] (nova/conf/compute.py); the agent
# keeps them in [compute]. A nova.conf's [DEFAULT] value applies when the
# same option is not set in [compute]: the agent's own section wins.
NOVA_DEFAULT_OPTS = [
    kind(name, help=f"nova's name for [compute] {name}.", **limits)
    for kind, limits, names in (
        (
            cfg.IntOpt,
            {"min": 0},
            ("reserved_host_memory_mb", "reserved_host_disk_mb", "reserved_host_cpus"),
        ),
        (
            cfg.FloatOpt,
            {"min": 0.0},
            tuple(
                f"{prefix}{kind}_allocation_ratio"
                for prefix in ("", "initial_")
                for kind in ("cpu", "ram", "disk")
            ),
        ),
        (cfg.StrOpt, {}, ("vcpu_pin_set", "instances_path")),
        (cfg.MultiStrOpt, {}, ("reserved_huge_pages",)),
    )
    for name in names
]
NOVA_DEFAULT_NAMES = frozenset(opt.dest for opt in NOVA_DEFAULT_OPTS)

HOST_OPTS = [
    cfg.StrOpt(
        "sysfs_root",
        default="/sys",
        help="Where sysfs is mounted. Every sysfs read goes through this "
        "root; point it at a captured tree to test the agent.",
    ),
]

LIBVIRT_OPTS = [
    cfg.StrOpt(
        "connection_uri",
        default="qemu:///system",
        help="libvirt URI, opened read-only. Leave empty on a host with no "
        "hypervisor: the agent then discovers from sysfs alone and "
        "reports no guests.",
    ),
    cfg.BoolOpt(
        "cpu_power_management",
        default=False,
        help="nova's option: nova powers down idle dedicated CPUs, so CPUs "
        "of cpu_dedicated_set may be offline. They must still be "
        "present, and each counts once in PCPU, online or not.",
    ),
    cfg.StrOpt(
        "virt_type",
        default="kvm",
        choices=("kvm", "qemu"),
        help="nova's option: the domain type guests run with. Decides the "
        "VIF model traits and which domain capabilities are read.",
    ),
    cfg.StrOpt(
        "images_type",
        default="default",
        choices=("raw", "flat", "qcow2", "lvm", "rbd", "ploop", "default"),
        help="nova's option: how nova stores guest disks. With lvm or rbd nova "
        "reports the volume group's or the Ceph pool's size as DISK_GB; "
        "the agent reads neither and reports the size of the filesystem "
        "holding instances_path, with a warning each cycle. Set "
        "[compute] reserved_host_disk_mb (or a provider file) to correct "
        "it.",
    ),
    cfg.StrOpt(
        "cpu_mode",
        choices=CPU_MODES,
        help="nova's option: the guest CPU mode. The CPU feature traits "
        "follow the guest CPU: unset (host-model), host-model and "
        "host-passthrough report the host's features; custom the "
        "features of cpu_models (resolved with libvirt's cpu_map); "
        "none those of the architecture's default model (qemu64).",
    ),
    cfg.ListOpt(
        "cpu_models",
        deprecated_name="cpu_model",
        default=[],
        help="nova's option: the guest CPU models for cpu_mode = custom "
        "(names from 'virsh cpu-models ARCH', any case). Required "
        "with custom, refused with the other modes.",
    ),
    cfg.ListOpt(
        "cpu_model_extra_flags",
        item_type=cfg.types.String(ignore_case=True),
        default=[],
        help="nova's option: CPU flags added ('+flag' or 'flag') or removed "
        "('-flag') for guests, and so for the CPU feature traits, with "
        "every cpu_mode but none.",
    ),
    cfg.BoolOpt(
        "swtpm_enabled",
        default=False,
        help="nova's option: guests may have an emulated TPM. Off, the "
        "COMPUTE_SECURITY_TPM_* traits are removed; on, they follow "
        "the domain capabilities (domain_capabilities = true).",
    ),
    cfg.ListOpt(
        "supported_tpm_secret_security",
        default=["user", "host", "deployment"],
        help="nova's option: TPM secret policies this host supports, "
        "reported as COMPUTE_SECURITY_TPM_SECRET_SECURITY_* with "
        "swtpm_enabled.",
    ),
    cfg.BoolOpt(
        "domain_capabilities",
        default=False,
        help="Read libvirt's domain capabilities for the storage bus, "
        "graphics model, vIOMMU, TPM and COMPUTE_ARCH_* traits. libvirt "
        "refuses them on a read-only connection, so this opens a "
        "read-write one: limit it with a polkit rule (README). Off, "
        "those traits are not reported (one INFO line says so). Also "
        "needed for the MEM_ENCRYPTION_CONTEXT (AMD SEV) child providers.",
    ),
    cfg.IntOpt(
        "num_memory_encrypted_guests",
        min=0,
        help="Older nova's option (nova 34 no longer reads it): the most "
        "guests with encrypted memory (AMD SEV) this host may run. "
        "Caps each <host>_amd_sev* child's MEM_ENCRYPTION_CONTEXT total; "
        "it never raises one above what libvirt reports (maxGuests, "
        "maxESGuests). Unset: libvirt's numbers. 0: no memory "
        "encryption is reported.",
    ),
    cfg.IntOpt(
        "num_intel_tdx_guests",
        min=0,
        help="nova's option: the most guests with Intel TDX this host may "
        "run, for the <host>_intel_tdx child's MEM_ENCRYPTION_CONTEXT "
        "total. TDX is reported only with cpu_mode = host-passthrough, "
        "domain_capabilities on and libvirt saying <tdx supported='yes'>. "
        "The kernel's misc cgroup (misc.capacity, line tdx) gives the "
        "count; this option is needed where that file cannot be read (a "
        "container), and lowers it when set. Unlike nova, a value above "
        "the cgroup's is not published (nova publishes it).",
    ),
]

LIBVIRT_OPTS += [
    cfg.ListOpt(
        "pmem_namespaces",
        default=[],
        help="nova's option: persistent-memory namespaces for guests, as "
        "LABEL:NAME|NAME,... (for example 128G:ns0|ns1,MEDIUM:ns2). Each "
        "label becomes CUSTOM_PMEM_NAMESPACE_<LABEL> on the root, one unit "
        "per namespace, as nova reports it. Every name must be a namespace "
        "of this host (its alt_name in /sys/bus/nd/devices, what "
        "'ndctl list' shows as name), else exit 78 as nova refuses to start.",
    ),
    cfg.IntOpt(
        "file_backed_memory",
        default=0,
        min=0,
        help="nova's option: guest memory is backed by files (in "
        "/etc/libvirt/qemu.conf's memory_backing_dir) of this many MiB in "
        "all, not by RAM. MEMORY_MB's total is then this size, as nova "
        "reports it. 0: guest memory is RAM. As in nova, it needs "
        "virt_type qemu or kvm, ram_allocation_ratio = 1.0 and "
        "reserved_host_memory_mb = 0 (else exit 78). Above 0, "
        "COMPUTE_MEM_BACKING_FILE is reported (removed at 0), as nova does.",
    ),
]

# nova's [workarounds] options that change what nova reports.
WORKAROUNDS_OPTS = [
    cfg.BoolOpt(
        "reserve_disk_resource_for_image_cache",
        default=False,
        help="nova's option: add the disk the image cache (instances_path's "
        "[image_cache] subdirectory_name, _base) occupies, in GiB rounded "
        "up, to DISK_GB's reserved, when the cache is on the filesystem "
        "of instances_path.",
    ),
    cfg.BoolOpt(
        "skip_cpu_compare_at_startup",
        default=False,
        help="nova's option: do not ask libvirt whether the guest CPU models "
        "of [libvirt] cpu_models (with cpu_model_extra_flags) run on this "
        "host; nova then starts on a host that cannot run them, and so "
        "does the agent.",
    ),
]

IMAGE_CACHE_OPTS = [
    cfg.StrOpt(
        "subdirectory_name",
        default="_base",
        help="nova's option: the image cache's directory, under "
        "instances_path unless absolute. Read for "
        "[workarounds] reserve_disk_resource_for_image_cache.",
    ),
]

COMPUTE_OPTS = [
    cfg.ListOpt(
        "image_type_exclude_list",
        default=[],
        help="nova's option: image formats (glance disk_format names) this "
        "host does not offer: their COMPUTE_IMAGE_TYPE_* traits are "
        "removed, as nova does.",
    ),
    cfg.StrOpt(
        "cpu_dedicated_set",
        help="Host CPUs for pinned guests, reported as PCPU. Grammar: a "
        "comma list of N, A-B, ^N, ^A-B (for example '4-15,^8'). Must "
        "not overlap cpu_shared_set; cannot be combined with "
        "vcpu_pin_set or reserved_host_cpus.",
    ),
    cfg.StrOpt(
        "cpu_shared_set",
        help="Host CPUs for floating (unpinned) guests, reported as VCPU. "
        "Same grammar as cpu_dedicated_set. Unset with "
        "cpu_dedicated_set unset: every online CPU is VCPU.",
    ),
    cfg.StrOpt(
        "vcpu_pin_set",
        deprecated_for_removal=True,
        deprecated_reason="Use cpu_shared_set and cpu_dedicated_set.",
        help="Deprecated. Host CPUs for guests, all reported as VCPU. "
        "Cannot be combined with cpu_dedicated_set.",
    ),
    cfg.IntOpt(
        "reserved_host_cpus",
        default=0,
        min=0,
        help="Number of VCPU held back for the host. Only valid when neither "
        "cpu_shared_set nor cpu_dedicated_set is set: with them, leave "
        "host CPUs out of both sets instead.",
    ),
    cfg.IntOpt(
        "reserved_host_memory_mb",
        default=512,
        min=0,
        help="MiB of host memory reported as reserved in MEMORY_MB.",
    ),
    cfg.IntOpt(
        "reserved_host_disk_mb",
        default=0,
        min=0,
        help="MiB of disk reserved for the host; rounded up to whole GiB in DISK_GB.",
    ),
    cfg.FloatOpt(
        "cpu_allocation_ratio", help="VCPU overcommit ratio. Unset: initial_cpu_allocation_ratio."
    ),
    cfg.FloatOpt(
        "ram_allocation_ratio",
        help="MEMORY_MB overcommit ratio. Unset: initial_ram_allocation_ratio.",
    ),
    cfg.FloatOpt(
        "disk_allocation_ratio",
        help="DISK_GB overcommit ratio. Unset: initial_disk_allocation_ratio.",
    ),
    cfg.FloatOpt(
        "initial_cpu_allocation_ratio",
        default=4.0,
        help="VCPU ratio used when cpu_allocation_ratio is unset.",
    ),
    cfg.FloatOpt(
        "initial_ram_allocation_ratio",
        default=1.0,
        help="MEMORY_MB ratio used when ram_allocation_ratio is unset.",
    ),
    cfg.FloatOpt(
        "initial_disk_allocation_ratio",
        default=1.0,
        help="DISK_GB ratio used when disk_allocation_ratio is unset.",
    ),
    cfg.StrOpt(
        "instances_path",
        sample_default="$state_path/instances",
        help="Directory holding guest disks. DISK_GB is the size of the "
        "filesystem that holds it. Unset: nova's [DEFAULT] "
        "instances_path, else instances under nova's [DEFAULT] "
        "state_path (nova's default), else /var/lib/nova/instances.",
    ),
    cfg.StrOpt(
        "shared_storage_aggregate",
        help="UUID of the aggregate of the hosts that share instances_path "
        "(one filesystem mounted by all of them). Set: this host's root "
        "reports no DISK_GB and joins the aggregate, and one sharing "
        "provider shared_storage_<uuid> (trait MISC_SHARES_VIA_AGGREGATE, "
        "member of the aggregate, its uuid derived from the aggregate's so "
        "every host names the same one) holds the filesystem's DISK_GB; "
        "when hosts measure different sizes the smaller is kept. Setting it "
        "moves the DISK_GB allocations of this host's guests to the sharing "
        "provider in one reshape; changing it moves them to the new "
        "aggregate's sharing provider, unsetting it back to the root (the "
        "sharing provider is found in Placement, a lost state file "
        "included). Set the same value on every host of the aggregate. Refused with "
        "[agent] mode = companion (nova writes the root) and upstream = "
        "messaging (the applier does not write a sharing provider).",
    ),
    cfg.BoolOpt(
        "pcpu_transition_mode",
        default=False,
        help="Removed: it reported the same CPUs as both VCPU and PCPU, so "
        "the scheduler could book each CPU twice. Setting it to true is "
        "refused; set cpu_dedicated_set (and cpu_shared_set) instead: "
        "the agent moves pinned guests from VCPU to PCPU in one reshape.",
    ),
    # --- nested providers (numa_tree, provider_config) ---
    cfg.BoolOpt(
        "numa_in_placement",
        default=False,
        help="Report each NUMA node as a child provider <host>_NUMA_<id> "
        "(traits HW_NUMA_ROOT and CUSTOM_NODE_AGENT_CHILD) holding its "
        "PCPU, VCPU, MEMORY_MB and huge pages (CUSTOM_MEMORY_PAGE_<KiB>); "
        "the root keeps DISK_GB. Host reservations are charged to the "
        "lowest node first. Turning it on or off while guests run moves "
        "their allocations in one reshape; turning it off then deletes "
        "the children. Opt-in, per host, as in nova's approved "
        "NUMA-in-Placement spec: Placement takes each resource class of a "
        "request group from one provider and cannot split it over nodes "
        "(no 'can_split'), so on this host a flavor larger than its largest "
        "node finds no candidate that the flat host would have given (on 8 "
        "nodes of 6 CPUs, VCPU:7 and up), and hw:numa_nodes=N flavors need N "
        "nodes that each hold 1/N of them. --dry-run and --check-config "
        "list those stranded flavor shapes for this host. The spec keeps "
        "NUMA-agnostic flavors off such hosts and puts one already there on "
        "a node: turning it on moves each guest with no NUMA placement (no "
        "pins, no numatune) whole to the node with the most room for it, or "
        "splits it over the nodes when none can hold it; one the nodes "
        "together cannot hold refuses NUMA children, naming it, and the "
        "cycle's other changes are written as with this option off. GPU "
        "and SR-IOV PF children "
        "move under the child of the node their device is attached to "
        "(sysfs numa_node), so a same_subtree request can ask for CPUs and "
        "a device of one node.",
    ),
    cfg.MultiStrOpt(
        "reserved_huge_pages",
        default=[],
        help="Huge pages held back for the host, one line per node and size, "
        "in nova's format node:N,size:S,count:C. size is KiB (2048) or "
        "has a unit (2M, 1G). Used with numa_in_placement.",
    ),
    cfg.StrOpt(
        "provider_config_location",
        default="/etc/node-agent/provider_config/",
        help="Directory of *.yaml files in nova's provider.yaml schema 1.0 "
        "adding CUSTOM_ inventories and traits to providers. Re-read "
        "every cycle. A missing directory means no files.",
    ),
]

DEVICES_OPTS = [
    cfg.ListOpt(
        "enabled_mdev_types",
        default=[],
        help="mdev types (as in mdev_supported_types, e.g. nvidia-35) "
        "reported as VGPU, chosen per GPU as nova does: a GPU listed in "
        "a type's [mdev_<type>] device_addresses serves that type, every "
        "other GPU the first listed type without device_addresses. A GPU "
        "serving a type it offers, with mdevs or instances left, becomes "
        "a child <host>_pci_<domain>_<bus>_<slot>_<function>; "
        "[mdev_<type>] max_instances and mdev_class as in nova. Empty: "
        "no VGPU.",
    ),
]

# nova's [mdev_<type>] options, registered for each type of
# [devices] enabled_mdev_types once the files are read.
MDEV_TYPE_OPTS = [
    cfg.ListOpt(
        "device_addresses",
        default=[],
        help="nova's option: the GPUs (PCI addresses) that serve this mdev "
        "type. A type without it is the default for every other GPU; only "
        "the first such type of enabled_mdev_types is used.",
    ),
    cfg.IntOpt(
        "max_instances",
        min=1,
        help="nova's option: the most mdevs of this type over all GPUs. A "
        "GPU whose available instances would pass it gets no provider.",
    ),
    cfg.StrOpt(
        "mdev_class",
        default="VGPU",
        regex=r"^(VGPU|CUSTOM_[A-Z0-9_]+)$",
        max_length=255,
        help="nova's option: the resource class the GPUs of "
        "device_addresses report (VGPU or CUSTOM_*).",
    ),
]


def register_mdev_type_opts(conf: cfg.ConfigOpts, types) -> None:
    """``[mdev_<type>]`` for each enabled type, as nova-compute registers
    them: ``device_addresses`` is also read from the type's older section
    name, ``[vgpu_<type>]``, as nova reads it."""
    for name in types:
        addresses, *rest = MDEV_TYPE_OPTS
        older = copy.copy(addresses)
        older.deprecated_opts = [cfg.DeprecatedOpt("device_addresses", group=f"vgpu_{name}")]
        conf.register_opts([older, *rest], group=f"mdev_{name}")


PCI_OPTS = [
    cfg.MultiStrOpt(
        "device_spec",
        default=[],
        help="One JSON object per line, as nova's: "
        '{"address": "0000:81:00.0", "physical_network": "physnet1"} '
        'or {"devname": "enp129s0f0", "physical_network": "physnet1"}. '
        "address is a glob (each field hex or *, a field left off is any: "
        '"*:81:00.*", "81:00.") or an object of regular expressions '
        '({"bus": "8[12]", "function": "[0-3]"}), read as nova 34 reads them. '
        "SR-IOV PFs matched by a spec with a physical_network become "
        "children <host>_<PF address> with SRIOV_NET_VF and trait "
        "CUSTOM_PHYSNET_<NAME>.",
    ),
    cfg.BoolOpt(
        "report_sriov_numvfs",
        default=True,
        help="Report the VFs enabled now (sriov_numvfs), which guests can "
        "use. False reports the most the PF supports (sriov_totalvfs), "
        "which overstates the host until that many VFs are enabled.",
    ),
    cfg.BoolOpt(
        "report_in_placement",
        default=False,
        help="nova's option: each PCI device matched by a device_spec "
        "without physical_network becomes a child <host>_<ADDRESS> (the "
        "VFs of one PF counted on the PF's child) with CUSTOM_PCI_<VENDOR>_"
        "<PRODUCT> or the spec's resource_class, trait "
        "COMPUTE_MANAGED_PCI_DEVICE plus the spec's traits, "
        "HW_PCI_LIVE_MIGRATABLE (live_migratable) and HW_PCI_ONE_TIME_USE "
        "(one_time_use: reserved = total once allocated). A child whose "
        "device is gone while allocated keeps its usage as total. devname "
        "specs are refused, as nova refuses them.",
    ),
]

NODE_OPTS = [
    cfg.StrOpt(
        "resource_class",
        help="Whole-node (bare-metal) mode: report this host as exactly one "
        "unit of this custom class (for example CUSTOM_BAREMETAL_GOLD) "
        "and no other inventory. Unset: report CPUs, memory and disk.",
    ),
]

AGENT_OPTS = [
    cfg.StrOpt(
        "state_path",
        help="Directory where the agent keeps its state: the root provider "
        "uuid and what it last applied. Must be writable by the service "
        "user. Losing it is safe: the agent adopts its provider by name. "
        "Unset: /var/lib/node-agent. Never nova's [DEFAULT] "
        "state_path.",
    ),
    cfg.IntOpt(
        "report_interval",
        default=60,
        min=1,
        help="Seconds between two cycles of discover-and-sync.",
    ),
    cfg.IntOpt(
        "full_verify_interval",
        default=300,
        min=0,
        help="Seconds between verifications of the tree in Placement, which "
        "catch changes made out of band (a provider deleted, an inventory "
        "edited by hand): one read of the tree, then the providers whose "
        "generation moved. Between them a cycle with no host change sends "
        "nothing. 0 verifies every cycle.",
    ),
    cfg.IntOpt(
        "audit_in_flight_grace",
        default=3600,
        min=0,
        help="Seconds the allocation audit lets an operation in flight (a "
        "consumer of type MIGRATION, or allocations on this host and on "
        "another host's compute providers) before it reports it as an "
        "alarm: a migration still half-way after that long has failed and "
        "left allocations on two hosts. Counted from the agent's own first "
        "sighting (kept in the state file across restarts).",
    ),
    cfg.IntOpt(
        "startup_splay",
        default=30,
        min=0,
        help="The service waits a random 0 to startup_splay seconds before "
        "its first cycle, so a fleet restarted together does not reach "
        "Placement all at once. 0 starts at once.",
    ),
    cfg.FloatOpt(
        "interval_jitter",
        default=0.1,
        min=0,
        max=0.5,
        help="Each wait between cycles is report_interval times a random "
        "factor in 1 +/- interval_jitter, so agents drift apart.",
    ),
    cfg.IntOpt(
        "retry_max_interval",
        default=300,
        min=1,
        help="While Placement or the host cannot be read, the wait between "
        "cycles doubles from report_interval up to this many seconds "
        "(never less than report_interval).",
    ),
    cfg.IntOpt(
        "metrics_port",
        default=0,
        min=0,
        max=65535,
        help="Serve Prometheus metrics over HTTP on this port (metrics_host). 0 serves none.",
    ),
    cfg.StrOpt(
        "metrics_host", default="127.0.0.1", help="Address the metrics endpoint listens on."
    ),
    cfg.StrOpt(
        "mode",
        default="writer",
        choices=[
            ("writer", "node-agent owns this host's provider tree and writes it to Placement"),
            (
                "companion",
                "someone else writes the host's provider "
                "(nova-compute: trait OWNER_NOVA); node-agent only "
                "reads Placement and reports drift, the allocation "
                "audit and what nova-compute will do at its next "
                "restart. It never sends a write and never "
                "creates a provider",
            ),
        ],
        help="Whether the agent writes this host's provider tree or only "
        "watches it. Companion mode reads the same options as nova "
        "(pass nova.conf with --config-file), so its picture of the host "
        "is nova's. It needs [placement] (read access is enough) and "
        "cannot be combined with upstream = messaging.",
    ),
    cfg.StrOpt(
        "upstream",
        default="placement",
        choices=[
            ("placement", "write to Placement directly with the [placement] credentials"),
            (
                "messaging",
                "send the tree over oslo.messaging "
                "([DEFAULT] transport_url) to node-agent-applier, "
                "which holds the Placement credentials",
            ),
        ],
        help="Where the agent sends its provider tree. In messaging mode the "
        "agent needs no [placement] section at all.",
    ),
    cfg.FloatOpt(
        "upstream_timeout",
        default=60,
        min=1,
        help="Messaging mode: seconds to wait for node-agent-applier's answer. "
        "No answer counts as an outage: the agent retries with backoff.",
    ),
    cfg.StrOpt(
        "upstream_topic",
        default="node-agent-applier",
        help="Messaging mode: the RPC topic node-agent-applier listens on (its [applier] topic).",
    ),
    cfg.StrOpt(
        "machine_id_path",
        default="/etc/machine-id",
        help="File holding this machine's id (machine-id(5)). The agent marks "
        "the root provider it manages with a trait derived from it "
        "(CUSTOM_OWNER_NODE_AGENT_<hash>) and refuses to write a root "
        "another machine has marked, so two machines configured with one "
        "host name do not overwrite each other.",
    ),
    cfg.BoolOpt(
        "take_over_provider",
        default=False,
        help="Write this host's root provider even when nova-compute "
        "(OWNER_NOVA) or node-agent on another machine manages it. "
        "Another machine's mark is replaced by this machine's, so one run "
        "with it is enough. OWNER_NOVA is nova's and is never removed: "
        "the option must stay set while the root carries it (remove the "
        "trait by hand once nova-compute is gone for good).",
    ),
    cfg.StrOpt(
        "upstream_key_file",
        help="Messaging mode: the file holding this host's signing key (64 hex "
        "digits, mode 0600, made on the control node with "
        "'node-agent-applier derive-key HOST'). Every message is signed with "
        "it, so no other hypervisor can send in this host's name. Required "
        "with upstream = messaging; a file open to its group or others is "
        "refused.",
    ),
    cfg.StrOpt(
        "metrics_textfile",
        help="Also write the metrics after each cycle to this file, for "
        "node_exporter's textfile collector (a path ending in .prom). "
        "Unset writes none.",
    ),
]

APPLIER_OPTS = [
    cfg.StrOpt(
        "topic",
        default="node-agent-applier",
        help="RPC topic the applier processes share; RabbitMQ hands each "
        "agent message to one of them.",
    ),
    cfg.StrOpt(
        "state_path",
        default="/var/lib/node-agent-applier",
        help="Without coordination_url: the directory every applier process "
        "on this machine shares (per host, the syncer's state, the last "
        "applied sequence number; the locks under locks/). Unused with a "
        "Redis or PostgreSQL coordination_url.",
    ),
    cfg.IntOpt(
        "full_verify_interval",
        default=300,
        min=0,
        help="Seconds between verifications of a host's tree in Placement "
        "(as the agent's own full_verify_interval), made when that host's "
        "heartbeat arrives.",
    ),
    cfg.FloatOpt(
        "lock_timeout",
        default=20,
        min=0,
        help="Seconds a message waits for another process applying the same "
        "host before it is answered 'busy'. With Redis, a killed "
        "applier's locks expire after half of it (see coordination_url).",
    ),
    cfg.IntOpt(
        "dead_after",
        default=600,
        min=0,
        help="Seconds without any message from a host (its agent sends one "
        "every [agent] report_interval, 60 s by default, and at least every "
        "[agent] retry_max_interval while failing) after which the applier "
        "closes it: COMPUTE_STATUS_DISABLED on its root provider, which "
        "nova's scheduler filters out; inventories and allocations are kept. "
        "The host is reopened (that trait removed, only when the applier "
        "added it) when it reports again. Must be above twice lock_timeout. "
        "Counted from the later of the host's last message and the applier's "
        "start. 0 never closes a host.",
    ),
    cfg.StrOpt(
        "coordination_url",
        secret=True,
        help="Where applier processes agree (per-host locks through tooz, and "
        "the per-host records: last sequence number, digest, cache). Unset: "
        "tooz's file driver and files under state_path, for processes on one "
        "machine. redis://[:PASSWORD@]HOST:PORT[?lock_timeout=SECONDS]: locks "
        "and records in Redis, for processes on several machines (nothing "
        "shared on disk); a lock held by a killed process expires after the "
        "URL's lock_timeout, which must be below [applier] lock_timeout "
        "(unset: half of it), so the host's next message applies. "
        "postgresql://USER:PASSWORD@HOST:PORT/DATABASE: advisory locks and "
        "the records in table node_agent_applier_hosts (created when "
        "missing), for processes on several machines; a killed process's "
        "locks end with its connection.",
    ),
    cfg.StrOpt(
        "master_key_file",
        help="The master secret every host's signing key is derived from "
        "(key = HMAC-SHA256(master, host)); at least 32 bytes, e.g. "
        "'openssl rand -hex 32', mode 0600. Required: messages whose "
        "signature does not verify with the sending host's key are refused.",
    ),
    cfg.StrOpt(
        "previous_master_key_file",
        help="Key rotation: the master secret being replaced. Messages signed "
        "with a key derived from it are still accepted until "
        "previous_master_key_until, while the hosts get their new keys.",
    ),
    cfg.StrOpt(
        "previous_master_key_until",
        help="Key rotation: when the overlap of previous_master_key_file ends "
        "(ISO 8601, UTC unless a zone is given, e.g. 2026-12-01T00:00:00Z). "
        "Required with previous_master_key_file.",
    ),
    cfg.IntOpt(
        "metrics_port",
        default=0,
        min=0,
        max=65535,
        help="Serve the applier's Prometheus metrics (messages by status, "
        "refusals by reason, lock waits, Placement requests) over HTTP on "
        "this port (metrics_host). 0 serves none.",
    ),
    cfg.StrOpt(
        "metrics_host",
        default="127.0.0.1",
        help="Address the applier's metrics endpoint listens on.",
    ),
    cfg.BoolOpt(
        "accept_unsigned",
        default=False,
        help="Upgrade only: also apply messages of wire format 2.0 and 2.1, "
        "which carry no signature (agents not upgraded yet). Such a message "
        "can name any host; once a host has sent a signed message, unsigned "
        "ones in its name are refused anyway. Turn off when every agent "
        "signs.",
    ),
]

PLACEMENT_GROUP = "placement"

# The agent's own [placement] options, next to keystoneauth's.
PLACEMENT_AGENT_OPTS = [
    cfg.ListOpt(
        "aggregates",
        default=[],
        help="Aggregate UUIDs this host's root provider joins in Placement "
        "(for example the uuid `openstack aggregate show NAME -c uuid` "
        "prints). Additive: the agent adds them to whatever aggregates the "
        "root already has and removes only ones it added itself (recorded "
        "in the state file) when they leave this list; an aggregate set by "
        "an operator or nova-api is never removed. After a lost state file "
        "an aggregate already on the root counts as the operator's and is "
        "kept. With upstream = messaging node-agent-applier applies them "
        "the same way (wire format 2.4), recording its own in the host's "
        "record. Refused with [agent] mode = companion (nova-api mirrors "
        "nova's host aggregates there).",
    ),
]


def register_opts(conf: cfg.ConfigOpts, placement: bool = True) -> None:
    """Register every option on ``conf``. ``placement=False`` leaves out the
    ``[placement]`` group, whose options come from keystoneauth (its import
    and plugin scan are most of a dry-run's start-up): files that have no
    ``[placement]`` section do not need them."""
    conf.register_opts(DEFAULT_OPTS)
    conf.register_opts(NOVA_DEFAULT_OPTS)
    conf.register_opts(HOST_OPTS, group="host")
    conf.register_opts(LIBVIRT_OPTS, group="libvirt")
    conf.register_opts(COMPUTE_OPTS, group="compute")
    conf.register_opts(AGENT_OPTS, group="agent")
    conf.register_opts(DEVICES_OPTS, group="devices")
    conf.register_opts(PCI_OPTS, group="pci")
    conf.register_opts(NODE_OPTS, group="node")
    conf.register_opts(APPLIER_OPTS, group="applier")
    conf.register_opts(WORKAROUNDS_OPTS, group="workarounds")
    conf.register_opts(IMAGE_CACHE_OPTS, group="image_cache")
    logs.register(conf)
    if placement:
        register_placement_opts(conf)


def register_placement_opts(conf: cfg.ConfigOpts) -> None:
    """keystoneauth's session, auth and adapter options in ``[placement]``."""
    from keystoneauth1 import loading as ks_loading

    conf.register_opts(_session_opts(), group=PLACEMENT_GROUP)
    conf.register_opts(PLACEMENT_AGENT_OPTS, group=PLACEMENT_GROUP)
    ks_loading.register_auth_conf_options(conf, PLACEMENT_GROUP)
    ks_loading.register_adapter_conf_options(conf, PLACEMENT_GROUP)


def configured_host(conf: cfg.ConfigOpts) -> Optional[str]:
    """``[DEFAULT] host`` as a parsed file sets it, None when no file does."""
    opt = conf._get_opt_info("host")["opt"]
    namespace = conf._namespace
    if namespace is None:
        return None
    try:
        value, _loc = opt._get_from_namespace(namespace, None)
    except (KeyError, AttributeError):
        return None
    return value


def default_host(conf: cfg.ConfigOpts) -> str:
    """``[DEFAULT] host``. oslo.config resolves ``conf.host`` to the ``[host]``
    group, which shadows the option of the same name, so it is read here from
    the parsed files directly (then the default)."""
    value = configured_host(conf)
    return value if value is not None else conf._get_opt_info("host")["opt"].default


# keystoneauth's session has no timeout by default: a Placement that accepts
# the connection and never answers would block a cycle for ever.
PLACEMENT_TIMEOUT = 30


def _session_opts():
    """keystoneauth's session options, with ``timeout`` defaulting to
    :data:`PLACEMENT_TIMEOUT` seconds instead of none."""
    from keystoneauth1 import loading as ks_loading

    opts = []
    for opt in ks_loading.get_session_conf_options():
        if opt.dest == "timeout":
            opt = cfg.FloatOpt(
                "timeout",
                default=PLACEMENT_TIMEOUT,
                min=0.1,
                help="Seconds to wait for each Placement request "
                "(connect and answer) before it counts as "
                "unreachable. A timed-out request is not "
                "retried within the cycle.",
            )
        opts.append(opt)
    return opts


def placement_base_opts() -> list:
    """The ``[placement]`` options every auth type shares: keystoneauth's
    session (our ``timeout``), common auth and adapter options."""
    from keystoneauth1 import loading as ks_loading

    return (
        _session_opts()
        + PLACEMENT_AGENT_OPTS
        + ks_loading.get_auth_common_conf_options()
        + ks_loading.get_adapter_conf_options()
    )


def _placement_opts():
    from keystoneauth1 import loading as ks_loading

    opts = placement_base_opts()
    for name in ("password", "v3applicationcredential", "admin_token"):
        opts += ks_loading.get_auth_plugin_conf_options(name)
    unique: dict[str, cfg.Opt] = {}
    for opt in opts:
        unique.setdefault(opt.dest, opt)
    return list(unique.values())


def messaging_default_opts() -> list:
    """oslo.messaging's ``[DEFAULT]`` options (``transport_url``...). They are
    registered by oslo.messaging itself when a transport is made; listed here
    so config checks and the sample file know them."""
    import warnings

    with warnings.catch_warnings():
        # oslo.messaging imports oslo.service, which warns about eventlet
        # even though the agent never uses it.
        warnings.simplefilter("ignore")
        from oslo_messaging import opts as messaging_opts
    return [opt for group, opts in messaging_opts.list_opts() if group is None for opt in opts]


def log_opts() -> list:
    """oslo.log's ``[DEFAULT]`` options (debug, log_file, use_journal, use_json...)."""
    from oslo_log import _options

    return [opt for _group, opts in _options.list_opts() for opt in opts]


def list_opts(with_messaging: bool = True, with_placement: bool = True):
    """Entry point for oslo-config-generator (namespace ``node_agent``).

    ``with_messaging=False`` skips oslo.messaging's options, whose import
    costs a third of a second that ``--dry-run`` should not pay;
    ``with_placement=False`` skips keystoneauth's (``[placement]``)."""
    return [
        (
            "DEFAULT",
            DEFAULT_OPTS
            + NOVA_DEFAULT_OPTS
            + log_opts()
            + (messaging_default_opts() if with_messaging else []),
        ),
        ("host", HOST_OPTS),
        ("libvirt", LIBVIRT_OPTS),
        ("compute", COMPUTE_OPTS),
        ("agent", AGENT_OPTS),
        ("devices", DEVICES_OPTS),
        ("pci", PCI_OPTS),
        ("node", NODE_OPTS),
        ("applier", APPLIER_OPTS),
        ("workarounds", WORKAROUNDS_OPTS),
        ("image_cache", IMAGE_CACHE_OPTS),
    ] + ([(PLACEMENT_GROUP, _placement_opts())] if with_placement else [])
