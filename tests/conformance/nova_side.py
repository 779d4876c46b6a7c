"""The nova side of the conformance bridge. Runs under ``.venv-nova``'s
Python, never under the agent's: it imports nova 34 and the standard library
only, never ``node_agent`` or ``tests``.

Protocol: one JSON object per line on stdin, ``{"op": NAME, "args": {...}}``;
one JSON object per line on stdout, ``{"ok": RESULT}`` or
``{"error": "Type: message"}``. The process lives for a whole test session;
end it by closing stdin.

Every operation calls nova's own function with the configuration set
through nova's own ``CONF`` (``set_override``), so the answer is nova's, not
a re-implementation of it. Batched operations answer one result per case,
each ``{"value": ...}`` or ``{"refused": "Type: message"}``.
"""

import functools
import json
import logging
import sys
import warnings

warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)

import nova.conf  # noqa: E402  (after the warning filters)
from nova.compute import provider_config  # noqa: E402
from nova.compute import provider_tree as nova_provider_tree  # noqa: E402
from nova.compute import utils as compute_utils  # noqa: E402
from nova.compute.resource_tracker import ResourceTracker  # noqa: E402
from nova.virt import driver as virt_driver  # noqa: E402
from nova.virt import hardware  # noqa: E402
from nova.virt.libvirt import driver as libvirt_driver  # noqa: E402
from nova.virt.libvirt import utils as libvirt_utils  # noqa: E402

CONF = nova.conf.CONF
CONF([], project="nova", default_config_files=[])

# (group, name) of every option an operation may set; None is [DEFAULT].
_OPTIONS = {
    "cpu_dedicated_set": "compute",
    "cpu_shared_set": "compute",
    "vcpu_pin_set": None,
    "reserved_host_cpus": None,
    "reserved_host_memory_mb": None,
    "reserved_host_disk_mb": None,
    "cpu_allocation_ratio": None,
    "ram_allocation_ratio": None,
    "disk_allocation_ratio": None,
    "initial_cpu_allocation_ratio": None,
    "initial_ram_allocation_ratio": None,
    "initial_disk_allocation_ratio": None,
    "cpu_power_management": "libvirt",
    "virt_type": "libvirt",
    "swtpm_enabled": "libvirt",
    "cpu_mode": "libvirt",
    "cpu_models": "libvirt",
    "cpu_model_extra_flags": "libvirt",
    "skip_cpu_compare_at_startup": "workarounds",
    "num_intel_tdx_guests": "libvirt",
    "images_type": "libvirt",
    "force_raw_images": None,
    "image_type_exclude_list": "compute",
    "file_backed_memory": "libvirt",
    "host": None,
}


def _configure(options):
    for name, group in _OPTIONS.items():
        CONF.clear_override(name, group=group)
    for name, value in (options or {}).items():
        CONF.set_override(name, value, group=_OPTIONS[name])


def _refusal(exc):
    return {"refused": f"{type(exc).__name__}: {exc}"}


def _each(cases, fn):
    out = []
    for case in cases:
        try:
            out.append({"value": fn(case)})
        except Exception as exc:  # nova refusing is an answer, not a bridge failure
            out.append(_refusal(exc))
    return out


def _runs(cpus):
    """Sorted ids as ``[[first, last], ...]`` runs: compact for wide ranges."""
    runs = []
    for cpu in sorted(cpus):
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return runs


def parse_cpu_spec(specs):
    """``hardware.parse_cpu_spec`` per spec, as runs of ids."""
    return _each(specs, lambda s: _runs(hardware.parse_cpu_spec(s)))


class _Host:
    """What the libvirt driver asks of ``self._host``: libvirt's CPU map."""

    def __init__(self, online, present):
        self._online, self._present = set(online), set(present)

    def get_online_cpus(self):
        return set(self._online)

    def get_available_cpus(self):
        return set(self._present)


class _Driver:
    def __init__(self, online, present):
        self._host = _Host(online, present)


def cpu_sets(cases):
    """Per case ``{options, online, present}``: nova's start-up check
    (``_check_cpu_set_configuration``), then ``_get_vcpu_available`` and
    ``_get_pcpu_available`` of the libvirt driver, and the VCPU reserved."""

    def one(case):
        _configure(case["options"])
        drv = _Driver(case["online"], case["present"])
        libvirt_driver.LibvirtDriver._check_cpu_set_configuration(drv)
        vcpu = libvirt_driver.LibvirtDriver._get_vcpu_available(drv)
        pcpu = libvirt_driver.LibvirtDriver._get_pcpu_available(drv)
        return {
            "vcpu": sorted(vcpu),
            "pcpu": sorted(pcpu),
            "vcpu_reserved": CONF.reserved_host_cpus,
        }

    try:
        return _each(cases, one)
    finally:
        _configure({})


def ratios(cases):
    """Per case ``{options, inventory}``: ``ComputeDriver._get_allocation_ratios``
    and the reserved values ``update_provider_tree`` writes."""

    def one(case):
        _configure(case["options"])
        result = virt_driver.ComputeDriver._get_allocation_ratios(case["inventory"])
        return {
            "ratios": result,
            "reserved": {
                "MEMORY_MB": CONF.reserved_host_memory_mb,
                "DISK_GB": compute_utils.convert_mb_to_ceil_gb(CONF.reserved_host_disk_mb),
            },
        }

    try:
        return _each(cases, one)
    finally:
        _configure({})


