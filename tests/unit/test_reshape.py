"""The pure reshape engine, on guests parsed from the test-driver host file."""

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from node_agent.host.domain import parse_domain
from node_agent.model.cpuset import parse_cpu_spec
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.model.snapshot import GuestMdev
from node_agent.placement.reshape_engine import (
    Consumer,
    ProviderAllocations,
    affected_consumers,
    compute_reshape,
    hold_inventories,
    move_targets,
    rule_sources,
    stage,
)
from node_agent.placement.reshape_rules import (
    chain,
    floating_placements,
    guest_names,
    host_rule,
    pcpu_to_numa_children,
    pinned_to_pcpu,
    rule_provider_names,
    vgpu_to_gpu_children,
)
from node_agent.policy.partition import partition_cpus
from node_agent.tree.build import build_tree
from tests.snapshots import settings, snapshot

HOST_XML = Path(__file__).resolve().parents[1] / "data" / "libvirt" / "host.xml"
ROOT = "aaaaaaaa-0000-4000-8000-000000000000"
SHARED_DISK = "dddddddd-0000-4000-8000-000000000000"  # a sharing provider, not ours
PROJECT, USER = "p" * 32, "u" * 32
PINNED = "11111111-0000-4000-8000-000000000001"  # 4 vCPUs on 2,10,3,11
PINNED_2 = "11111111-0000-4000-8000-000000000002"  # 2 vCPUs on 4,12
UNPINNED = "11111111-0000-4000-8000-000000000003"  # 2 vCPUs floating
ORPHAN = "99999999-0000-4000-8000-000000000009"  # no such domain


def _guests():
    root = ET.parse(HOST_XML).getroot()
    return tuple(
        parse_domain(ET.tostring(d, encoding="unicode"), running=True)
        for d in root.findall("domain")
    )


GUESTS = _guests()


def tree(vcpu=8, pcpu=8, ratio=4.0, vgpu=0):
    inventories = {"MEMORY_MB": Inventory(65536, reserved=512), "DISK_GB": Inventory(500)}
    if vcpu:
        inventories["VCPU"] = Inventory(vcpu, allocation_ratio=ratio)
    if pcpu:
        inventories["PCPU"] = Inventory(pcpu)
    if vgpu:
        inventories["VGPU"] = Inventory(vgpu)
    return ProviderTree((Provider("host", uuid=ROOT, inventories=inventories),))


def consumer(uuid, generation=1, **on_root):
    allocations = {ROOT: dict(on_root)}
    return Consumer(uuid, generation, PROJECT, USER, allocations)


def provider_view(*consumers, generation=7):
    return {
        ROOT: ProviderAllocations(
            ROOT, generation, {c.uuid: c.allocations[ROOT] for c in consumers}
        )
    }


def legacy_consumers():
    pinned = Consumer(
        PINNED,
        3,
        PROJECT,
        USER,
        {ROOT: {"VCPU": 4, "MEMORY_MB": 4096, "DISK_GB": 20}, SHARED_DISK: {"DISK_GB": 100}},
    )
    return [
        pinned,
        consumer(PINNED_2, VCPU=2, MEMORY_MB=2048),
        consumer(UNPINNED, VCPU=2, MEMORY_MB=1024, DISK_GB=10),
    ]


def rule(dedicated="2-5,10-13"):
    return pinned_to_pcpu(GUESTS, ROOT, parse_cpu_spec(dedicated) if dedicated else None)


def test_pinned_guests_vcpu_becomes_pcpu_and_everything_else_is_carried_over():
    consumers = legacy_consumers()
    plan = compute_reshape(
        provider_view(*consumers),
        {c.uuid: c for c in consumers},
        tree(),
        rule(),
        consumer_names=guest_names(GUESTS),
    )

    assert plan.refusals == ()
    assert plan.body["inventories"] == {
        ROOT: {
            "resource_provider_generation": 7,
            "inventories": {rc: inv.as_placement() for rc, inv in tree().root.inventories.items()},
        }
    }
    assert set(plan.body["allocations"]) == {PINNED, PINNED_2}  # unpinned untouched
    assert plan.body["allocations"][PINNED] == {
        "allocations": {
            ROOT: {"resources": {"PCPU": 4, "MEMORY_MB": 4096, "DISK_GB": 20}},
            SHARED_DISK: {"resources": {"DISK_GB": 100}},
        },
        "project_id": PROJECT,
        "user_id": USER,
        "consumer_generation": 3,
    }
    assert plan.body["allocations"][PINNED_2]["allocations"] == {
        ROOT: {"resources": {"PCPU": 2, "MEMORY_MB": 2048}}
    }
    assert plan.totals() == {"consumers": 2, "moved": {"VCPU -> PCPU": 6}}


