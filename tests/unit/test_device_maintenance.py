"""Per-device maintenance, pure: literal trees, no server."""

from __future__ import annotations

import pytest

from node_agent.errors import UnknownProvider
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.policy import device_maintenance as devmaint
from node_agent.policy import maintenance as maint
from node_agent.policy.maintenance import TRAIT

TREE = ProviderTree(
    (
        Provider("h", inventories={"DISK_GB": Inventory(100)}),
        Provider("h_NUMA_0", parent="h", inventories={"VCPU": Inventory(8, reserved=1)}),
        Provider("h_NUMA_1", parent="h", inventories={"VCPU": Inventory(8)}),
    )
)
ON = maint.record(True, "reseat", "2026-01-01T00:00:00+00:00")
OFF = maint.record(False, None, "2026-01-02T00:00:00+00:00")


def test_on_closes_that_child_only_and_marks_it():
    tree, notes = devmaint.apply(TREE, {"h_NUMA_0": ON})

    node0, node1 = tree.by_name("h_NUMA_0"), tree.by_name("h_NUMA_1")
    assert node0.inventories["VCPU"].reserved == 8 and node0.traits[TRAIT] is True
    assert node1 == TREE.by_name("h_NUMA_1") and tree.root == TREE.root
    assert "device maintenance is on for h_NUMA_0 (reseat)" in notes[0]


def test_off_wants_the_trait_gone_and_keeps_the_configured_reservation():
    tree, _ = devmaint.apply(TREE, {"h_NUMA_0": OFF})

    assert tree.by_name("h_NUMA_0").traits[TRAIT] is False
    assert tree.by_name("h_NUMA_0").inventories["VCPU"].reserved == 1


def test_a_record_for_a_provider_gone_from_the_tree_is_noted_not_applied():
    tree, notes = devmaint.apply(TREE, {"h_gpu_gone": ON})

    assert tree == TREE
    assert "h_gpu_gone, which is not a child provider" in notes[0]


@pytest.mark.parametrize(
    "tree_traits, placement, closed",
    [
        ({}, {"h_NUMA_0": {TRAIT}}, True),  # no record: Placement's trait holds it
        ({TRAIT: False}, {"h_NUMA_0": {TRAIT}}, False),  # an off record wins
        ({}, {"h_NUMA_0": set()}, False),
    ],
)
def test_placement_holds_a_child_only_without_a_record(tree_traits, placement, closed):
    tree = ProviderTree(
        (
            TREE.root,
            Provider(
                "h_NUMA_0", parent="h", traits=tree_traits, inventories={"VCPU": Inventory(8)}
            ),
        )
    )

    held, _ = devmaint.held_by_placement(tree, placement)

    assert (held.by_name("h_NUMA_0").inventories["VCPU"].reserved == 8) is closed


def test_an_unknown_name_is_refused_naming_the_children():
    with pytest.raises(UnknownProvider) as refused:
        devmaint.check_name(TREE, "gpu0")

    assert "h_NUMA_0, h_NUMA_1" in str(refused.value)
    assert refused.value.exit_code == 2
