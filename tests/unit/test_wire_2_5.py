"""Wire 2.5: the devices running guests pass through reach the applier, so
its syncer reserves those no allocation covers, as the direct mode does
(``Inventory.guest_held``, :func:`node_agent.tree.pci_placement.at_guest_holds`)."""

from __future__ import annotations

import json
import re

import pytest

from node_agent.cycle.desired import desired_from
from node_agent.model.device_spec import parse_spec
from node_agent.model.snapshot import PCI_PF, PCI_VF, Guest, PciDevice
from node_agent.remote import wire
from tests.snapshots import settings, snapshot
from tests.unit.test_wire_2_4 import message_of, rebuilt

GPU, PF, VF = "0000:81:00.0", "0000:3b:00.0", "0000:3b:02.1"
GUEST = "0f1c9a4e-5d0b-4c52-9f8e-4e1f1e0a0c01"
DEVICES = (
    PciDevice(GPU, "10de", "1eb8"),
    PciDevice(PF, "8086", "158b", PCI_PF),
    PciDevice("0000:3b:02.0", "8086", "154c", PCI_VF, PF),
    PciDevice(VF, "8086", "154c", PCI_VF, PF),
)
SPECS = ({"vendor_id": "10de"}, {"product_id": "154c", "resource_class": "vf"})


def pci_host(tmp_path, held=(GPU, VF)):
    guests = (Guest(GUEST, "g", 1, True, 1024 * 1024, pci_devices=held),) if held else ()
    host = snapshot("virhostcpudata/linux-test4", tmp_path, pci_devices=DEVICES, guests=guests)
    specs = tuple(parse_spec(json.dumps(s)) for s in SPECS)
    return desired_from(settings(host="node1", pci_in_placement=True, pci_device_specs=specs), host)


def held_of(tree) -> dict:
    return {
        p.name: inv.guest_held
        for p in tree.providers
        for inv in p.inventories.values()
        if inv.guest_held
    }


def test_devices_guests_hold_cross_the_wire_on_their_childs_inventory(tmp_path):
    desired = pci_host(tmp_path)
    assert held_of(desired.tree) == {
        "node1_0000:81:00.0": ((GUEST, 1),),
        "node1_0000:3B:00.0": ((GUEST, 1),),
    }
    remote = rebuilt(wire.body_of(desired))
    assert remote.tree == desired.tree


def test_no_guest_holding_a_device_sends_no_key_and_keeps_the_digest(tmp_path):
    body = wire.body_of(pci_host(tmp_path, held=()))
    assert "guest_held" not in json.dumps(body)
    held = wire.body_of(pci_host(tmp_path / "held"))
    assert wire.digest_of(held) != wire.digest_of(body)


def test_a_2_4_message_carrying_guest_held_is_refused(tmp_path):
    body = wire.body_of(pci_host(tmp_path))
    with pytest.raises(wire.Malformed, match="unknown key 'guest_held'"):
        wire.parse_message(message_of(body, "2.4"))


@pytest.mark.parametrize(
    "held, words",
    [
        ([[GUEST, 0]], "guest_held[0][1]: must be an integer of at least 1"),
        ([["not-a-uuid", 1]], "guest_held[0][0]"),
        ([], "guest_held: must be a non-empty list"),
        ([[GUEST, 1], [GUEST, 2]], "guest_held: a guest appears twice"),
    ],
)
def test_malformed_guest_held_is_refused_naming_its_path(tmp_path, held, words):
    body = wire.body_of(pci_host(tmp_path))
    gpu = next(p for p in body["tree"] if p["name"] == "node1_0000:81:00.0")
    gpu["inventories"]["CUSTOM_PCI_10DE_1EB8"]["guest_held"] = held
    with pytest.raises(wire.Malformed, match=re.escape(words)):
        rebuilt(body)


def test_the_applier_reapplies_on_a_heartbeat_only_a_tree_guests_hold_devices_of(tmp_path):
    # A heartbeat shows no allocation change: a held device's reservation
    # depends on one, so such a tree is applied again (node_agent.applier).
    assert wire.has_guest_held(wire.body_of(pci_host(tmp_path)))
    assert not wire.has_guest_held(wire.body_of(pci_host(tmp_path / "free", held=())))