def test_dry_run_plan_names_each_guest_and_the_totals():
    consumers = legacy_consumers()
    plan = compute_reshape(
        provider_view(*consumers),
        {c.uuid: c for c in consumers},
        tree(),
        rule(),
        consumer_names=guest_names(GUESTS),
    )
    shown = plan.as_dict()

    assert [c["name"] for c in shown["consumers"]] == ["instance-00000001", "instance-00000002"]
    assert shown["consumers"][0]["moves"] == [
        {
            "from_provider": "host",
            "from_class": "VCPU",
            "to_provider": "host",
            "to_class": "PCPU",
            "amount": 4,
        }
    ]
    assert shown["lines"][0] == (f"{PINNED} (instance-00000001): 4 VCPU@host -> PCPU@host")
    assert shown["lines"][-1].startswith("total: 2 consumers; 6 VCPU -> PCPU")


def test_only_consumers_the_rule_moves_need_a_full_read():
    consumers = legacy_consumers() + [consumer(ORPHAN, VCPU=1)]
    assert affected_consumers(provider_view(*consumers), rule()) == [PINNED, PINNED_2]


def test_nothing_moves_once_pinned_guests_hold_pcpu():
    done = [consumer(PINNED, PCPU=4, MEMORY_MB=4096), consumer(UNPINNED, VCPU=2)]
    view = provider_view(*done)
    assert affected_consumers(view, rule()) == []
    plan = compute_reshape(view, {c.uuid: c for c in done}, tree(), rule())
    assert plan.body is None and not plan.needed
    assert "nothing to move" in plan.lines()[-1]


def test_transition_mode_without_dedicated_set_moves_nothing():
    consumers = legacy_consumers()
    plan = compute_reshape(
        provider_view(*consumers),
        {c.uuid: c for c in consumers},
        tree(vcpu=16, pcpu=16),
        rule(dedicated=None),
    )
    assert plan.body is None


def test_pinned_guest_outside_the_dedicated_set_moves_to_pcpu_as_nova_moves_it():
    """nova warns about stale pins and reshapes every dedicated instance."""
    consumers = legacy_consumers()
    plan = compute_reshape(
        provider_view(*consumers),
        {c.uuid: c for c in consumers},
        tree(),
        rule(dedicated="2-3,10-11,5-7"),
    )
    assert not plan.refusals
    stale = next(u for u, name in guest_names(GUESTS).items() if name == "instance-00000002")
    assert stale in {m["consumer"] for m in plan.as_dict()["consumers"]}


def test_fewer_pcpu_than_pinned_vcpus_in_use_is_refused():
    consumers = legacy_consumers()
    plan = compute_reshape(
        provider_view(*consumers),
        {c.uuid: c for c in consumers},
        tree(pcpu=5),
        rule(),
        consumer_names=guest_names(GUESTS),
    )
    assert len(plan.refusals) == 1
    assert "PCPU on host would need 6 but the new inventory holds 5" in plan.refusals[0]
    assert "instance-00000001" in plan.refusals[0]
    assert "instance-00000002" in plan.refusals[0]


def test_pcpu_already_used_by_other_guests_counts_against_the_new_capacity():
    consumers = legacy_consumers() + [consumer(ORPHAN, PCPU=3)]
    plan = compute_reshape(
        provider_view(*consumers), {c.uuid: c for c in consumers}, tree(pcpu=8), rule()
    )
    assert plan.refusals and "would need 9" in plan.refusals[0]


def test_unmatched_consumer_keeps_its_vcpu_inventory_and_is_reported():
    consumers = legacy_consumers() + [consumer(ORPHAN, VCPU=3)]
    view = provider_view(*consumers)
    everyone = {c.uuid: c for c in consumers}
    first = compute_reshape(view, everyone, tree(vcpu=0, pcpu=8), rule())
    assert first.missing_inventories == {ROOT}

    current = {
        ROOT: {
            "VCPU": {
                "total": 16,
                "reserved": 0,
                "min_unit": 1,
                "max_unit": 16,
                "step_size": 1,
                "allocation_ratio": 4.0,
            }
        }
    }
    plan = compute_reshape(
        view, everyone, tree(vcpu=0, pcpu=8), rule(), current_inventories=current
    )
    assert plan.body["inventories"][ROOT]["inventories"]["VCPU"] == current[ROOT]["VCPU"]
    assert ORPHAN not in plan.body["allocations"]
    assert any(ORPHAN in w and "VCPU inventory is kept" in w for w in plan.warnings)