def provider_configs(directory):
    """``get_provider_configs(dir)`` as plain data, or the refusal."""
    try:
        configs = provider_config.get_provider_configs(directory)
    except Exception as exc:
        return _refusal(exc)
    return {
        "value": {
            key: {k: v for k, v in value.items() if k != "__source_file"}
            for key, value in configs.items()
        }
    }


def merge_provider_configs(directory, tree):
    """Load ``directory`` and merge it into ``tree`` (a list of
    ``{name, uuid, parent_uuid, inventories, traits}``) with the resource
    tracker's ``_merge_provider_configs``. Returns the merged tree."""
    try:
        configs = provider_config.get_provider_configs(directory)
    except Exception as exc:
        return _refusal(exc)
    ptree = nova_provider_tree.ProviderTree()
    for p in tree:
        if p["parent_uuid"] is None:
            ptree.new_root(p["name"], p["uuid"], generation=1)
        else:
            ptree.new_child(p["name"], p["parent_uuid"], uuid=p["uuid"], generation=1)
        ptree.update_inventory(p["uuid"], p["inventories"])
        ptree.update_traits(p["uuid"], p["traits"])
    tracker = type("Tracker", (), {})()
    tracker.absent_providers = set()
    tracker._get_providers_to_update = functools.partial(
        ResourceTracker._get_providers_to_update, tracker
    )
    try:
        ResourceTracker._merge_provider_configs(tracker, configs, ptree)
    except Exception as exc:
        return _refusal(exc)
    out = []
    for p in tree:
        data = ptree.data(p["uuid"])
        out.append(
            {
                "name": data.name,
                "uuid": data.uuid,
                "inventories": data.inventory,
                "traits": sorted(data.traits),
            }
        )
    return {"value": out}


def cpu_traits(feature_sets):
    return _each(feature_sets, lambda f: libvirt_utils.cpu_features_to_traits(set(f)))


class _CapsHost:
    """``self._host`` for the trait functions: the real XML, parsed by nova's
    own config classes; libvirt's answers (baselineCPU, CPU model names,
    versions) recorded by the agent side from real libvirt."""

    def __init__(self, case):
        from nova.virt.libvirt import config as vconfig

        self._case = case
        self._caps = vconfig.LibvirtConfigCaps()
        self._caps.parse_str(
            case.get("capabilities_xml")
            or "<capabilities><host><cpu><arch>%s</arch></cpu></host></capabilities>"
            % case["host_arch"]
        )
        self._domain_caps = {}
        for arch, machines in (case.get("domain_caps") or {}).items():
            for machine, xml in machines.items():
                caps = vconfig.LibvirtConfigDomainCaps()
                caps.parse_str(xml)
                self._domain_caps.setdefault(arch, {})[machine] = caps
        self._uri = "recorded"

    def get_capabilities(self):
        return self._caps

    def get_domain_capabilities(self):
        return self._domain_caps

    def has_min_version(self, lv_ver=None, hv_ver=None, hv_type=None):
        def ok(have, want):
            return want is None or tuple(have) >= tuple(want)

        return ok(self._case["libvirt_version"], lv_ver) and ok(self._case["qemu_version"], hv_ver)

    def get_cpu_model_names(self):
        return list(self._case["model_names"])

    def get_connection(self):
        return self

    def baselineCPU(self, xmls, flags=0):
        from nova.virt.libvirt import config as vconfig

        cpu = vconfig.LibvirtConfigCPU()
        cpu.parse_str(xmls[0])
        return self._case["baseline"][cpu.model]

    tpm_models = property(lambda self: _HostClass().tpm_models.fget(self))
    tpm_versions = property(lambda self: _HostClass().tpm_versions.fget(self))


def _HostClass():
    from nova.virt.libvirt import host as libvirt_host

    return type(
        "H",
        (),
        {
            "tpm_models": libvirt_host.Host.tpm_models,
            "tpm_versions": libvirt_host.Host.tpm_versions,
        },
    )


def _caps_driver(case):
    drv = object.__new__(libvirt_driver.LibvirtDriver)
    drv._host = _CapsHost(case)
    drv.cpu_models_mapping = {}
    drv._get_cpu_info = lambda: {"arch": case["host_arch"]}
    return drv


_STATIC = (
    "_get_packed_virtqueue_traits",
    "_get_storage_bus_traits",
    "_get_video_model_traits",
    "_get_vif_model_traits",
    "_get_iommu_model_traits",
    "_get_tpm_traits",
    "_get_sound_model_traits",
    "_get_cpu_emulation_arch_traits",
)


def static_traits(cases):
    """Per case ``{options, host_arch, domain_caps: {arch: {machine: xml}},
    libvirt_version, qemu_version}``: the libvirt driver's static trait
    functions but the CPU ones, filtered by os-traits as ``static_traits``."""
    import os_traits

    def one(case):
        _configure(case["options"])
        drv = _caps_driver(case)
        traits = {}
        for name in _STATIC:
            traits.update(getattr(libvirt_driver.LibvirtDriver, name)(drv))
        _valid, invalid = os_traits.check_traits(traits)
        return {t: v for t, v in traits.items() if t not in invalid}

    try:
        return _each(cases, one)
    finally:
        _configure({})


