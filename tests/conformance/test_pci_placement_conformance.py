"""PCI devices in Placement: nova 34's ``update_provider_tree_for_pci`` and
the agent on the same devices, the same ``[pci] device_spec`` and the same
allocations (area ``pci_placement``).

The hosts are the layouts nova's fakelibvirt ``HostPCIDevicesInfo`` emulates
(standalone devices, then PFs with their VFs, on bus 0x81) plus one with hex
letters in its address; the cases are nova's functional-test configurations
(``nova/tests/functional/libvirt/test_pci_in_placement.py``), a table of
specs over those hosts, and allocations held by devices that lost their spec
or vanished. nova's tracker keeps an allocated device even when it is gone
from the host or from the specs; the agent sees only what sysfs shows and
Placement's usage, so a "gone" device is in nova's tracker and not in the
agent's snapshot.
"""

from __future__ import annotations

import itertools
import json

from node_agent.config.files import load_conf
from node_agent.config.settings import load_settings
from node_agent.errors import ConfigError
from node_agent.model.provider_state import ProviderState
from node_agent.model.provider_tree import Provider, ProviderTree
from node_agent.model.snapshot import PciDevice
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT
from node_agent.tree import pci_placement
from tests.conformance.differences import UNCLASSIFIED, Observed, check
from tests.snapshots import bare_host
from tests.unit.test_pci_placement import (
    CUSTOM_RC_SPECS,
    INIT_WITH_PCI_DEVS_SPECS,
    PCI_PROD,
    PF_PROD,
    VEND,
    VF_PROD,
    fake_host_devices,
)

PCI_RC, PF_RC, VF_RC = (f"CUSTOM_PCI_{VEND}_{p}" for p in (PCI_PROD, PF_PROD, VF_PROD))
MANAGED = "COMPUTE_MANAGED_PCI_DEVICE"
SHAPES = ((1, 0, 0), (2, 1, 2), (0, 2, 4), (2, 2, 4), (1, 1, 1))
SPEC_TABLE = (
    [{"vendor_id": VEND}],
    [{"product_id": PCI_PROD}],
    [{"product_id": PF_PROD, "traits": "x,HW_NIC_SRIOV"}],
    [{"product_id": VF_PROD, "resource_class": "vf"}],
    [{"address": "0000:81:01.0"}],
    [{"product_id": VF_PROD, "physical_network": "p"}, {"vendor_id": VEND}],
    [{"product_id": PF_PROD, "one_time_use": "true", "live_migratable": "true"}],
    [
        {
            "address": "*:81:*.*",
            "product_id": PCI_PROD,
            "resource_class": "CUSTOM_foo",
            "traits": "custom_bar,a@b",
        }
    ],
    [{"address": "81:00.", "resource_class": "pgpu"}],
    [{"product_id": VF_PROD, "one_time_use": "true"}],
    [
        {"product_id": VF_PROD, "address": "0000:81:00.1", "traits": "a"},
        {"product_id": VF_PROD, "traits": "b"},
    ],
    [{"product_id": PF_PROD}, {"product_id": VF_PROD, "resource_class": "vf"}],
    # nova's regex form of address.
    [{"address": {"slot": "0[01]", "function": "[1-9]"}, "resource_class": "vf"}],
    [{"address": {"domain": "0000", "bus": "81", "slot": "01", "function": "0"}}],
    [{"address": {"function": "0"}, "product_id": PF_PROD, "traits": "pf"}],
    [{"address": {"slot": "00"}, "physical_network": "p"}, {"address": {"bus": "8."}}],
)


def _device(dev: PciDevice, **extra) -> dict:
    out = {
        "address": dev.address,
        "vendor_id": dev.vendor_id,
        "product_id": dev.product_id,
        "dev_type": dev.dev_type,
        "parent_addr": dev.parent_addr,
    }
    out.update(extra)
    return out


def _case(
    name, devices, specs, held=(), allocations=None, gone=(), used=(), in_placement=True
) -> dict:
    """``used``: addresses nova's tracker has allocated (to ``i-<address>``);
    ``gone``: addresses no longer on the host (nova's tracker keeps those
    allocated, and forgets the others)."""
    return {
        "name": name,
        "device_spec": [json.dumps(s) for s in specs],
        "devices": [
            _device(d, **({"instance_uuid": f"i-{d.address}"} if d.address in used else {}))
            for d in devices
            if d.address in used or d.address not in gone
        ],
        "held": list(held),
        "allocations": allocations or {},
        "gone": list(gone),
        "report_in_placement": in_placement,
    }