def test_without_a_reshape_a_dropped_class_still_in_use_is_warned():
    view = provider_view(consumer(ORPHAN, VCPU=3))
    plan = compute_reshape(view, {}, tree(vcpu=0), rule())
    assert plan.body is None
    assert len(plan.warnings) == 1 and ORPHAN in plan.warnings[0]


GPU = "cccccccc-0000-4000-8000-00000000000a"
GPU_2 = "cccccccc-0000-4000-8000-00000000000b"


def test_vgpu_moves_from_root_to_the_child_of_the_mdev_parent():
    mdev_guest = next(g for g in GUESTS if g.mdevs)
    guest = dataclasses.replace(
        mdev_guest,
        mdevs=(
            GuestMdev(mdev_guest.mdevs[0].uuid, parent="0000:81:00.0"),
            GuestMdev("5b20d080-1b54-4048-85b3-a6a62d165c02", parent="0000:82:00.0"),
        ),
    )
    gpu_rule = vgpu_to_gpu_children([guest], ROOT, {"0000:81:00.0": GPU, "0000:82:00.0": GPU_2})
    desired = ProviderTree(
        (
            tree().root,
            Provider(
                "host_pci_0000_81_00_0",
                parent="host",
                uuid=GPU,
                inventories={"VGPU": Inventory(16)},
            ),
            Provider(
                "host_pci_0000_82_00_0",
                parent="host",
                uuid=GPU_2,
                inventories={"VGPU": Inventory(16)},
            ),
        )
    )
    holder = consumer(guest.uuid, VGPU=2, MEMORY_MB=2048)
    view = {
        **provider_view(holder),
        GPU: ProviderAllocations(GPU, 0),
        GPU_2: ProviderAllocations(GPU_2, 0),
    }

    plan = compute_reshape(view, {guest.uuid: holder}, desired, gpu_rule)

    assert plan.body["allocations"][guest.uuid]["allocations"] == {
        ROOT: {"resources": {"MEMORY_MB": 2048}},
        GPU: {"resources": {"VGPU": 1}},
        GPU_2: {"resources": {"VGPU": 1}},
    }
    assert set(plan.body["inventories"]) == {ROOT, GPU, GPU_2}


def test_vgpu_of_a_guest_whose_mdev_parent_is_unknown_stays():
    guest = next(g for g in GUESTS if g.mdevs)  # parent not known
    gpu_rule = vgpu_to_gpu_children([guest], ROOT, {"0000:81:00.0": GPU})
    assert gpu_rule(guest.uuid, ROOT, "VGPU", 1) == [(ROOT, "VGPU", 1)]


NODE0 = "eeeeeeee-0000-4000-8000-000000000000"
NODE1 = "eeeeeeee-0000-4000-8000-000000000001"


def node_of(cpu):
    return 0 if cpu < 8 else 1


def numa_tree(node_classes=("PCPU", "VCPU", "MEMORY_MB")):
    inventories = {rc: Inventory(8 if rc != "MEMORY_MB" else 32768) for rc in node_classes}
    return ProviderTree(
        (
            Provider("host", uuid=ROOT, inventories={"DISK_GB": Inventory(500)}),
            Provider("host_NUMA_0", parent="host", uuid=NODE0, inventories=inventories),
            Provider("host_NUMA_1", parent="host", uuid=NODE1, inventories=inventories),
        )
    )


def numa_view(*consumers):
    return {
        **provider_view(*consumers),
        NODE0: ProviderAllocations(NODE0, 2),
        NODE1: ProviderAllocations(NODE1, 5),
    }


def on_node_0(guest):
    """The guest pinned inside node 0 (CPUs 2-5), memory on node 0."""
    pins = tuple((vcpu, parse_cpu_spec(str(2 + vcpu))) for vcpu in range(guest.vcpus))
    return dataclasses.replace(guest, vcpupin=pins, numa_nodes=frozenset({0}))


