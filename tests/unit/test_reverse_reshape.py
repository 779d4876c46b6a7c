"""The way back (pure): which children are the agent's, and children_to_root."""

import pytest

from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.placement.reshape_engine import Consumer, ProviderAllocations, compute_reshape
from node_agent.placement.reshape_rules import children_to_root
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT, ListedChild, agent_children, candidates

ROOT = "aaaaaaaa-0000-4000-8000-000000000000"
NODE0 = "bbbbbbbb-0000-4000-8000-000000000000"
GUEST = "11111111-0000-4000-8000-000000000001"
MIGRATION = "99999999-0000-4000-8000-000000000009"


@pytest.mark.parametrize(
    "name,parent,traits,owned,mine",
    [
        ("h_NUMA_0", ROOT, {AGENT_CHILD_TRAIT}, (), "numa"),
        ("h_pci_0000_81_00_0", ROOT, {AGENT_CHILD_TRAIT}, (), "gpu"),
        ("h_NUMA_0", ROOT, set(), ("c",), "numa"),  # the state file says so
        ("h_NUMA_0", ROOT, set(), (), None),  # no proof: left alone
        ("h_pci_0000_81_00_0", ROOT, {"HW_GPU_API_CUDA_V10_0"}, (), None),  # nova's, say
        ("h_NUMA_0", "elsewhere", {AGENT_CHILD_TRAIT}, (), None),  # not under our root
        ("h_NUMA_0_extra", ROOT, {AGENT_CHILD_TRAIT}, (), None),  # not our exact name
        ("other_NUMA_0", ROOT, {AGENT_CHILD_TRAIT}, (), None),  # another host's name
        ("h-foreign-widget", ROOT, {AGENT_CHILD_TRAIT}, (), None),
    ],
)
def test_a_child_is_the_agents_by_exact_name_under_its_root_and_mark_or_state(
    name, parent, traits, owned, mine
):
    child = ListedChild("c", name, parent, frozenset(traits), {})
    assert agent_children("h", ROOT, [child], owned).get("c") == mine


@pytest.mark.parametrize(
    "parent,mine",
    [(NODE0, "gpu"), ("foreign-parent", None)],
)
def test_a_gpu_child_under_the_agents_numa_child_is_the_agents(parent, mine):
    # With NUMA children a GPU child sits under its device's node.
    node = ListedChild(NODE0, "h_NUMA_0", ROOT, frozenset({AGENT_CHILD_TRAIT}), {})
    gpu = ListedChild("g", "h_pci_0000_81_00_0", parent, frozenset({AGENT_CHILD_TRAIT}), {})
    assert agent_children("h", ROOT, [node, gpu]).get("g") == mine
    assert [c.uuid for c in candidates("h", ROOT, [node, gpu], ["h"])] == (
        [NODE0, "g"] if mine else [NODE0]
    )


def test_candidates_are_named_like_the_agents_children_and_dropped_by_the_tree():
    listed = [
        ListedChild("0", "h_NUMA_0", ROOT),
        ListedChild("1", "h_NUMA_1", ROOT),
        ListedChild("f", "h-foreign", ROOT),
        ListedChild("r", "h", None),
    ]
    assert [c.uuid for c in candidates("h", ROOT, listed, ["h", "h_NUMA_1"])] == ["0"]


def _flat(vcpu=8):
    return ProviderTree(
        (
            Provider(
                "h", uuid=ROOT, inventories={"VCPU": Inventory(vcpu), "MEMORY_MB": Inventory(4096)}
            ),
            Provider("h_NUMA_0", parent="h", uuid=NODE0),
        )
    )


def _consumer(uuid, resources):
    return Consumer(uuid, 1, "p" * 32, "u" * 32, {NODE0: resources})


def test_everything_on_a_retired_child_moves_to_the_root_whoever_holds_it():
    rule = children_to_root(
        ROOT, {NODE0: "h_NUMA_0"}, ["VCPU", "MEMORY_MB"], {NODE0: {"VCPU", "MEMORY_MB"}}
    )
    guest = _consumer(GUEST, {"VCPU": 2, "MEMORY_MB": 1024})
    migration = _consumer(MIGRATION, {"VCPU": 1})
    view = {
        ROOT: ProviderAllocations(ROOT, 3),
        NODE0: ProviderAllocations(
            NODE0, 5, {GUEST: guest.allocations[NODE0], MIGRATION: {"VCPU": 1}}
        ),
    }
    plan = compute_reshape(view, {GUEST: guest, MIGRATION: migration}, _flat(), rule)
    assert not plan.refusals
    assert plan.body["inventories"][NODE0] == {"resource_provider_generation": 5, "inventories": {}}
    assert set(plan.body["inventories"][ROOT]["inventories"]) == {"VCPU", "MEMORY_MB"}
    assert plan.body["allocations"][GUEST]["allocations"] == {
        ROOT: {"resources": {"VCPU": 2, "MEMORY_MB": 1024}}
    }
    assert plan.body["allocations"][MIGRATION]["allocations"] == {ROOT: {"resources": {"VCPU": 1}}}


def test_a_retired_child_with_inventory_but_no_allocation_is_emptied_in_one_body():
    rule = children_to_root(ROOT, {NODE0: "h_NUMA_0"}, ["VCPU"], {NODE0: {"VCPU"}})
    view = {ROOT: ProviderAllocations(ROOT, 3), NODE0: ProviderAllocations(NODE0, 5)}
    plan = compute_reshape(view, {}, _flat(), rule)
    assert plan.needed and plan.body["allocations"] == {}
    assert plan.body["inventories"][NODE0]["inventories"] == {}


def test_a_class_the_root_does_not_report_refuses_the_way_back():
    rule = children_to_root(
        ROOT,
        {NODE0: "h_NUMA_0"},
        ["VCPU", "MEMORY_MB"],
        {NODE0: {"CUSTOM_MEMORY_PAGE_2048"}},
        hint="numa off",
    )
    pages = _consumer(GUEST, {"CUSTOM_MEMORY_PAGE_2048": 4})
    view = {
        ROOT: ProviderAllocations(ROOT, 3),
        NODE0: ProviderAllocations(NODE0, 5, {GUEST: pages.allocations[NODE0]}),
    }
    plan = compute_reshape(view, {GUEST: pages}, _flat(), rule)
    assert plan.refusals == (
        f"consumer {GUEST} (no guest on this host) holds 4 CUSTOM_MEMORY_PAGE_2048 on "
        "h_NUMA_0, which is going away (numa off); the root reports no "
        "CUSTOM_MEMORY_PAGE_2048 to move it back to. Keep the configuration that reports "
        "that child, or remove that allocation (migrate or delete the instance) first.",
    )


def test_the_root_too_small_for_what_comes_back_refuses():
    rule = children_to_root(ROOT, {NODE0: "h_NUMA_0"}, ["VCPU"], {NODE0: {"VCPU"}})
    guest = _consumer(GUEST, {"VCPU": 6})
    view = {
        ROOT: ProviderAllocations(ROOT, 3),
        NODE0: ProviderAllocations(NODE0, 5, {GUEST: {"VCPU": 6}}),
    }
    plan = compute_reshape(view, {GUEST: guest}, _flat(vcpu=4), rule)
    assert (
        plan.refusals and "VCPU on h would need 6 but the new inventory holds 4" in plan.refusals[0]
    )