def _held(address: str, rc: str, total: int, traits=(), reserved: int = 0) -> dict:
    return {
        "name": f"compute1_{address}",
        "rc": rc,
        "total": total,
        "reserved": reserved,
        "traits": sorted({MANAGED, "OWNER_NOVA", *traits}),
    }


def cases() -> list[dict]:
    out = []
    # nova's functional tests (PlacementPCIInventoryReportingTests).
    out.append(
        _case(
            "test_new_compute_init_with_pci_devs",
            fake_host_devices(2, 2, 4),
            INIT_WITH_PCI_DEVS_SPECS,
        )
    )
    out.append(
        _case(
            "test_new_compute_init_with_pci_dev_custom_rc",
            fake_host_devices(1, 1, 1),
            CUSTOM_RC_SPECS,
        )
    )
    out.append(
        _case(
            "test_dependent_device_config_is_rejected",
            fake_host_devices(0, 1, 1),
            [{"address": "0000:81:00.0"}, {"address": "0000:81:00.1"}],
        )
    )
    out.append(
        _case(
            "test_sibling_vfs_with_contradicting_resource_classes_rejected",
            fake_host_devices(0, 1, 2),
            [
                {"address": "0000:81:00.1", "resource_class": "vf1"},
                {"address": "0000:81:00.2", "resource_class": "vf2"},
            ],
        )
    )
    out.append(
        _case(
            "test_sibling_vfs_with_contradicting_traits_rejected",
            fake_host_devices(0, 1, 2),
            [
                {"address": "0000:81:00.1", "traits": "foo"},
                {"address": "0000:81:00.2", "traits": "bar"},
            ],
        )
    )
    out.append(
        _case(
            "test_neutron_sriov_devs_ignored",
            fake_host_devices(0, 1, 1),
            [{"vendor_id": VEND, "product_id": PF_PROD, "physical_network": "physnet0"}],
        )
    )
    out.append(
        _case(
            "vfs_with_partial_address",
            fake_host_devices(0, 1, 3),
            [{"vendor_id": VEND, "product_id": VF_PROD, "address": "0000:81:00."}],
        )
    )
    out.append(
        _case(
            "hex_letters_in_address",
            (PciDevice("0000:af:00.0", "10de", "1eb8"), PciDevice("0000:af:00.1", "10de", "10f8")),
            [{"vendor_id": "10DE", "product_id": "1eb8"}],
        )
    )
    # A table of specs over fakelibvirt's host shapes.
    for (shape, specs), n in zip(itertools.product(SHAPES, SPEC_TABLE), itertools.count()):
        out.append(_case(f"table-{n}-{shape}", fake_host_devices(*shape), specs))
    out.append(
        _case(
            "resource_class_the_agent_reports_from_the_host",
            fake_host_devices(1, 0, 0),
            [{"product_id": PCI_PROD, "resource_class": "VGPU"}],
        )
    )
    # Allocations held by devices that lost their spec or vanished.
    pf_alone = (PciDevice("0000:81:00.0", VEND, PF_PROD, "type-PF"),)
    pci_one = fake_host_devices(1, 0, 0)
    pf_spec = [{"vendor_id": VEND, "product_id": PF_PROD}]
    out.append(
        _case(
            "test_pf_devspec_removed_while_allocated",
            pf_alone,
            [],
            held=[_held("0000:81:00.0", PF_RC, 1)],
            allocations={"i-0000:81:00.0": {"compute1_0000:81:00.0": {PF_RC: 1}}},
            used={"0000:81:00.0"},
        )
    )
    out.append(
        _case(
            "test_last_vf_devspec_removed_while_allocated",
            fake_host_devices(0, 1, 1),
            [],
            held=[_held("0000:81:00.0", VF_RC, 1)],
            allocations={"i-0000:81:00.1": {"compute1_0000:81:00.0": {VF_RC: 1}}},
            used={"0000:81:00.1"},
        )
    )
    out.append(
        _case(
            "test_non_last_vf_devspec_removed_while_allocated",
            fake_host_devices(0, 1, 2),
            [{"vendor_id": VEND, "product_id": VF_PROD, "address": "0000:81:00.2"}],
            held=[_held("0000:81:00.0", VF_RC, 2)],
            allocations={"i-0000:81:00.1": {"compute1_0000:81:00.0": {VF_RC: 1}}},
            used={"0000:81:00.1"},
        )
    )
    out.append(
        _case(
            "vfs_unlisted_below_usage",
            fake_host_devices(0, 1, 4),
            [{"vendor_id": VEND, "product_id": VF_PROD, "address": "0000:81:00.4"}],
            held=[_held("0000:81:00.0", VF_RC, 4)],
            allocations={
                "i-0000:81:00.1": {"compute1_0000:81:00.0": {VF_RC: 1}},
                "i-0000:81:00.2": {"compute1_0000:81:00.0": {VF_RC: 1}},
            },
            used={"0000:81:00.1", "0000:81:00.2"},
        )
    )
    out.append(
        _case(
            "pci_device_gone_while_allocated",
            pci_one,
            [{"product_id": PCI_PROD}],
            held=[_held("0000:81:00.0", PCI_RC, 1)],
            allocations={"i-0000:81:00.0": {"compute1_0000:81:00.0": {PCI_RC: 1}}},
            used={"0000:81:00.0"},
            gone={"0000:81:00.0"},
        )
    )
    out.append(
        _case(
            "pci_device_gone_unallocated",
            pci_one,
            [{"product_id": PCI_PROD}],
            held=[_held("0000:81:00.0", PCI_RC, 1)],
            gone={"0000:81:00.0"},
        )
    )
    out.append(
        _case(
            "vf_gone_while_allocated",
            fake_host_devices(0, 1, 3),
            [{"product_id": VF_PROD}],
            held=[_held("0000:81:00.0", VF_RC, 3)],
            allocations={"i-0000:81:00.1": {"compute1_0000:81:00.0": {VF_RC: 1}}},
            used={"0000:81:00.1"},
            gone={"0000:81:00.1"},
        )
    )
    otu = [{"vendor_id": VEND, "product_id": PF_PROD, "one_time_use": "true"}]
    otu_traits = ("HW_PCI_ONE_TIME_USE",)
    out.append(
        _case(
            "test_one_time_use_workflow_allocated",
            pf_alone,
            otu,
            held=[_held("0000:81:00.0", PF_RC, 1, otu_traits)],
            allocations={"i-0000:81:00.0": {"compute1_0000:81:00.0": {PF_RC: 1}}},
            used={"0000:81:00.0"},
        )
    )
    out.append(
        _case(
            "test_one_time_use_workflow_freed_still_reserved",
            pf_alone,
            otu,
            held=[_held("0000:81:00.0", PF_RC, 1, otu_traits, reserved=1)],
        )
    )
    out.append(
        _case(
            "test_one_time_use_workflow_unreserved_by_operator",
            pf_alone,
            otu,
            held=[_held("0000:81:00.0", PF_RC, 1, otu_traits, reserved=0)],
        )
    )
    out.append(
        _case(
            "spec_traits_changed",
            pf_alone,
            [{"vendor_id": VEND, "product_id": PF_PROD, "traits": "new"}],
            held=[_held("0000:81:00.0", PF_RC, 1, ("CUSTOM_OLD", "HW_PCI_LIVE_MIGRATABLE"))],
        )
    )
    out.append(
        _case(
            "test_heal_single_pci_allocation",
            pf_alone,
            pf_spec,
            held=[_held("0000:81:00.0", PF_RC, 1)],
            # The instance holds its CPUs on the root, not its PF yet.
            allocations={"i-0000:81:00.0": {"compute1": {"VCPU": 1}}},
            used={"0000:81:00.0"},
        )
    )
    out.append(
        _case(
            "test_reporting_cannot_be_disable_once_it_is_enabled",
            pci_one,
            [{"product_id": PCI_PROD}],
            held=[_held("0000:81:00.0", PCI_RC, 1)],
            in_placement=False,
        )
    )
    out.append(
        _case(
            "pf_steady_with_held_child",
            pf_alone,
            pf_spec,
            held=[_held("0000:81:00.0", PF_RC, 1)],
        )
    )
    return out


