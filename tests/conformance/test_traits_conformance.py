"""Traits parity with nova 34: the static hypervisor traits on libvirt's own
captured domain capabilities, the CPU feature traits under a table of
``[libvirt] cpu_mode`` / ``cpu_models`` / ``cpu_model_extra_flags``, and the
memory-encryption (AMD SEV) child providers.

Both sides get the same libvirt answers: the domain capabilities XML from
``domaincapsdata`` (nova parses it with its own config classes), and for
the CPU modes what real libvirt (the test driver, which runs libvirt's own
cpu_map code) answers to baselineCPU and getCPUModelNames.
"""

from __future__ import annotations

import re

import os_traits
import pytest

from node_agent.config.settings import load_settings
from node_agent.errors import ConfigError
from node_agent.host.capabilities import parse_cpu_model_xml
from node_agent.host.domain_capabilities import parse_domain_capabilities
from node_agent.host.hypervisor import Hypervisor
from node_agent.host.hypervisor_info import tdx_capacity
from node_agent.host.libvirt_facts import cpu_model_xml, guest_cpu_models
from node_agent.host.sysfs import SysFS
from node_agent.model.snapshot import HostCpuModel, HypervisorInfo
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT
from node_agent.tree.build import capability_settings, trait_settings
from node_agent.tree.capability_traits import capability_traits
from node_agent.tree.cpu_traits import guest_cpu_traits
from node_agent.tree.hypervisor_traits import hypervisor_traits
from node_agent.tree.mem_encryption import (
    TdxSettings,
    host_mem_encryption,
    mem_encryption_children,
)
from tests.conformance import agent_side
from tests.conformance.differences import UNCLASSIFIED, Observed, check
from tests.hostdata import HOSTDATA

MEC = "MEM_ENCRYPTION_CONTEXT"

DOMCAPS = HOSTDATA / "domaincapsdata"
CPUS = HOSTDATA / "cputestdata"
LIBVIRT_VERSION = (9, 0, 0)  # Debian bookworm's, the agent's pin


def _qemu_version(path) -> tuple[int, int, int]:
    major, minor, micro = re.match(r"qemu_(\d+)\.(\d+)\.(\d+)", path.name).groups()
    return int(major), int(minor), int(micro)


def _static_cases() -> list[tuple[str, dict]]:
    files = sorted(DOMCAPS.glob("*.xml"))
    assert files, f"no domain capabilities under {DOMCAPS}"
    option_sets = ({}, {"swtpm_enabled": True}, {"virt_type": "qemu"})
    cases = []
    for path in files:
        xml = path.read_text()
        caps = parse_domain_capabilities(xml)
        for options in option_sets:
            for libvirt_version in (LIBVIRT_VERSION, (10, 4, 0)):
                cases.append(
                    (
                        f"{path.name} {options} libvirt {libvirt_version}",
                        {
                            "options": options,
                            "host_arch": caps.arch,
                            "domain_caps": {caps.arch: {caps.machine: xml}},
                            "libvirt_version": libvirt_version,
                            "qemu_version": _qemu_version(path),
                        },
                    )
                )
    # One host emulating several architectures: x86_64 KVM plus TCG guests.
    several = {}
    for name in (
        "qemu_8.2.0-q35.x86_64.xml",
        "qemu_10.0.0-virt.aarch64.xml",
        "qemu_10.0.0.s390x.xml",
        "qemu_10.0.0.ppc64.xml",
    ):
        xml = (DOMCAPS / name).read_text()
        caps = parse_domain_capabilities(xml)
        several.setdefault(caps.arch, {})[caps.machine] = xml
    for options in ({}, {"swtpm_enabled": True}):
        cases.append(
            (
                f"x86_64 host emulating 4 archs {options}",
                {
                    "options": options,
                    "host_arch": "x86_64",
                    "domain_caps": several,
                    "libvirt_version": LIBVIRT_VERSION,
                    "qemu_version": (8, 2, 0),
                },
            )
        )
    return cases


def _hypervisor_info(case: dict, **kwargs) -> HypervisorInfo:
    """The case's libvirt and QEMU versions and every domain capabilities
    document it gives, as the agent's discovery returns them."""
    caps = tuple(
        parse_domain_capabilities(xml)
        for machines in case["domain_caps"].values()
        for xml in machines.values()
    )
    return HypervisorInfo(
        tuple(case["libvirt_version"]), tuple(case["qemu_version"]), caps, **kwargs
    )


