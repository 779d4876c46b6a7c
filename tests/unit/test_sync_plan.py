"""plan_changes against literal trees: no server, no files."""

import pytest

from node_agent.model.provider_state import ProviderState, inventories_equal
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.placement.planner import Change, describe_inventory_diff, plan_changes

ROOT = "11111111-1111-4111-8111-111111111111"
NUMA0 = "22222222-2222-4222-8222-222222222222"
NUMA1 = "33333333-3333-4333-8333-333333333333"
GPU = "44444444-4444-4444-8444-444444444444"
FOREIGN = "55555555-5555-4555-8555-555555555555"


def tree(root_inv=None, numa0_inv=None, root_traits=None, extra=()):
    return ProviderTree(
        (
            Provider(
                "host1",
                uuid=ROOT,
                inventories=root_inv
                if root_inv is not None
                else {"MEMORY_MB": Inventory(65536, reserved=512), "DISK_GB": Inventory(900)},
                traits=root_traits
                if root_traits is not None
                else {"HW_CPU_X86_AVX2": True, "COMPUTE_STATUS_DISABLED": False},
            ),
            Provider(
                "host1_NUMA0",
                parent="host1",
                uuid=NUMA0,
                inventories=numa0_inv
                if numa0_inv is not None
                else {"VCPU": Inventory(16, allocation_ratio=4.0), "PCPU": Inventory(8)},
            ),
        )
        + tuple(extra)
    )


def state_of(provider, parent_uuid=None, generation=3, traits=()):
    return ProviderState(
        provider.uuid,
        provider.name,
        generation,
        parent_uuid,
        {rc: i.as_placement() for rc, i in provider.inventories.items()},
        frozenset(traits),
    )


def in_sync(desired, extra_traits=()):
    root, numa0 = desired.providers[0], desired.providers[1]
    return {
        ROOT: state_of(root, traits={"HW_CPU_X86_AVX2", *extra_traits}),
        NUMA0: state_of(numa0, parent_uuid=ROOT, generation=7),
    }


def test_tree_already_in_placement_needs_no_change():
    desired = tree()
    assert plan_changes(desired, in_sync(desired), {NUMA0}) == []


def test_empty_placement_creates_parents_before_children_then_writes():
    changes = plan_changes(tree(), {}, set())
    assert [(c.method, c.path) for c in changes] == [
        ("POST", "/resource_providers"),
        ("POST", "/resource_providers"),
        ("PUT", f"/resource_providers/{ROOT}/inventories"),
        ("PUT", f"/resource_providers/{NUMA0}/inventories"),
        ("PUT", f"/resource_providers/{ROOT}/traits"),
    ]
    assert changes[0].body == {"name": "host1", "uuid": ROOT}
    assert changes[1].body == {"name": "host1_NUMA0", "uuid": NUMA0, "parent_provider_uuid": ROOT}


def test_new_provider_writes_carry_predicted_generations():
    changes = plan_changes(tree(), {}, set())
    by_path = {c.path: c.body for c in changes}
    assert by_path[f"/resource_providers/{ROOT}/inventories"]["resource_provider_generation"] == 0
    # The inventory PUT bumps the new root to generation 1.
    assert by_path[f"/resource_providers/{ROOT}/traits"] == {
        "resource_provider_generation": 1,
        "traits": ["HW_CPU_X86_AVX2"],
    }


def test_changed_total_puts_whole_inventory_with_generation_and_summary():
    desired = tree(numa0_inv={"VCPU": Inventory(32, allocation_ratio=4.0), "PCPU": Inventory(8)})
    actual = in_sync(tree())
    [change] = plan_changes(desired, actual, {NUMA0})
    assert change.method == "PUT"
    assert change.path == f"/resource_providers/{NUMA0}/inventories"
    assert change.body["resource_provider_generation"] == 7
    assert set(change.body["inventories"]) == {"VCPU", "PCPU"}
    assert change.body["inventories"]["VCPU"]["total"] == 32
    assert change.summary == ("set VCPU total 16→32, max_unit 16→32 on host1_NUMA0")


def test_every_inventory_field_counts_as_a_difference():
    base = {
        "total": 16,
        "reserved": 0,
        "min_unit": 1,
        "max_unit": 16,
        "step_size": 1,
        "allocation_ratio": 4.0,
    }
    for name, value in [
        ("reserved", 1),
        ("min_unit", 2),
        ("max_unit", 8),
        ("step_size", 2),
        ("allocation_ratio", 2.0),
    ]:
        assert not inventories_equal({"VCPU": base}, {"VCPU": {**base, name: value}}), name


def test_ratio_read_back_as_rounded_float_is_not_a_difference():
    desired = tree(numa0_inv={"VCPU": Inventory(16, allocation_ratio=1.1), "PCPU": Inventory(8)})
    actual = in_sync(desired)
    rounded = dict(actual[NUMA0].inventories)
    rounded["VCPU"] = {**rounded["VCPU"], "allocation_ratio": 1.10000002384}
    actual[NUMA0] = ProviderState(NUMA0, "host1_NUMA0", 7, ROOT, rounded)
    assert plan_changes(desired, actual, {NUMA0}) == []