def agent_children(case: dict, tmp_path) -> list[dict]:
    """The agent's children for ``case``: the tree from the devices still on
    the host, then what Placement's usage changes (as the syncer does)."""
    on = "true" if case["report_in_placement"] else "false"
    text = f"[DEFAULT]\nhost = compute1\n[pci]\nreport_in_placement = {on}\n"
    text += "".join(f"device_spec = {spec}\n" for spec in case["device_spec"])
    path = tmp_path / f"{case['name']}.conf"
    path.write_text(text)
    settings = load_settings(load_conf(["--config-file", str(path)]))
    present = [
        PciDevice(d["address"], d["vendor_id"], d["product_id"], d["dev_type"], d["parent_addr"])
        for d in case["devices"]
        if d["address"] not in case["gone"]
    ]
    root = Provider("compute1")
    tree = ProviderTree((root,) + pci_placement.pci_children(settings, bare_host(present)))
    held = [
        ProviderState(
            uuid=f"uuid-{h['name']}",
            name=h["name"],
            generation=1,
            parent_uuid="root",
            inventories={
                h["rc"]: {"total": h["total"], "max_unit": h["total"], "reserved": h["reserved"]}
            },
            traits=frozenset(t for t in h["traits"] if t != "OWNER_NOVA") | {AGENT_CHILD_TRAIT},
        )
        for h in case["held"]
    ]
    usages: dict[str, dict[str, int]] = {}
    for by_rp in case["allocations"].values():
        for name, resources in by_rp.items():
            for rc, n in resources.items():
                usages.setdefault(name, {}).setdefault(rc, 0)
                usages[name][rc] += n
    need = [s for s in held if pci_placement.needs_usage(tree, s)]
    tree = pci_placement.at_usage(tree, held, {s.name: usages.get(s.name, {}) for s in need})
    return [
        {
            "name": p.name,
            "inventories": {
                rc: {"total": i.total, "max_unit": i.max_unit, "reserved": i.reserved}
                for rc, i in p.inventories.items()
            },
            "traits": sorted(p.wanted_traits),
        }
        for p in tree.providers[1:]
    ]


