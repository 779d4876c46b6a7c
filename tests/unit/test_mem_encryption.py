"""AMD SEV / SEV-ES / SEV-SNP and Intel TDX child providers (nova 34's
MEM_ENCRYPTION_CONTEXT layout) and their capacity rule, on libvirt's captured
domain capabilities."""

import dataclasses

import os_traits as ot
import pytest

from node_agent.errors import ParseError
from node_agent.host.domain_capabilities import parse_domain_capabilities
from node_agent.host.hypervisor_info import tdx_capacity
from node_agent.host.sysfs import SysFS
from node_agent.model.snapshot import HypervisorInfo
from node_agent.policy import capacity as cap
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT
from node_agent.tree.mem_encryption import (
    TdxSettings,
    host_mem_encryption,
    mem_encryption_children,
)
from tests.hostdata import HOSTDATA

DOMCAPS = HOSTDATA / "domaincapsdata"
AMD = (DOMCAPS / "qemu_10.0.0-q35.x86_64+amdsev.xml").read_text()
PLAIN = (DOMCAPS / "qemu_8.2.0-q35.x86_64.xml").read_text()
TDX = (DOMCAPS / "qemu_10.1.0-q35.x86_64+inteltdx.xml").read_text()
PASSTHROUGH = "host-passthrough"


def info(*xmls, kvm_amd=("sev", "sev_es"), qemu=(10, 0, 0)):
    return HypervisorInfo(
        (10, 0, 0), qemu, tuple(parse_domain_capabilities(x) for x in xmls), frozenset(kvm_amd)
    )


def test_sev_counts_and_launch_security_types_are_parsed():
    amd = parse_domain_capabilities(AMD)
    assert (amd.sev_max_guests, amd.sev_max_es_guests) == (59, 450)
    assert amd.launch_security == {"sev", "sev-snp"}
    plain = parse_domain_capabilities(PLAIN)
    assert (plain.sev_max_guests, plain.launch_security) == (None, frozenset())


def test_a_negative_sev_guest_count_is_a_parse_error():
    with pytest.raises(ParseError, match="maxGuests"):
        parse_domain_capabilities(AMD.replace("<maxGuests>59", "<maxGuests>-1"))


def test_sev_and_sev_es_children_carry_nova_names_inventory_and_traits():
    children = mem_encryption_children("cn1", host_mem_encryption(info(AMD), "x86_64"))
    assert [c.name for c in children] == ["cn1_amd_sev", "cn1_amd_sev_es"]
    sev, es = children
    assert sev.parent == "cn1"
    assert sev.inventories["MEM_ENCRYPTION_CONTEXT"].as_placement() == {
        "total": 59,
        "reserved": 0,
        "min_unit": 1,
        "max_unit": 1,
        "step_size": 1,
        "allocation_ratio": 1.0,
    }
    assert es.inventories["MEM_ENCRYPTION_CONTEXT"].total == 450
    # The agent's mark, not nova-compute's OWNER_NOVA: the agent writes them.
    assert sev.wanted_traits == {ot.HW_CPU_X86_AMD_SEV, AGENT_CHILD_TRAIT}
    assert es.wanted_traits == {ot.HW_CPU_X86_AMD_SEV_ES, AGENT_CHILD_TRAIT}


@pytest.mark.parametrize(
    "kvm_amd, qemu, models",
    [
        ((), (10, 0, 0), {}),  # kernel: SEV off
        (("sev",), (10, 0, 0), {"amd_sev": 59}),  # SEV-ES off in the kernel
        (("sev", "sev_es"), (7, 2, 0), {"amd_sev": 59}),  # QEMU before 8.0: no SEV-ES
        (
            ("sev", "sev_es", "sev_snp"),
            (10, 0, 0),  # SNP on: SEV-ES ignored
            {"amd_sev": 59, "amd_sev_snp": 450},
        ),
        (("sev_es",), (10, 0, 0), {}),  # SEV-ES needs SEV
    ],
)
def test_kernel_parameters_and_qemu_decide_the_models_as_nova(kvm_amd, qemu, models):
    offered = host_mem_encryption(info(AMD, kvm_amd=kvm_amd, qemu=qemu), "x86_64")
    assert offered.totals == models


def test_a_host_without_sev_or_off_x86_offers_nothing():
    assert host_mem_encryption(info(PLAIN), "x86_64").totals == {}
    assert host_mem_encryption(info(AMD), "aarch64").totals == {}


def test_without_domain_capabilities_the_children_are_not_decided():
    unread = HypervisorInfo((10, 0, 0), (10, 0, 0), None, frozenset({"sev"}))
    assert host_mem_encryption(unread, "x86_64") is None
    assert mem_encryption_children("cn1", None) == ()