def cpu_mode_traits(cases):
    """Per case ``{options, host_arch, capabilities_xml, model_names,
    baseline}``: nova's start-up check (``_check_cpu_compatibility``, CPU
    comparison skipped) and ``_get_cpu_feature_traits``."""

    def one(case):
        _configure(dict(case["options"], skip_cpu_compare_at_startup=True, virt_type="kvm"))
        drv = _caps_driver(case)
        libvirt_driver.LibvirtDriver._check_cpu_compatibility(drv)
        return libvirt_driver.LibvirtDriver._get_cpu_feature_traits(drv)

    try:
        return _each(cases, one)
    finally:
        _configure({})


def _mem_encryption_host(case):
    """``_CapsHost`` with nova's own memory-encryption members of ``Host``
    (support checks, slots, traits); their reads of /sys go to the files
    ``case["kvm_amd"]`` names, written by ``mem_encryption_children``."""
    from nova.virt.libvirt import host as libvirt_host

    members = vars(libvirt_host.Host)
    names = [n for n in members if n.startswith(("supports_amd_sev", "_get_mem_encryption_"))]
    names += [
        "supports_intel_tdx",
        "max_intel_tdx_guests",
        "_get_tdx_capacity",
        "_get_cgroup_tdx_capacity",
        "get_mem_encryption_inventories",
        "_kernel_supports_amd_sev",
    ]
    host = type("MemHost", (_CapsHost,), {n: members[n] for n in names})(case)
    host._supports_amd_sev = host._supports_amd_sev_es = None
    host._supports_amd_sev_snp = host._supports_intel_tdx = None
    host._max_sev_guests = host._max_sev_es_guests = 0
    host._max_intel_tdx_guests = None
    return host


def mem_encryption_children(cases):
    """Per case ``{options, host_arch, domain_caps, libvirt_version,
    qemu_version, kvm_amd: [parameters that are on], misc_capacity: the
    kernel misc cgroup's misc.capacity or None}``: the children nova's
    ``_update_provider_tree_for_memory_encryption`` adds under root ``cn1``,
    as ``{name: {inventories, traits}}``. nova 34 has no
    ``num_memory_encrypted_guests``: a nova.conf setting it is read as if
    it did not."""
    import os
    import tempfile

    from nova.virt.libvirt import host as libvirt_host

    def one(case, params):
        for name in os.listdir(params):
            os.unlink(os.path.join(params, name))
        for name in case["kvm_amd"]:
            with open(os.path.join(params, name), "w") as f:
                f.write("Y\n")
        if case.get("misc_capacity") is not None:
            with open(os.path.join(params, "misc.capacity"), "w") as f:
                f.write(case["misc_capacity"])
        _configure({k: v for k, v in case["options"].items() if k != "num_memory_encrypted_guests"})
        drv = _caps_driver(case)
        drv._host = _mem_encryption_host(case)
        tree = nova_provider_tree.ProviderTree()
        tree.new_root("cn1", "00000000-0000-0000-0000-000000000001")
        libvirt_driver.LibvirtDriver._update_provider_tree_for_memory_encryption(
            drv, tree, "cn1", None
        )
        out = {}
        for name in sorted(tree.get_provider_uuids()):
            data = tree.data(name)
            if data.name != "cn1":
                out[data.name] = {"inventories": data.inventory, "traits": sorted(data.traits)}
        return out

    saved = (libvirt_host.SEV_KERNEL_PARAM_FILE, libvirt_host.MISC_CONTROL_GROUP_CAPACITY_FILE)
    with tempfile.TemporaryDirectory() as params:
        libvirt_host.SEV_KERNEL_PARAM_FILE = os.path.join(params, "%s")
        libvirt_host.MISC_CONTROL_GROUP_CAPACITY_FILE = os.path.join(params, "misc.capacity")
        try:
            return _each(cases, lambda case: one(case, params))
        finally:
            (libvirt_host.SEV_KERNEL_PARAM_FILE, libvirt_host.MISC_CONTROL_GROUP_CAPACITY_FILE) = (
                saved
            )
            _configure({})


def _fakelibvirt():
    """nova's fakelibvirt (``nova/tests/fixtures/libvirt.py``), imported
    without the fixtures package's ``__init__``, which needs testtools."""
    import os
    import types

    import nova.tests

    name = "nova.tests.fixtures"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(os.path.dirname(nova.tests.__file__), "fixtures")]
        sys.modules[name] = package
    from nova.tests.fixtures import libvirt as fakelibvirt

    return fakelibvirt