def test_pinned_guest_inside_one_node_moves_cpu_and_memory_to_that_node():
    guest = on_node_0(next(g for g in GUESTS if g.uuid == PINNED))
    numa_rule = pcpu_to_numa_children([guest], ROOT, {0: NODE0, 1: NODE1}, node_of)
    both = chain(pinned_to_pcpu([guest], ROOT, parse_cpu_spec("2-5,10-13")), numa_rule)
    holder = consumer(PINNED, VCPU=4, MEMORY_MB=4096, DISK_GB=20)

    plan = compute_reshape(numa_view(holder), {PINNED: holder}, numa_tree(), both)

    assert plan.refusals == ()
    assert plan.body["allocations"][PINNED]["allocations"] == {
        ROOT: {"resources": {"DISK_GB": 20}},
        NODE0: {"resources": {"PCPU": 4, "MEMORY_MB": 4096}},
    }
    assert {
        rp: e["resource_provider_generation"] for rp, e in plan.body["inventories"].items()
    } == {ROOT: 7, NODE0: 2, NODE1: 5}


def test_guest_with_only_numatune_moves_its_vcpu_and_memory_to_that_node():
    floating = next(g for g in GUESTS if g.name == "instance-00000005")  # numatune node 1
    numa_rule = pcpu_to_numa_children(GUESTS, ROOT, {0: NODE0, 1: NODE1}, node_of)
    assert numa_rule(floating.uuid, ROOT, "VCPU", 2) == [(NODE1, "VCPU", 2)]
    assert numa_rule(floating.uuid, ROOT, "MEMORY_MB", 2048) == [(NODE1, "MEMORY_MB", 2048)]
    assert numa_rule(floating.uuid, ROOT, "DISK_GB", 5) == [(ROOT, "DISK_GB", 5)]


def test_guest_pinned_across_nodes_is_refused_naming_guest_and_nodes():
    numa_rule = pcpu_to_numa_children(GUESTS, ROOT, {0: NODE0, 1: NODE1}, node_of)
    both = chain(rule(), numa_rule)
    # instance-00000001 pins vCPUs to 2, 10, 3, 11: two on each node. It stays...
    assert both(PINNED, ROOT, "VCPU", 4) == [(ROOT, "PCPU", 4)]
    holder = consumer(PINNED, VCPU=4, MEMORY_MB=4096)

    plan = compute_reshape(
        numa_view(holder), {PINNED: holder}, numa_tree(), both, consumer_names=guest_names(GUESTS)
    )

    # ... and the reshape is refused: no guessing which node it belongs to.
    assert len(plan.refusals) == 1
    assert "guest instance-00000001" in plan.refusals[0]
    assert "spans NUMA nodes 0-1" in plan.refusals[0]
    assert "pinned CPUs 2-3,10-11" in plan.refusals[0]


def test_floating_guest_without_numatune_is_refused_even_when_nothing_else_moves():
    floating = next(g for g in GUESTS if g.uuid == UNPINNED)
    numa_rule = pcpu_to_numa_children(GUESTS, ROOT, {0: NODE0, 1: NODE1}, node_of)
    holder = consumer(UNPINNED, VCPU=2, MEMORY_MB=1024)
    view = numa_view(holder)

    assert affected_consumers(view, numa_rule) == []
    plan = compute_reshape(view, {}, numa_tree(), numa_rule)

    assert plan.body is None
    assert plan.refusals == (
        f"guest {floating.name} ({UNPINNED}) has neither CPU pins nor numatune memory "
        "nodes, so its NUMA node is unknown; its allocations cannot move to a NUMA node "
        "child",
    )


def test_floating_guest_goes_to_the_node_numa_fit_gives_it():
    # host.xml's instance-00000003: 2 vCPUs, no pins, no numatune.
    numa_rule = pcpu_to_numa_children(GUESTS, ROOT, {0: NODE0, 1: NODE1}, node_of)
    tree = numa_tree()
    numa_rule.floating = floating_placements(
        numa_rule, {0: tree.providers[1], 1: tree.providers[2]}, GUESTS
    )
    node = numa_rule.floating[UNPINNED][0][0]
    holder = consumer(UNPINNED, VCPU=2, MEMORY_MB=1024)

    plan = compute_reshape(numa_view(holder), {UNPINNED: holder}, tree, numa_rule)

    assert plan.refusals == ()
    assert plan.body["allocations"][UNPINNED]["allocations"] == {
        (NODE0, NODE1)[node]: {"resources": {"VCPU": 2, "MEMORY_MB": 1024}}
    }


def test_floating_guest_the_nodes_cannot_hold_is_refused_naming_it_and_the_option():
    floating = next(g for g in GUESTS if g.uuid == UNPINNED)
    numa_rule = pcpu_to_numa_children(
        GUESTS, ROOT, {0: NODE0, 1: NODE1}, node_of, floating={UNPINNED: None}
    )
    holder = consumer(UNPINNED, VCPU=2, MEMORY_MB=1024)

    plan = compute_reshape(numa_view(holder), {UNPINNED: holder}, numa_tree(), numa_rule)

    assert plan.body is None or plan.refusals
    assert len(plan.refusals) == 1
    assert f"guest {floating.name} ({UNPINNED}) has no NUMA placement" in plan.refusals[0]
    assert "keep [compute] numa_in_placement off" in plan.refusals[0]


