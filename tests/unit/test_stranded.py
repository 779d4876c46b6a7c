"""The stranded-flavor report on real fixture hosts (policy/stranded.py)."""

from __future__ import annotations

import dataclasses

from node_agent.cycle.desired import numa_stranded
from node_agent.model.cpuset import parse_cpu_spec
from node_agent.model.provider_tree import Inventory
from node_agent.policy.partition import partition_cpus
from node_agent.policy.stranded import largest_allocation, stranded_shapes
from node_agent.tree.build import build_tree
from tests.snapshots import settings, snapshot

TEST3 = "virhostcpudata/linux-test3"  # 48 CPUs, 8 nodes of 6


def trees(tmp_path, tree_dir=TEST3, **overrides):
    host = snapshot(tree_dir, tmp_path)
    conf = settings(**overrides)
    partition = partition_cpus(conf, host)
    numa = build_tree(dataclasses.replace(conf, numa_in_placement=True), host, partition)
    flat = build_tree(dataclasses.replace(conf, numa_in_placement=False), host, partition)
    return numa, flat


def by_kind(shapes):
    return {s.kind: s for s in shapes}


def test_a_48_cpu_8_node_host_strands_floating_flavors_above_one_node(tmp_path):
    shapes = by_kind(stranded_shapes(*trees(tmp_path)))
    floating = shapes["floating"]
    # max_unit is the node's CPU count: VCPU:7 fits flat (max 48), not on any node.
    assert floating.flat["VCPU"] == 48 and floating.numa["VCPU"] == 6
    assert floating.stranded()["VCPU"] == (7, 48)
    assert "VCPU 7..48" in floating.line()
    assert "pinned" not in shapes  # no cpu_dedicated_set: no PCPU anywhere


def test_numa_nodes_flavors_are_stranded_above_n_times_the_nth_largest_node(tmp_path):
    shapes = by_kind(stranded_shapes(*trees(tmp_path)))
    two = shapes["hw:numa_nodes=2"]
    assert two.numa["VCPU"] == 12 and two.stranded()["VCPU"] == (14, 48)
    assert two.together
    assert two.request(12, 2048) == (
        "resources1=VCPU:6,MEMORY_MB:1024&required1=HW_NUMA_ROOT"
        "&resources2=VCPU:6,MEMORY_MB:1024&required2=HW_NUMA_ROOT&group_policy=isolate"
    )
    # Eight nodes of six: an 8-node flavor of 48 VCPU fits both ways.
    assert "VCPU" not in shapes["hw:numa_nodes=8"].stranded()


def test_pinned_flavors_count_pcpu_per_node(tmp_path):
    # test3's node 0 is CPUs 0,4,...,20, node 1 is 24,28,...,44: four and two dedicated.
    numa, flat = trees(
        tmp_path,
        cpu_dedicated_set=parse_cpu_spec("0,4,8,12,24,28"),
        cpu_shared_set=parse_cpu_spec("1-3,5-7,9-11,13-23,25-27,29-47"),
    )
    pinned = by_kind(stranded_shapes(numa, flat))["pinned"]
    assert pinned.flat["PCPU"] == 6 and pinned.numa["PCPU"] == 4
    assert pinned.stranded()["PCPU"] == (5, 6)


def test_usage_lowers_what_a_node_still_takes(tmp_path):
    numa, flat = trees(tmp_path)
    node = numa.by_name("fixture_NUMA_0").inventories["MEMORY_MB"]
    used = {"fixture_NUMA_0": {"VCPU": 20}}  # 24 VCPU at ratio 4: 4 left on node 0
    assert largest_allocation(numa.by_name("fixture_NUMA_0").inventories["VCPU"], 20) == 4
    shapes = by_kind(stranded_shapes(numa, flat, used))
    assert shapes["floating"].numa["VCPU"] == 6  # another node still takes 6
    assert largest_allocation(node) == node.total - node.reserved


def test_largest_allocation_follows_max_unit_and_step_size():
    assert largest_allocation(Inventory(total=8, allocation_ratio=4.0)) == 8
    assert largest_allocation(Inventory(total=8, max_unit=32, allocation_ratio=4.0)) == 32
    assert largest_allocation(Inventory(total=100, step_size=16)) == 96
    assert largest_allocation(Inventory(total=4, min_unit=2), used=3) == 0


def test_the_report_says_what_turning_it_on_would_strand_when_it_is_off(tmp_path):
    host = snapshot(TEST3, tmp_path)
    conf = settings()
    report = numa_stranded(conf, host, partition_cpus(conf, host))
    assert report["numa_in_placement"] is False
    assert "what turning it on would strand" in report["lines"][0]
    assert any("floating: flavors with VCPU 7..48" in line for line in report["lines"])


def test_no_report_on_a_host_without_numa_nodes_or_in_whole_node_mode(tmp_path):
    host = snapshot(TEST3, tmp_path)
    conf = settings(node_resource_class="CUSTOM_BAREMETAL")
    assert numa_stranded(conf, host, partition_cpus(settings(), host)) is None
    flat_host = dataclasses.replace(host, nodes=())
    assert numa_stranded(settings(), flat_host, partition_cpus(settings(), host)) is None


def test_usage_on_the_nodes_counts_on_the_flat_root_as_their_sum(tmp_path):
    numa, flat = trees(tmp_path, "virhostcpudata/linux-test4")  # 2 nodes of 8 CPUs
    used = {"fixture_NUMA_0": {"VCPU": 30}, "fixture_NUMA_1": {"VCPU": 30}}
    floating = by_kind(stranded_shapes(numa, flat, used))["floating"]
    # Each node has 2 of its 32 VCPU left; flat, 4 of 64 are.
    assert floating.numa["VCPU"] == 2 and floating.flat["VCPU"] == 4
    assert floating.stranded()["VCPU"] == (3, 4)
