"""NUMA children against the real Placement: the flavors the report names
as stranded find no candidate, the shape just under does, and on the flat
tree the stranded shape finds one; a same_subtree request for CPUs and a
vGPU gets only pairs of one NUMA node.

Hosts: virhostcpudata/linux-test3 (48 CPUs, 8 nodes of 6, the issue's host)
and linux-test4 (16 CPUs, 2 nodes of 8) with two GPUs built in sysfs, one
attached to each node. No guests (libvirt's test driver, no domains).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from uuid import uuid4

import pytest

from node_agent.cycle.desired import compute_desired
from node_agent.cycle.reconcile import Reconciler, ReshapeRefused
from node_agent.placement.client import PlacementClient
from node_agent.placement.sync import TreeSyncer
from node_agent.state import StateStore
from tests.hostdata import HOSTDATA, sysfs_root_for
from tests.integration.reshape_driver import agent_cycle, allocate, make_settings
from tests.integration.test_nested_reshape import NestedHost, guest, host_xml, prefix
from tests.unit.test_pci import add_device, add_mdev_type

pytestmark = pytest.mark.integration
LOG = logging.getLogger(__name__)

MDEV_TYPE = "nvidia-222"
GPUS = {"0000:81:00.0": "0", "0000:c1:00.0": "1"}  # address -> sysfs numa_node


class Host:
    def __init__(self, tmp_path, url, name, tree_dir, gpus=None):
        self.name, self.tmp = name, tmp_path
        self.sysroot = sysfs_root_for(HOSTDATA / "virhostcpudata" / tree_dir, tmp_path)
        for address, node in (gpus or {}).items():
            device = add_device(self.sysroot, address, numa_node=node)
            add_mdev_type(device, MDEV_TYPE, available=2, name="GRID T4-2B")
        self.uri = host_xml(tmp_path / "host.xml", [])
        self.client = PlacementClient.for_endpoint(url)

    def cycle(self, dedicated=None, shared=None, **kw):
        base = make_settings(
            self.name,
            str(self.sysroot),
            self.uri,
            str(self.tmp / "state"),
            str(self.tmp),
            dedicated,
            shared,
        )
        outcome, report, desired = agent_cycle(self.client, dataclasses.replace(base, **kw))
        assert report.ok, report.errors
        return desired

    def tree(self) -> dict:
        """uuid -> (name, parent uuid) of the host's providers."""
        root = self.client.get(f"/resource_providers?name={self.name}")["resource_providers"]
        listed = self.client.get(f"/resource_providers?in_tree={root[0]['uuid']}")
        return {
            rp["uuid"]: (rp["name"], rp["parent_provider_uuid"])
            for rp in listed["resource_providers"]
        }

    def candidates(self, query: str) -> list[dict]:
        """This host's allocation requests for ``query``: provider name -> resources."""
        tree = self.tree()
        found = self.client.get(f"/allocation_candidates?{query}")["allocation_requests"]
        mine = [a["allocations"] for a in found if set(a["allocations"]) <= set(tree)]
        return [{tree[rp][0]: a["resources"] for rp, a in alloc.items()} for alloc in mine]


# hw:numa_nodes=N on 8 nodes costs Placement 8^N group combinations (at N=6
# it did not answer within 30 s): the probes stop at 3 groups.
ASKED = ("floating", "pinned", "hw:numa_nodes=2", "hw:numa_nodes=3")


def probes(desired) -> list[dict]:
    return [
        p for shape in desired.stranded["shapes"] if shape["kind"] in ASKED for p in shape["probes"]
    ]


def test_shapes_the_report_names_stranded_find_none_nested_and_one_flat(
    tmp_path, placement_server, host_name
):
    host = Host(tmp_path, placement_server.url, host_name, "linux-test3")
    # Three dedicated CPUs on node 0 (0,4,8), two on node 1 (24,28).
    sets = {"dedicated": "0,4,8,24,28", "shared": "1-3,5-7,9-23,25-27,29-47"}
    flat = host.cycle(**sets)
    assert flat.stranded["numa_in_placement"] is False
    named = probes(flat)
    kinds = {s["kind"] for s in flat.stranded["shapes"]}
    assert {"floating", "pinned", "hw:numa_nodes=2", "hw:numa_nodes=8"} <= kinds
    assert len(named) == 16  # per kind asked: CPU and memory, stranded and just under
    stranded = [p for p in named if p["what"] == "stranded"]
    requests = [p["request"] for p in stranded]
    assert "resources=VCPU:7,MEMORY_MB:1" in requests
    assert "resources=PCPU:4,MEMORY_MB:1" in requests  # 5 flat, 3 on node 0
    # Flat: every stranded shape finds this host (the spec's fallback request).
    for probe in stranded:
        assert len(host.candidates(probe["flat_request"])) == 1, probe

    nested = host.cycle(numa_in_placement=True, **sets)
    assert probes(nested) == named  # an empty host: the same report on or off
    assert len(host.tree()) == 9
    for probe in named:
        found = host.candidates(probe["request"])
        if probe["what"] == "stranded":
            assert found == [], probe
        else:
            assert found, probe
            groups = len(re.findall(r"resources\d+=", probe["request"]))
            for allocation in found:  # N groups: on N distinct nodes, each whole
                if groups:
                    assert len(allocation) == groups, (probe, allocation)
                    assert all(len(res) == 2 for res in allocation.values()), allocation