def test_consumer_with_no_guest_on_this_host_is_not_refused_but_warned():
    numa_rule = pcpu_to_numa_children(GUESTS, ROOT, {0: NODE0, 1: NODE1}, node_of)
    plan = compute_reshape(numa_view(consumer(ORPHAN, VCPU=3)), {}, numa_tree(), numa_rule)
    assert plan.refusals == () and plan.body is None
    assert any(ORPHAN in w and "VCPU" in w for w in plan.warnings)


def test_memory_stays_on_the_root_when_the_node_children_hold_none():
    guest = on_node_0(next(g for g in GUESTS if g.uuid == PINNED))
    numa_rule = pcpu_to_numa_children(
        [guest],
        ROOT,
        {0: NODE0, 1: NODE1},
        node_of,
        node_classes={0: {"PCPU", "VCPU"}, 1: {"PCPU", "VCPU"}},
    )
    assert numa_rule(PINNED, ROOT, "MEMORY_MB", 4096) == [(ROOT, "MEMORY_MB", 4096)]
    assert numa_rule.unplaced(PINNED, ROOT, "MEMORY_MB", 4096) == []
    assert numa_rule(PINNED, ROOT, "PCPU", 4) == [(NODE0, "PCPU", 4)]


def test_vgpu_of_a_guest_whose_mdev_parent_is_unknown_is_refused():
    guest = next(g for g in GUESTS if g.mdevs)  # parent not known
    gpu_rule = vgpu_to_gpu_children([guest], ROOT, {"0000:81:00.0": GPU})
    holder = consumer(guest.uuid, VGPU=1, MEMORY_MB=2048)
    view = {**provider_view(holder), GPU: ProviderAllocations(GPU, 0)}
    desired = ProviderTree(
        (
            tree().root,
            Provider(
                "host_pci_0000_81_00_0", parent="host", uuid=GPU, inventories={"VGPU": Inventory(4)}
            ),
        )
    )

    plan = compute_reshape(view, {}, desired, gpu_rule)

    assert plan.body is None
    assert len(plan.refusals) == 1
    assert guest.name in plan.refusals[0] and guest.mdevs[0].uuid in plan.refusals[0]
    assert "parent GPU" in plan.refusals[0]


def test_vgpu_of_a_guest_on_a_gpu_the_tree_does_not_report_is_refused():
    mdev_guest = next(g for g in GUESTS if g.mdevs)
    guest = dataclasses.replace(
        mdev_guest, mdevs=(GuestMdev(mdev_guest.mdevs[0].uuid, parent="0000:82:00.0"),)
    )
    gpu_rule = vgpu_to_gpu_children([guest], ROOT, {"0000:81:00.0": GPU})
    assert gpu_rule(guest.uuid, ROOT, "VGPU", 1) == [(ROOT, "VGPU", 1)]
    (why,) = gpu_rule.unplaced(guest.uuid, ROOT, "VGPU", 1)
    assert "0000:82:00.0" in why and "enabled_mdev_types" in why


def test_a_move_onto_a_provider_not_yet_in_placement_is_an_error():
    mdev_guest = next(g for g in GUESTS if g.mdevs)
    guest = dataclasses.replace(
        mdev_guest, mdevs=(GuestMdev(mdev_guest.mdevs[0].uuid, parent="0000:81:00.0"),)
    )
    gpu_rule = vgpu_to_gpu_children([guest], ROOT, {"0000:81:00.0": GPU})
    desired = ProviderTree(
        (tree().root, Provider("host_pci_0000_81_00_0", parent="host", uuid=GPU))
    )
    holder = consumer(guest.uuid, VGPU=1)
    assert move_targets(provider_view(holder), gpu_rule) == {GPU}
    with pytest.raises(ValueError, match="host_pci_0000_81_00_0"):
        compute_reshape(provider_view(holder), {guest.uuid: holder}, desired, gpu_rule)


