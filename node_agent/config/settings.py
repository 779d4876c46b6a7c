"""The agent's configuration, validated once and frozen.

``load_settings(conf)`` turns a parsed ``ConfigOpts`` into :class:`Settings`
(plain data, defined in :mod:`node_agent.model.settings` so the pure core
never loads oslo.config),
collecting every problem it can see without looking at the host. Checks that
need the host (CPUs present and online, reserved below total) live in
:mod:`node_agent.policy.partition`.
"""

from __future__ import annotations

import logging
import math
import os
import re
from typing import Optional

import os_resource_classes as orc
from oslo_config import cfg

from node_agent.config import options as conf_mod
from node_agent.errors import ConfigError
from node_agent.model.cpuset import CpuSet, CpuSetSyntaxError, parse_cpu_spec
from node_agent.model.device_spec import parse_device_specs
from node_agent.model.hugepages import parse_reserved_huge_pages
from node_agent.model.settings import CycleMode, MdevTypeSettings, Settings
from node_agent.policy.provider_config import (
    NEUTRON_CLASS_PREFIXES,
    NEUTRON_TRAIT_PREFIXES,
    NEUTRON_WHY,
)
from node_agent.state import FILE_NAME as STATE_FILE_NAME
from node_agent.tree.pci_placement import spec_problems

LOG = logging.getLogger(__name__)

CPU_SPEC_HELP = "a comma list of N, A-B, ^N or ^A-B, for example '2-7,^4'"


class _Group:
    def __init__(self, get: "_Reader", group: str):
        self._get = get
        self._group = group

    def __getattr__(self, name):
        if self._group == "compute" and name in conf_mod.NOVA_DEFAULT_NAMES:
            return self._get.compute_or_nova_default(name, _FALLBACKS.get(name))
        return self._get(self._group, name, fallback=_FALLBACKS.get(name))


_FALLBACKS = {
    "reserved_host_cpus": 0,
    "reserved_host_memory_mb": 0,
    "reserved_host_disk_mb": 0,
    "report_interval": 60,
    "full_verify_interval": 300,
    "pcpu_transition_mode": False,
    "startup_splay": 30,
    "interval_jitter": 0.1,
    "retry_max_interval": 300,
    "audit_in_flight_grace": 3600,
}


def _cpu_spec(group: str, name: str, value: Optional[str], problems: list) -> Optional[CpuSet]:
    if value is None or value == "":
        return None  # "cpu_shared_set =" is unset, as nova reads it
    try:
        cpus = parse_cpu_spec(value)
    except CpuSetSyntaxError as exc:
        problems.append(
            f"[{group}] {name} = '{value}' is not a CPU spec: {exc}. "
            f"Write {CPU_SPEC_HELP}, or remove the option."
        )
        return None
    if not cpus:
        problems.append(
            f"[{group}] {name} = '{value}' leaves no CPU after exclusions. "
            "List at least one CPU, or remove the option."
        )
        return None
    return cpus


def _ratio(
    group: str, name: str, value: Optional[float], initial_name: str, initial: float, problems: list
) -> float:
    # nova reads 0.0 as unset (its default before Stein), so nova.conf
    # files that still carry it mean the initial ratio.
    chosen, chosen_name = (value, name) if value else (initial, initial_name)
    # NaN compares false with everything, so "<= 0" alone would let it in.
    if chosen is None or not math.isfinite(chosen) or chosen <= 0:
        problems.append(
            f"[{group}] {chosen_name} = {chosen} must be greater than 0 (1.0 means no overcommit)."
        )
        return 1.0
    return float(chosen)