def capability_traits(cases):
    """Per case ``{options, host_arch, domain_caps, libvirt_version,
    qemu_version, uri, traits}``: the root traits nova-compute publishes
    from its capabilities. nova's own ``LibvirtDriver.__init__`` (its
    capabilities dict) and ``_update_host_specific_capabilities`` (what
    ``init_host`` adds) run on a ``Host`` connected to nova's fakelibvirt
    with the case's versions and URI; the resource tracker's own
    ``_get_traits`` then merges them into ``traits`` (what the root holds
    before). Its DB-backed COMPUTE_STATUS_DISABLED sync is left out; the
    PCI tracker has remote-managed devices when ``remote_managed``."""
    import types

    from nova.compute import provider_tree as nova_tree
    from nova.virt.libvirt import config as vconfig
    from nova.virt.libvirt import host as libvirt_host

    fakelibvirt = _fakelibvirt()
    saved = (libvirt_driver.libvirt, libvirt_host.libvirt)
    libvirt_driver.libvirt = libvirt_host.libvirt = fakelibvirt

    def version(v):
        return v[0] * 1_000_000 + v[1] * 1000 + v[2]

    def one(case):
        _configure(case["options"])
        drv = libvirt_driver.LibvirtDriver(object(), read_only=True)
        drv._host._wrapped_conn = fakelibvirt.Connection(
            case["uri"],
            readonly=True,
            version=version(case["libvirt_version"]),
            hv_version=version(case["qemu_version"]),
        )
        caps = vconfig.LibvirtConfigCaps()
        caps.parse_str(
            "<capabilities><host><cpu><arch>%s</arch></cpu></host></capabilities>"
            % case["host_arch"]
        )
        drv._host._caps = caps
        domain_caps = {}
        for arch, machines in (case.get("domain_caps") or {}).items():
            for machine, xml in machines.items():
                parsed = vconfig.LibvirtConfigDomainCaps()
                parsed.parse_str(xml)
                domain_caps.setdefault(arch, {})[machine] = parsed
        drv._host._domain_caps = domain_caps
        drv._update_host_specific_capabilities()
        rt = object.__new__(ResourceTracker)
        rt.driver = drv
        rt.pci_tracker = types.SimpleNamespace(
            pci_stats=types.SimpleNamespace(
                has_remote_managed_device_pools=lambda: bool(case.get("remote_managed"))
            )
        )
        rt._sync_compute_service_disabled_trait = lambda _context, _traits: None
        tree = nova_tree.ProviderTree()
        tree.new_root("node", "00000000-0000-0000-0000-000000000001")
        tree.update_traits("node", case.get("traits", []))
        return sorted(rt._get_traits(None, "node", tree))

    try:
        return _each(cases, one)
    finally:
        libvirt_driver.libvirt, libvirt_host.libvirt = saved
        _configure({})


def node_names(cases):
    """Per case ``{options, hostname}``: the name nova-compute gives its
    compute node and root provider (``LibvirtDriver.get_nodenames_by_uuid``,
    what the resource tracker names the provider) with libvirt answering
    ``hostname`` to getHostname, and ``CONF.host`` (the service's name)."""
    from nova.virt.libvirt import host as libvirt_host

    fakelibvirt = _fakelibvirt()
    saved = (libvirt_driver.libvirt, libvirt_host.libvirt)
    libvirt_driver.libvirt = libvirt_host.libvirt = fakelibvirt

    def one(case):
        _configure(case["options"])
        drv = libvirt_driver.LibvirtDriver(object(), read_only=True)
        drv._host._wrapped_conn = fakelibvirt.Connection(
            "qemu:///system", readonly=True, hostname=case["hostname"]
        )
        drv._host._node_uuid = "00000000-0000-0000-0000-000000000001"
        [name] = drv.get_nodenames_by_uuid().values()
        assert drv.get_available_nodes() == [name]
        return {"node": name, "service": CONF.host}

    try:
        return _each(cases, one)
    finally:
        libvirt_driver.libvirt, libvirt_host.libvirt = saved
        _configure({})


def capability_trait_names():
    """Every trait of nova's ``CAPABILITY_TRAITS_MAP``, sorted."""
    return sorted(set(virt_driver.CAPABILITY_TRAITS_MAP.values()))


def test_data_dir():
    """Where the nova wheel keeps its provider.yaml test data."""
    import os

    import nova.tests.unit.compute as pkg

    return os.path.join(os.path.dirname(pkg.__file__), "provider_config_data")


# The namespaces nova's own sample config is generated from
# (etc/nova/nova-config-generator.conf), where installed.
NOVA_CONFIG_NAMESPACES = (
    "nova.conf",
    "keystonemiddleware.auth_token",
    "oslo.log",
    "oslo.messaging",
    "oslo.policy",
    "oslo.privsep",
    "oslo.service.periodic_task",
    "oslo.service.service",
    "oslo.db",
    "oslo.cache",
    "oslo.middleware",
    "oslo.concurrency",
    "oslo.reports",
    "oslo.versionedobjects",
    "os_vif",
    "castellan.config",
    "oslo.limit",
    "os_brick",
)


def option_names():
    """{section: sorted option names} of a nova.conf, deprecated names included."""
    from oslo_config import generator

    names = {}
    for _namespace, groups in generator._list_opts(NOVA_CONFIG_NAMESPACES):
        for group, opts in groups:
            section = getattr(group, "name", group) or "DEFAULT"
            bucket = names.setdefault(section, set())
            for opt in opts:
                bucket.add(opt.dest)
                bucket.add(opt.name.replace("-", "_"))
                for old in opt.deprecated_opts:
                    if old.name and old.group in (None, section):
                        bucket.add(old.name.replace("-", "_"))
    return {section: sorted(opts) for section, opts in sorted(names.items())}


