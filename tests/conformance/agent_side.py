"""The agent's answers to the conformance cases, through its real code.

Options arrive named as nova names them; they are set on a ConfigOpts with
the agent's own options registered and go through ``load_settings``, so
option-level rules (a ratio of 0.0, an empty CPU set) are compared too.
"""

from __future__ import annotations

from typing import Mapping

from oslo_config import cfg

from node_agent.config import options as conf_mod
from node_agent.config.settings import load_settings
from node_agent.errors import ConfigError
from node_agent.model.cpuset import CpuSet
from node_agent.model.provider_tree import Provider
from node_agent.model.settings import Settings
from node_agent.model.snapshot import HostCpuModel, HostSnapshot
from node_agent.placement.planner import wanted_inventories
from node_agent.policy.partition import partition_cpus
from node_agent.tree.build import root_inventories


def _group_of(conf: cfg.ConfigOpts, name: str) -> str | None:
    """The section nova reads ``name`` from; the agent must read it there too."""
    if name in (
        "cpu_power_management",
        "virt_type",
        "swtpm_enabled",
        "cpu_mode",
        "cpu_models",
        "cpu_model_extra_flags",
        "num_memory_encrypted_guests",
        "num_intel_tdx_guests",
        "images_type",
        "file_backed_memory",
    ):
        return "libvirt"
    if name in ("cpu_dedicated_set", "cpu_shared_set", "image_type_exclude_list"):
        return "compute"
    return None  # nova's legacy [DEFAULT] options


def agent_conf(options: Mapping) -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    conf_mod.register_opts(conf)
    conf([], project="node-agent", default_config_files=[], use_env=False)
    conf.set_override("host", "fixture")
    for name, value in options.items():
        group = _group_of(conf, name)
        try:
            conf.set_override(name, value, group=group)
        except (cfg.NoSuchOptError, cfg.NoSuchGroupError):
            # An option the agent does not have: a file setting it is refused.
            raise ConfigError(f"unknown option [{group or 'DEFAULT'}] {name}") from None
    return conf


def settings(options: Mapping) -> Settings:
    return load_settings(agent_conf(options))


_HOST = HostSnapshot(
    hostname="fixture",
    present=CpuSet(range(8)),
    online=CpuSet(range(8)),
    isolated=CpuSet(),
    cpus=(),
    nodes=(),
    memory_mb=65536,
    disk_gb=500,
    cpu_model=HostCpuModel(arch="x86_64"),
    warnings=(),
)


def ratios_and_reserved(options: Mapping, placement: Mapping) -> dict:
    """The VCPU/MEMORY_MB/DISK_GB ratios and reserved values the agent would
    write to a provider whose Placement inventory is ``placement``."""
    values = settings(options)
    invs = root_inventories(values, _HOST, partition_cpus(values, _HOST))
    wanted = wanted_inventories(Provider(name="fixture", inventories=invs), placement)
    return {
        "ratios": {rc: wanted[rc]["allocation_ratio"] for rc in ("VCPU", "MEMORY_MB", "DISK_GB")},
        "reserved": {rc: wanted[rc]["reserved"] for rc in ("MEMORY_MB", "DISK_GB")},
    }