def _agent_static(case: dict) -> dict[str, bool]:
    settings = agent_side.settings(case["options"])
    info = _hypervisor_info(case)
    return hypervisor_traits(info, trait_settings(settings), case["host_arch"])


def _static_difference(case: dict, trait: str) -> str:
    if trait in ("COMPUTE_SECURITY_TPM_2_0", "COMPUTE_SECURITY_TPM_1_2"):
        native = [
            parse_domain_capabilities(xml)
            for xml in case["domain_caps"].get(case["host_arch"], {}).values()
        ]
        if native and not native[0].tpm_supported:
            return "tpm-unsupported-versions-assumed"
    return UNCLASSIFIED + " trait"


def test_static_traits_match_nova_on_libvirts_domain_capabilities(nova):
    cases = _static_cases()
    theirs_all = nova.call("static_traits", cases=[case for _n, case in cases])
    observed = Observed("static_traits", cases=len(cases))
    for (name, case), answer in zip(cases, theirs_all):
        assert "value" in answer, f"{name}: nova refused: {answer}"
        theirs, ours = answer["value"], _agent_static(case)
        for trait in sorted(set(theirs) | set(ours)):
            if bool(theirs.get(trait)) != bool(ours.get(trait)):
                observed.add(
                    _static_difference(case, trait),
                    f"{name}: {trait} nova {theirs.get(trait)}, agent {ours.get(trait)}",
                )
    check(observed)


# ------------------------------------------------------------ cpu_mode

CPU_SETTINGS = [
    {},
    {"cpu_mode": "host-model"},
    {"cpu_mode": "host-passthrough"},
    {"cpu_mode": "host-model", "cpu_model_extra_flags": ["pdpe1gb", "+AVX512F"]},
    {"cpu_mode": "host-passthrough", "cpu_model_extra_flags": ["-pcid"]},
    {"cpu_mode": "custom", "cpu_models": ["Haswell-noTSX"]},
    {"cpu_mode": "custom", "cpu_models": ["haswell-notsx"]},
    {"cpu_mode": "custom", "cpu_models": ["SandyBridge", "IvyBridge", "Broadwell-noTSX"]},
    {"cpu_mode": "custom", "cpu_models": ["Nehalem"], "cpu_model_extra_flags": ["+avx", "-sse4.2"]},
    {"cpu_mode": "custom", "cpu_models": ["EPYC"]},
    {"cpu_mode": "none"},
    {"cpu_mode": "none", "cpu_model_extra_flags": ["+avx2"]},
    # refused by both
    {"cpu_mode": "custom"},
    {"cpu_mode": "host-model", "cpu_models": ["Haswell"]},
    {"cpu_models": ["Haswell"]},
    {"cpu_mode": "custom", "cpu_models": ["NoSuchCPU"]},
]


@pytest.fixture(scope="module")
def libvirt_test_driver():
    hypervisor = Hypervisor("test:///default")
    yield hypervisor
    hypervisor.close()


def _host_cpu(hypervisor, path) -> HostCpuModel:
    """The host CPU as the agent reads it: listed plus implied features."""
    xml = path.read_text()
    listed = parse_cpu_model_xml(xml)
    expanded = parse_cpu_model_xml(hypervisor.expand_cpu_features(xml))
    return HostCpuModel("x86_64", listed.model, listed.vendor, listed.features | expanded.features)


def _capabilities_xml(host: HostCpuModel) -> str:
    features = "".join(f"<feature name='{name}'/>" for name in sorted(host.features))
    return (
        f"<capabilities><host><cpu><arch>{host.arch}</arch><model>{host.model}</model>"
        f"<vendor>{host.vendor}</vendor>{features}</cpu></host></capabilities>"
    )


def _agent_cpu_traits(hypervisor, host: HostCpuModel, options: dict):
    settings = load_settings(agent_side.agent_conf(options))
    models = guest_cpu_models(hypervisor, host, settings)
    return guest_cpu_traits(settings.cpu_mode, host, models, settings.cpu_model_extra_flags)