def test_num_memory_encrypted_guests_caps_each_total_and_never_raises_one():
    assert host_mem_encryption(info(AMD), "x86_64", limit=16).totals == {
        "amd_sev": 16,
        "amd_sev_es": 16,
    }
    assert host_mem_encryption(info(AMD), "x86_64", limit=1000).totals == {
        "amd_sev": 59,
        "amd_sev_es": 450,
    }
    assert host_mem_encryption(info(AMD), "x86_64", limit=0).totals == {}


def test_sev_without_guest_counts_is_reported_only_with_the_option():
    old = AMD.replace("<maxGuests>59</maxGuests>", "").replace("<maxESGuests>450</maxESGuests>", "")
    offered = host_mem_encryption(info(old, kvm_amd=("sev",)), "x86_64")
    assert offered.totals == {} and "num_memory_encrypted_guests" in offered.warnings[0]
    assert host_mem_encryption(info(old, kvm_amd=("sev",)), "x86_64", limit=8).totals == {
        "amd_sev": 8
    }


# ------------------------------------------------------------ capacity rule


def _published(total, name="cn1_amd_sev", root=False):
    return cap.Published(
        name,
        root,
        {"MEM_ENCRYPTION_CONTEXT": {"total": total, "reserved": 0, "allocation_ratio": 1.0}},
    )


LIMITS = cap.HostLimits(cpus=1, memory_mb=1, disk_gb=1, mem_encryption=509)


def test_mem_encryption_context_within_the_firmwares_keys_passes():
    assert cap.check([_published(59), _published(450, "cn1_amd_sev_es")], LIMITS).ok


def test_mem_encryption_context_over_the_firmwares_keys_is_refused():
    verdict = cap.check([_published(59), _published(451, "cn1_amd_sev_es")], LIMITS)
    assert verdict.lines() == [
        "MEM_ENCRYPTION_CONTEXT: 510 schedulable units published "
        "(MEM_ENCRYPTION_CONTEXT on cn1_amd_sev, cn1_amd_sev_es) but the host has 509"
    ]


def test_mem_encryption_context_on_the_root_and_a_child_is_refused():
    # nova's pre-2025.2 layout left on the root next to the new child.
    verdict = cap.check([_published(15, "cn1", root=True), _published(59)], LIMITS)
    assert [v.rule for v in verdict.violations] == ["one level per class"]


def test_host_limits_count_sev_and_sev_es_keys_and_unknown_without_domain_caps():
    from node_agent.model.cpuset import CpuSet
    from node_agent.model.snapshot import HostSnapshot
    from node_agent.policy.partition import CpuPartition

    host = HostSnapshot(
        hostname="cn1",
        present=CpuSet(),
        online=CpuSet(),
        isolated=CpuSet(),
        cpus=(),
        nodes=(),
        memory_mb=1,
        disk_gb=1,
        hypervisor=info(AMD),
    )
    partition = CpuPartition(CpuSet(), CpuSet(), CpuSet(), CpuSet(), 0)
    assert cap.host_limits(host, partition).mem_encryption == 509
    unread = dataclasses.replace(host, hypervisor=HypervisorInfo((10, 0, 0), (10, 0, 0)))
    assert cap.host_limits(unread, partition).mem_encryption is None
    # Intel TDX: the kernel's keys count; without the kernel's count it is not known.
    tdx = dataclasses.replace(host, hypervisor=tdx_host(32))
    assert cap.host_limits(tdx, partition).mem_encryption == 32
    tdx = dataclasses.replace(host, hypervisor=tdx_host(None))
    assert cap.host_limits(tdx, partition).mem_encryption is None


# ------------------------------------------------------------ reshape rule


def test_host_rule_moves_root_mem_encryption_context_to_the_sev_child():
    from node_agent.model.cpuset import CpuSet
    from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
    from node_agent.model.snapshot import HostSnapshot
    from node_agent.placement.reshape_rules import host_rule, rule_provider_names

    host = HostSnapshot(
        hostname="cn1",
        present=CpuSet(),
        online=CpuSet(),
        isolated=CpuSet(),
        cpus=(),
        nodes=(),
        memory_mb=1,
        disk_gb=1,
    )
    child = Provider(
        "cn1_amd_sev",
        parent="cn1",
        uuid="child",
        inventories={"MEM_ENCRYPTION_CONTEXT": Inventory(59, max_unit=1)},
    )
    tree = ProviderTree((Provider("cn1", uuid="root"), child))
    rule = host_rule(tree, host, None)
    assert rule("guest", "root", "MEM_ENCRYPTION_CONTEXT", 1) == [
        ("child", "MEM_ENCRYPTION_CONTEXT", 1)
    ]
    assert rule("guest", "root", "MEMORY_MB", 512) == [("root", "MEMORY_MB", 512)]
    assert rule_provider_names(tree, host) == ["cn1", "cn1_amd_sev"]
    # Without the SEV child (SEV off, or SEV-SNP alone) nothing moves, as
    # nova refuses then; the usage guard keeps the root's inventory.
    alone = ProviderTree((Provider("cn1", uuid="root"),))
    assert host_rule(alone, host, None)("g", "root", "MEM_ENCRYPTION_CONTEXT", 1) == [
        ("root", "MEM_ENCRYPTION_CONTEXT", 1)
    ]


