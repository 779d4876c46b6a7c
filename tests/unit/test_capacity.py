"""The capacity invariant (node_agent.policy.capacity), with literal values, no server."""

from __future__ import annotations

import dataclasses

import pytest

from node_agent.model.cpuset import parse_cpu_spec
from node_agent.model.snapshot import HugePagePool, MdevTypeInfo, NumaNode, PciGpu, SriovPf
from node_agent.policy.capacity import (
    HostLimits,
    Published,
    check,
    enforce,
    host_limits,
    published,
    units,
)
from node_agent.policy.partition import partition_cpus
from node_agent.tree.build import build_tree
from tests.hostdata import HOSTDATA, sysfs_trees, tree_name
from tests.snapshots import settings, snapshot

LIMITS = HostLimits(
    cpus=16,
    memory_mb=64000,
    disk_gb=500,
    hugepages={"CUSTOM_MEMORY_PAGE_2048": 1024},
    vgpus=8,
    vfs=16,
)


def rec(total, reserved=0, ratio=1.0):
    return {
        "total": total,
        "reserved": reserved,
        "min_unit": 1,
        "max_unit": total,
        "step_size": 1,
        "allocation_ratio": ratio,
    }


def root(**inv):
    return Published("host", True, inv)


def child(name, **inv):
    return Published(name, False, inv)


@pytest.mark.parametrize(
    "rc,record,expected",
    [
        ("VCPU", rec(16, 0, 4.0), 16),  # overcommit is the operator's business
        ("VCPU", rec(16, 2, 16.0), 14),
        ("MEMORY_MB", rec(64000, 512, 1.5), 63488),
        ("DISK_GB", rec(500, 0, 2.0), 500),
        ("PCPU", rec(16, 0, 1.0), 16),
        ("PCPU", rec(8, 0, 2.0), 16),  # exact class: the ratio counts
        ("VGPU", rec(4, 1, 1.0), 3),
        ("CUSTOM_MEMORY_PAGE_2048", rec(1024, 1024), 0),  # fully reserved: closed
        ("PCPU", rec(4, 9), 0),  # reserved above total: closed, not negative
    ],
)
def test_units_of_a_record(rc, record, expected):
    assert units(rc, record) == expected


@pytest.mark.parametrize(
    "tree",
    [
        [root(VCPU=rec(16, 0, 4.0), MEMORY_MB=rec(64000, 512), DISK_GB=rec(500))],
        [root(VCPU=rec(4, 0, 16.0), PCPU=rec(12), MEMORY_MB=rec(64000, 0, 1.5))],
        # bullet 1 after the fix: VCPU kept, no PCPU beside it
        [root(VCPU=rec(16, 0, 4.0))],
        # PCPU added but fully reserved: nothing the scheduler can take
        [root(VCPU=rec(16, 0, 4.0), PCPU=rec(16, 16))],
        # NUMA: root keeps disk, children split CPUs and memory; each pool's
        # memory (512 x 2 MiB) is reserved in its node's MEMORY_MB
        [
            root(DISK_GB=rec(500)),
            child(
                "host_NUMA_0",
                VCPU=rec(8, 0, 4.0),
                MEMORY_MB=rec(32000, 512 + 1024),
                CUSTOM_MEMORY_PAGE_2048=rec(512),
            ),
            child(
                "host_NUMA_1",
                PCPU=rec(8),
                MEMORY_MB=rec(32000, 1024),
                CUSTOM_MEMORY_PAGE_2048=rec(512),
            ),
        ],
        # pages and memory within the host together, even with nothing reserved
        [
            child("host_NUMA_0", MEMORY_MB=rec(30000), CUSTOM_MEMORY_PAGE_2048=rec(512)),
            child("host_NUMA_1", MEMORY_MB=rec(30000), CUSTOM_MEMORY_PAGE_2048=rec(512)),
        ],
        # an emptied child left behind (cannot be deleted yet) is harmless
        [
            root(VCPU=rec(16, 0, 4.0), MEMORY_MB=rec(64000)),
            child("host_NUMA_0", VCPU=rec(8, 8), MEMORY_MB=rec(32000, 32000)),
        ],
        [
            root(VCPU=rec(16)),
            child("host_pci_0000_81_00_0", VGPU=rec(8)),
            child("host_0000:03:00.0", SRIOV_NET_VF=rec(16)),
        ],
        # classes the agent knows nothing about are not checked
        [root(VCPU=rec(16), CUSTOM_LICENSE=rec(1000)), child("x", CUSTOM_LICENSE=rec(5))],
    ],
)
def test_trees_within_the_host_pass(tree):
    assert check(tree, LIMITS).ok