def _cpu_case(hypervisor, host: HostCpuModel, options: dict) -> dict:
    """What nova's side needs: the host, and libvirt's answers for every
    model it may ask about (the configured ones and the arch default)."""
    names = hypervisor.cpu_model_names("x86_64")
    by_lower = {name.lower(): name for name in names}
    wanted = {
        by_lower[m.lower()] for m in options.get("cpu_models", ()) if m.lower() in by_lower
    } | {"qemu64"}
    baseline = {
        model: hypervisor.expand_cpu_features(cpu_model_xml(host.arch, model, host.vendor))
        for model in sorted(wanted)
    }
    return {
        "options": options,
        "host_arch": "x86_64",
        "capabilities_xml": _capabilities_xml(host),
        "model_names": names,
        "baseline": baseline,
        "libvirt_version": LIBVIRT_VERSION,
        "qemu_version": (8, 2, 0),
    }


# Traits compared: those nova's table decides. The agent's wider table and
# libvirt's "pni" for SSE3 are the cpu_traits area's listed differences.
_NOT_COMPARED = {"HW_CPU_X86_SSE3"}


def _cpu_difference(options: dict, trait: str, theirs) -> str:
    _enabled, disabled = (
        {
            f.lstrip("+").lower()
            for f in options.get("cpu_model_extra_flags", ())
            if not f.startswith("-")
        },
        {f[1:].lower() for f in options.get("cpu_model_extra_flags", ()) if f.startswith("-")},
    )
    if theirs and disabled and options.get("cpu_mode") != "none":
        return "cpu-extra-flag-disabled"
    return UNCLASSIFIED + " trait"


def test_cpu_traits_follow_cpu_mode_as_nova_on_every_cputestdata_host(nova, libvirt_test_driver):
    hosts = [
        (path.stem, _host_cpu(libvirt_test_driver, path)) for path in sorted(CPUS.glob("*.xml"))
    ]
    assert hosts, f"no CPU model under {CPUS}"
    cases = [
        (f"{name} {options}", host, options) for name, host in hosts for options in CPU_SETTINGS
    ]
    answers = nova.call(
        "cpu_mode_traits",
        cases=[_cpu_case(libvirt_test_driver, host, options) for _n, host, options in cases],
    )
    observed = Observed("cpu_mode", cases=len(cases))
    for (name, host, options), answer in zip(cases, answers):
        try:
            ours = _agent_cpu_traits(libvirt_test_driver, host, options)
        except ConfigError as exc:
            if "refused" not in answer:
                observed.add(UNCLASSIFIED + " agent refuses", f"{name}: agent {exc}, nova {answer}")
            continue
        if "refused" in answer:
            observed.add(UNCLASSIFIED + " nova refuses", f"{name}: nova {answer['refused']}")
            continue
        theirs = answer["value"]
        for trait in sorted(set(theirs) - _NOT_COMPARED):
            if bool(theirs[trait]) != bool(ours.get(trait)):
                observed.add(
                    _cpu_difference(options, trait, theirs[trait]),
                    f"{name}: {trait} nova {theirs[trait]}, agent {ours.get(trait)}",
                )
    check(observed)


# ------------------------------------------------------------ memory encryption

# nova reads these kvm_amd parameters from /sys/module/kvm_amd/parameters.
KERNELS = ((), ("sev",), ("sev", "sev_es"), ("sev", "sev_es", "sev_snp"))
# The options both sides get (num_memory_encrypted_guests is older nova's),
# with the kernel misc cgroup's misc.capacity (None: no such file).
MEM_OPTIONS = (
    ({}, None),
    ({"num_memory_encrypted_guests": 16}, None),
    ({"num_memory_encrypted_guests": 0}, None),
    ({"cpu_mode": "host-passthrough", "num_intel_tdx_guests": 8}, None),
    ({"cpu_mode": "host-passthrough"}, None),
    ({"cpu_mode": "host-passthrough"}, "sev 0\ntdx 32\n"),
    ({"cpu_mode": "host-passthrough", "num_intel_tdx_guests": 8}, "tdx 32\n"),
    ({"cpu_mode": "host-passthrough", "num_intel_tdx_guests": 64}, "tdx 32\n"),
    ({"cpu_mode": "host-passthrough"}, "tdx x\n"),
    ({"cpu_mode": "host-model", "num_intel_tdx_guests": 8}, "tdx 32\n"),
)