def test_body_lists_only_the_providers_the_rule_works_on():
    consumers = legacy_consumers()
    # The tree also has a GPU child and a NUMA-less SR-IOV child: not the rule's.
    desired = ProviderTree(
        (
            tree().root,
            Provider(
                "host_pci_0000_81_00_0",
                parent="host",
                uuid=GPU,
                inventories={"VGPU": Inventory(16)},
            ),
            Provider(
                "host_0000:3b:00.0", parent="host", inventories={"SRIOV_NET_VF": Inventory(8)}
            ),
        )
    )
    pcpu_rule = rule()
    assert pcpu_rule.sources == pcpu_rule.providers == {ROOT}
    assert rule_sources(pcpu_rule, desired) == [ROOT]

    plan = compute_reshape(
        provider_view(*consumers), {c.uuid: c for c in consumers}, desired, pcpu_rule
    )

    assert set(plan.body["inventories"]) == {ROOT}


def test_chain_works_on_the_union_of_its_rules_providers():
    both = chain(
        rule(),
        vgpu_to_gpu_children(GUESTS, ROOT, {"0000:81:00.0": GPU}),
        pcpu_to_numa_children(GUESTS, ROOT, {0: NODE0}, node_of),
    )
    assert both.sources == {ROOT}
    assert both.targets == {ROOT, GPU, NODE0}
    assert both.classes == {"VCPU", "PCPU", "VGPU", "MEMORY_MB"}


def test_host_rule_fits_the_tree_built_for_a_numa_host(tmp_path):
    host = snapshot("virhostcpudata/linux-test4", tmp_path, guests=GUESTS)
    conf = settings(
        numa_in_placement=True,
        cpu_dedicated_set=parse_cpu_spec("2-5,10-13"),
        cpu_shared_set=parse_cpu_spec("0-1,6-9,14-15"),
    )
    built = build_tree(conf, host, partition_cpus(conf, host))
    names = rule_provider_names(built, host)
    assert names == ["fixture", "fixture_NUMA_0", "fixture_NUMA_1"]
    uuids = dict(zip(names, (ROOT, NODE0, NODE1)))

    chained = host_rule(built.with_uuids(uuids), host, parse_cpu_spec("2-5,10-13"))

    # VCPU may sit on the root or on a node; CPU and memory move root -> node.
    assert chained.sources == {ROOT, NODE0, NODE1}
    assert chained.targets == {ROOT, NODE0, NODE1}
    floating = next(g for g in GUESTS if g.name == "instance-00000005")
    assert chained(floating.uuid, ROOT, "MEMORY_MB", 2048) == [(NODE1, "MEMORY_MB", 2048)]


def test_host_rule_without_children_is_vcpu_to_pcpu_on_the_root_alone(tmp_path):
    host = snapshot("virhostcpudata/linux-test4", tmp_path, guests=GUESTS)
    flat = ProviderTree((Provider("fixture", uuid=ROOT),))
    chained = host_rule(flat, host, parse_cpu_spec("2-5,10-13"))
    assert chained.providers == {ROOT}
    assert chained(PINNED, ROOT, "VCPU", 4) == [(ROOT, "PCPU", 4)]


def test_refused_reshape_holds_only_the_rules_classes_on_the_rules_providers():
    current = {
        ROOT: {
            "VGPU": {
                "total": 4,
                "reserved": 0,
                "min_unit": 1,
                "max_unit": 4,
                "step_size": 1,
                "allocation_ratio": 1.0,
            }
        }
    }
    desired = ProviderTree(
        (
            tree().root,
            Provider(
                "host_pci_0000_81_00_0",
                parent="host",
                uuid=GPU,
                inventories={"VGPU": Inventory(16)},
            ),
            Provider("host_other", parent="host", uuid=GPU_2, inventories={"VGPU": Inventory(2)}),
        )
    )
    held = hold_inventories(desired, current, {"VGPU"}, providers={ROOT, GPU})
    assert held.root.inventories["VGPU"] == Inventory(4, max_unit=4)
    assert held.root.inventories["MEMORY_MB"] == tree().root.inventories["MEMORY_MB"]
    assert held.by_name("host_pci_0000_81_00_0").inventories == {}  # not created yet
    assert held.by_name("host_other").inventories == {"VGPU": Inventory(2)}