def local_disk(paths):
    """Per nova.conf path: what ``LibvirtDriver._get_local_gb_info`` sizes
    as DISK_GB with that file loaded by nova's ``CONF``: ``["fs", path]``
    (the filesystem of ``instances_path``), ``["lvm", volume group]`` or
    ``["rbd", pool]``. The three sizing calls are replaced by recorders: the
    choice, and the paths resolved from the file, are nova's."""
    from unittest import mock

    def one(path):
        CONF(["--config-file", path], project="nova", default_config_files=[])
        seen = []

        def fs_info(where):
            seen.append(["fs", where])
            return {"total": 0, "free": 0, "used": 0}

        def vg_info(group):
            seen.append(["lvm", group])
            return {"total": 0, "free": 0, "used": 0}

        def rbd_driver():
            seen.append(["rbd", CONF.libvirt.images_rbd_pool])
            return mock.Mock(get_pool_info=lambda: {"total": 0, "free": 0, "used": 0})

        with (
            mock.patch.object(libvirt_driver.libvirt_utils, "get_fs_info", fs_info),
            mock.patch.object(libvirt_driver.lvm, "get_volume_group_info", vg_info),
            mock.patch.object(libvirt_driver.rbd_utils, "RBDDriver", rbd_driver),
        ):
            libvirt_driver.LibvirtDriver._get_local_gb_info()
        [choice] = seen
        return choice

    try:
        return _each(paths, one)
    finally:
        CONF([], project="nova", default_config_files=[])


# The capability traits the resource tracker adds on the root
# (``ComputeDriver.capabilities_as_traits``): reported apart, so the agent
# side can tell them from the driver's.
_DRIVER_HOSTS = {}


def _fakelibvirt():
    """nova's fake libvirt, importable without ``nova.tests.fixtures``'s
    ``__init__`` (which needs test-only packages .venv-nova lacks)."""
    import os
    import types

    import nova.tests

    if "nova.tests.fixtures" not in sys.modules:
        package = types.ModuleType("nova.tests.fixtures")
        package.__path__ = [os.path.join(os.path.dirname(nova.tests.__file__), "fixtures")]
        sys.modules["nova.tests.fixtures"] = package
    from nova.tests.fixtures import libvirt as fakelibvirt

    return fakelibvirt


def _set_conf(conf):
    """``{group: {name: value}}`` onto nova's CONF; returns an undo."""
    done = []
    for group, values in conf.items():
        for name, value in values.items():
            grp = None if group == "DEFAULT" else group
            CONF.set_override(name, value, group=grp)
            done.append((name, grp))

    def undo():
        for name, grp in done:
            CONF.clear_override(name, group=grp)

    return undo


def _fake_host(fakelibvirt, case):
    spec = case["host"]
    info = fakelibvirt.HostInfo(
        cpu_nodes=spec.get("cpu_nodes", 1),
        cpu_sockets=spec.get("cpu_sockets", 1),
        cpu_cores=spec.get("cpu_cores", 2),
        cpu_threads=spec.get("cpu_threads", 1),
        kB_mem=spec.get("kB_mem", 16780000),
    )
    if spec.get("arch"):
        info.arch = spec["arch"]
        _complete_host_template(fakelibvirt, spec["arch"])
    pci = case.get("pci")
    pci_info = fakelibvirt.HostPCIDevicesInfo(**pci) if pci else None
    mdev_info = None
    if case.get("mdevs"):
        mdev_info = fakelibvirt.HostMdevDevicesInfo(
            devices={
                name: fakelibvirt.FakeMdevDevice(dev_name=name, type_id=t, parent=parent)
                for name, (t, parent) in case["mdevs"].items()
            }
        )
    conn = fakelibvirt.Connection(
        "qemu:///system",
        version=spec.get("libvirt_version", fakelibvirt.FAKE_LIBVIRT_VERSION),
        hv_version=spec.get("qemu_version", fakelibvirt.FAKE_QEMU_VERSION),
        host_info=info,
        pci_info=pci_info,
        mdev_info=mdev_info,
    )
    corpus = case.get("corpus")
    if corpus:
        # A host of the corpus: libvirt's own capabilities for its sysfs
        # tree, and the CPU map and memory of that tree (driver_host).
        # ``with_qemu``: libvirt's test formats the host part only; a
        # libvirtd with QEMU installed adds its <guest> elements (nova's).
        info.arch = corpus["arch"]
        xml = corpus["capabilities"]
        if corpus.get("with_qemu"):
            guests = "".join(fakelibvirt.fake_libvirt_data.CAPABILITIES_GUEST.values())
            xml = xml.replace("</capabilities>", guests + "</capabilities>")
        conn.getCapabilities = lambda: xml
        if corpus.get("baseline"):
            conn.baselineCPU = _captured_baseline(conn.baselineCPU, xml, corpus["baseline"])
        conn.getCPUMap = lambda: tuple(corpus["cpu_map"])
        conn.getInfo = lambda: list(corpus["info"])
    for method in case.get("refuse", ()):
        # A libvirt without this call (VIR_ERR_NO_SUPPORT), as older ones.
        def refuse(*_a, _m=method, **_k):
            raise fakelibvirt.make_libvirtError(
                fakelibvirt.libvirtError,
                f"this function is not supported by the connection driver: {_m}",
                error_code=fakelibvirt.VIR_ERR_NO_SUPPORT,
            )

        setattr(conn, method, refuse)
    return info, conn


