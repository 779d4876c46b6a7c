"""NUMA children built from real fixture hosts (numa_in_placement = true)."""

from __future__ import annotations

import dataclasses

import os_resource_classes as orc
import os_traits
import pytest

from node_agent.errors import ConfigError
from node_agent.model.cpuset import parse_cpu_spec, parse_cpulist
from node_agent.model.hugepages import ReservedPages
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT
from node_agent.policy.partition import partition_cpus
from node_agent.tree.build import build_tree
from node_agent.tree.numa import spread
from tests.hostdata import ground_truth
from tests.snapshots import settings, snapshot

MULTI_NUMA = [
    "virhostcpudata/linux-test3",
    "virhostcpudata/linux-test8",
    "virhostcpudata/linux-deconf-cpus",
    "virhostcpudata/linux-subcores1",
    "virhostcpudata/linux-subcores2",
    "virhostcpudata/linux-subcores3",
]


def tree_of(tree_dir, tmp_path, host=None, **overrides):
    host = host or snapshot(tree_dir, tmp_path)
    conf = settings(numa_in_placement=True, **overrides)
    return build_tree(conf, host, partition_cpus(conf, host))


def inventory(tree, name):
    return {rc: inv.as_placement() for rc, inv in tree.by_name(name).inventories.items()}


@pytest.mark.parametrize("tree_dir", MULTI_NUMA)
def test_each_node_holds_its_online_cpus_and_memory_and_root_keeps_disk(tree_dir, tmp_path):
    tree = tree_of(tree_dir, tmp_path)
    truth = ground_truth()[tree_dir]["nodes"]
    assert tree.names() == ["fixture"] + [f"fixture_NUMA_{n}" for n in sorted(truth, key=int)]
    assert set(tree.root.inventories) == {orc.DISK_GB}
    online = parse_cpulist(ground_truth()[tree_dir]["online_list"])
    reserved_left = 512
    for node_id in sorted(truth, key=int):
        child = tree.by_name(f"fixture_NUMA_{node_id}")
        node_cpus = parse_cpulist(truth[node_id]["cpus"]) & online
        memory_mb = truth[node_id]["MemTotal_kB"] // 1024
        assert child.parent == "fixture"
        assert child.traits == {os_traits.HW_NUMA_ROOT: True, AGENT_CHILD_TRAIT: True}
        assert child.inventories[orc.VCPU].total == len(node_cpus)
        assert child.inventories[orc.VCPU].allocation_ratio == 4.0
        assert child.inventories[orc.MEMORY_MB].total == memory_mb
        assert child.inventories[orc.MEMORY_MB].reserved == min(reserved_left, memory_mb)
        reserved_left -= child.inventories[orc.MEMORY_MB].reserved
        assert orc.PCPU not in child.inventories


def test_test3_interleaved_nodes_get_their_own_cpus(tmp_path):
    # node2 owns CPUs 3,7,...,23: dedicating 3 and 7 puts 2 PCPU on node2 only.
    tree = tree_of(
        "virhostcpudata/linux-test3",
        tmp_path,
        cpu_dedicated_set=parse_cpu_spec("3,7"),
        cpu_shared_set=parse_cpu_spec("0-2,4-6,8-47"),
    )
    assert inventory(tree, "fixture_NUMA_2")[orc.PCPU]["total"] == 2
    assert inventory(tree, "fixture_NUMA_2")[orc.VCPU]["total"] == 4
    assert inventory(tree, "fixture_NUMA_0")[orc.VCPU]["total"] == 6
    assert orc.PCPU not in inventory(tree, "fixture_NUMA_0")
    assert inventory(tree, "fixture_NUMA_0")[orc.MEMORY_MB] == {
        "total": 65526,
        "reserved": 512,
        "min_unit": 1,
        "max_unit": 65526,
        "step_size": 1,
        "allocation_ratio": 1.0,
    }
    assert inventory(tree, "fixture_NUMA_7")[orc.MEMORY_MB]["reserved"] == 0