def test_integer_ratio_from_placement_equals_float_ratio():
    desired = tree()
    actual = in_sync(desired)
    inv = dict(actual[NUMA0].inventories)
    inv["PCPU"] = {**inv["PCPU"], "allocation_ratio": 1}
    actual[NUMA0] = ProviderState(NUMA0, "host1_NUMA0", 7, ROOT, inv)
    assert plan_changes(desired, actual, {NUMA0}) == []


def test_removed_class_is_left_out_of_the_put_and_named_in_summary():
    desired = tree(numa0_inv={"PCPU": Inventory(24)})
    [change] = plan_changes(desired, in_sync(tree()), {NUMA0})
    assert set(change.body["inventories"]) == {"PCPU"}
    assert change.summary == ("set PCPU total 8→24, max_unit 8→24; remove VCPU on host1_NUMA0")


def test_describe_inventory_diff_names_added_class():
    assert describe_inventory_diff({}, {"PCPU": Inventory(4).as_placement()}) == [
        "add PCPU total 4"
    ]


def test_a_class_added_closed_says_so():
    # In maintenance a class the new sets add is added fully reserved; the
    # log must not read as if capacity opened.
    assert describe_inventory_diff({}, {"PCPU": Inventory(4, reserved=4).as_placement()}) == [
        "add PCPU total 4 fully reserved"
    ]


def test_operator_traits_are_kept_when_agent_traits_change():
    desired = tree(
        root_traits={
            "HW_CPU_X86_AVX2": True,
            "HW_CPU_X86_AVX512F": True,
            "COMPUTE_STATUS_DISABLED": False,
        }
    )
    actual = in_sync(tree(), extra_traits={"CUSTOM_RACK_7", "COMPUTE_STATUS_DISABLED"})
    [change] = plan_changes(desired, actual, {NUMA0})
    assert change.path == f"/resource_providers/{ROOT}/traits"
    assert change.body == {
        "resource_provider_generation": 3,
        "traits": ["CUSTOM_RACK_7", "HW_CPU_X86_AVX2", "HW_CPU_X86_AVX512F"],
    }
    assert change.summary == ("traits +HW_CPU_X86_AVX512F -COMPUTE_STATUS_DISABLED on host1")


def test_trait_outside_the_agents_map_never_causes_a_write():
    desired = tree()
    actual = in_sync(desired, extra_traits={"CUSTOM_GOLD", "HW_NIC_SRIOV"})
    assert plan_changes(desired, actual, {NUMA0}) == []


def test_custom_class_and_trait_are_defined_first_unless_known():
    extra = [
        Provider(
            "host1_gpu0",
            parent="host1",
            uuid=GPU,
            inventories={"CUSTOM_VGPU_A": Inventory(4)},
            traits={"CUSTOM_NVIDIA_A10": True, "CUSTOM_OLD": False},
        )
    ]
    desired = tree(extra=extra)
    changes = plan_changes(desired, in_sync(desired), {NUMA0})
    assert [(c.method, c.path) for c in changes[:3]] == [
        ("PUT", "/resource_classes/CUSTOM_VGPU_A"),
        ("PUT", "/traits/CUSTOM_NVIDIA_A10"),
        ("POST", "/resource_providers"),
    ]
    again = plan_changes(
        desired,
        in_sync(desired),
        {NUMA0},
        known_resource_classes={"CUSTOM_VGPU_A"},
        known_traits={"CUSTOM_NVIDIA_A10"},
    )
    assert not [c for c in again if c.kind in ("resource_class", "trait")]


def test_custom_class_seen_in_placement_is_not_redefined():
    extra = [
        Provider(
            "host1_gpu0", parent="host1", uuid=GPU, inventories={"CUSTOM_VGPU_A": Inventory(4)}
        )
    ]
    desired = tree(extra=extra)
    actual = in_sync(desired)
    actual[GPU] = state_of(extra[0], parent_uuid=ROOT)
    assert plan_changes(desired, actual, {NUMA0, GPU}) == []


def test_owned_child_no_longer_desired_is_deleted_last():
    numa1 = Provider("host1_NUMA1", parent="host1", uuid=NUMA1, inventories={"VCPU": Inventory(16)})
    desired = tree(numa0_inv={"VCPU": Inventory(8, allocation_ratio=4.0), "PCPU": Inventory(8)})
    actual = in_sync(tree())
    actual[NUMA1] = state_of(numa1, parent_uuid=ROOT)
    changes = plan_changes(desired, actual, {NUMA0, NUMA1})
    assert changes[-1] == Change(
        "delete",
        NUMA1,
        "delete provider host1_NUMA1 (no longer on the host)",
        provider="host1_NUMA1",
    )
    assert changes[0].kind == "inventories"


def test_foreign_child_is_never_deleted():
    bandwidth = ProviderState(
        FOREIGN,
        "host1:neutron-agent:bw",
        1,
        ROOT,
        {"NET_BW_EGR_KILOBIT_PER_SEC": Inventory(10000).as_placement()},
    )
    desired = tree()
    actual = {**in_sync(desired), FOREIGN: bandwidth}
    assert plan_changes(desired, actual, {NUMA0}) == []