@pytest.mark.parametrize(
    "tree,resource,classes,published_units",
    [
        # issue 12 bullet 1: PCPU 16 added beside VCPU 16 kept in use
        ([root(VCPU=rec(16, 0, 4.0), PCPU=rec(16))], "CPUs", ("PCPU", "VCPU"), 32),
        ([root(VCPU=rec(17))], "CPUs", ("VCPU",), 17),
        ([root(PCPU=rec(8, 0, 2.5))], "CPUs", ("PCPU",), 20),
        # issue 12 bullet 2: root keeps memory, NUMA children report it again
        (
            [
                root(MEMORY_MB=rec(64000)),
                child("host_NUMA_0", MEMORY_MB=rec(32000)),
                child("host_NUMA_1", MEMORY_MB=rec(32000)),
            ],
            "MEMORY_MB",
            ("MEMORY_MB",),
            128000,
        ),
        ([root(DISK_GB=rec(501))], "DISK_GB", ("DISK_GB",), 501),
        (
            [
                child("n0", CUSTOM_MEMORY_PAGE_2048=rec(1024)),
                child("n1", CUSTOM_MEMORY_PAGE_2048=rec(1)),
            ],
            "CUSTOM_MEMORY_PAGE_2048",
            ("CUSTOM_MEMORY_PAGE_2048",),
            1025,
        ),
        # a page size the host does not have at all
        (
            [child("n0", CUSTOM_MEMORY_PAGE_1048576=rec(1))],
            "CUSTOM_MEMORY_PAGE_1048576",
            ("CUSTOM_MEMORY_PAGE_1048576",),
            1,
        ),
        # huge pages counted twice: all of each node's memory and its 2 MiB pool
        (
            [
                child("host_NUMA_0", MEMORY_MB=rec(32000), CUSTOM_MEMORY_PAGE_2048=rec(512)),
                child("host_NUMA_1", MEMORY_MB=rec(32000), CUSTOM_MEMORY_PAGE_2048=rec(512)),
            ],
            "memory (MEMORY_MB and huge pages, in MiB)",
            ("MEMORY_MB", "CUSTOM_MEMORY_PAGE_2048"),
            64000 + 2 * 1024,
        ),
        # pages reserved for the host (reserved_huge_pages) are not offered
        (
            [child("n0", MEMORY_MB=rec(63000), CUSTOM_MEMORY_PAGE_2048=rec(1024, 512))],
            "memory (MEMORY_MB and huge pages, in MiB)",
            ("MEMORY_MB", "CUSTOM_MEMORY_PAGE_2048"),
            63000 + 1024,
        ),
        ([root(VGPU=rec(8)), child("gpu", VGPU=rec(8))], "VGPU", ("VGPU",), 16),
        ([child("pf", SRIOV_NET_VF=rec(16, 0, 2.0))], "SRIOV_NET_VF", ("SRIOV_NET_VF",), 32),
    ],
)
def test_trees_overstating_the_host_are_refused(tree, resource, classes, published_units):
    verdict = check(tree, LIMITS)
    assert not verdict.ok
    over = [v for v in verdict.violations if v.host_has is not None]
    assert [(v.resource, v.classes, v.published) for v in over] == [
        (resource, classes, published_units)
    ]


def test_a_class_on_both_levels_is_refused_even_within_the_host():
    tree = [root(VCPU=rec(4, 0, 4.0)), child("host_NUMA_0", VCPU=rec(4, 0, 4.0))]
    verdict = check(tree, LIMITS)
    assert [(v.resource, v.where, v.host_has) for v in verdict.violations] == [
        ("VCPU", ("host", "host_NUMA_0"), None)
    ]
    assert verdict.classes == {"VCPU"}


def test_verdict_names_the_providers_and_what_the_host_has():
    verdict = check([root(VCPU=rec(16, 0, 4.0), PCPU=rec(16))], LIMITS)
    assert verdict.lines() == [
        "CPUs: 32 schedulable units published (PCPU + VCPU on host) but the host has 16"
    ]
    assert verdict.as_dict()["violations"][0]["host_has"] == 16