def test_undecided_children_are_kept_as_placement_holds_them_and_no_others():
    from node_agent.model.provider_tree import Provider, ProviderTree
    from node_agent.policy.child_owner import ListedChild
    from node_agent.tree.mem_encryption import keep_as_held, undecided

    record = {
        "total": 59,
        "reserved": 0,
        "min_unit": 1,
        "max_unit": 1,
        "step_size": 1,
        "allocation_ratio": 1.0,
    }
    held = [
        ListedChild("sev", "cn1_amd_sev", "root", frozenset(), {"MEM_ENCRYPTION_CONTEXT": record}),
        ListedChild("numa", "cn1_NUMA_0", "root", frozenset(), {}),
        ListedChild("other", "cn2_amd_sev", "elsewhere", frozenset(), {}),
    ]
    tree = ProviderTree((Provider("cn1"),))
    kept = keep_as_held(tree, "root", held)
    assert kept.names() == ["cn1", "cn1_amd_sev"]
    child = kept.by_name("cn1_amd_sev")
    assert child.uuid == "sev" and child.traits == {}
    assert child.inventories["MEM_ENCRYPTION_CONTEXT"].as_placement() == record
    assert keep_as_held(tree, None, held) is tree  # no root in Placement yet

    unread = HypervisorInfo((10, 0, 0), (10, 0, 0), None)
    assert undecided(type("Host", (), {"hypervisor": unread})())
    assert undecided(type("Host", (), {"hypervisor": None})())
    assert not undecided(type("Host", (), {"hypervisor": info(AMD)})())
    assert not undecided(object())  # the applier's host: the agent decided


def test_companion_drift_on_a_sev_child_names_what_decides_it():
    from node_agent.policy.drift import explain_inventory, explain_provider, explain_trait
    from tests.snapshots import settings

    for said in (
        explain_provider("cn1_amd_sev_es", "cn1"),
        explain_inventory("MEM_ENCRYPTION_CONTEXT", "total", settings()),
        explain_trait(ot.HW_CPU_X86_AMD_SEV),
    ):
        assert "num_memory_encrypted_guests" in said and "kvm_amd" in said


def tdx_host(capacity, xml=TDX):
    return dataclasses.replace(info(xml, kvm_amd=()), tdx_capacity=capacity)


def test_tdx_child_counts_the_kernels_keys_with_cpu_mode_host_passthrough():
    offered = host_mem_encryption(tdx_host(32), "x86_64", None, TdxSettings(PASSTHROUGH))
    [child] = mem_encryption_children("cn1", offered)
    assert child.name == "cn1_intel_tdx"
    assert child.inventories["MEM_ENCRYPTION_CONTEXT"].total == 32
    assert child.inventories["MEM_ENCRYPTION_CONTEXT"].max_unit == 1
    assert child.wanted_traits == {ot.HW_CPU_X86_INTEL_TDX, AGENT_CHILD_TRAIT}


@pytest.mark.parametrize(
    "mode, xml, arch",
    [
        ("host-model", TDX, "x86_64"),
        (None, TDX, "x86_64"),
        (PASSTHROUGH, PLAIN, "x86_64"),
        (PASSTHROUGH, TDX, "aarch64"),
    ],
)
def test_no_tdx_child_without_passthrough_libvirts_support_or_an_x86_host(mode, xml, arch):
    assert host_mem_encryption(tdx_host(32, xml), arch, None, TdxSettings(mode, 8)).totals == {}


def test_num_intel_tdx_guests_counts_where_the_kernel_does_not_and_never_raises_it():
    def total(kernel, option):
        offered = host_mem_encryption(
            tdx_host(kernel), "x86_64", None, TdxSettings(PASSTHROUGH, option)
        )
        return offered.totals.get("intel_tdx"), offered.warnings

    assert total(None, 8) == (8, ())
    assert total(32, 8) == (8, ())
    count, warnings = total(32, 64)
    assert count == 32 and "num_intel_tdx_guests = 64" in warnings[0]
    count, warnings = total(None, None)
    assert count is None and "num_intel_tdx_guests" in warnings[0]
    assert total(0, None) == (None, ())


@pytest.mark.parametrize(
    "text, expected",
    [("sev 0\ntdx 32\n", 32), ("sev 509\n", None), ("tdx x\n", None), (None, None)],
)
def test_the_tdx_count_is_the_misc_cgroups_tdx_line(tmp_path, text, expected):
    if text is not None:
        (tmp_path / "fs" / "cgroup").mkdir(parents=True)
        (tmp_path / "fs" / "cgroup" / "misc.capacity").write_text(text)
    assert tdx_capacity(SysFS(str(tmp_path))) == expected