def test_ppc64_sparse_node_ids_name_the_children(tmp_path):
    tree = tree_of(
        "virhostcpudata/linux-deconf-cpus",
        tmp_path,
        cpu_dedicated_set=parse_cpu_spec("16,24,104"),
        cpu_shared_set=parse_cpu_spec("40,48,72,112,120,128,136"),
    )
    assert tree.names()[1:] == [
        "fixture_NUMA_0",
        "fixture_NUMA_1",
        "fixture_NUMA_16",
        "fixture_NUMA_17",
    ]
    assert inventory(tree, "fixture_NUMA_0")[orc.PCPU]["total"] == 2
    assert inventory(tree, "fixture_NUMA_16")[orc.PCPU]["total"] == 1
    assert inventory(tree, "fixture_NUMA_16")[orc.VCPU]["total"] == 1
    assert inventory(tree, "fixture_NUMA_17")[orc.VCPU]["total"] == 3


def test_reserved_host_cpus_are_charged_to_the_lowest_nodes_first(tmp_path):
    tree = tree_of("virhostcpudata/linux-test3", tmp_path, reserved_host_cpus=8)
    assert inventory(tree, "fixture_NUMA_0")[orc.VCPU]["reserved"] == 6
    assert inventory(tree, "fixture_NUMA_1")[orc.VCPU]["reserved"] == 2
    assert inventory(tree, "fixture_NUMA_2")[orc.VCPU]["reserved"] == 0


def test_reserved_memory_above_a_node_overflows_to_the_next(tmp_path):
    tree = tree_of("virhostcpudata/linux-test3", tmp_path, reserved_host_memory_mb=70000)
    assert inventory(tree, "fixture_NUMA_0")[orc.MEMORY_MB]["reserved"] == 65526
    assert inventory(tree, "fixture_NUMA_1")[orc.MEMORY_MB]["reserved"] == 70000 - 65526


def test_spread_fills_buckets_in_order():
    assert spread(10, [4, 0, 3, 8]) == [4, 0, 3, 3]
    assert spread(0, [4, 2]) == [0, 0]


def test_hmat_cpu_less_node_with_memory_holds_only_memory(tmp_path):
    host = snapshot("vircaps2xmldata/linux-hmat/system", tmp_path)
    node0, node1 = host.nodes
    host = dataclasses.replace(
        host,
        nodes=(
            dataclasses.replace(node0, memory_kb=2 * 1024 * 1024),
            dataclasses.replace(node1, memory_kb=1024 * 1024),
        ),
    )
    tree = tree_of(None, tmp_path, host=host)
    assert inventory(tree, "fixture_NUMA_0")[orc.VCPU]["total"] == 24
    assert set(inventory(tree, "fixture_NUMA_1")) == {orc.MEMORY_MB}
    assert inventory(tree, "fixture_NUMA_1")[orc.MEMORY_MB]["total"] == 1024
    assert tree.by_name("fixture_NUMA_1").traits == {
        os_traits.HW_NUMA_ROOT: True,
        AGENT_CHILD_TRAIT: True,
    }


def test_hmat_without_node_meminfo_keeps_memory_on_the_root(tmp_path):
    # The fixture has no node meminfo; the memory-only node is still known
    # from its hugepages directory, and the root keeps all of MEMORY_MB.
    host = snapshot("vircaps2xmldata/linux-hmat/system", tmp_path, memory_mb=4096)
    tree = tree_of(None, tmp_path, host=host)
    assert tree.names() == ["fixture", "fixture_NUMA_0", "fixture_NUMA_1"]
    assert inventory(tree, "fixture")[orc.MEMORY_MB]["total"] == 4096
    assert inventory(tree, "fixture_NUMA_1") == {}


def test_resctrl_1g_pages_are_a_page_class_on_node1(tmp_path):
    tree = tree_of(
        "vircaps2xmldata/linux-resctrl/system",
        tmp_path,
        reserved_huge_pages=(ReservedPages(node=1, size_kb=1048576, count=1),),
    )
    node1 = inventory(tree, "fixture_NUMA_1")
    assert node1["CUSTOM_MEMORY_PAGE_1048576"]["total"] == 4
    assert node1["CUSTOM_MEMORY_PAGE_1048576"]["reserved"] == 1
    assert orc.is_custom("CUSTOM_MEMORY_PAGE_1048576")
    # empty pools (2M here, and 1G on node0) are not reported
    assert "CUSTOM_MEMORY_PAGE_2048" not in node1
    assert not any(rc.startswith("CUSTOM_MEMORY_PAGE") for rc in inventory(tree, "fixture_NUMA_0"))