def test_host_limits_count_each_configured_cpu_once_and_sum_pools(tmp_path):
    host = snapshot("virhostcpudata/linux-test4", tmp_path, disk_gb=40)
    node = NumaNode(
        0,
        host.nodes[0].cpus,
        2048 * 1024,
        (HugePagePool(2048, 100, 10), HugePagePool(1048576, 2, 2)),
    )
    gpu = PciGpu(
        "0000:81:00.0",
        (MdevTypeInfo("nvidia-35", 6, mdevs=("a", "b")), MdevTypeInfo("nvidia-36", 2)),
    )
    host = dataclasses.replace(
        host, memory_mb=1000, nodes=(node,), gpus=(gpu,), sriov_pfs=(SriovPf("0000:03:00.0", 8, 4),)
    )
    conf = settings(cpu_dedicated_set=parse_cpu_spec("2-5"), cpu_shared_set=parse_cpu_spec("6-7"))
    limits = host_limits(host, partition_cpus(conf, host))
    assert limits == HostLimits(
        cpus=6,
        memory_mb=2048,
        disk_gb=40,
        hugepages={"CUSTOM_MEMORY_PAGE_2048": 100, "CUSTOM_MEMORY_PAGE_1048576": 2},
        vgpus=8,
        vfs=8,
        online_cpus=len(host.online),
    )


@pytest.mark.parametrize("numa", [False, True])
@pytest.mark.parametrize("system_dir", sysfs_trees(), ids=tree_name)
def test_the_tree_the_agent_builds_never_overstates_its_host(system_dir, numa, tmp_path):
    host = snapshot(str(system_dir.relative_to(HOSTDATA)), tmp_path)
    conf = settings(numa_in_placement=numa)
    partition = partition_cpus(conf, host)
    tree = build_tree(conf, host, partition)
    verdict = check(published(tree), host_limits(host, partition))
    assert verdict.ok, verdict.lines()


def _enforce(planned, current, untouched=(), in_use=lambda classes: set(classes)):
    names = {"r": "host", "n0": "host_NUMA_0"}
    return enforce(planned, current, names, "r", list(untouched), LIMITS, in_use)


def test_enforce_leaves_a_plan_within_the_host_as_planned():
    planned = {"r": {"VCPU": rec(4, 0, 4.0), "PCPU": rec(12)}}
    result = _enforce(planned, {"r": {"VCPU": rec(16, 0, 4.0)}})
    assert result.inventories == planned and not result.refused


def test_enforce_keeps_placements_records_of_the_classes_involved():
    # bullet 1: VCPU held by the usage guard (in use), PCPU 16 wanted beside it
    result = _enforce(
        {"r": {"VCPU": rec(16, 0, 4.0), "PCPU": rec(16), "DISK_GB": rec(400)}},
        {"r": {"VCPU": rec(16, 0, 4.0), "DISK_GB": rec(500)}},
    )
    assert result.refused and result.kept == ("PCPU", "VCPU") and result.closed == ()
    assert result.inventories == {"r": {"VCPU": rec(16, 0, 4.0), "DISK_GB": rec(400)}}
    assert result.left.ok


def test_enforce_gives_a_new_child_none_of_the_classes_the_root_keeps():
    # bullet 2: the root keeps its memory, the new NUMA child gets none of it
    result = _enforce(
        {"r": {"MEMORY_MB": rec(64000)}, "n0": {"MEMORY_MB": rec(64000)}},
        {"r": {"MEMORY_MB": rec(64000)}},
    )
    assert result.inventories == {"r": {"MEMORY_MB": rec(64000)}, "n0": {}}


def test_enforce_closes_idle_classes_first_when_placement_already_overstates():
    current = {"r": {"VCPU": rec(16, 0, 4.0), "PCPU": rec(16)}}
    result = _enforce(
        {"r": {"PCPU": rec(16), "VCPU": rec(16, 0, 4.0)}},
        current,
        in_use=lambda classes: {"VCPU"} & set(classes),
    )
    assert result.closed == ("PCPU",)
    assert result.inventories == {"r": {"VCPU": rec(16, 0, 4.0), "PCPU": rec(16, 16)}}
    assert result.left.ok


def test_enforce_closes_every_class_involved_when_all_are_in_use():
    current = {"r": {"VCPU": rec(16, 0, 4.0), "PCPU": rec(16)}}
    result = _enforce(dict(current), current)
    assert result.closed == ("PCPU", "VCPU")
    assert result.inventories == {"r": {"VCPU": rec(16, 16, 4.0), "PCPU": rec(16, 16)}}