def _captured_baseline(fake, capabilities, expanded):
    """baselineCPU answering for the host's own CPU model what the real
    libvirtd answered (``expanded``); any other model as the fake does."""
    import xml.etree.ElementTree as ET

    host_model = ET.fromstring(capabilities).findtext("host/cpu/model")

    def baseline(cpus, flags=0):
        models = {ET.fromstring(cpu).findtext("model") for cpu in cpus}
        return expanded if models == {host_model} else fake(cpus, flags)

    return baseline


def _complete_host_template(fakelibvirt, arch):
    """Some of fakelibvirt's host templates (ARMv7: "incomplete", its note
    says) lack the NUMA topology every libvirt reports; nova's driver then
    cannot start on them. Give them the x86_64 template's ``<topology>``
    and ``<cpu>`` shape, keeping their own ``<arch>``."""
    import re

    data = sys.modules[fakelibvirt.__name__.replace("libvirt", "libvirt_data")]
    template = data.CAPABILITIES_HOST_TEMPLATES.get(arch)
    if template is None or "%(topology)s" in template:
        return
    own_arch = re.search(r"<arch>([^<]*)</arch>", template).group(1)
    x86 = data.CAPABILITIES_HOST_TEMPLATES["x86_64"]
    host_cpu = re.search(r"<cpu>.*?</cpu>", x86, re.S).group(0)
    host_cpu = re.sub(r"<arch>[^<]*</arch>", f"<arch>{own_arch}</arch>", host_cpu)
    host_cpu = re.sub(r"\s*<(model|vendor|feature)[^>]*>[^<]*(</\1>)?", "", host_cpu)
    host_cpu = re.sub(r"\s*<feature [^>]*/>", "", host_cpu)
    topology = re.search(r"\s*%\(topology\)s", x86).group(0)
    data.CAPABILITIES_HOST_TEMPLATES[arch] = re.sub(
        r"<cpu>.*?</cpu>", lambda _m: host_cpu + topology, template, flags=re.S
    )


def _ndctl_list(names):
    """``ndctl list -X`` for devdax namespaces of these names (what nova's
    privsep reads), one 128 GiB namespace each."""
    return json.dumps(
        [
            {
                "dev": f"namespace0.{i}",
                "mode": "devdax",
                "size": 128 * 1024**3,
                "name": name,
                "daxregion": {"id": 0, "align": 2097152, "devices": [{"chardev": f"dax0.{i}"}]},
            }
            for i, name in enumerate(names)
        ]
    )


def _uname(arch):
    import os

    return os.uname_result(("Linux", "fixture", "6.1.0", "", arch))


def _topology(info):
    """The fake host's cells as the agent's sysfs needs them."""
    cells = []
    for cell in info.numa_topology.cells:
        cells.append(
            {
                "id": cell.id,
                "memory_kb": cell.memory,
                "cpus": [
                    {
                        "id": cpu.id,
                        "socket": cpu.socket_id,
                        "core": cpu.core_id,
                        "siblings": sorted(cpu.siblings or {cpu.id}),
                    }
                    for cpu in cell.cpus
                ],
            }
        )
    return cells


