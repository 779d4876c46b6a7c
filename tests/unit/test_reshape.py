"""The pure reshape engine, on guests parsed from the test-driver host file."""

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from node_agent.cpuset import parse_cpu_spec
from node_agent.domain import parse_domain
from node_agent.provider_tree import Inventory, Provider, ProviderTree
from node_agent.reshape import (Consumer, ProviderAllocations, affected_consumers, chain,
                                compute_reshape, guest_names, pcpu_to_numa_children,
                                pinned_to_pcpu, vgpu_to_gpu_children)
from node_agent.topology import GuestMdev

HOST_XML = Path(__file__).resolve().parents[1] / "data" / "libvirt" / "host.xml"
ROOT = "aaaaaaaa-0000-4000-8000-000000000000"
SHARED_DISK = "dddddddd-0000-4000-8000-000000000000"  # a sharing provider, not ours
PROJECT, USER = "p" * 32, "u" * 32
PINNED = "11111111-0000-4000-8000-000000000001"     # 4 vCPUs on 2,10,3,11
PINNED_2 = "11111111-0000-4000-8000-000000000002"   # 2 vCPUs on 4,12
UNPINNED = "11111111-0000-4000-8000-000000000003"   # 2 vCPUs floating
ORPHAN = "99999999-0000-4000-8000-000000000009"     # no such domain


def _guests():
    root = ET.parse(HOST_XML).getroot()
    return tuple(parse_domain(ET.tostring(d, encoding="unicode"), running=True)
                 for d in root.findall("domain"))


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
    return {ROOT: ProviderAllocations(ROOT, generation, {
        c.uuid: c.allocations[ROOT] for c in consumers})}


def legacy_consumers():
    pinned = Consumer(PINNED, 3, PROJECT, USER, {
        ROOT: {"VCPU": 4, "MEMORY_MB": 4096, "DISK_GB": 20},
        SHARED_DISK: {"DISK_GB": 100}})
    return [pinned,
            consumer(PINNED_2, VCPU=2, MEMORY_MB=2048),
            consumer(UNPINNED, VCPU=2, MEMORY_MB=1024, DISK_GB=10)]


def rule(dedicated="2-5,10-13"):
    return pinned_to_pcpu(GUESTS, ROOT, parse_cpu_spec(dedicated) if dedicated else None)


def test_pinned_guests_vcpu_becomes_pcpu_and_everything_else_is_carried_over():
    consumers = legacy_consumers()
    plan = compute_reshape(provider_view(*consumers), {c.uuid: c for c in consumers},
                           tree(), rule(), consumer_names=guest_names(GUESTS))

    assert plan.refusals == ()
    assert plan.body["inventories"] == {ROOT: {
        "resource_provider_generation": 7,
        "inventories": {rc: inv.as_placement()
                        for rc, inv in tree().root.inventories.items()}}}
    assert set(plan.body["allocations"]) == {PINNED, PINNED_2}  # unpinned untouched
    assert plan.body["allocations"][PINNED] == {
        "allocations": {ROOT: {"resources": {"PCPU": 4, "MEMORY_MB": 4096, "DISK_GB": 20}},
                        SHARED_DISK: {"resources": {"DISK_GB": 100}}},
        "project_id": PROJECT, "user_id": USER, "consumer_generation": 3}
    assert plan.body["allocations"][PINNED_2]["allocations"] == {
        ROOT: {"resources": {"PCPU": 2, "MEMORY_MB": 2048}}}
    assert plan.totals() == {"consumers": 2, "moved": {"VCPU -> PCPU": 6}}


def test_dry_run_plan_names_each_guest_and_the_totals():
    consumers = legacy_consumers()
    plan = compute_reshape(provider_view(*consumers), {c.uuid: c for c in consumers},
                           tree(), rule(), consumer_names=guest_names(GUESTS))
    shown = plan.as_dict()

    assert [c["name"] for c in shown["consumers"]] == ["instance-00000001",
                                                       "instance-00000002"]
    assert shown["consumers"][0]["moves"] == [{
        "from_provider": "host", "from_class": "VCPU",
        "to_provider": "host", "to_class": "PCPU", "amount": 4}]
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
    plan = compute_reshape(provider_view(*consumers), {c.uuid: c for c in consumers},
                           tree(vcpu=16, pcpu=16), rule(dedicated=None))
    assert plan.body is None


def test_pinned_guest_outside_the_dedicated_set_is_refused_naming_guest_and_cpus():
    consumers = legacy_consumers()
    plan = compute_reshape(provider_view(*consumers), {c.uuid: c for c in consumers},
                           tree(), rule(dedicated="2-3,10-11,5-7"))
    assert len(plan.refusals) == 1
    assert "instance-00000002" in plan.refusals[0]
    assert "CPUs 4,12 are outside cpu_dedicated_set = '2-3,5-7,10-11'" in plan.refusals[0]


def test_fewer_pcpu_than_pinned_vcpus_in_use_is_refused():
    consumers = legacy_consumers()
    plan = compute_reshape(provider_view(*consumers), {c.uuid: c for c in consumers},
                           tree(pcpu=5), rule(), consumer_names=guest_names(GUESTS))
    assert len(plan.refusals) == 1
    assert "PCPU on host would need 6 but the new inventory holds 5" in plan.refusals[0]
    assert "instance-00000001" in plan.refusals[0]
    assert "instance-00000002" in plan.refusals[0]