class _Reader:
    """Reads options, turning oslo's type and range errors into problems."""

    def __init__(self, conf, problems: list):
        self._conf = conf
        self._problems = problems

    def __call__(self, group: Optional[str], name: str, fallback=None):
        try:
            if group is None:
                return self._conf[name]
            return getattr(getattr(self._conf, group), name)
        except (cfg.ConfigFileValueError, ValueError) as exc:
            detail = str(exc).split(" is not valid: ")[-1]
            self._problems.append(
                f"[{group or 'DEFAULT'}] {name} has an invalid value"
                f"{self._shown(group, name)}: {detail}. See "
                "etc/node-agent.conf.sample for what it accepts."
            )
            return fallback

    def compute_or_nova_default(self, name: str, fallback=None):
        """``[compute] name`` when a file sets it there, else nova's
        ``[DEFAULT] name`` when set, else the ``[compute]`` default."""
        if _configured_value(self._conf, name, "compute") is None:
            value = self(None, name)
            if value is not None and value != []:
                return value
        return self("compute", name, fallback)

    def _shown(self, group: Optional[str], name: str) -> str:
        """`` 'value'`` as written in the file; nothing for secret options."""
        try:
            if self._conf._get_opt_info(name, group)["opt"].secret:
                return ""
        except (cfg.NoSuchOptError, cfg.NoSuchGroupError, KeyError):
            return ""
        raw = _configured_value(self._conf, name, group)
        return "" if raw is None else f" '{raw}'"


_CUSTOM_NAME = re.compile(r"^CUSTOM_[A-Z0-9_]+$")


def _node_resource_class(value: Optional[str], problems: list) -> Optional[str]:
    if value is None or not value.strip():
        return None
    value = value.strip()
    if len(value) > 255:
        problems.append(
            f"[node] resource_class = '{value[:40]}...' is {len(value)} "
            "characters long; Placement takes at most 255. Shorten it."
        )
        return None
    if not _CUSTOM_NAME.match(value):
        suggestion = value if value.startswith("CUSTOM_") else orc.normalize_name(value)
        suggestion = "CUSTOM_" + re.sub("[^A-Z0-9_]", "_", suggestion[7:].upper())
        problems.append(
            f"[node] resource_class = '{value}' is not a custom resource "
            "class (CUSTOM_ followed by A-Z, 0-9 and _). "
            f"Write it as '{suggestion}'."
        )
        return None
    return value


def _nested_provider_values(get: "_Reader", problems: list) -> dict:
    compute = _Group(get, "compute")
    return dict(
        numa_in_placement=bool(compute.numa_in_placement),
        reserved_huge_pages=parse_reserved_huge_pages(compute.reserved_huge_pages or (), problems),
        provider_config_location=compute.provider_config_location
        or "/etc/node-agent/provider_config/",
        enabled_mdev_types=tuple(
            t.strip() for t in (get("devices", "enabled_mdev_types") or ()) if t.strip()
        ),
        pci_device_specs=_pci_specs(get, problems),
        report_sriov_numvfs=bool(get("pci", "report_sriov_numvfs")),
        pci_in_placement=bool(get("pci", "report_in_placement")),
        node_resource_class=_node_resource_class(get("node", "resource_class"), problems),
    )


def _pci_specs(get: "_Reader", problems: list):
    """The device specs, with nova's refusals under report_in_placement
    (PlacementPciException, PciConfigInvalidSpec)."""
    specs = parse_device_specs(get("pci", "device_spec") or (), problems)
    in_placement = bool(get("pci", "report_in_placement"))
    for spec in specs:
        if in_placement and spec.devname:
            problems.append(
                f"[pci] device_spec with devname '{spec.devname}': with [pci] "
                "report_in_placement the devices are named by PCI address; give "
                "the address instead (nova refuses devname here too)."
            )
        if in_placement:
            problems += spec_problems(
                spec, NEUTRON_CLASS_PREFIXES, NEUTRON_TRAIT_PREFIXES, NEUTRON_WHY
            )
        if spec.one_time_use and not in_placement:
            problems.append(
                "[pci] device_spec with one_time_use = true needs [pci] "
                "report_in_placement = true (only Placement can reserve a used "
                "device); nova refuses it too."
            )
    return specs


def load_settings(conf) -> Settings:
    """Validate the option values that need no host knowledge.

    Raises ConfigError listing every problem found.
    """
    settings, problems = check_settings(conf)
    if problems:
        raise ConfigError(problems)
    return settings