def whole_driver(cases):
    """Per case ``{name, host: HostInfo arguments, conf: {group: {name:
    value}}, instances_path, image_cache_files?, pci?, mdevs?, refuse?}``:
    nova's whole libvirt driver on nova's fake libvirt — ``init_host``, then
    ``update_provider_tree`` on a tree with the root ``fixture``, then the
    traits the resource tracker adds on the root. Answers ``{providers:
    [{name, parent, inventories, traits}], tracker_traits, topology,
    memory_kb}``; the fake connection stays for :func:`libvirt_call`."""
    from unittest import mock

    fakelibvirt = _fakelibvirt()
    from nova import objects
    from nova.virt import fake as fake_virt

    objects.register_all()
    nova.conf.devices.register_dynamic_opts(CONF)
    real_fs_info = libvirt_utils.get_fs_info

    def one(case):
        info, conn = _fake_host(fakelibvirt, case)
        _DRIVER_HOSTS[case["name"]] = (conn, info.arch)
        CONF.set_override("instances_path", case["instances_path"])
        # [devices] enabled_mdev_types names the [mdev_*] sections nova reads.
        types = case["conf"].get("devices", {}).get("enabled_mdev_types", [])
        CONF.set_override("enabled_mdev_types", types, group="devices")
        nova.conf.devices.register_dynamic_opts(CONF)
        undo = _set_conf(case["conf"])
        try:
            with (
                mock.patch("nova.virt.libvirt.host.Host.get_connection", return_value=conn),
                mock.patch(
                    "nova.virt.libvirt.host.Host._has_cgroupsv1_cpu_controller",
                    return_value=True,
                ),
                mock.patch.object(libvirt_utils, "get_fs_info", real_fs_info),
                mock.patch("nova.privsep.utils.supports_direct_io", return_value=True),
                mock.patch("os.uname", return_value=_uname(info.arch)),
                mock.patch(
                    "nova.privsep.libvirt.get_pmem_namespaces",
                    return_value=_ndctl_list(case.get("pmem", ())),
                ),
                # A new host: no compute node record with a NUMA topology,
                # so no PCPU reshape to ask the database about.
                mock.patch.object(
                    objects.ComputeNode,
                    "get_by_nodename",
                    return_value=objects.ComputeNode(numa_topology=None),
                ),
            ):
                drvr = libvirt_driver.LibvirtDriver(fake_virt.FakeVirtAPI(), False)
                drvr.init_host("fixture")
                tree = nova_provider_tree.ProviderTree()
                tree.new_root("fixture", "00000000-0000-0000-0000-000000000001")
                drvr.update_provider_tree(tree, "fixture")
                from types import SimpleNamespace as Namespace

                # The resource tracker's _get_traits, on a PCI tracker with no
                # remote-managed device pools (the fixture hosts have none).
                rt = object.__new__(ResourceTracker)
                rt.driver = drvr
                rt.pci_tracker = Namespace(
                    pci_stats=Namespace(has_remote_managed_device_pools=lambda: False)
                )
                rt._sync_compute_service_disabled_trait = lambda _context, _traits: None
                merged = nova_provider_tree.ProviderTree()
                merged.new_root("node", "00000000-0000-0000-0000-000000000001")
                kept = set(rt._get_traits(None, "node", merged))
                tracker = {trait: trait in kept for trait in drvr.capabilities_as_traits()}
                providers = []
                for uuid in tree.get_provider_uuids():
                    data = tree.data(uuid)
                    parent = tree.data(data.parent_uuid).name if data.parent_uuid else None
                    providers.append(
                        {
                            "name": data.name,
                            "parent": parent,
                            "inventories": data.inventory,
                            "traits": sorted(data.traits),
                        }
                    )
            return {
                "providers": providers,
                "tracker_traits": tracker,
                "topology": _topology(info),
                "memory_kb": info.kB_mem,
                "arch": info.arch,
            }
        finally:
            undo()
            CONF.clear_override("instances_path")
            CONF.clear_override("enabled_mdev_types", group="devices")

    def each(case):
        # The host's facts even when nova refuses: the agent runs on it too.
        info, _conn = _fake_host(fakelibvirt, case)
        facts = {"topology": _topology(info), "memory_kb": info.kB_mem, "arch": info.arch}
        try:
            return {"value": one(case)}
        except Exception as exc:  # nova refusing to start is an answer
            return dict(_refusal(exc), host=facts)

    with fakelibvirt.LibvirtFixture():
        return [each(case) for case in cases]


def libvirt_call(host, method, args):
    """``method(*args)`` on the fake connection of :func:`whole_driver`'s
    case ``host``: the agent's libvirt answers are the ones nova had. Node
    devices answer by name (``XMLDesc``); a libvirt error answers
    ``{"libvirt_error": [code, message]}``."""
    from unittest import mock

    fakelibvirt = _fakelibvirt()
    conn, arch = _DRIVER_HOSTS[host]
    try:
        with mock.patch("os.uname", return_value=_uname(arch)):
            return _libvirt_answer(fakelibvirt, conn, method, args)
    except fakelibvirt.libvirtError as exc:
        return {"libvirt_error": [exc.get_error_code(), str(exc)]}


def _libvirt_answer(fakelibvirt, conn, method, args):
    if method == "nodeDeviceXMLDesc":
        return {"value": conn.nodeDeviceLookupByName(args[0]).XMLDesc(0)}
    value = getattr(conn, method)(*args)
    if method == "listAllDomains":
        value = [[dom.XMLDesc(0), bool(dom.isActive())] for dom in value]
    if isinstance(value, (set, frozenset, type({}.keys()))):
        value = sorted(value)
    return {"value": value}


