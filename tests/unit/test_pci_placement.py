"""PCI devices in Placement (nova's ``[pci] report_in_placement``): the
devices read from sysfs, the children built from them, and what Placement's
usage changes. Several cases are the expectations of nova 34's own tests
(``nova/tests/unit/compute/test_pci_placement_translator.py`` and
``nova/tests/functional/libvirt/test_pci_in_placement.py``), named there."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from node_agent.errors import ConfigError
from node_agent.host.sysfs import SysFS
from node_agent.host.sysfs_pci import read_pci_functions
from node_agent.model.device_spec import parse_spec
from node_agent.model.provider_state import ProviderState
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.model.snapshot import PCI_PF, PCI_STANDARD, PCI_VF, PciDevice
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT
from node_agent.tree.pci_placement import (
    at_usage,
    needs_usage,
    pci_children,
    resource_class,
    spec_traits,
)
from tests.snapshots import bare_host
from tests.snapshots import settings as make_settings
from tests.unit.test_pci import add_device, write

# nova's fakelibvirt ids (nova/tests/fixtures/libvirt.py).
VEND, PCI_PROD, PF_PROD, VF_PROD = "8086", "1533", "1528", "1515"


# nova's test_new_compute_init_with_pci_devs: a GPU, a PF for one-time use,
# and VFs of another PF, each with traits.
INIT_WITH_PCI_DEVS_SPECS = [
    {"vendor_id": VEND, "product_id": PCI_PROD, "traits": "HW_GPU_API_VULKAN,CUSTOM_GPU,purple"},
    {
        "vendor_id": VEND,
        "product_id": PF_PROD,
        "address": "0000:81:02.0",
        "traits": "HW_NIC_SRIOV,CUSTOM_PF,pf-white",
        "one_time_use": "true",
    },
    {
        "vendor_id": VEND,
        "product_id": VF_PROD,
        "address": "0000:81:03.*",
        "traits": "HW_NIC_SRIOV_TRUSTED,CUSTOM_VF,vf-red",
    },
]


# nova's test_new_compute_init_with_pci_dev_custom_rc: a class and traits
# to normalise, one of them in lower case.
CUSTOM_RC_SPECS = [
    {
        "vendor_id": VEND,
        "product_id": PCI_PROD,
        "resource_class": "PGPU",
        "traits": "HW_GPU_API_VULKAN",
    },
    {
        "product_id": PF_PROD,
        "address": "0000:81:01.0",
        "resource_class": "crypto",
        "traits": "to-the-moon,hodl",
    },
]


def fake_host_devices(num_pci=0, num_pfs=0, num_vfs=0) -> tuple[PciDevice, ...]:
    """The devices nova's ``HostPCIDevicesInfo`` emulates: type-PCI in slots
    0.., then PFs, each with num_vfs/num_pfs VFs as functions 1.. of its slot."""
    devs = [PciDevice(f"0000:81:{s:02x}.0", VEND, PCI_PROD) for s in range(num_pci)]
    for p in range(num_pfs):
        slot = num_pci + p
        pf = f"0000:81:{slot:02x}.0"
        devs.append(PciDevice(pf, VEND, PF_PROD, PCI_PF))
        for f in range(1, num_vfs // num_pfs + 1):
            devs.append(PciDevice(f"0000:81:{slot:02x}.{f}", VEND, VF_PROD, PCI_VF, pf))
    return tuple(devs)


def children(devices, specs, **extra):
    parsed = tuple(parse_spec(json.dumps(s)) for s in specs)
    settings = make_settings(
        host="compute1", pci_in_placement=True, pci_device_specs=parsed, **extra
    )
    return pci_children(settings, bare_host(devices))


def view(providers):
    """{address: (inventories, traits without nova's and the agent's marks)}."""
    out = {}
    for p in providers:
        address = p.name.split("_", 1)[1]
        traits = sorted(
            t for t in p.wanted_traits if t not in ("COMPUTE_MANAGED_PCI_DEVICE", AGENT_CHILD_TRAIT)
        )
        out[address] = ({rc: i.total for rc, i in p.inventories.items()}, traits)
    return out


# -- nova's unit test tables (TestTranslator)


@pytest.mark.parametrize(
    "names, expected",
    [
        (None, set()),
        ("", set()),
        ("a", {"CUSTOM_A"}),
        ("a,b", {"CUSTOM_A", "CUSTOM_B"}),
        ("HW_GPU_API_VULKAN", {"HW_GPU_API_VULKAN"}),
        ("CUSTOM_FOO", {"CUSTOM_FOO"}),
        ("custom_bar", {"CUSTOM_BAR"}),
        ("custom-bar", {"CUSTOM_CUSTOM_BAR"}),
        ("CUSTOM_a", {"CUSTOM_A"}),
        ("a@!#$b123X", {"CUSTOM_A_B123X"}),
        ("a!@b,a###b", {"CUSTOM_A_B"}),
    ],
)
def test_spec_traits_are_normalised_as_nova_does(names, expected):
    assert spec_traits(names) == expected


@pytest.mark.parametrize(
    "vendor, product, requested, expected",
    [
        ("1234", "5678", None, "CUSTOM_PCI_1234_5678"),
        ("1234", "5678", "", "CUSTOM_PCI_1234_5678"),
        ("1234", "5678", "PGPU", "PGPU"),
        ("1234", "5678", "pgpu", "PGPU"),
        ("1234", "5678", "foobar", "CUSTOM_FOOBAR"),
        ("1234", "5678", "custom_foo", "CUSTOM_FOO"),
        ("1234", "5678", "CUSTOM_foo", "CUSTOM_FOO"),
        ("1234", "5678", "custom_FOO", "CUSTOM_FOO"),
        ("1234", "5678", "CUSTOM_FOO", "CUSTOM_FOO"),
        ("1234", "5678", "custom-foo", "CUSTOM_CUSTOM_FOO"),
        ("1234", "5678", "a###b", "CUSTOM_A_B"),
        ("123a", "567b", "", "CUSTOM_PCI_123A_567B"),
    ],
)
def test_resource_class_is_normalised_as_nova_does(vendor, product, requested, expected):
    assert resource_class(requested, vendor, product) == expected


# -- nova's functional tests (PlacementPCIInventoryReportingTests)


def test_new_compute_with_pci_devices_reports_pci_pfs_and_vfs_on_their_pf():
    # test_new_compute_init_with_pci_devs
    specs = INIT_WITH_PCI_DEVS_SPECS
    got = children(fake_host_devices(num_pci=2, num_pfs=2, num_vfs=4), specs)
    pci_rc, pf_rc, vf_rc = (f"CUSTOM_PCI_{VEND}_{p}" for p in (PCI_PROD, PF_PROD, VF_PROD))
    gpu = ["CUSTOM_GPU", "CUSTOM_PURPLE", "HW_GPU_API_VULKAN"]
    assert view(got) == {
        "0000:81:00.0": ({pci_rc: 1}, gpu),
        "0000:81:01.0": ({pci_rc: 1}, gpu),
        "0000:81:02.0": (
            {pf_rc: 1},
            ["CUSTOM_PF", "CUSTOM_PF_WHITE", "HW_NIC_SRIOV", "HW_PCI_ONE_TIME_USE"],
        ),
        "0000:81:03.0": ({vf_rc: 2}, ["CUSTOM_VF", "CUSTOM_VF_RED", "HW_NIC_SRIOV_TRUSTED"]),
    }
    assert all(p.inventories[next(iter(p.inventories))].max_unit is not None for p in got)
    assert all(p.wanted_traits >= {"COMPUTE_MANAGED_PCI_DEVICE", AGENT_CHILD_TRAIT} for p in got)


def test_spec_resource_class_and_traits_are_normalised_on_the_child():
    # test_new_compute_init_with_pci_dev_custom_rc
    got = children(fake_host_devices(num_pci=1, num_pfs=1, num_vfs=1), CUSTOM_RC_SPECS)
    assert view(got) == {
        "0000:81:00.0": ({"PGPU": 1}, ["HW_GPU_API_VULKAN"]),
        "0000:81:01.0": ({"CUSTOM_CRYPTO": 1}, ["CUSTOM_HODL", "CUSTOM_TO_THE_MOON"]),
    }


def test_pf_and_its_vf_both_matched_are_refused():
    # test_dependent_device_config_is_rejected
    with pytest.raises(ConfigError, match=re.escape("0000:81:00.1 and 0000:81:00.0")):
        children(
            fake_host_devices(num_pfs=1, num_vfs=1),
            [{"address": "0000:81:00.0"}, {"address": "0000:81:00.1"}],
        )


def test_spec_naming_a_pf_address_matches_its_vfs_too():
    # nova's WhitelistPciAddress: a single PF address matches its VFs, so
    # the PF and its VFs land on one provider: refused as above.
    with pytest.raises(ConfigError, match=r"a PF\s+and its VF"):
        children(fake_host_devices(num_pfs=1, num_vfs=2), [{"address": "0000:81:00.0"}])


def test_sibling_vfs_with_different_classes_are_refused():
    # test_sibling_vfs_with_contradicting_resource_classes_rejected
    with pytest.raises(ConfigError, match=re.escape("CUSTOM_VF2 for 0000:81:00.2 and CUSTOM_VF1")):
        children(
            fake_host_devices(num_pfs=1, num_vfs=2),
            [
                {"address": "0000:81:00.1", "resource_class": "vf1"},
                {"address": "0000:81:00.2", "resource_class": "vf2"},
            ],
        )


def test_sibling_vfs_with_different_traits_are_refused():
    # test_sibling_vfs_with_contradicting_traits_rejected
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "COMPUTE_MANAGED_PCI_DEVICE,CUSTOM_BAR for 0000:81:00.2 and "
            "COMPUTE_MANAGED_PCI_DEVICE,CUSTOM_FOO for 0000:81:00.1"
        ),
    ):
        children(
            fake_host_devices(num_pfs=1, num_vfs=2),
            [
                {"address": "0000:81:00.1", "traits": "foo"},
                {"address": "0000:81:00.2", "traits": "bar"},
            ],
        )


def test_one_time_use_on_a_vf_is_refused():
    with pytest.raises(ConfigError, match=re.escape("one_time_use on VF 0000:81:00.1")):
        children(
            fake_host_devices(num_pfs=1, num_vfs=1),
            [{"product_id": VF_PROD, "one_time_use": True}],
        )


def test_physnet_devices_are_left_to_neutron():
    # test_neutron_sriov_devs_ignored
    got = children(
        fake_host_devices(num_pfs=1, num_vfs=1),
        [{"vendor_id": VEND, "product_id": PF_PROD, "physical_network": "physnet0"}],
    )
    assert got == ()


def test_vf_child_with_partial_address_counts_every_vf():
    # _create_one_compute_with_vfs_one_consumed_by_an_instance: "0000:81:00."
    got = children(
        fake_host_devices(num_pfs=1, num_vfs=3),
        [{"vendor_id": VEND, "product_id": VF_PROD, "address": "0000:81:00."}],
    )
    assert view(got) == {"0000:81:00.0": ({f"CUSTOM_PCI_{VEND}_{VF_PROD}": 3}, [])}


def test_live_migratable_adds_nova_trait():
    got = children(
        fake_host_devices(num_pci=1),
        [{"product_id": PCI_PROD, "live_migratable": "yes"}],
    )
    assert view(got)["0000:81:00.0"][1] == ["HW_PCI_LIVE_MIGRATABLE"]


def test_without_report_in_placement_no_pci_child():
    parsed = (parse_spec(json.dumps({"product_id": PCI_PROD})),)
    settings = make_settings(pci_device_specs=parsed)
    assert pci_children(settings, bare_host(fake_host_devices(num_pci=1))) == ()


def test_address_in_child_name_is_upper_case_as_nova_writes_it():
    devices = (PciDevice("0000:af:00.0", "10de", "1eb8"),)
    got = children(devices, [{"vendor_id": "10de"}])
    assert [p.name for p in got] == ["compute1_0000:AF:00.0"]
    assert list(got[0].inventories) == ["CUSTOM_PCI_10DE_1EB8"]


# -- Placement's usage (nova's _adjust_for_removals_and_held_devices)

RC = "CUSTOM_PCI_8086_1515"
ROOT = Provider("compute1", inventories={"VCPU": Inventory(total=8)})


def held(name, total, reserved=0, traits=("COMPUTE_MANAGED_PCI_DEVICE", AGENT_CHILD_TRAIT)):
    return ProviderState(
        uuid=f"uuid-{name}",
        name=name,
        generation=1,
        parent_uuid="root",
        inventories={RC: {"total": total, "reserved": reserved, "max_unit": total}},
        traits=frozenset(traits),
    )


def child(name, total, one_time_use=False):
    traits = {"COMPUTE_MANAGED_PCI_DEVICE": True, AGENT_CHILD_TRAIT: True}
    traits["HW_PCI_ONE_TIME_USE"] = one_time_use
    return Provider(
        name, "compute1", inventories={RC: Inventory(total, max_unit=total)}, traits=traits
    )


def test_device_gone_while_allocated_keeps_its_usage_as_total():
    state = held("compute1_0000:81:00.0", total=4)
    tree = ProviderTree((ROOT,))
    assert needs_usage(tree, state)
    kept = at_usage(tree, [state], {state.name: {RC: 2}}).by_name(state.name)
    assert kept.inventories[RC] == Inventory(total=2, max_unit=2)
    assert kept.wanted_traits == state.traits


def test_device_gone_and_unused_is_not_kept():
    state = held("compute1_0000:81:00.0", total=1)
    tree = ProviderTree((ROOT,))
    assert at_usage(tree, [state], {state.name: {RC: 0}}) == tree


def test_fewer_devices_than_allocated_is_published_at_usage_never_below():
    state = held("compute1_0000:81:00.0", total=4)
    tree = ProviderTree((ROOT, child(state.name, 1)))
    assert needs_usage(tree, state)
    got = at_usage(tree, [state], {state.name: {RC: 3}}).by_name(state.name)
    assert got.inventories[RC].total == 3 and got.inventories[RC].max_unit == 3


def test_fewer_devices_than_before_but_above_usage_is_published_as_found():
    state = held("compute1_0000:81:00.0", total=4)
    tree = ProviderTree((ROOT, child(state.name, 2)))
    got = at_usage(tree, [state], {state.name: {RC: 1}}).by_name(state.name)
    assert got.inventories[RC].total == 2


def test_steady_child_needs_no_usage_read():
    state = held("compute1_0000:81:00.0", total=2)
    assert not needs_usage(ProviderTree((ROOT, child(state.name, 2))), state)


def test_one_time_use_device_in_use_is_fully_reserved():
    state = held("compute1_0000:81:00.0", total=1)
    tree = ProviderTree((ROOT, child(state.name, 1, one_time_use=True)))
    assert needs_usage(tree, state)
    got = at_usage(tree, [state], {state.name: {RC: 1}}).by_name(state.name)
    assert got.inventories[RC].reserved == 1


def test_one_time_use_device_freed_stays_reserved_until_an_operator_frees_it():
    state = held("compute1_0000:81:00.0", total=1, reserved=1)
    tree = ProviderTree((ROOT, child(state.name, 1, one_time_use=True)))
    assert not needs_usage(tree, state)
    got = at_usage(tree, [state], {}).by_name(state.name)
    assert got.inventories[RC].reserved == 1


def test_one_time_use_device_unreserved_by_an_operator_and_unused_stays_open():
    state = held("compute1_0000:81:00.0", total=1, reserved=0)
    tree = ProviderTree((ROOT, child(state.name, 1, one_time_use=True)))
    got = at_usage(tree, [state], {state.name: {}}).by_name(state.name)
    assert got.inventories[RC].reserved == 0


# -- sysfs


def test_sysfs_types_functions_as_nova_does(tmp_path):
    root = tmp_path / "sys"
    add_device(root, "0000:00:02.0", vendor="0x8086", device="0x0046")
    pf = add_device(root, "0000:3b:00.0", vendor="0x8086", device="0x158b", numa_node="0")
    write(pf / "sriov_totalvfs", "4")
    vf = add_device(root, "0000:3b:02.0", vendor="0x8086", device="0x154c")
    (vf / "physfn").symlink_to(pf)
    nic = add_device(root, "0000:00:19.0", vendor="0x8086", device="0x1502")
    write(nic / "sriov_totalvfs", "0")
    got = {d.address: (d.dev_type, d.parent_addr) for d in read_pci_functions(SysFS(str(root)))}
    assert got == {
        "0000:00:02.0": (PCI_STANDARD, None),
        "0000:00:19.0": (PCI_STANDARD, None),
        "0000:3b:00.0": (PCI_PF, None),
        "0000:3b:02.0": (PCI_VF, "0000:3b:00.0"),
    }


# -- SR-IOV children beside PCI children


def _sriov_host():
    from node_agent.model.snapshot import SriovPf

    pf = "0000:81:00.0"
    return dataclasses.replace(
        bare_host(fake_host_devices(num_pfs=1, num_vfs=4)),
        sriov_pfs=(SriovPf(pf, total_vfs=8, num_vfs=4, vendor_id=VEND, product_id=PF_PROD),),
    )


def _sriov_total(specs):
    from node_agent.tree.pci import sriov_children
    from node_agent.tree.pci_placement import claimed_vfs

    parsed = tuple(parse_spec(json.dumps(s)) for s in specs)
    settings = make_settings(host="compute1", pci_in_placement=True, pci_device_specs=parsed)
    host = _sriov_host()
    [child] = sriov_children(settings, host, claimed_vfs(settings, host))
    return child.inventories.get("SRIOV_NET_VF")


def test_vfs_on_a_pci_child_are_not_counted_again_as_sriov_net_vf():
    physnet = {"product_id": PF_PROD, "physical_network": "physnet1"}
    inv = _sriov_total([physnet, {"product_id": VF_PROD, "address": "0000:81:00.1"}])
    assert inv.total == 3  # 4 enabled VFs, one on its PCI child
    assert _sriov_total([physnet, {"product_id": VF_PROD}]) is None  # all four taken


def test_sriov_child_keeps_every_vf_without_report_in_placement():
    from node_agent.tree.pci import sriov_children
    from node_agent.tree.pci_placement import claimed_vfs

    parsed = (parse_spec(json.dumps({"product_id": PF_PROD, "physical_network": "p"})),)
    settings = make_settings(host="compute1", pci_device_specs=parsed)
    host = _sriov_host()
    [child] = sriov_children(settings, host, claimed_vfs(settings, host))
    assert child.inventories["SRIOV_NET_VF"].total == 4


def test_trait_a_spec_no_longer_gives_is_removed_as_nova_replaces_them():
    state = held(
        "compute1_0000:81:00.0",
        total=1,
        traits=("COMPUTE_MANAGED_PCI_DEVICE", AGENT_CHILD_TRAIT, "CUSTOM_OLD"),
    )
    tree = ProviderTree((ROOT, child(state.name, 1)))
    got = at_usage(tree, [state], {}).by_name(state.name)
    assert got.traits["CUSTOM_OLD"] is False
    assert got.wanted_traits == {"COMPUTE_MANAGED_PCI_DEVICE", AGENT_CHILD_TRAIT}


def test_child_closed_for_maintenance_stays_closed_when_raised_to_usage():
    state = held("compute1_0000:81:00.0", total=4)
    closed = Provider(
        state.name,
        "compute1",
        inventories={RC: Inventory(1, reserved=1, max_unit=1)},
        traits={"COMPUTE_MANAGED_PCI_DEVICE": True, AGENT_CHILD_TRAIT: True},
    )
    got = at_usage(ProviderTree((ROOT, closed)), [state], {state.name: {RC: 3}})
    inv = got.by_name(state.name).inventories[RC]
    assert (inv.total, inv.reserved) == (3, 3)


def test_one_time_use_child_closed_for_maintenance_is_not_reopened():
    state = held("compute1_0000:81:00.0", total=1, reserved=0)
    closed = child(state.name, 1, one_time_use=True)
    closed = dataclasses.replace(closed, inventories={RC: Inventory(1, reserved=1, max_unit=1)})
    got = at_usage(ProviderTree((ROOT, closed)), [state], {state.name: {}})
    assert got.by_name(state.name).inventories[RC].reserved == 1


def test_spec_matching_no_device_is_warned_under_report_in_placement():
    from node_agent.tree.pci_placement import unmatched_specs

    specs = (
        parse_spec(json.dumps({"product_id": PCI_PROD})),
        parse_spec(json.dumps({"address": "0000:99:00.0"})),
        parse_spec(json.dumps({"address": "0000:98:00.0", "physical_network": "p"})),
    )
    settings = make_settings(host="compute1", pci_in_placement=True, pci_device_specs=specs)
    [warning] = unmatched_specs(settings, bare_host(fake_host_devices(num_pci=1)))
    assert "0000:99:00.0" in warning and "matches no PCI device" in warning


# -- devices running guests pass through, with or without an allocation

GUEST_A, GUEST_B = "a1b2c3d4-0000-4000-8000-00000000000a", "a1b2c3d4-0000-4000-8000-00000000000b"
HOLD_SPECS = [
    {"vendor_id": VEND, "product_id": PCI_PROD},
    {"vendor_id": VEND, "product_id": VF_PROD, "resource_class": "CUSTOM_VF"},
]


def host_with_guests(devices, *guests):
    from node_agent.model.snapshot import Guest

    made = tuple(
        Guest(uuid, uuid[-1], vcpus=1, running=running, memory_kb=1024, pci_devices=addresses)
        for uuid, addresses, running in guests
    )
    return dataclasses.replace(bare_host(devices), guests=made)


def holds(host, specs=HOLD_SPECS):
    from node_agent.tree.pci_placement import guest_holds

    parsed = tuple(parse_spec(json.dumps(s)) for s in specs)
    settings = make_settings(host="compute1", pci_in_placement=True, pci_device_specs=parsed)
    return guest_holds(settings, host), pci_children(settings, host)


def test_running_guests_holding_devices_are_counted_per_child_vfs_on_their_pf():
    devices = fake_host_devices(num_pci=2, num_pfs=1, num_vfs=3)  # VFs 0000:81:02.1-3
    host = host_with_guests(
        devices,
        (GUEST_A, ("0000:81:00.0", "0000:81:02.1", "0000:81:02.3"), True),
        (GUEST_B, ("0000:81:02.2", "0000:99:00.0"), True),  # 99: not a device we publish
    )
    found, providers = holds(host)
    assert found == {
        "compute1_0000:81:00.0": {GUEST_A: 1},
        "compute1_0000:81:02.0": {GUEST_A: 2, GUEST_B: 1},
    }
    by_name = {p.name: p for p in providers}
    assert by_name["compute1_0000:81:02.0"].inventories["CUSTOM_VF"].guest_held == (
        (GUEST_A, 2),
        (GUEST_B, 1),
    )
    assert (
        by_name["compute1_0000:81:01.0"].inventories[f"CUSTOM_PCI_{VEND}_{PCI_PROD}"].guest_held
        == ()
    )


def test_a_stopped_guest_holds_no_device():
    host = host_with_guests(fake_host_devices(num_pci=1), (GUEST_A, ("0000:81:00.0",), False))
    assert holds(host)[0] == {}


def held_child(total, guest_held, reserved=0):
    inv = Inventory(total, reserved=reserved, max_unit=total, guest_held=guest_held)
    return Provider("compute1_0000:81:00.0", "compute1", inventories={RC: inv})


@pytest.mark.parametrize(
    "total, reserved, guest_held, allocations, expected",
    [
        # Held, no allocation at all: reserved.
        (1, 0, ((GUEST_A, 1),), {}, 1),
        # Held and allocated to that consumer: nothing extra.
        (1, 0, ((GUEST_A, 1),), {GUEST_A: {RC: 1}}, 0),
        # An allocation of another class, or to another consumer, covers nothing.
        (2, 0, ((GUEST_A, 1),), {GUEST_A: {"VCPU": 1}, GUEST_B: {RC: 1}}, 1),
        # Too small an allocation: the rest is reserved.
        (4, 0, ((GUEST_A, 3),), {GUEST_A: {RC: 1}}, 2),
        # Two guests, one allocated, one not.
        (4, 0, ((GUEST_A, 2), (GUEST_B, 1)), {GUEST_B: {RC: 1}}, 2),
        # The larger of the other rules' reserved and the held, never above total.
        (4, 3, ((GUEST_A, 1),), {}, 3),
        (2, 1, ((GUEST_A, 3),), {}, 2),
        # An allocation above what is held gives nothing back.
        (2, 0, ((GUEST_A, 1), (GUEST_B, 1)), {GUEST_A: {RC: 2}}, 1),
    ],
)
def test_devices_held_without_allocation_are_reserved(
    total, reserved, guest_held, allocations, expected
):
    from node_agent.tree.pci_placement import at_guest_holds

    tree = ProviderTree((ROOT, held_child(total, guest_held, reserved)))
    got = at_guest_holds(tree, {"compute1_0000:81:00.0": allocations})
    assert got.by_name("compute1_0000:81:00.0").inventories[RC].reserved == expected


def test_only_children_guests_hold_need_their_allocations_read():
    from node_agent.tree.pci_placement import at_guest_holds, held_by_guests

    tree = ProviderTree((ROOT, child("compute1_0000:81:00.0", 1)))
    assert held_by_guests(tree) == []
    assert at_guest_holds(tree, {}) == tree
    held = ProviderTree((ROOT, held_child(1, ((GUEST_A, 1),))))
    assert held_by_guests(held) == ["compute1_0000:81:00.0"]


def test_allocations_body_is_read_by_consumer():
    from node_agent.tree.pci_placement import allocated_by_consumer

    body = {
        "resource_provider_generation": 3,
        "allocations": {GUEST_A: {"resources": {RC: 1}}, GUEST_B: {"resources": {}}},
    }
    assert allocated_by_consumer(body) == {GUEST_A: {RC: 1}, GUEST_B: {}}


def test_the_operator_is_told_which_guest_holds_what_without_allocation():
    from node_agent.tree.pci_placement import holds_message, holds_without_allocation

    tree = ProviderTree((ROOT, held_child(4, ((GUEST_A, 2), (GUEST_B, 1)))))
    allocations = {"compute1_0000:81:00.0": {GUEST_B: {RC: 1}, GUEST_A: {RC: 1}}}
    found = holds_without_allocation(tree, allocations)
    assert found == (("compute1_0000:81:00.0", RC, GUEST_A, 1),)
    assert f"compute1_0000:81:00.0 {RC}: 1 by guest {GUEST_A}" in holds_message(found)
    covered = {"compute1_0000:81:00.0": {GUEST_A: {RC: 2}, GUEST_B: {RC: 1}}}
    assert holds_without_allocation(tree, covered) == ()
