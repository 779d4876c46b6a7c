"""Layout changes go back: NUMA children off, GPU children gone (issue 12, item 2).

Same host as test_nested_reshape (linux-test4: node 0 = CPUs 0-7, node 1 =
CPUs 8-15; dedicated 2-5,10-13; shared 0-1,6-9,14-15), guests from
libvirt's test driver, the real Placement. The "scheduler" writes
allocations through its own client.
"""

from __future__ import annotations

import shutil
import uuid

import pytest

from node_agent.cycle.reconcile import ReshapeRefused
from tests.integration.reshape_driver import allocate, reshaper_posts
from tests.integration.test_nested_reshape import (
    FOREIGN_RC,
    GPU1,
    GPU2,
    MDEV_TYPE,
    MDEVS,
    TRAIT,
    NestedHost,
    guest,
    prefix,
)

pytestmark = pytest.mark.integration

CPU_MEMORY = {"VCPU", "PCPU", "MEMORY_MB"}


class NumaHost(NestedHost):
    """Three guests, one consumer with no guest here (a migration record)."""

    def __init__(self, tmp_path, url, name, gpus=None):
        p = prefix()
        guests = [
            guest(1, p, pins=(2, 3), nodes="0", mdevs=MDEVS[:1] if gpus else ()),
            guest(2, p, pins=(10, 11), nodes="1", memory=2048),
            guest(3, p, nodes="1"),
        ]
        super().__init__(tmp_path, url, name, guests, gpus=gpus)
        self.migration = str(uuid.uuid4())

    def allocations(self) -> dict:
        found = super().allocations()
        body = self.scheduler.get(f"/allocations/{self.migration}")["allocations"]
        found[self.migration] = {rp: a["resources"] for rp, a in body.items()}
        return found

    def numa_children(self) -> dict:
        return {name: rp for name, (rp, _parent) in self.tree().items() if "_NUMA_" in name}


def to_root(allocations: dict, children: set, root: str) -> dict:
    """``allocations`` with everything on ``children`` summed onto ``root``."""
    out = {}
    for consumer, by_rp in allocations.items():
        merged: dict = {}
        for rp, res in by_rp.items():
            target = merged.setdefault(root if rp in children else rp, {})
            for rc, amount in res.items():
                target[rc] = target.get(rc, 0) + amount
        out[consumer] = merged
    return out


def numa_host_with_guests(tmp_path, url, name, **cycle_kw) -> NumaHost:
    """NUMA on, guests allocated on the node children, an operator trait on
    the root, a foreign child with an allocation."""
    host = NumaHost(tmp_path, url, name)
    _outcome, report, _ = host.cycle(numa_in_placement=True, **cycle_kw)
    assert report.ok, report.errors
    root = host.root
    nodes = host.numa_children()
    node0, node1 = nodes[f"{name}_NUMA_0"], nodes[f"{name}_NUMA_1"]
    host.add_operator_trait()
    host.foreign = host.add_foreign_child()
    a, b, c = (g["uuid"] for g in host.guests)
    allocate(host.scheduler, a, {node0: {"PCPU": 2, "MEMORY_MB": 1024}, root: {"DISK_GB": 5}})
    allocate(host.scheduler, b, {node1: {"PCPU": 2, "MEMORY_MB": 2048}})
    allocate(
        host.scheduler, c, {node1: {"VCPU": 2, "MEMORY_MB": 1024}, host.foreign: {FOREIGN_RC: 1}}
    )
    allocate(host.scheduler, host.migration, {node0: {"VCPU": 3, "MEMORY_MB": 512}})
    return host


@pytest.mark.parametrize("lose_state", [False, True], ids=["state-kept", "state-lost"])
def test_numa_off_moves_every_allocation_back_to_the_root_and_deletes_the_children(
    tmp_path, placement_server, host_name, lose_state
):
    host = numa_host_with_guests(tmp_path, placement_server.url, host_name)
    root, children = host.root, set(host.numa_children().values())
    before = host.allocations()
    if lose_state:
        shutil.rmtree(host.state_dir)
    host.agent.stats.reset()

    outcome, report, _ = host.cycle()  # numa_in_placement = false

    assert not isinstance(outcome, ReshapeRefused), outcome
    assert outcome.reshaped and report.ok, report.errors
    assert len(reshaper_posts(host.agent)) == 1
    assert host.allocations() == to_root(before, children, root)
    assert sorted(host.tree()) == sorted([host.name, f"{host.name}-foreign-widget"])
    inventories = host.inventories(root)
    assert inventories["PCPU"] == 8 and inventories["VCPU"] == 8
    assert inventories["MEMORY_MB"] > 0 and "DISK_GB" in inventories
    assert TRAIT in host.root_traits()
    assert host.inventories(host.foreign) == {FOREIGN_RC: 10}
    # A second run has nothing left to do.
    outcome, report, _ = host.cycle()
    assert not outcome.reshaped and report.ok and report.applied == []