def test_owned_child_with_a_foreign_grandchild_is_not_deleted():
    numa1 = Provider("host1_NUMA1", parent="host1", uuid=NUMA1)
    desired = tree()
    actual = {
        **in_sync(desired),
        NUMA1: state_of(numa1, parent_uuid=ROOT),
        FOREIGN: ProviderState(FOREIGN, "pf0", 1, NUMA1),
    }
    assert plan_changes(desired, actual, {NUMA0, NUMA1}) == []


def test_owned_children_are_deleted_deepest_first():
    numa1 = Provider("host1_NUMA1", parent="host1", uuid=NUMA1)
    gpu = Provider("host1_NUMA1_gpu", parent="host1_NUMA1", uuid=GPU)
    desired = tree()
    actual = {
        **in_sync(desired),
        NUMA1: state_of(numa1, parent_uuid=ROOT),
        GPU: state_of(gpu, parent_uuid=NUMA1),
    }
    changes = plan_changes(desired, actual, {NUMA0, NUMA1, GPU})
    assert [c.path for c in changes] == [
        f"/resource_providers/{GPU}",
        f"/resource_providers/{NUMA1}",
    ]


def test_a_kept_child_moved_to_the_root_first_lets_its_old_parent_go():
    # numa_in_placement turned off: the GPU child leaves host1_NUMA1 for the
    # root (PUT), then host1_NUMA1 is deleted, in the same plan.
    numa1 = Provider("host1_NUMA1", parent="host1", uuid=NUMA1)
    gpu = Provider("host1_gpu", parent="host1", uuid=GPU, inventories={"VGPU": Inventory(4)})
    desired = tree(extra=(gpu,))
    actual = {
        **in_sync(desired),
        NUMA1: state_of(numa1, parent_uuid=ROOT),
        GPU: state_of(gpu, parent_uuid=NUMA1),
    }
    changes = plan_changes(desired, actual, {NUMA0, NUMA1, GPU})
    assert [(c.method, c.path) for c in changes] == [
        ("PUT", f"/resource_providers/{GPU}"),
        ("DELETE", f"/resource_providers/{NUMA1}"),
    ]
    assert changes[0].body["parent_provider_uuid"] == ROOT


def test_root_is_never_deleted_even_if_listed_as_owned():
    desired = tree()
    other_root = ProviderState(FOREIGN, "old-host", 0, None)
    actual = {**in_sync(desired), FOREIGN: other_root}
    assert plan_changes(desired, actual, {NUMA0, FOREIGN}) == []


def test_aggregates_are_never_written():
    changes = plan_changes(tree(), {}, set())
    assert not [c for c in changes if "aggregates" in c.path]


def test_renamed_provider_is_updated_in_place():
    desired = tree()
    actual = in_sync(desired)
    actual[NUMA0] = ProviderState(NUMA0, "old-name", 7, ROOT, actual[NUMA0].inventories)
    [change] = plan_changes(desired, actual, {NUMA0})
    assert (change.method, change.path) == ("PUT", f"/resource_providers/{NUMA0}")
    assert change.body == {"name": "host1_NUMA0", "parent_provider_uuid": ROOT}


def test_provider_without_uuid_is_refused():
    desired = ProviderTree((Provider("host1"),))
    with pytest.raises(ValueError, match="host1"):
        plan_changes(desired, {}, set())


# --- [placement] aggregates: added, and only ours removed


AGG_A, AGG_B, AGG_OP = (f"{n}0000000-0000-4000-8000-000000000000" for n in "abc")


@pytest.mark.parametrize(
    "current, wanted, ours, expected",
    [
        ({AGG_OP}, {AGG_A}, set(), {AGG_OP, AGG_A}),  # added beside the operator's
        ({AGG_OP, AGG_A}, set(), {AGG_A}, {AGG_OP}),  # ours dropped, theirs kept
        ({AGG_OP, AGG_A}, set(), None, {AGG_OP, AGG_A}),  # no record: nothing removed
        ({AGG_OP}, set(), {AGG_OP, AGG_A}, set()),  # recorded as ours: ours to remove
        ({AGG_A}, {AGG_A}, set(), {AGG_A}),  # nothing to do
    ],
)
def test_aggregates_are_added_and_only_ours_removed(current, wanted, ours, expected):
    from node_agent.policy.aggregates import merged

    assert merged(frozenset(current), frozenset(wanted), ours) == frozenset(expected)


@pytest.mark.parametrize(
    "ours, before, after, expected",
    [
        (None, {AGG_OP}, {AGG_OP, AGG_A}, {AGG_A}),  # there before, no record: not ours
        ({AGG_A}, {AGG_A}, {AGG_A, AGG_B}, {AGG_A, AGG_B}),
        ({AGG_A, AGG_B}, {AGG_A, AGG_B}, {AGG_B}, {AGG_B}),
    ],
)
def test_ours_after_a_write_are_what_we_had_and_what_we_added(ours, before, after, expected):
    from node_agent.policy.aggregates import owned_after

    assert owned_after(ours, frozenset(before), frozenset(after)) == frozenset(expected)