def test_same_subtree_pairs_cpus_and_a_vgpu_of_one_numa_node(tmp_path, placement_server, host_name):
    host = Host(tmp_path, placement_server.url, host_name, "linux-test4", GPUS)
    desired = host.cycle(enabled_mdev_types=(MDEV_TYPE,), numa_in_placement=True)
    gpu0, gpu1 = (f"{host_name}_pci_{a.replace(':', '_').replace('.', '_')}" for a in GPUS)
    assert desired.tree.by_name(gpu0).parent == f"{host_name}_NUMA_0"
    parents = {name: host.tree()[parent][0] for name, parent in host.tree().values() if parent}
    assert parents[gpu0] == f"{host_name}_NUMA_0" and parents[gpu1] == f"{host_name}_NUMA_1"

    query = (
        "resources_CPU=VCPU:2&resources_GPU=VGPU:1&required_NUMA=HW_NUMA_ROOT"
        "&same_subtree=_CPU,_GPU,_NUMA&group_policy=none"
    )
    pairs = host.candidates(query)
    assert sorted(pairs, key=str) == [
        {f"{host_name}_NUMA_0": {"VCPU": 2}, gpu0: {"VGPU": 1}},
        {f"{host_name}_NUMA_1": {"VCPU": 2}, gpu1: {"VGPU": 1}},
    ]
    # Without same_subtree, Placement also offers the cross-node pairs.
    loose = host.candidates("resources_CPU=VCPU:2&resources_GPU=VGPU:1&group_policy=none")
    assert len(loose) == 4


def test_gpu_children_move_under_their_node_and_back_keeping_uuids_and_allocations(
    tmp_path, placement_server, host_name
):
    host = Host(tmp_path, placement_server.url, host_name, "linux-test4", GPUS)
    host.cycle(enabled_mdev_types=(MDEV_TYPE,))
    flat = {name: (uuid, parent) for uuid, (name, parent) in host.tree().items()}
    root = flat[host_name][0]
    gpu0 = f"{host_name}_pci_0000_81_00_0"
    assert flat[gpu0][1] == root
    consumer = "6c1fa7a2-7c3e-4d2b-9a55-1f6d6a1e0001"  # a claim with no guest here
    allocate(host.client, consumer, {flat[gpu0][0]: {"VGPU": 1}})

    host.cycle(enabled_mdev_types=(MDEV_TYPE,), numa_in_placement=True)
    nested = {name: (uuid, parent) for uuid, (name, parent) in host.tree().items()}
    assert nested[gpu0] == (flat[gpu0][0], nested[f"{host_name}_NUMA_0"][0])
    held = host.client.get(f"/allocations/{consumer}")["allocations"]
    assert {rp: a["resources"] for rp, a in held.items()} == {flat[gpu0][0]: {"VGPU": 1}}

    host.cycle(enabled_mdev_types=(MDEV_TYPE,))
    back = {name: (uuid, parent) for uuid, (name, parent) in host.tree().items()}
    assert back == flat
    held = host.client.get(f"/allocations/{consumer}")["allocations"]
    assert {rp: a["resources"] for rp, a in held.items()} == {flat[gpu0][0]: {"VGPU": 1}}