def check_settings(conf) -> tuple[Settings, list[str]]:
    """The settings and every problem found in them. With problems, a bad
    value is left at its default (a bad CPU spec at unset), so checks that
    need the host can still run on the rest in the same pass."""
    problems: list[str] = []
    get = _Reader(conf, problems)
    compute = _Group(get, "compute")
    agent = _Group(get, "agent")
    values = dict(
        cpu_dedicated_set=_cpu_spec(
            "compute", "cpu_dedicated_set", compute.cpu_dedicated_set, problems
        ),
        cpu_shared_set=_cpu_spec("compute", "cpu_shared_set", compute.cpu_shared_set, problems),
        vcpu_pin_set=_cpu_spec("compute", "vcpu_pin_set", compute.vcpu_pin_set, problems),
        reserved_host_cpus=compute.reserved_host_cpus,
        reserved_host_memory_mb=compute.reserved_host_memory_mb,
        reserved_host_disk_mb=compute.reserved_host_disk_mb,
        instances_path=_instances_path(compute, get),
        images_type=get("libvirt", "images_type") or "default",
        force_raw_images=bool(get(None, "force_raw_images", True)),
        image_type_exclude_list=tuple(
            kind.strip() for kind in get("compute", "image_type_exclude_list") or () if kind.strip()
        ),
        pcpu_transition_mode=compute.pcpu_transition_mode,
        report_interval=agent.report_interval,
        full_verify_interval=agent.full_verify_interval,
        startup_splay=agent.startup_splay,
        interval_jitter=agent.interval_jitter,
        retry_max_interval=agent.retry_max_interval,
        audit_in_flight_grace=agent.audit_in_flight_grace,
        cycle_mode=CycleMode.of(agent.mode or "writer", agent.upstream or "placement"),
        upstream_timeout=float(agent.upstream_timeout or 60.0),
        upstream_topic=agent.upstream_topic or "node-agent-applier",
        upstream_key_file=agent.upstream_key_file or "",
        state_path=_state_path(get, problems),
        machine_id_path=agent.machine_id_path or "/etc/machine-id",
        take_over_provider=bool(agent.take_over_provider),
        sysfs_root=conf.host.sysfs_root,
        libvirt_uri=(conf.libvirt.connection_uri or "").strip(),
        cpu_power_management=bool(get("libvirt", "cpu_power_management")),
        **_guest_cpu(get, problems),
        virt_type=get("libvirt", "virt_type") or "kvm",
        swtpm_enabled=bool(get("libvirt", "swtpm_enabled")),
        supported_tpm_secret_security=tuple(get("libvirt", "supported_tpm_secret_security") or ()),
        domain_capabilities=bool(get("libvirt", "domain_capabilities")),
        num_memory_encrypted_guests=get("libvirt", "num_memory_encrypted_guests"),
        num_intel_tdx_guests=get("libvirt", "num_intel_tdx_guests"),
        file_backed_memory=get("libvirt", "file_backed_memory", 0) or 0,
        pmem_namespaces=_pmem_namespaces(get("libvirt", "pmem_namespaces") or (), problems),
        reserve_disk_for_image_cache=bool(
            get("workarounds", "reserve_disk_resource_for_image_cache")
        ),
        skip_cpu_compare_at_startup=bool(get("workarounds", "skip_cpu_compare_at_startup")),
        image_cache_subdirectory=get("image_cache", "subdirectory_name") or "_base",
    )
    values["explicit_ratios"] = frozenset(
        kind for kind in ("cpu", "ram", "disk") if getattr(compute, f"{kind}_allocation_ratio")
    )
    for kind in ("cpu", "ram", "disk"):
        values[f"{kind}_allocation_ratio"] = _ratio(
            "compute",
            f"{kind}_allocation_ratio",
            getattr(compute, f"{kind}_allocation_ratio"),
            f"initial_{kind}_allocation_ratio",
            getattr(compute, f"initial_{kind}_allocation_ratio"),
            problems,
        )
    problems += _file_backed_memory_problems(
        values["file_backed_memory"],
        values["virt_type"],
        compute.ram_allocation_ratio,
        values["reserved_host_memory_mb"],
    )
    values.update(_nested_provider_values(get, problems))
    values["placement_aggregates"] = _aggregates(conf, get, values["cycle_mode"], problems)
    values["shared_storage_aggregate"] = _shared_storage(
        get("compute", "shared_storage_aggregate"), values["cycle_mode"], problems
    )
    values["mdev_types"] = _mdev_types(conf, get, values["enabled_mdev_types"], problems)
    host = conf_mod.default_host(conf)
    if not host or not host.strip():
        problems.append(
            "[DEFAULT] host is empty. Set it to this node's name, "
            "or remove it to use the machine's hostname."
        )
    _read_every_option(get, conf)
    problems.extend(transport_url_problems(conf))
    return Settings(host=(host or "").strip(), **values), list(dict.fromkeys(problems))