def test_reserving_more_pages_than_the_node_has_is_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        tree_of(
            "vircaps2xmldata/linux-resctrl/system",
            tmp_path,
            reserved_huge_pages=(ReservedPages(node=1, size_kb=1048576, count=5),),
        )
    assert "node:1,size:1048576,count:5" in str(err.value)
    assert "at most 4" in str(err.value)


def test_reserving_pages_of_a_size_the_node_lacks_is_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        tree_of(
            "vircaps2xmldata/linux-resctrl/system",
            tmp_path,
            reserved_huge_pages=(ReservedPages(node=3, size_kb=2048, count=1),),
        )
    assert "NUMA node 3 has no 2048 KiB page pool" in str(err.value)


def test_cpus_in_no_node_stay_on_the_root(tmp_path):
    # linux-test1: two memory nodes without CPUs; CPUs 0-1 belong to none.
    tree = tree_of("virhostcpudata/linux-test1", tmp_path)
    assert inventory(tree, "fixture")[orc.VCPU]["total"] == 2
    assert inventory(tree, "fixture_NUMA_0")[orc.MEMORY_MB]["total"] == 32768
    # Its meminfo counts huge pages but no hugepages/ dir gives their size,
    # so no page class is reported (discovery warns about it).
    assert set(inventory(tree, "fixture_NUMA_1")) == {orc.MEMORY_MB}


def test_option_off_keeps_the_flat_root(tmp_path):
    host = snapshot("virhostcpudata/linux-test3", tmp_path)
    conf = settings()
    tree = build_tree(conf, host, partition_cpus(conf, host))
    assert tree.names() == ["fixture"]
    assert tree.root.inventories[orc.VCPU].total == 48


def test_non_numa_host_has_no_children(tmp_path):
    tree = tree_of("virhostcpudata/linux-test5", tmp_path)
    assert tree.names() == ["fixture"]


def test_huge_page_pools_are_reserved_in_their_nodes_memory_not_offered_twice(tmp_path):
    """linux-resctrl: node 1 holds 4 pages of 1 GiB. Published as
    CUSTOM_MEMORY_PAGE_1048576, the 4096 MiB are reserved in that node's
    MEMORY_MB, whose total stays the node's memory."""
    from node_agent.policy.capacity import check, host_limits, published

    host = snapshot("vircaps2xmldata/linux-resctrl/system", tmp_path)
    # The fixture has no node meminfo: give each node 32 GiB.
    host = dataclasses.replace(
        host, nodes=tuple(dataclasses.replace(n, memory_kb=32 * 1024 * 1024) for n in host.nodes)
    )
    conf = settings(numa_in_placement=True, reserved_host_memory_mb=512)
    tree = build_tree(conf, host, partition_cpus(conf, host))
    node1 = inventory(tree, "fixture_NUMA_1")
    assert node1["CUSTOM_MEMORY_PAGE_1048576"]["total"] == 4
    assert node1[orc.MEMORY_MB]["total"] == 32 * 1024
    assert node1[orc.MEMORY_MB]["reserved"] == 4096  # the pool, no more
    assert inventory(tree, "fixture_NUMA_0")[orc.MEMORY_MB]["reserved"] == 512
    assert check(published(tree), host_limits(host, partition_cpus(conf, host))).ok


def test_pools_are_reserved_on_the_root_when_node_memory_is_unknown(tmp_path):
    # linux-resctrl has no node meminfo: the root keeps MEMORY_MB.
    tree = tree_of("vircaps2xmldata/linux-resctrl/system", tmp_path, reserved_host_memory_mb=512)
    assert inventory(tree, "fixture")[orc.MEMORY_MB]["reserved"] == 512 + 4096
    assert inventory(tree, "fixture_NUMA_1")["CUSTOM_MEMORY_PAGE_1048576"]["total"] == 4