def pci_placement(cases):
    """Per case ``{device_spec: [json], devices: [{address, vendor_id,
    product_id, dev_type, parent_addr?, instance_uuid?}], held: [{name, rc,
    total, reserved?, traits}], allocations: {consumer: {provider name:
    {rc: n}}}}``: nova's ``update_provider_tree_for_pci`` with
    ``report_in_placement`` on a tree whose root is ``compute1`` and holds
    the ``held`` children, over a PCI tracker holding the devices (as nova's
    tracker does: those a spec matches, and allocated ones it keeps), with
    nova's own ``Whitelist``. ``is_physical_function`` answers from the
    devices, as sysfs would; ``report_in_placement`` (default true) as given.
    Answers ``{children: [{name, inventories, traits}], healed}`` (healed:
    nova changed the allocations, adding the PCI ones its tracker has and
    Placement lacks) or nova's refusal."""
    from types import SimpleNamespace as Namespace
    from unittest import mock

    from nova import objects
    from nova.compute import pci_placement_translator as ppt
    from nova.pci import whitelist

    objects.register_all()

    def one(case):
        pfs = {d["address"] for d in case["devices"] if d["dev_type"] == "type-PF"}

        def is_pf(domain, bus, slot, function):
            return f"{domain}:{bus}:{slot}.{function}" in pfs

        CONF.set_override("report_in_placement", case.get("report_in_placement", True), group="pci")
        CONF.set_override("device_spec", case["device_spec"], group="pci")
        try:
            with mock.patch("nova.pci.utils.is_physical_function", is_pf):
                dev_filter = whitelist.Whitelist(CONF.pci.device_spec)
                devs = []
                for d in case["devices"]:
                    dev = objects.PciDevice(
                        address=d["address"],
                        vendor_id=d["vendor_id"],
                        product_id=d["product_id"],
                        dev_type=d["dev_type"],
                        parent_addr=d.get("parent_addr"),
                        instance_uuid=d.get("instance_uuid"),
                        status="allocated" if d.get("instance_uuid") else "available",
                        extra_info={},
                    )
                    if d.get("instance_uuid") or dev_filter.get_devspec(dev):
                        devs.append(dev)
                tracker = Namespace(
                    pci_devs=devs,
                    dev_filter=dev_filter,
                    stats=Namespace(populate_pools_metadata_from_assigned_devices=lambda: None),
                )
                tree = nova_provider_tree.ProviderTree()
                tree.new_root("compute1", "00000000-0000-0000-0000-000000000001")
                uuids = {"compute1": "00000000-0000-0000-0000-000000000001"}
                for n, held in enumerate(case.get("held", ())):
                    uuids[held["name"]] = f"00000000-0000-0000-0001-{n:012d}"
                    tree.new_child(held["name"], "compute1", uuid=uuids[held["name"]])
                    record = {"total": held["total"], "max_unit": held["total"]}
                    record["reserved"] = held.get("reserved", 0)
                    tree.update_inventory(held["name"], {held["rc"]: record})
                    tree.update_traits(held["name"], held["traits"])
                allocations = {
                    consumer: {
                        "allocations": {
                            uuids[name]: {"resources": resources}
                            for name, resources in by_rp.items()
                        }
                    }
                    for consumer, by_rp in case.get("allocations", {}).items()
                }
                healed = ppt.update_provider_tree_for_pci(
                    tree, "compute1", tracker, allocations, []
                )
            children = []
            for uuid in tree.get_provider_uuids():
                data = tree.data(uuid)
                if data.parent_uuid:
                    children.append(
                        {
                            "name": data.name,
                            "inventories": data.inventory,
                            "traits": sorted(data.traits),
                        }
                    )
            return {"children": children, "healed": bool(healed)}
        finally:
            CONF.clear_override("report_in_placement", group="pci")
            CONF.clear_override("device_spec", group="pci")

    return _each(cases, one)


def pci_device_specs(cases):
    """Per case ``{spec: json, devices: [{address, vendor_id, product_id,
    parent_addr?}], pfs: [address], netdevs: {ifname: address}}``: nova's
    ``Whitelist`` of that one ``[pci] device_spec`` value (an object or a
    list of them), then per device the index of the first spec whose
    ``PciDeviceSpec.match`` takes it (``Whitelist.device_assignable``), or
    None. sysfs is answered from the case: ``is_physical_function`` from
    ``pfs``, ``get_function_by_ifname`` from ``netdevs`` (a PF's interface
    says so, as sriov_totalvfs would). Answers the indexes, or nova's
    refusal of the value."""
    from unittest import mock

    from nova.pci import whitelist

    def one(case):
        pfs = set(case["pfs"])

        def is_pf(domain, bus, slot, function):
            return f"{domain}:{bus}:{slot}.{function}" in pfs

        def by_ifname(ifname):
            address = case["netdevs"].get("%s" % (ifname,))
            return address, address in pfs

        with (
            mock.patch("nova.pci.utils.is_physical_function", is_pf),
            mock.patch("nova.pci.utils.get_function_by_ifname", by_ifname),
        ):
            specs = whitelist.Whitelist([case["spec"]]).specs
            return [
                next(
                    (n for n, spec in enumerate(specs) if spec.match({"parent_addr": None, **d})),
                    None,
                )
                for d in case["devices"]
            ]

    return _each(cases, one)


def version():
    import importlib.metadata

    return importlib.metadata.version("nova")


OPS = {
    f.__name__: f
    for f in (
        parse_cpu_spec,
        cpu_sets,
        ratios,
        provider_configs,
        merge_provider_configs,
        cpu_traits,
        static_traits,
        cpu_mode_traits,
        mem_encryption_children,
        capability_traits,
        capability_trait_names,
        node_names,
        test_data_dir,
        option_names,
        local_disk,
        whole_driver,
        libvirt_call,
        pci_placement,
        pci_device_specs,
        version,
    )
}


def main():
    for line in sys.stdin:
        try:
            request = json.loads(line)
            answer = {"ok": OPS[request["op"]](**request.get("args", {}))}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