def _aggregates(conf, get: "_Reader", mode: CycleMode, problems: list) -> tuple[str, ...]:
    """``[placement] aggregates``: aggregate uuids, canonical and sorted.
    Registered only when a file has ``[placement]``."""
    if conf_mod.PLACEMENT_GROUP not in conf:
        return ()
    written = [a.strip() for a in get(conf_mod.PLACEMENT_GROUP, "aggregates") or () if a.strip()]
    if not written:
        return ()
    import uuid  # loaded where a value is one: start-up cost, test_start_cost.py

    found: set[str] = set()
    for value in written:
        try:
            found.add(str(uuid.UUID(value)))
        except ValueError:
            problems.append(
                f"[placement] aggregates: '{value}' is not an aggregate UUID. Placement "
                "names aggregates by UUID: give the uuid `openstack aggregate show NAME "
                "-c uuid` prints (nova's), or any UUID the hosts to group share."
            )
    # upstream = messaging carries them to node-agent-applier (wire 2.4).
    if found and mode is CycleMode.COMPANION:
        problems.append(
            f"[placement] aggregates = {', '.join(sorted(found))}: [agent] mode = "
            "companion never writes the root; nova-api mirrors nova's host aggregates "
            "into Placement there (`openstack aggregate add host`). Remove the "
            "option, or set the aggregates on the root in Placement "
            "(`openstack resource provider aggregate set`)."
        )
        return ()
    return tuple(sorted(found))


def _shared_storage(value, mode: CycleMode, problems: list) -> Optional[str]:
    """``[compute] shared_storage_aggregate``: the aggregate uuid, canonical."""
    if value is None or not str(value).strip():
        return None
    value = str(value).strip()
    import uuid  # loaded where a value is one: start-up cost, test_start_cost.py

    try:
        found = str(uuid.UUID(value))
    except ValueError:
        problems.append(
            f"[compute] shared_storage_aggregate: '{value}' is not an aggregate UUID. "
            "Give the uuid of the aggregate of the hosts that share instances_path "
            "(`openstack aggregate show NAME -c uuid`), the same on each of them."
        )
        return None
    if mode is not CycleMode.DIRECT:
        why = (
            "[agent] mode = companion never writes the root, and nova-compute reports DISK_GB on it"
            if mode is CycleMode.COMPANION
            else "[agent] upstream = messaging: node-agent-applier writes the tree and "
            "does not write a sharing provider nor move allocations to it"
        )
        problems.append(
            f"[compute] shared_storage_aggregate = {found}: {why}. Remove the option, "
            "or run this host with [agent] mode = writer and upstream = placement."
        )
        return None
    return found


_PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def _mdev_types(conf, get: "_Reader", types, problems: list) -> tuple[MdevTypeSettings, ...]:
    """nova's ``[mdev_<type>]`` sections of the enabled types. A GPU named
    by two types, or an address that is not one, is refused, as nova-compute
    refuses to start on them (InvalidLibvirtMdevConfig)."""
    conf_mod.register_mdev_type_opts(conf, types)
    result: list[MdevTypeSettings] = []
    owner: dict[str, str] = {}
    for name in types:
        group = f"mdev_{name}"
        addresses = tuple(a.strip() for a in (get(group, "device_addresses") or ()) if a.strip())
        for address in addresses:
            if not _PCI_ADDRESS.match(address):
                problems.append(
                    f"[{group}] device_addresses: '{address}' is not a PCI address "
                    "(domain:bus:slot.function, e.g. 0000:84:00.0); nova refuses it too."
                )
            elif address in owner:
                problems.append(
                    f"[{group}] device_addresses: {address} is already given type "
                    f"{owner[address]}; a GPU serves one type (nova refuses this too)."
                )
            owner.setdefault(address, name)
        result.append(
            MdevTypeSettings(
                name=name,
                device_addresses=addresses,
                max_instances=get(group, "max_instances"),
                mdev_class=get(group, "mdev_class") or "VGPU",
            )
        )
    return tuple(result)


