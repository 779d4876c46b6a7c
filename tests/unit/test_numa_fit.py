"""Where guests with no NUMA placement go when NUMA children appear (policy/numa_fit.py)."""

from __future__ import annotations

from node_agent.model.provider_tree import Inventory
from node_agent.policy.numa_fit import place_floating, spread_amount

# linux-test4's nodes as the tree publishes them: 8 CPUs each at ratio 4, ~64 GiB.
NODE = {
    "VCPU": Inventory(8, allocation_ratio=4.0),
    "MEMORY_MB": Inventory(64000, reserved=512),
}
NODES = {0: NODE, 1: NODE}


def test_each_floating_guest_goes_whole_to_the_node_with_most_room_left():
    placed = place_floating(
        NODES,
        {0: [{"VCPU": 4, "MEMORY_MB": 16000}]},  # a guest numatune keeps on node 0
        {"a": {"VCPU": 2, "MEMORY_MB": 4096}, "b": {"VCPU": 2, "MEMORY_MB": 4096}},
    )
    assert placed == {
        "a": ((1, {"VCPU": 2, "MEMORY_MB": 4096}),),
        "b": ((1, {"VCPU": 2, "MEMORY_MB": 4096}),),
    }


def test_largest_guests_are_placed_first_and_spread_over_the_nodes():
    placed = place_floating(
        NODES,
        {},
        {
            "small": {"VCPU": 1, "MEMORY_MB": 1024},
            "big": {"VCPU": 8, "MEMORY_MB": 40000},
            "mid": {"VCPU": 4, "MEMORY_MB": 30000},
        },
    )
    assert placed["big"] == ((0, {"VCPU": 8, "MEMORY_MB": 40000}),)
    assert placed["mid"] == ((1, {"VCPU": 4, "MEMORY_MB": 30000}),)
    assert placed["small"][0][0] == 1  # node 1 has more of its memory left


def test_a_guest_larger_than_any_node_is_split_within_max_unit():
    # 12 vCPUs: no node takes more than 8 in one allocation (max_unit = total).
    placed = place_floating(NODES, {}, {"wide": {"VCPU": 12, "MEMORY_MB": 100000}})
    assert placed["wide"] == (
        (0, {"VCPU": 8, "MEMORY_MB": 63488}),
        (1, {"VCPU": 4, "MEMORY_MB": 36512}),
    )


def test_a_guest_the_nodes_together_cannot_hold_is_unplaced():
    placed = place_floating(NODES, {}, {"huge": {"VCPU": 4, "MEMORY_MB": 200000}})
    assert placed == {"huge": None}


def test_spread_amount_follows_the_plan_and_keeps_the_rest_on_the_first_piece():
    assert spread_amount(12, [8, 4]) == [8, 4]
    assert spread_amount(10, [8, 4]) == [8, 2]
    assert spread_amount(14, [8, 4]) == [10, 4]