def test_numa_off_that_the_root_cannot_hold_is_refused_and_nothing_is_offered_twice(
    tmp_path, placement_server, host_name
):
    host = numa_host_with_guests(tmp_path, placement_server.url, host_name)
    root, nodes = host.root, host.numa_children()
    node1 = nodes[f"{host.name}_NUMA_1"]
    # 12 more VCPU on node 1 (4 CPUs x ratio 4.0 = 16, max_unit 4): the flat
    # root at ratio 1.0 offers 8 VCPU, less than the 3 + 2 + 12 in use.
    for _ in range(3):
        allocate(host.scheduler, str(uuid.uuid4()), {node1: {"VCPU": 4}})
    before = host.allocations()
    held = {rp: host.inventories(rp) for rp in [root, *nodes.values()]}
    host.agent.stats.reset()

    outcome, report, _ = host.cycle(cpu_allocation_ratio=1.0)

    assert isinstance(outcome, ReshapeRefused)
    assert f"VCPU on {host.name} would need 17 but the new inventory holds 8" in str(outcome)
    assert reshaper_posts(host.agent) == []
    assert host.allocations() == before
    # The children keep what they offer; the root does not offer it again.
    assert {rp: host.inventories(rp) for rp in held} == held
    assert not CPU_MEMORY & set(host.inventories(root))
    assert set(host.numa_children().values()) == set(nodes.values())


def test_gpu_children_going_away_refuse_while_a_guest_holds_vgpu_then_are_deleted(
    tmp_path, placement_server, host_name
):
    host = NumaHost(
        tmp_path, placement_server.url, host_name, gpus={GPU1: MDEVS[:2], GPU2: MDEVS[2:]}
    )
    _o, report, _ = host.cycle(enabled_mdev_types=(MDEV_TYPE,))
    assert report.ok, report.errors
    gpu1 = host.uuid_of(f"{host.name}_pci_0000_81_00_0")
    gpu2 = host.uuid_of(f"{host.name}_pci_0000_82_00_0")
    a = host.guests[0]
    allocate(
        host.scheduler, a["uuid"], {host.root: {"PCPU": 2, "MEMORY_MB": 1024}, gpu1: {"VGPU": 1}}
    )
    before = host.allocations()
    shutil.rmtree(host.state_dir)

    # The type is no longer enabled: the root reports no VGPU to move it back to.
    outcome, report, _ = host.cycle()

    assert isinstance(outcome, ReshapeRefused)
    assert (f"guest {a['name']} ({a['uuid']}) holds 1 VGPU on {host.name}_pci_0000_81_00_0") in str(
        outcome
    )
    assert "enabled_mdev_types" in str(outcome)
    assert host.allocations() == before
    assert host.inventories(gpu1) == {"VGPU": 4} and host.inventories(gpu2) == {"VGPU": 3}
    assert "VGPU" not in host.inventories(host.root)

    # The guest's VGPU is released: the children are emptied and deleted.
    allocate(
        host.scheduler,
        a["uuid"],
        {host.root: {"PCPU": 2, "MEMORY_MB": 1024}},
        generation=host.scheduler.get(f"/allocations/{a['uuid']}")["consumer_generation"],
    )
    outcome, report, _ = host.cycle()
    assert not isinstance(outcome, ReshapeRefused), outcome
    assert report.ok, report.errors
    assert sorted(host.tree()) == [host.name]


def test_a_child_named_like_the_agents_but_not_marked_is_left_alone(
    tmp_path, placement_server, host_name
):
    host = NumaHost(tmp_path, placement_server.url, host_name)
    _o, report, _ = host.cycle()
    assert report.ok
    # Someone else's NUMA-like child under this root: no mark, not in the state.
    other = str(uuid.uuid4())
    host.scheduler.post(
        "/resource_providers",
        {"name": f"{host.name}_NUMA_7", "uuid": other, "parent_provider_uuid": host.root},
    )
    host.scheduler.put(
        f"/resource_providers/{other}/inventories",
        {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 2}}},
    )
    shutil.rmtree(host.state_dir)

    outcome, report, _ = host.cycle()

    assert not outcome.reshaped
    assert host.tree()[f"{host.name}_NUMA_7"][0] == other
    assert host.inventories(other) == {"VCPU": 2}
    # Left alone, but counted: its 2 VCPU beside the root's would overstate
    # the host, so the capacity invariant refuses and closes the root's CPUs.
    assert any("overstate the host" in e for e in report.errors), report.errors
    root = host.scheduler.get(f"/resource_providers/{host.root}/inventories")["inventories"]
    for rc in ("PCPU", "VCPU"):
        if rc in root:
            assert root[rc]["reserved"] == root[rc]["total"], root