def _pmem_namespaces(values, problems: list) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``LABEL:NAME|NAME`` items; nova refuses one without a colon, and a
    namespace named twice (PMEMNamespaceConfigInvalid)."""
    result, seen = [], set()
    for item in values:
        label, colon, names = item.strip().partition(":")
        if not colon or not label:
            problems.append(
                f"[libvirt] pmem_namespaces: '{item}' is not LABEL:NAME|NAME "
                "(for example 128G:ns0|ns1); nova refuses it too."
            )
            continue
        for name in names.split("|"):
            if name in seen:
                problems.append(
                    f"[libvirt] pmem_namespaces: namespace '{name}' is named twice; "
                    "nova refuses it too."
                )
            seen.add(name)
        result.append((label, tuple(names.split("|"))))
    return tuple(result)


def _file_backed_memory_problems(
    size_mb: int, virt_type: str, ram_ratio: Optional[float], reserved_mb: int
) -> list[str]:
    """nova refuses to start with file-backed memory unless guests are
    QEMU/KVM, RAM is not overcommitted and none is reserved (libvirt
    Host._check_file_backed_memory_support); so does the agent."""
    if not size_mb:
        return []
    problems = []
    if virt_type not in ("qemu", "kvm"):
        problems.append(
            f"[libvirt] file_backed_memory = {size_mb} needs [libvirt] virt_type "
            f"qemu or kvm, not {virt_type}; nova refuses it too."
        )
    if ram_ratio != 1.0:
        problems.append(
            f"[libvirt] file_backed_memory = {size_mb} needs "
            f"[DEFAULT] ram_allocation_ratio = 1.0 set explicitly (now "
            f"{'unset' if ram_ratio is None else ram_ratio}): file-backed memory "
            "cannot be overcommitted; nova refuses it too."
        )
    if reserved_mb:
        problems.append(
            f"[libvirt] file_backed_memory = {size_mb} does not go with "
            f"[DEFAULT] reserved_host_memory_mb = {reserved_mb}: set it to 0 "
            "(the host's RAM is not what guests use); nova refuses it too."
        )
    return problems


def _guest_cpu(get: "_Reader", problems: list[str]) -> dict:
    """``[libvirt] cpu_mode``, ``cpu_models``, ``cpu_model_extra_flags``,
    checked as nova checks them at start (``_check_cpu_compatibility``).
    Whether a model exists is checked against libvirt, at discovery."""
    mode = get("libvirt", "cpu_mode")
    models = tuple(m.strip() for m in get("libvirt", "cpu_models") or () if m.strip())
    flags = tuple(
        f.strip().lower() for f in get("libvirt", "cpu_model_extra_flags") or () if f.strip()
    )
    if mode == "custom" and not models:
        problems.append(
            "[libvirt] cpu_mode = custom needs [libvirt] cpu_models (the "
            "guest CPU models, e.g. 'Haswell-noTSX'); nova refuses it too."
        )
    if mode != "custom" and models:
        problems.append(
            f"[libvirt] cpu_models = {','.join(models)} is only used with "
            f"cpu_mode = custom (cpu_mode is {mode or 'unset'}); nova refuses "
            "it too. Set cpu_mode = custom or remove cpu_models."
        )
    return {"cpu_mode": mode, "cpu_models": models, "cpu_model_extra_flags": flags}


DEFAULT_STATE_PATH = "/var/lib/node-agent"
# nova's [DEFAULT] instances_path when neither it nor state_path is set in
# the files (nova's own default, $pybasedir/instances, is a packaging detail).
DEFAULT_INSTANCES_PATH = "/var/lib/nova/instances"


def _state_path(get: "_Reader", problems: list[str]) -> str:
    """``[agent] state_path``, else /var/lib/node-agent. ``[DEFAULT]
    state_path`` is nova's directory, whatever file sets it: the agent never
    keeps its state there."""
    own = get("agent", "state_path")
    chosen = own or DEFAULT_STATE_PATH
    novas = get(None, "state_path")
    if not novas:
        return chosen
    if os.path.normpath(novas) == DEFAULT_STATE_PATH:
        # The sample of agents before 906cb2c set [DEFAULT] state_path to
        # this directory (then the agent's option): an upgraded file keeps it.
        problems.append(
            f"[DEFAULT] state_path = {novas} is the option an earlier "
            "node-agent read its own directory from. It is now nova's option "
            "(nova's files, and instances_path defaults under it), and the "
            "agent's directory is [agent] state_path, whose default is "
            f"{DEFAULT_STATE_PATH}. Delete the [DEFAULT] state_path line from "
            "node-agent's config file: the state stays where it is."
        )
    elif os.path.normpath(chosen) == os.path.normpath(novas):
        problems.append(
            f"[agent] state_path = {chosen} is nova's [DEFAULT] state_path: "
            "the agent never keeps its state in nova's directory. Choose "
            f"another directory, for example {DEFAULT_STATE_PATH}."
        )
    elif not own and os.path.exists(os.path.join(novas, STATE_FILE_NAME)):
        # An older agent read its directory from [DEFAULT] state_path; its
        # state (maintenance among it) is not silently left behind.
        problems.append(
            f"[DEFAULT] state_path = {novas} holds node-agent's "
            f"{STATE_FILE_NAME}, written by an older agent that read its "
            "directory from that option. [DEFAULT] state_path is nova's "
            "option; the agent's is [agent] state_path. Rename the option "
            "to [agent] state_path to keep that state there, or move the "
            f"file to {DEFAULT_STATE_PATH}."
        )
    return chosen


def _instances_path(compute: "_Group", get: "_Reader") -> str:
    """nova's rule: ``[DEFAULT] instances_path`` (or the agent's ``[compute]``
    one), else ``$state_path/instances`` of nova's ``[DEFAULT] state_path``."""
    chosen = compute.instances_path
    if chosen:
        return chosen
    novas_state = get(None, "state_path")
    return os.path.join(novas_state, "instances") if novas_state else DEFAULT_INSTANCES_PATH