def _mem_cases() -> list[tuple[str, dict]]:
    sources = [(p.name, p.read_text()) for p in sorted(DOMCAPS.glob("*.xml"))]
    amd = (DOMCAPS / "qemu_10.0.0-q35.x86_64+amdsev.xml").read_text()
    # libvirt before 8.0 says SEV is supported but not for how many guests.
    sources.append(
        (
            "amdsev without maxGuests",
            amd.replace("<maxGuests>59</maxGuests>", "").replace(
                "<maxESGuests>450</maxESGuests>", ""
            ),
        )
    )
    cases = []
    for name, xml in sources:
        caps = parse_domain_capabilities(xml)
        for kvm_amd in KERNELS:
            for options, misc in MEM_OPTIONS:
                for qemu in ((7, 2, 0), (10, 0, 0)):
                    cases.append(
                        (
                            f"{name} kvm_amd={kvm_amd} {options} misc {misc!r} qemu {qemu}",
                            {
                                "options": options,
                                "host_arch": caps.arch,
                                "domain_caps": {caps.arch: {caps.machine: xml}},
                                "libvirt_version": LIBVIRT_VERSION,
                                "qemu_version": qemu,
                                "kvm_amd": list(kvm_amd),
                                "misc_capacity": misc,
                            },
                        )
                    )
    return cases


def _agent_mem(case: dict, tmp_path) -> dict:
    settings = agent_side.settings(case["options"])
    sysfs = tmp_path / "sys"
    if case["misc_capacity"] is not None:
        (sysfs / "fs" / "cgroup").mkdir(parents=True, exist_ok=True)
        (sysfs / "fs" / "cgroup" / "misc.capacity").write_text(case["misc_capacity"])
    info = _hypervisor_info(
        case, kvm_amd=frozenset(case["kvm_amd"]), tdx_capacity=tdx_capacity(SysFS(str(sysfs)))
    )
    offered = host_mem_encryption(
        info,
        case["host_arch"],
        settings.num_memory_encrypted_guests,
        TdxSettings(settings.cpu_mode, settings.num_intel_tdx_guests),
    )
    return {
        child.name: {
            "inventories": {rc: inv.as_placement() for rc, inv in child.inventories.items()},
            "traits": sorted(child.wanted_traits),
        }
        for child in mem_encryption_children("cn1", offered)
    }


def _mem_difference(case: dict, name: str, theirs, ours) -> str:
    if theirs and ours and theirs["inventories"] == ours["inventories"]:
        if set(ours["traits"]) ^ set(theirs["traits"]) == {AGENT_CHILD_TRAIT, "OWNER_NOVA"}:
            return "mem-encryption-owner-mark"
    if (
        name.endswith("_intel_tdx")
        and theirs
        and ours
        and case["options"].get("num_intel_tdx_guests", 0) > ours["inventories"][MEC]["total"]
    ):
        return "mem-encryption-tdx-above-cgroup"
    if case["options"].get("num_memory_encrypted_guests") is not None:
        return "mem-encryption-guest-limit"
    return UNCLASSIFIED + " child"


def test_mem_encryption_children_match_nova_on_libvirts_domain_capabilities(nova, tmp_path):
    cases = _mem_cases()
    answers = nova.call("mem_encryption_children", cases=[case for _n, case in cases])
    observed = Observed("mem_encryption", cases=len(cases))
    reported = 0
    tdx = 0
    for number, ((name, case), answer) in enumerate(zip(cases, answers)):
        ours = _agent_mem(case, tmp_path / f"case{number}")
        reported += bool(ours)
        tdx += any(child.endswith("_intel_tdx") for child in ours)
        if "refused" in answer:
            if "TypeError" in answer["refused"]:
                # nova formats a missing maxGuests with %d and fails every
                # cycle; the agent reports no child and says why (or
                # num_memory_encrypted_guests' count, older nova's fallback).
                observed.add("mem-encryption-no-guest-count", f"{name}: nova {answer}")
            else:
                observed.add(UNCLASSIFIED + " nova refuses", f"{name}: nova {answer}")
            continue
        theirs = answer["value"]
        for child in sorted(set(theirs) | set(ours)):
            if theirs.get(child) != ours.get(child):
                observed.add(
                    _mem_difference(case, child, theirs.get(child), ours.get(child)),
                    f"{name}: {child} nova {theirs.get(child)}, agent {ours.get(child)}",
                )
    assert reported > 0, "no case reported a memory-encryption child: the test proves nothing"
    assert tdx > 0, "no case reported an Intel TDX child: the test proves nothing for it"
    check(observed)


# ------------------------------------------------------------ capability traits