def test_after_a_conflict_only_consumers_the_view_shows_changed_are_read_again():
    from node_agent.placement.reshape_engine import stale_consumers

    def record(uuid, resources):
        return Consumer(uuid, 1, PROJECT, USER, {ROOT: resources, SHARED_DISK: {"DISK_GB": 5}})

    read = {
        PINNED: record(PINNED, {"VCPU": 4, "MEMORY_MB": 512}),
        PINNED_2: record(PINNED_2, {"VCPU": 2, "MEMORY_MB": 256}),
    }
    view = {
        ROOT: ProviderAllocations(
            ROOT,
            7,
            {
                PINNED: {"VCPU": 4, "MEMORY_MB": 512},  # as read
                PINNED_2: {"VCPU": 2, "MEMORY_MB": 1024},  # resized since
                ORPHAN: {"VCPU": 1},
            },
        )
    }  # booted since
    assert stale_consumers(view, read, [PINNED, PINNED_2, ORPHAN]) == {PINNED_2, ORPHAN}
    # A consumer the plan does not need is never read, changed or not.
    assert stale_consumers(view, read, [PINNED]) == set()


# ---------------------------------------------------------------- stages


def _staging_inputs():
    """PINNED (4 VCPU) and PINNED_2 (2 VCPU) move to PCPU; UNPINNED stays.
    Placement holds the legacy shape: 16 VCPU at ratio 4, no PCPU."""
    consumers = {
        c.uuid: c
        for c in (
            consumer(PINNED, VCPU=4, MEMORY_MB=1024),
            consumer(PINNED_2, VCPU=2, MEMORY_MB=512),
            consumer(UNPINNED, VCPU=2, MEMORY_MB=512),
        )
    }
    view = provider_view(*consumers.values())
    rule = pinned_to_pcpu(GUESTS, ROOT, parse_cpu_spec("2-7,10-15"))
    plan = compute_reshape(view, consumers, tree(), rule)
    current = {
        ROOT: {
            "VCPU": Inventory(16, allocation_ratio=4.0).as_placement(),
            "MEMORY_MB": Inventory(65536, reserved=512).as_placement(),
            "DISK_GB": Inventory(500).as_placement(),
        }
    }
    return view, plan, current


def test_a_stage_moves_only_its_consumers_and_closes_the_moved_classes_at_their_usage():
    view, plan, current = _staging_inputs()

    staged = stage(plan, view, current, [PINNED_2])

    assert sorted(staged.body["allocations"]) == [PINNED_2]
    assert staged.body["allocations"][PINNED_2] == plan.body["allocations"][PINNED_2]
    assert {m.consumer for m in staged.moves} == {PINNED_2}
    root = staged.body["inventories"][ROOT]
    assert root["resource_provider_generation"] == 7
    # PCPU: the new record, 2 held by PINNED_2, nothing free.
    assert root["inventories"]["PCPU"] == {
        **plan.body["inventories"][ROOT]["inventories"]["PCPU"],
        "reserved": 6,
    }
    # VCPU: 6 still held (PINNED 4 + UNPINNED 2): 2 units of the new record
    # at ratio 4 (8 >= 6), the rest reserved.
    assert root["inventories"]["VCPU"]["total"] == 8
    assert root["inventories"]["VCPU"]["reserved"] == 6
    # Classes nothing moves keep what Placement holds; the plan's new
    # records wait for the last stage.
    assert root["inventories"]["MEMORY_MB"] == current[ROOT]["MEMORY_MB"]
    assert root["inventories"]["DISK_GB"] == current[ROOT]["DISK_GB"]


def test_a_stage_of_every_consumer_is_the_plan_itself():
    view, plan, current = _staging_inputs()

    assert stage(plan, view, current, [PINNED, PINNED_2]) is plan


def test_a_class_neither_record_can_hold_is_not_staged():
    view, plan, current = _staging_inputs()
    small = {ROOT: {**current[ROOT], "VCPU": Inventory(1).as_placement()}}
    final = plan.body["inventories"][ROOT]["inventories"]
    tight = dataclasses.replace(
        plan,
        body={
            **plan.body,
            "inventories": {
                ROOT: {
                    "resource_provider_generation": 7,
                    "inventories": {**final, "VCPU": Inventory(1).as_placement()},
                }
            },
        },
    )

    # 6 VCPU stay held after PINNED_2 moves: neither 1 VCPU record holds them.
    assert stage(tight, view, small, [PINNED_2]) is None


def test_moves_to_another_provider_are_not_staged():
    view, plan, current = _staging_inputs()
    child = "cccccccc-0000-4000-8000-000000000000"
    moves = tuple(dataclasses.replace(m, to_provider=child) for m in plan.moves)

    assert stage(dataclasses.replace(plan, moves=moves), view, current, [PINNED_2]) is None


def _stages(**figures):
    from node_agent.placement.reshape_stages import Stages

    return Stages(limit=4, **figures)