# Groups whose options are all ours (or keystoneauth's) to type-check.
_CHECKED_GROUPS = (
    "host",
    "libvirt",
    "compute",
    "agent",
    "devices",
    "pci",
    "node",
    conf_mod.PLACEMENT_GROUP,
)


def _read_every_option(get: "_Reader", conf) -> None:
    """oslo.config checks a value's type and range only when it is read, so
    an option only the service reads (``metrics_port = 70000``) would pass
    ``--check-config`` and fail later; read them all now."""
    for group in _CHECKED_GROUPS:
        if group not in conf:  # [placement]: registered only when a file has it
            continue
        for name in list(conf[group]):
            get(group, name)


# Where oslo.messaging reads transport URLs: (group, label in messages).
_TRANSPORT_URL_OPTS = (
    (None, "[DEFAULT] transport_url"),
    ("oslo_messaging_notifications", "[oslo_messaging_notifications] transport_url"),
)


def _masked_url(url: str) -> str:
    """The URL with any password replaced by ``***``, fit for a message."""
    return re.sub(r"(//|,)([^:@/,]*):[^@/]*@", r"\1\2:***@", url)


def _configured_value(conf, name: str, group: Optional[str]) -> Optional[str]:
    """An option's value as written in the files, whether or not it is
    registered (oslo.messaging registers transport_url only when used)."""
    opt = cfg.StrOpt(name)
    try:
        value, _loc = opt._get_from_namespace(conf._namespace, group)
    except (KeyError, AttributeError, cfg.Error):
        return None
    return value


def transport_url_problems(conf) -> list[str]:
    """Problems with the configured transport URLs (none when unset)."""
    problems = []
    for group, label in _TRANSPORT_URL_OPTS:
        url = _configured_value(conf, "transport_url", group)
        if not url:
            continue
        why = _transport_url_error(url)
        if why:
            problems.append(
                f"{label} = '{_masked_url(url)}' is not a valid transport "
                f"URL: {why}. Write driver://user:password@host:port/vhost, "
                "for example rabbit://node-agent:SECRET@rabbit1:5672/."
            )
    return problems


def _transport_url_error(url: str) -> Optional[str]:
    import importlib.metadata
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # oslo.service's eventlet notice
        import oslo_messaging
    try:
        parsed = oslo_messaging.TransportURL.parse(cfg.ConfigOpts(), url)
    except (oslo_messaging.InvalidTransportURL, ValueError) as exc:
        return _masked_url(str(exc))
    drivers = {e.name for e in importlib.metadata.entry_points(group="oslo.messaging.drivers")}
    if parsed.transport not in drivers:
        return f"no messaging driver '{parsed.transport}' (installed: {', '.join(sorted(drivers))})"
    for host in parsed.hosts:
        if host.port is not None and not 0 < host.port < 65536:
            return f"port {host.port} is outside 1-65535"
    return None