def test_pcpu_already_used_by_other_guests_counts_against_the_new_capacity():
    consumers = legacy_consumers() + [consumer(ORPHAN, PCPU=3)]
    plan = compute_reshape(provider_view(*consumers), {c.uuid: c for c in consumers},
                           tree(pcpu=8), rule())
    assert plan.refusals and "would need 9" in plan.refusals[0]


def test_unmatched_consumer_keeps_its_vcpu_inventory_and_is_reported():
    consumers = legacy_consumers() + [consumer(ORPHAN, VCPU=3)]
    view = provider_view(*consumers)
    everyone = {c.uuid: c for c in consumers}
    first = compute_reshape(view, everyone, tree(vcpu=0, pcpu=8), rule())
    assert first.missing_inventories == {ROOT}

    current = {ROOT: {"VCPU": {"total": 16, "reserved": 0, "min_unit": 1, "max_unit": 16,
                               "step_size": 1, "allocation_ratio": 4.0}}}
    plan = compute_reshape(view, everyone, tree(vcpu=0, pcpu=8), rule(),
                           current_inventories=current)
    assert plan.body["inventories"][ROOT]["inventories"]["VCPU"] == current[ROOT]["VCPU"]
    assert ORPHAN not in plan.body["allocations"]
    assert any(ORPHAN in w and "VCPU inventory is kept" in w for w in plan.warnings)


def test_without_a_reshape_a_dropped_class_still_in_use_is_warned():
    view = provider_view(consumer(ORPHAN, VCPU=3))
    plan = compute_reshape(view, {}, tree(vcpu=0), rule())
    assert plan.body is None
    assert len(plan.warnings) == 1 and ORPHAN in plan.warnings[0]


def test_a_moved_consumer_on_a_provider_not_yet_created_is_an_error():
    consumers = legacy_consumers()
    child = Provider("host_gpu", parent="host", uuid="cccccccc-0000-4000-8000-000000000000")
    two = ProviderTree((tree().root, child))
    with pytest.raises(ValueError, match="host_gpu"):
        compute_reshape(provider_view(*consumers), {c.uuid: c for c in consumers},
                        two, rule())


GPU = "cccccccc-0000-4000-8000-00000000000a"
GPU_2 = "cccccccc-0000-4000-8000-00000000000b"


def test_vgpu_moves_from_root_to_the_child_of_the_mdev_parent():
    mdev_guest = next(g for g in GUESTS if g.mdevs)
    guest = dataclasses.replace(mdev_guest, mdevs=(
        GuestMdev(mdev_guest.mdevs[0].uuid, parent="0000:81:00.0"),
        GuestMdev("5b20d080-1b54-4048-85b3-a6a62d165c02", parent="0000:82:00.0")))
    gpu_rule = vgpu_to_gpu_children([guest], ROOT, {"0000:81:00.0": GPU,
                                                    "0000:82:00.0": GPU_2})
    desired = ProviderTree((
        tree().root,
        Provider("host_pci_0000_81_00_0", parent="host", uuid=GPU,
                 inventories={"VGPU": Inventory(16)}),
        Provider("host_pci_0000_82_00_0", parent="host", uuid=GPU_2,
                 inventories={"VGPU": Inventory(16)})))
    holder = consumer(guest.uuid, VGPU=2, MEMORY_MB=2048)
    view = {**provider_view(holder), GPU: ProviderAllocations(GPU, 0),
            GPU_2: ProviderAllocations(GPU_2, 0)}

    plan = compute_reshape(view, {guest.uuid: holder}, desired, gpu_rule)

    assert plan.body["allocations"][guest.uuid]["allocations"] == {
        ROOT: {"resources": {"MEMORY_MB": 2048}},
        GPU: {"resources": {"VGPU": 1}}, GPU_2: {"resources": {"VGPU": 1}}}
    assert set(plan.body["inventories"]) == {ROOT, GPU, GPU_2}


def test_vgpu_of_a_guest_whose_mdev_parent_is_unknown_stays():
    guest = next(g for g in GUESTS if g.mdevs)  # parent not known
    gpu_rule = vgpu_to_gpu_children([guest], ROOT, {"0000:81:00.0": GPU})
    assert gpu_rule(guest.uuid, ROOT, "VGPU", 1) == [(ROOT, "VGPU", 1)]


NODE0 = "eeeeeeee-0000-4000-8000-000000000000"
NODE1 = "eeeeeeee-0000-4000-8000-000000000001"


def test_chained_rules_move_pinned_vcpu_to_pcpu_on_the_numa_nodes_of_its_pins():
    def node_of(cpu):
        return 0 if cpu < 8 else 1

    numa_rule = pcpu_to_numa_children(GUESTS, ROOT, {0: NODE0, 1: NODE1}, node_of)
    both = chain(rule(), numa_rule)
    # instance-00000001 pins vCPUs to 2, 10, 3, 11: two on each node.
    assert both(PINNED, ROOT, "VCPU", 4) == [(NODE0, "PCPU", 2), (NODE1, "PCPU", 2)]
    assert both(UNPINNED, ROOT, "VCPU", 2) == [(ROOT, "VCPU", 2)]
    assert both.refusals([PINNED_2], {}) == []