def test_enforce_counts_children_it_does_not_write_and_reports_what_it_cannot_fix():
    foreign = Published("foreign-gpu", False, {"VGPU": rec(9)})
    result = _enforce({"r": {"VCPU": rec(16)}}, {"r": {"VCPU": rec(16)}}, [foreign])
    assert result.refused and not result.left.ok
    assert result.inventories == {"r": {"VCPU": rec(16)}}


def test_records_kept_from_a_previous_configuration_are_bounded_by_every_online_cpu():
    limits = HostLimits(cpus=11, memory_mb=1, disk_gb=1, online_cpus=16)
    result = enforce(
        {"r": {"VCPU": rec(16, 0, 4.0), "PCPU": rec(7)}},
        {"r": {"VCPU": rec(16, 0, 4.0)}},
        {"r": "host"},
        "r",
        [],
        limits,
    )
    assert result.kept == ("PCPU", "VCPU") and result.closed == ()
    assert result.inventories == {"r": {"VCPU": rec(16, 0, 4.0)}}


def test_a_plan_that_already_keeps_placements_records_is_not_a_refusal():
    # a refused reshape kept VCPU 16 of the old configuration; the new sets hold 11 CPUs
    limits = HostLimits(cpus=11, memory_mb=1, disk_gb=1, online_cpus=16)
    kept = {"r": {"VCPU": rec(16, 0, 4.0)}}
    result = enforce(kept, kept, {"r": "host"}, "r", [], limits)
    assert not result.refused and result.inventories == kept


def test_offline_dedicated_cpus_under_cpu_power_management_count_once(tmp_path):
    # linux-test6: CPUs 0-7 present, 5 and 7 offline (powered down by nova
    # under [libvirt] cpu_power_management). They still back PCPU; the limit
    # counts each configured CPU once, online or not, and the tree fits it.
    host = snapshot("virhostcpudata/linux-test6", tmp_path)
    conf = settings(
        cpu_dedicated_set=parse_cpu_spec("4-7"),
        cpu_shared_set=parse_cpu_spec("0-3"),
        cpu_power_management=True,
    )
    partition = partition_cpus(conf, host)
    limits = host_limits(host, partition)
    assert (limits.cpus, limits.online_cpus) == (8, 6)
    tree = build_tree(conf, host, partition)
    root = tree.providers[0].inventories
    assert (root["PCPU"].total, root["VCPU"].total) == (4, 4)
    assert check(published(tree), limits).ok
    # Had the offline ones not counted, the same tree would be refused.
    assert not check(published(tree), dataclasses.replace(limits, cpus=6)).ok
    # The same CPUs in both sets would not make ten: a CPU counts once.
    assert (
        host_limits(
            host, dataclasses.replace(partition, shared=partition.shared | parse_cpu_spec("4,6"))
        ).cpus
        == 8
    )


def test_a_tree_whose_limits_are_unknown_is_published_with_every_checked_class_closed():
    """Wire 2.0 (no limits): the applier cannot check, so it publishes less."""
    from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
    from node_agent.policy.capacity import closed_unchecked

    tree = ProviderTree(
        (
            Provider(
                "host",
                inventories={
                    "VCPU": Inventory(16, allocation_ratio=4.0),
                    "DISK_GB": Inventory(500),
                    "CUSTOM_WIDGET": Inventory(3),
                },
            ),
            Provider(
                "host_NUMA_0",
                parent="host",
                inventories={
                    "MEMORY_MB": Inventory(32000, reserved=512),
                    "CUSTOM_MEMORY_PAGE_2048": Inventory(1024),
                },
            ),
        )
    )

    closed = closed_unchecked(tree)

    assert {
        (p.name, rc): (inv.reserved, inv.total)
        for p in closed.providers
        for rc, inv in p.inventories.items()
    } == {
        ("host", "VCPU"): (16, 16),
        ("host", "DISK_GB"): (500, 500),
        ("host", "CUSTOM_WIDGET"): (0, 3),  # not the invariant's: left alone
        ("host_NUMA_0", "MEMORY_MB"): (32000, 32000),
        ("host_NUMA_0", "CUSTOM_MEMORY_PAGE_2048"): (1024, 1024),
    }
    assert check(published(closed), HostLimits(cpus=0, memory_mb=0, disk_gb=0)).ok
