"""Every oslo.config option of the agent, registered on a ConfigOpts passed in.

Nothing registers on a global object: callers build a ``cfg.ConfigOpts()``,
call :func:`register_opts`, parse, then turn it once into the frozen
``Settings`` of :mod:`node_agent.settings`. ``list_opts`` feeds
oslo-config-generator, which writes ``etc/node-agent.conf.sample``.
"""

from __future__ import annotations

import socket

from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

DEFAULT_OPTS = [
    cfg.StrOpt(
        "host",
        default=socket.gethostname(),
        sample_default="<hostname>",
        help="Name of this compute node. It names the root resource provider "
             "in Placement, so it must be unique in the cloud and must not "
             "change while instances run here."),
    cfg.StrOpt(
        "state_path",
        default="/var/lib/node-agent",
        help="Directory where the agent keeps its state: the root provider "
             "uuid and what it last applied. Must be writable by the service "
             "user. Losing it is safe: the agent adopts its provider by name."),
]

HOST_OPTS = [
    cfg.StrOpt(
        "sysfs_root",
        default="/sys",
        help="Where sysfs is mounted. Every sysfs read goes through this "
             "root; point it at a captured tree to test the agent."),
]

LIBVIRT_OPTS = [
    cfg.StrOpt(
        "connection_uri",
        default="qemu:///system",
        help="libvirt URI, opened read-only. Leave empty on a host with no "
             "hypervisor: the agent then discovers from sysfs alone and "
             "reports no guests."),
]

COMPUTE_OPTS = [
    cfg.StrOpt(
        "cpu_dedicated_set",
        help="Host CPUs for pinned guests, reported as PCPU. Grammar: a "
             "comma list of N, A-B, ^N, ^A-B (for example '4-15,^8'). Must "
             "not overlap cpu_shared_set; cannot be combined with "
             "vcpu_pin_set or reserved_host_cpus."),
    cfg.StrOpt(
        "cpu_shared_set",
        help="Host CPUs for floating (unpinned) guests, reported as VCPU. "
             "Same grammar as cpu_dedicated_set. Unset with "
             "cpu_dedicated_set unset: every online CPU is VCPU."),
    cfg.StrOpt(
        "vcpu_pin_set",
        deprecated_for_removal=True,
        deprecated_reason="Use cpu_shared_set and cpu_dedicated_set.",
        help="Deprecated. Host CPUs for guests, all reported as VCPU. "
             "Cannot be combined with cpu_dedicated_set."),
    cfg.IntOpt(
        "reserved_host_cpus",
        default=0,
        min=0,
        help="Number of VCPU held back for the host. Only valid when neither "
             "cpu_shared_set nor cpu_dedicated_set is set: with them, leave "
             "host CPUs out of both sets instead."),
    cfg.IntOpt(
        "reserved_host_memory_mb",
        default=512,
        min=0,
        help="MiB of host memory reported as reserved in MEMORY_MB."),
    cfg.IntOpt(
        "reserved_host_disk_mb",
        default=0,
        min=0,
        help="MiB of disk reserved for the host; rounded up to whole GiB in "
             "DISK_GB."),
    cfg.FloatOpt(
        "cpu_allocation_ratio",
        help="VCPU overcommit ratio. Unset: initial_cpu_allocation_ratio."),
    cfg.FloatOpt(
        "ram_allocation_ratio",
        help="MEMORY_MB overcommit ratio. Unset: initial_ram_allocation_ratio."),
    cfg.FloatOpt(
        "disk_allocation_ratio",
        help="DISK_GB overcommit ratio. Unset: initial_disk_allocation_ratio."),
    cfg.FloatOpt("initial_cpu_allocation_ratio", default=4.0,
                 help="VCPU ratio used when cpu_allocation_ratio is unset."),
    cfg.FloatOpt("initial_ram_allocation_ratio", default=1.0,
                 help="MEMORY_MB ratio used when ram_allocation_ratio is unset."),
    cfg.FloatOpt("initial_disk_allocation_ratio", default=1.0,
                 help="DISK_GB ratio used when disk_allocation_ratio is unset."),
    cfg.StrOpt(
        "instances_path",
        default="/var/lib/nova/instances",
        help="Directory holding guest disks. DISK_GB is the size of the "
             "filesystem that holds it."),
    cfg.BoolOpt(
        "pcpu_transition_mode",
        default=False,
        help="Upgrade aid. While some schedulers still ask for VCPU for "
             "pinned guests and others already ask for PCPU, report the "
             "CPUs pinned guests may use as both VCPU and PCPU. The same "
             "CPUs are then counted twice: keep pinned and unpinned guests "
             "on separate hosts (aggregates) and switch this off once "
             "cpu_dedicated_set is configured everywhere."),
]

AGENT_OPTS = [
    cfg.IntOpt(
        "report_interval",
        default=60,
        min=1,
        help="Seconds between two cycles of discover-and-sync."),
    cfg.IntOpt(
        "full_verify_interval",
        default=300,
        min=0,
        help="Seconds between full re-reads of the tree from Placement, "
             "which catch changes made out of band. 0 verifies every cycle."),
]

PLACEMENT_GROUP = "placement"


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(DEFAULT_OPTS)
    conf.register_opts(HOST_OPTS, group="host")
    conf.register_opts(LIBVIRT_OPTS, group="libvirt")
    conf.register_opts(COMPUTE_OPTS, group="compute")
    conf.register_opts(AGENT_OPTS, group="agent")
    ks_loading.register_session_conf_options(conf, PLACEMENT_GROUP)
    ks_loading.register_auth_conf_options(conf, PLACEMENT_GROUP)
    ks_loading.register_adapter_conf_options(conf, PLACEMENT_GROUP)


def default_host(conf: cfg.ConfigOpts) -> str:
    """``[DEFAULT] host``. oslo.config resolves ``conf.host`` to the ``[host]``
    group, which shadows the option of the same name, so it is read here from
    the parsed files directly (then the default)."""
    opt = conf._get_opt_info("host")["opt"]
    try:
        value, _loc = opt._get_from_namespace(conf._namespace, None)
    except (KeyError, AttributeError):
        return opt.default
    return value if value is not None else opt.default


def _placement_opts():
    opts = (ks_loading.get_session_conf_options()
            + ks_loading.get_auth_common_conf_options()
            + ks_loading.get_adapter_conf_options())
    for name in ("password", "v3applicationcredential", "admin_token"):
        opts += ks_loading.get_auth_plugin_conf_options(name)
    unique = {}
    for opt in opts:
        unique.setdefault(opt.dest, opt)
    return list(unique.values())


def list_opts():
    """Entry point for oslo-config-generator (namespace ``node_agent``)."""
    return [
        ("DEFAULT", DEFAULT_OPTS),
        ("host", HOST_OPTS),
        ("libvirt", LIBVIRT_OPTS),
        ("compute", COMPUTE_OPTS),
        ("agent", AGENT_OPTS),
        (PLACEMENT_GROUP, _placement_opts()),
    ]