def test_floating_guests_go_to_a_node_when_numa_children_appear_and_a_wide_one_is_split(
    tmp_path, placement_server, host_name
):
    # linux-test4, no dedicated set: 8 VCPU per node (max_unit 8), 16 flat.
    p = prefix()
    guests = [
        guest(1, p, pins=(2, 3), nodes="0"),  # its node is known: 0
        guest(2, p),  # floating: neither pins nor numatune
        guest(3, p, vcpus=12, memory=2048),  # floating, wider than any node
    ]
    host = NestedHost(tmp_path, placement_server.url, host_name, guests)
    pinned, floating, wide = (g["uuid"] for g in guests)
    outcome, report, _ = host.cycle(dedicated=None, shared=None)
    assert report.ok
    root = host.root
    allocate(host.scheduler, pinned, {root: {"VCPU": 2, "MEMORY_MB": 1024}})
    allocate(host.scheduler, floating, {root: {"VCPU": 2, "MEMORY_MB": 1024, "DISK_GB": 5}})
    allocate(host.scheduler, wide, {root: {"VCPU": 12, "MEMORY_MB": 2048}})

    outcome, report, _ = host.cycle(dedicated=None, shared=None, numa_in_placement=True)

    assert not isinstance(outcome, ReshapeRefused), outcome
    assert outcome.reshaped and report.ok, report.errors
    tree = host.tree()
    node0, node1 = tree[f"{host_name}_NUMA_0"][0], tree[f"{host_name}_NUMA_1"][0]
    assert host.allocations() == {
        pinned: {node0: {"VCPU": 2, "MEMORY_MB": 1024}},
        # The wide guest first: the roomier node 1 takes 8 VCPU (max_unit)
        # and all its memory, node 0 the 4 VCPU left ...
        wide: {node1: {"VCPU": 8, "MEMORY_MB": 2048}, node0: {"VCPU": 4}},
        # ... then the small one, whole, on the node with more room left.
        floating: {node0: {"VCPU": 2, "MEMORY_MB": 1024}, root: {"DISK_GB": 5}},
    }
    assert set(host.inventories(root)) == {"DISK_GB"}


def test_dry_run_counts_the_usage_placement_holds_on_the_nodes(
    tmp_path, placement_server, host_name
):
    from tests.integration.reshape_driver import Host as CliHost
    from tests.integration.test_cli_reshape import once, write_config

    host = CliHost(tmp_path, placement_server.url, host_name)
    config = write_config(host, "numa_in_placement = true\n")
    assert once(config).code == 0
    root = host.scheduler.get(f"/resource_providers?name={host_name}")["resource_providers"][0]
    listed = host.scheduler.get(f"/resource_providers?in_tree={root['uuid']}")
    tree = {rp["name"]: rp["uuid"] for rp in listed["resource_providers"]}
    # 30 of each node's 32 VCPU (8 CPUs at ratio 4), at most 8 a claim (max_unit).
    for node in (0, 1):
        for amount in (8, 8, 8, 6):
            rp = tree[f"{host_name}_NUMA_{node}"]
            allocate(host.scheduler, str(uuid4()), {rp: {"VCPU": amount}})

    plan = once(config, "--dry-run", "--output", "json")

    assert plan.code == 0, plan.stderr
    report = plan.json()["numa_stranded"]
    assert report["usage_counted"] is True
    floating = next(s for s in report["shapes"] if s["kind"] == "floating")
    assert floating["numa"]["VCPU"] == 2 and floating["flat"]["VCPU"] == 4
    assert floating["stranded"]["VCPU"] == [3, 4]


def test_a_refused_numa_reshape_holds_back_no_other_change_of_the_cycle(
    tmp_path, placement_server, host_name
):
    p = prefix()
    guests = [guest(1, p, pins=(2, 3), nodes="0"), guest(2, p, pins=(4, 12))]  # 2 spans nodes
    host = NestedHost(tmp_path, placement_server.url, host_name, guests)
    host.cycle(dedicated=None, shared=None)  # legacy: every CPU VCPU
    root = host.root
    for g in guests:
        allocate(host.scheduler, g["uuid"], {root: {"VCPU": 2, "MEMORY_MB": 1024}})

    # One config change: a dedicated set (the pinned guests' VCPU becomes
    # PCPU) and NUMA children, which instance-00000002 refuses.
    # The dry run says so, and shows the plan without NUMA children.
    store = StateStore(Path(host.state_dir))
    host.agent.stats.reset()
    _tree, _changes, plan = Reconciler(host.agent, TreeSyncer(host.agent, store)).plan(
        compute_desired(host.settings(numa_in_placement=True), state=store.load_or_empty(LOG))
    )
    assert host.agent.stats.writes == 0
    assert "spans NUMA nodes 0-1" in plan["refused"][0]
    assert any("as with [compute] numa_in_placement off" in line for line in plan["lines"])
    assert plan["totals"] == {"consumers": 2, "moved": {"VCPU -> PCPU": 4}}

    outcome, report, _ = host.cycle(numa_in_placement=True)

    assert isinstance(outcome, ReshapeRefused)
    assert f"instance-00000002 ({guests[1]['uuid']}) spans NUMA nodes 0-1" in str(outcome)
    assert "written as with [compute] numa_in_placement off" in str(outcome)
    assert report.ok, report.errors
    assert host.allocations() == {g["uuid"]: {root: {"PCPU": 2, "MEMORY_MB": 1024}} for g in guests}
    assert list(host.tree()) == [host_name]
    assert host.inventories(root)["PCPU"] == 8