CAPABILITY_OPTIONS = (
    {},
    {"images_type": "rbd", "force_raw_images": False},
    {"images_type": "lvm"},
    {"images_type": "qcow2", "image_type_exclude_list": ["qcow2", "iso"]},
    {"virt_type": "qemu", "image_type_exclude_list": ["raw"]},
    {"file_backed_memory": 1024, "ram_allocation_ratio": 1.0, "reserved_host_memory_mb": 0},
)
CAPABILITY_LIBVIRTS = ((8, 0, 0), (8, 6, 0), (8, 7, 0))  # the thresholds nova checks


def _capability_cases() -> list[tuple[str, dict]]:
    sources = [
        (name, (DOMCAPS / name).read_text())
        for name in (
            "qemu_8.2.0-q35.x86_64.xml",
            "qemu_10.0.0-virt.aarch64.xml",
            "qemu_10.0.0.s390x.xml",
        )
    ]
    # Firmware without secure boot.
    q35 = (DOMCAPS / "qemu_8.2.0-q35.x86_64.xml").read_text()
    sources.append(
        (
            "q35 without secure boot",
            re.sub(r"(<enum name='secure'>\s*)<value>yes</value>", r"\1", q35),
        )
    )
    cases = []
    for name, xml in sources:
        caps = parse_domain_capabilities(xml)
        qemu = _qemu_version(DOMCAPS / name) if name.startswith("qemu_") else (8, 2, 0)
        for options in CAPABILITY_OPTIONS:
            for libvirt_version in CAPABILITY_LIBVIRTS:
                for uri in ("qemu:///system", "test:///default"):
                    cases.append(
                        (
                            f"{name} {options} libvirt {libvirt_version} {uri}",
                            {
                                "options": options,
                                "host_arch": caps.arch,
                                "domain_caps": {caps.arch: {caps.machine: xml}},
                                "libvirt_version": libvirt_version,
                                "qemu_version": qemu,
                                "uri": uri,
                            },
                        )
                    )
    return cases


def _agent_capabilities(case: dict) -> dict[str, bool]:
    settings = agent_side.settings(case["options"])
    info = _hypervisor_info(case, hv_type="QEMU" if case["uri"].startswith("qemu:") else "Test")
    return capability_traits(info, capability_settings(settings), case["host_arch"])


def _nova_decisions(before_none: list[str], before_all: list[str], every: set[str]):
    """nova's {trait: present?} from its answers on a root holding none and
    all of the map's traits: what it adds is True, what it removes False,
    what it leaves as found is not decided."""
    decided = {trait: True for trait in before_none}
    decided.update({trait: False for trait in every - set(before_all)})
    return decided


def test_capability_traits_match_nova_compute(nova):
    """The root's capability traits, nova's resource tracker merging its
    libvirt driver's capabilities, against the agent's on the same libvirt
    versions, URI, domain capabilities and nova.conf."""
    every = set(nova.call("capability_trait_names"))
    cases = _capability_cases()
    empty = nova.call("capability_traits", cases=[dict(c, traits=[]) for _n, c in cases])
    full = nova.call("capability_traits", cases=[dict(c, traits=sorted(every)) for _n, c in cases])
    observed = Observed("capability_traits", cases=len(cases))
    for (name, case), none_answer, all_answer in zip(cases, empty, full):
        assert "value" in none_answer, f"{name}: nova refused: {none_answer}"
        assert "value" in all_answer, f"{name}: nova refused: {all_answer}"
        theirs = _nova_decisions(none_answer["value"], all_answer["value"], every)
        ours = _agent_capabilities(case)
        ours[os_traits.COMPUTE_NODE] = True  # root_traits' own
        for trait in sorted((set(theirs) | set(ours)) - {os_traits.OWNER_NOVA}):
            if theirs.get(trait) != ours.get(trait):
                observed.add(
                    UNCLASSIFIED + " trait",
                    f"{name}: {trait} nova {theirs.get(trait)}, agent {ours.get(trait)}",
                )
    # nova adds COMPUTE_REMOTE_MANAGED_PORTS for remote-managed PCI devices
    # its PCI tracker pools; the agent does not track them.
    [pools] = nova.call("capability_traits", cases=[dict(cases[0][1], remote_managed=True)])
    if "COMPUTE_REMOTE_MANAGED_PORTS" in pools["value"]:
        observed.add(
            "capability-remote-managed-ports",
            f"{cases[0][0]} with remote-managed devices: nova adds it, the agent does not",
        )
    check(observed)