def _comparable(children: list[dict], mark: str) -> dict:
    return {
        c["name"]: (
            {
                rc: (r["total"], r.get("max_unit", r["total"]), r.get("reserved", 0))
                for rc, r in c["inventories"].items()
            },
            sorted(t for t in c["traits"] if t != mark),
        )
        for c in children
    }


def _difference(case: dict) -> str:
    if case["name"] == "vf_gone_while_allocated":
        return "pci-vanished-vf-in-use"
    return UNCLASSIFIED


def test_pci_children_are_novas_on_the_same_devices_specs_and_usage(nova, tmp_path):
    every = cases()
    theirs = nova.call("pci_placement", cases=every)
    observed = Observed("pci_placement", cases=len(every))
    for case, answer in zip(every, theirs):
        try:
            ours = agent_children(case, tmp_path)
        except ConfigError as exc:
            if "refused" not in answer and "reports from the host itself" in str(exc):
                observed.add("pci-host-class-refused", f"{case['name']}: {exc}")
            elif "refused" not in answer:
                observed.add(
                    UNCLASSIFIED + " agent refuses",
                    f"{case['name']}: agent refuses ({exc}), nova reports {answer['value']}",
                )
            continue
        if "refused" in answer and "report_in_placement is False but it was enabled" in str(
            answer["refused"]
        ):
            observed.add(
                "pci-disable-after-enable",
                f"{case['name']}: nova refuses to start ({answer['refused']}), the agent "
                f"reports {_comparable(ours, AGENT_CHILD_TRAIT)}",
            )
            continue
        if "refused" in answer:
            observed.add(
                UNCLASSIFIED + " nova refuses",
                f"{case['name']}: nova refuses ({answer['refused']}), agent reports {ours}",
            )
            continue
        novas = answer["value"]["children"]
        if answer["value"]["healed"]:
            observed.add(
                "pci-allocation-healing",
                f"{case['name']}: nova adds the PCI allocations its tracker holds "
                "and Placement lacks; the agent writes no allocation",
            )
        if any("OWNER_NOVA" in c["traits"] for c in novas):
            observed.add(
                "pci-child-owner-mark",
                f"{case['name']}: nova marks its children OWNER_NOVA, the agent "
                f"{AGENT_CHILD_TRAIT}",
            )
        if _comparable(novas, "OWNER_NOVA") != _comparable(ours, AGENT_CHILD_TRAIT):
            observed.add(
                _difference(case),
                f"{case['name']}: nova {_comparable(novas, 'OWNER_NOVA')}, "
                f"agent {_comparable(ours, AGENT_CHILD_TRAIT)}",
            )
    check(observed)