def test_a_host_whose_writes_come_faster_than_three_quick_posts_is_too_busy():
    # 16 refused, 20 through: fewer than two in three refused, but writes
    # every 0.12 s against a 0.05 s POST: one in three or more refused.
    busy = _stages(refusals=16, through=20, windows=16 * 0.12, staged_refusals=16, fastest=0.05)
    calm = _stages(refusals=16, through=20, windows=16 * 0.35, staged_refusals=16, fastest=0.05)

    assert busy.busy(16) and not calm.busy(16)
    assert not _stages(refusals=15, through=0).busy(16)  # not yet the attempts asked
    assert _stages(refusals=16, through=7).busy(16)  # two in three refused


def test_a_host_written_more_often_than_every_tenth_of_a_second_is_too_busy_however_fast_placement_is():
    # A quiet machine: POSTs of a few consumers answer in 10 ms, so most go
    # through and three of them fit between two writes; still, a write every
    # 0.05 s is the scheduler filling this host right now.
    fast = _stages(refusals=16, through=40, windows=16 * 0.05, staged_refusals=16, fastest=0.01)
    calm = _stages(refusals=16, through=40, windows=16 * 0.3, staged_refusals=16, fastest=0.01)

    assert fast.busy(16) and not calm.busy(16)


def test_the_next_stage_is_what_placement_processes_in_half_the_interval():
    stages = _stages(windows=4 * 0.4, staged_refusals=4, timed=(20, 0.2, False))
    stages.size()
    assert stages.limit == 20  # 20 consumers in 0.2 s: 20 fit in 0.2 s

    stages = _stages(windows=4 * 0.4, staged_refusals=4, timed=(20, 0.05, False))
    stages.size()
    assert stages.limit == 40  # 80 would fit, twice the last at most

    stages = _stages(windows=4 * 0.4, staged_refusals=4, timed=(20, 0.2, True))
    stages.size()
    assert stages.limit == 10  # refused: half at most


def test_a_refused_reshape_in_maintenance_holds_its_classes_closed():
    """Every inventory of the tree closed (maintenance): the classes a
    refused reshape keeps as Placement holds them are closed too."""
    from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
    from node_agent.placement.reshape_engine import hold_inventories

    tree = ProviderTree(
        (
            Provider("h", uuid="r", inventories={"DISK_GB": Inventory(100, reserved=100)}),
            Provider(
                "h_NUMA_0", parent="h", uuid="n0", inventories={"VCPU": Inventory(8, reserved=8)}
            ),
        )
    )
    current = {"r": {"VCPU": {"total": 16, "reserved": 0, "allocation_ratio": 4.0}}}

    held = hold_inventories(tree, current, {"VCPU"})

    assert held.by_name("h").inventories["VCPU"] == Inventory(16, 16, allocation_ratio=4.0)
    assert "VCPU" not in held.by_name("h_NUMA_0").inventories  # not created yet: none
    opened = ProviderTree(
        (replace_inventories(tree.root, DISK_GB=Inventory(100)),) + tree.providers[1:]
    )
    assert hold_inventories(opened, current, {"VCPU"}).by_name("h").inventories[
        "VCPU"
    ] == Inventory(16, 0, allocation_ratio=4.0)


def replace_inventories(provider, **inventories):
    import dataclasses

    return dataclasses.replace(provider, inventories=inventories)


def test_a_local_guest_that_keeps_its_vcpu_is_named_as_this_hosts_not_as_a_stranger():
    """Issue 28: a running local guest the reshape leaves in VCPU was
    described as "no guest on this host matches those consumers, or they
    are not pinned". The warning says which holders are this host's guests
    and why they stay, and which have no guest here."""
    consumers = legacy_consumers() + [consumer(ORPHAN, VCPU=1)]
    current = {ROOT: {"VCPU": {"total": 16, "reserved": 0, "allocation_ratio": 4.0}}}
    plan = compute_reshape(
        provider_view(*consumers),
        {c.uuid: c for c in consumers},
        tree(vcpu=0, pcpu=8),
        rule(),
        current_inventories=current,
        consumer_names={g.uuid: g.name for g in GUESTS},
    )
    [kept] = [w for w in plan.warnings if "VCPU inventory is kept" in w]
    assert "no guest on this host matches" not in kept and "not pinned" not in kept
    assert (
        "guests of this host that stay in VCPU (only guests nova counts as dedicated "
        "move to PCPU; shared and mixed guests keep their VCPU, whatever their pins): "
        f"instance-00000003 ({UNPINNED}) 2" in kept
    )
    assert f"consumers with no guest on this host: {ORPHAN} 1" in kept
