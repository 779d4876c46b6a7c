"""PCI devices reach the real Placement in nova 34's model
(``[pci] report_in_placement``), and a device in use that disappears keeps
its inventory at the usage: never less than allocated, never more.

The host is a sysfs tree in ``tmp_path`` (linux-test4's CPUs plus PCI
functions laid out as the kernel does, VFs linked to their PF by
``physfn``); the cycles are the agent's own (discovery, tree, syncer,
reconciler) against the session's Placement.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import os_traits as ot
import pytest

from node_agent.cycle.desired import compute_desired
from node_agent.cycle.reconcile import Reconciler
from node_agent.model.device_spec import parse_spec
from node_agent.placement.client import PlacementClient
from node_agent.placement.sync import TreeSyncer
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT
from node_agent.state import StateStore
from tests.hostdata import HOSTDATA, sysfs_root_for
from tests.integration.placement_tree import tree_by_name
from tests.integration.reshape_driver import allocate, make_settings
from tests.integration.test_nested_reshape import host_xml
from tests.unit.test_pci import add_device, write

pytestmark = pytest.mark.integration
LOG = logging.getLogger(__name__)

GPU, PF, OTU = "0000:81:00.0", "0000:3b:00.0", "0000:82:00.0"
VFS = ("0000:3b:02.0", "0000:3b:02.1")
GPU_RC, VF_RC, OTU_RC = "CUSTOM_PCI_10DE_1EB8", "CUSTOM_VF", "CUSTOM_PCI_1234_5678"
SPECS = (
    {"vendor_id": "10de", "traits": "gpu,HW_GPU_API_VULKAN", "live_migratable": "true"},
    {"product_id": "154c", "resource_class": "vf"},
    {"address": OTU, "one_time_use": True},
    {"product_id": "158b", "physical_network": "physnet1"},
)


def _host(tmp_path: Path) -> Path:
    root = sysfs_root_for(HOSTDATA / "virhostcpudata" / "linux-test4", tmp_path)
    add_device(root, GPU, vendor="0x10de", device="0x1eb8")
    add_device(root, OTU, vendor="0x1234", device="0x5678")
    pf = add_device(root, PF, vendor="0x8086", device="0x158b")
    write(pf / "sriov_totalvfs", "8")
    write(pf / "sriov_numvfs", "2")
    for vf_address in VFS:
        vf = add_device(root, vf_address, vendor="0x8086", device="0x154c")
        (vf / "physfn").symlink_to(pf)
    return root


def _remove(root: Path, address: str) -> None:
    """The device leaves the host (hot-unplug, a VF count lowered)."""
    link = root / "bus" / "pci" / "devices" / address
    shutil.rmtree(link.resolve())
    link.unlink()


def _settings(root: Path, tmp_path: Path, host: str):
    base = make_settings(host, str(root), "", str(tmp_path / "state"), str(tmp_path))
    return dataclasses.replace(
        base,
        pci_in_placement=True,
        pci_device_specs=tuple(parse_spec(json.dumps(s)) for s in SPECS),
    )


def _cycle(client, settings):
    store = StateStore(Path(settings.state_path))
    desired = compute_desired(settings, None, store.load_or_empty(LOG))
    return Reconciler(client, TreeSyncer(client, store)).apply(desired).report


@pytest.fixture
def client(placement_server):
    return PlacementClient.for_endpoint(placement_server.url)


def test_pci_children_classes_and_traits_appear_as_nova_lays_them_out(client, host_name, tmp_path):
    settings = _settings(_host(tmp_path), tmp_path, host_name)
    assert _cycle(client, settings).ok
    tree = tree_by_name(client, host_name)
    gpu, vfs, otu = (f"{host_name}_{a.upper()}" for a in (GPU, PF, OTU))
    # The physnet PF keeps its SR-IOV child (driver-physnet-sriov-children),
    # without the VFs the PCI child counts: no VF is offered twice.
    sriov = f"{host_name}_{PF}"
    assert set(tree) == {host_name, gpu, vfs, otu, sriov}
    assert "SRIOV_NET_VF" not in tree[sriov]["inventories"]
    for name, rc, total in ((gpu, GPU_RC, 1), (vfs, VF_RC, 2), (otu, OTU_RC, 1)):
        assert tree[name]["parent"] == tree[host_name]["uuid"]
        inv = tree[name]["inventories"][rc]
        assert (inv["total"], inv["max_unit"], inv["reserved"]) == (total, total, 0)
        assert {ot.COMPUTE_MANAGED_PCI_DEVICE, AGENT_CHILD_TRAIT} <= tree[name]["traits"]
    assert {"CUSTOM_GPU", ot.HW_GPU_API_VULKAN, ot.HW_PCI_LIVE_MIGRATABLE} <= tree[gpu]["traits"]
    assert ot.HW_PCI_ONE_TIME_USE in tree[otu]["traits"]
    assert ot.OWNER_NOVA not in tree[gpu]["traits"]


def test_devices_in_use_that_disappear_keep_their_inventory_at_usage(client, host_name, tmp_path):
    root = _host(tmp_path)
    settings = _settings(root, tmp_path, host_name)
    assert _cycle(client, settings).ok
    tree = tree_by_name(client, host_name)
    gpu, vfs = f"{host_name}_{GPU.upper()}", f"{host_name}_{PF.upper()}"
    guest_gpu, guest_vf = str(uuid.uuid4()), str(uuid.uuid4())
    allocate(client, guest_gpu, {tree[gpu]["uuid"]: {GPU_RC: 1}})
    allocate(client, guest_vf, {tree[vfs]["uuid"]: {VF_RC: 1}})

    # The GPU and both VFs leave the host while guests hold one of each.
    _remove(root, GPU)
    for vf_address in VFS:
        _remove(root, vf_address)
    report = _cycle(client, settings)
    assert report.ok, report.errors
    tree = tree_by_name(client, host_name)
    assert gpu in tree and vfs in tree
    held_gpu = tree[gpu]["inventories"][GPU_RC]
    held_vf = tree[vfs]["inventories"][VF_RC]
    # At the usage: not the 2 VFs published before (overstating), not 0.
    assert (held_gpu["total"], held_gpu["max_unit"]) == (1, 1)
    assert (held_vf["total"], held_vf["max_unit"]) == (1, 1)
    assert ot.HW_PCI_LIVE_MIGRATABLE in tree[gpu]["traits"]

    # Once the guest lets the GPU go, its child goes too.
    client.delete(f"/allocations/{guest_gpu}")
    assert _cycle(client, settings).ok
    assert gpu not in tree_by_name(client, host_name)


def test_one_time_use_device_is_reserved_once_allocated_and_stays_reserved(
    client, host_name, tmp_path
):
    settings = _settings(_host(tmp_path), tmp_path, host_name)
    assert _cycle(client, settings).ok
    otu = f"{host_name}_{OTU.upper()}"
    guest = str(uuid.uuid4())
    allocate(client, guest, {tree_by_name(client, host_name)[otu]["uuid"]: {OTU_RC: 1}})
    assert _cycle(client, settings).ok
    assert tree_by_name(client, host_name)[otu]["inventories"][OTU_RC]["reserved"] == 1

    # Freed: it stays reserved (only an operator unreserves a one-time-use device).
    client.delete(f"/allocations/{guest}")
    assert _cycle(client, settings).ok
    assert tree_by_name(client, host_name)[otu]["inventories"][OTU_RC]["reserved"] == 1


def test_traits_a_spec_no_longer_gives_leave_the_child_as_nova_replaces_them(
    client, host_name, tmp_path
):
    settings = _settings(_host(tmp_path), tmp_path, host_name)
    assert _cycle(client, settings).ok
    gpu = f"{host_name}_{GPU.upper()}"
    assert "CUSTOM_GPU" in tree_by_name(client, host_name)[gpu]["traits"]
    respec = ({"vendor_id": "10de", "traits": "accel"},) + SPECS[1:]
    changed = dataclasses.replace(
        settings, pci_device_specs=tuple(parse_spec(json.dumps(s)) for s in respec)
    )
    assert _cycle(client, changed).ok
    traits = tree_by_name(client, host_name)[gpu]["traits"]
    assert "CUSTOM_ACCEL" in traits
    assert not {"CUSTOM_GPU", ot.HW_GPU_API_VULKAN, ot.HW_PCI_LIVE_MIGRATABLE} & traits


def test_regex_address_spec_publishes_exactly_the_devices_it_matches(client, host_name, tmp_path):
    # nova's dict (regex) form of address: each field a pattern matched at
    # the start of the device's field, a field left off matching anything.
    root = sysfs_root_for(HOSTDATA / "virhostcpudata" / "linux-test4", tmp_path)
    gpus = ("0000:81:00.0", "0000:82:00.0", "0000:83:00.0", "0001:81:00.0")
    for address in gpus:
        add_device(root, address, vendor="0x10de", device="0x1eb8")
    add_device(root, "0000:81:00.1", vendor="0x10de", device="0x10f8")
    pf = add_device(root, PF, vendor="0x8086", device="0x158b")
    write(pf / "sriov_totalvfs", "8")
    write(pf / "sriov_numvfs", "4")
    for n in range(4):
        vf = add_device(root, f"0000:3b:02.{n}", vendor="0x8086", device="0x154c")
        (vf / "physfn").symlink_to(pf)
    specs = [
        {"address": {"domain": "0000", "bus": "8[12]", "function": "0"}, "resource_class": "pgpu"},
        {"address": {"bus": "3b", "slot": "02", "function": "[0-2]"}, "resource_class": "vf"},
    ]
    base = _settings(root, tmp_path, host_name)
    settings = dataclasses.replace(
        base, pci_device_specs=tuple(parse_spec(json.dumps(s)) for s in specs)
    )
    assert _cycle(client, settings).ok
    tree = tree_by_name(client, host_name)
    pgpus = {f"{host_name}_{a.upper()}" for a in gpus[:2]}
    vfs = f"{host_name}_{PF.upper()}"
    # Not 0000:81:00.1 (function 1), 0000:83:00.0 (bus), 0001:81:00.0
    # (domain), nor the PF itself or its fourth VF.
    assert set(tree) == {host_name, vfs} | pgpus
    for name in pgpus:
        assert set(tree[name]["inventories"]) == {"PGPU"}
        assert tree[name]["inventories"]["PGPU"]["total"] == 1
    assert tree[vfs]["inventories"]["CUSTOM_VF"]["total"] == 3

    # Narrowed to two functions: the PF's child counts two VFs.
    specs[1]["address"]["function"] = "[01]"
    narrowed = dataclasses.replace(
        base, pci_device_specs=tuple(parse_spec(json.dumps(s)) for s in specs)
    )
    assert _cycle(client, narrowed).ok
    tree = tree_by_name(client, host_name)
    assert set(tree) == {host_name, vfs} | pgpus
    assert tree[vfs]["inventories"]["CUSTOM_VF"]["total"] == 2


# The <hostdev> elements nova 34's libvirt driver writes (tests/data/nova_hostdevs).
NOVA_HOSTDEVS = (
    Path(__file__).resolve().parents[1] / "data" / "nova_hostdevs" / "pci-passthrough.xml"
)


def _nova_hostdevs(*addresses: str) -> str:
    found = {}
    for hostdev in ET.parse(NOVA_HOSTDEVS).getroot().iter("hostdev"):
        a = hostdev.find("source/address")
        address = "{:04x}:{:02x}:{:02x}.{:x}".format(
            *(int(a.get(k), 16) for k in ("domain", "bus", "slot", "function"))
        )
        found[address] = ET.tostring(hostdev, encoding="unicode")
    return "".join(found[a] for a in addresses)


def holding_guest(tmp_path: Path, host_name: str):
    """(the guest, the host's settings with it running, without it): a guest
    nova did not place passing the GPU and one VF through."""
    guest = {
        "name": "outside-nova",
        "uuid": str(uuid.uuid4()),
        "memory": 1024,
        "vcpus": 1,
        "hostdevs": _nova_hostdevs(GPU, VFS[1]),
    }
    base = _settings(_host(tmp_path), tmp_path, host_name)
    with_guest = dataclasses.replace(base, libvirt_uri=host_xml(tmp_path / "with.xml", [guest]))
    without = dataclasses.replace(base, libvirt_uri=host_xml(tmp_path / "without.xml", []))
    return guest, with_guest, without


def reserved_of(client, host_name: str) -> tuple[int, int]:
    """(GPU child's reserved, VFs child's reserved) as Placement holds them."""
    tree = tree_by_name(client, host_name)
    return (
        tree[f"{host_name}_{GPU.upper()}"]["inventories"][GPU_RC]["reserved"],
        tree[f"{host_name}_{PF.upper()}"]["inventories"][VF_RC]["reserved"],
    )


def test_device_a_guest_holds_without_allocation_stays_reserved_until_the_guest_goes(
    client, host_name, tmp_path
):
    # A guest nova did not place (or whose PCI allocation was never healed)
    # passes the GPU and one VF through: neither may be offered again.
    guest, with_guest, without = holding_guest(tmp_path, host_name)
    gpu, vfs = f"{host_name}_{GPU.upper()}", f"{host_name}_{PF.upper()}"

    def reserved():
        return reserved_of(client, host_name)

    report = _cycle(client, with_guest)
    assert report.ok, report.errors
    assert reserved() == (1, 1)  # from the children's first write

    # The guest goes: so does the reservation.
    assert _cycle(client, without).ok
    assert reserved() == (0, 0)

    # As nova runs it: the devices allocated to the consumer, then the guest
    # started. They count as used, not also reserved.
    tree = tree_by_name(client, host_name)
    allocate(client, guest["uuid"], {tree[gpu]["uuid"]: {GPU_RC: 1}, tree[vfs]["uuid"]: {VF_RC: 1}})
    assert _cycle(client, with_guest).ok
    assert reserved() == (0, 0)

    # The allocation goes while the guest still runs: reserved again.
    client.delete(f"/allocations/{guest['uuid']}")
    assert _cycle(client, with_guest).ok
    assert reserved() == (1, 1)

    # The guest goes: so does the reservation.
    assert _cycle(client, without).ok
    assert reserved() == (0, 0)


def test_a_steady_cycle_reads_each_held_childs_allocations_once(
    client, host_name, tmp_path, caplog
):
    """Every plan, check and sync of a cycle prepares the tree; the held
    children's allocations are read by the first of them only, and again by
    the next cycle, which must see an allocation made or deleted since. The
    same for the usages of a one-time-use child not yet reserved. The
    operator is warned once, naming the guest, not every cycle."""
    guest, with_guest, _without = holding_guest(tmp_path, host_name)
    store = StateStore(Path(with_guest.state_path))
    reconciler = Reconciler(client, TreeSyncer(client, store))

    def cycle():
        desired = compute_desired(with_guest, None, store.load_or_empty(LOG))
        client.stats.reset()
        assert reconciler.apply(desired).report.ok
        gets = [p for m, p, _s in client.stats.log if m == "GET"]
        # The unused one-time-use child's usages too: each once, not at
        # every prepare of the cycle.
        assert len(gets) == len(set(gets)), gets
        return [p for p in gets if p.endswith("/allocations")]

    caplog.set_level(logging.INFO, logger="node_agent.placement.sync")
    cycle()
    warned = [r for r in caplog.records if "without a Placement allocation" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert guest["uuid"] in warned[0].getMessage()
    tree = tree_by_name(client, host_name)
    held = {tree[f"{host_name}_{a.upper()}"]["uuid"] for a in (GPU, PF)}
    caplog.clear()
    for _ in range(2):
        reads = cycle()
        assert sorted(reads) == sorted(f"/resource_providers/{u}/allocations" for u in held)
    assert reserved_of(client, host_name) == (1, 1)
    assert not [r for r in caplog.records if "without a Placement allocation" in r.getMessage()]


def test_a_cycle_that_ended_before_its_sync_leaves_no_allocations_for_the_next(
    client, host_name, tmp_path
):
    """The cycle before read that the guest's devices were allocated, then
    stopped before its sync; the allocation went since. The next cycle
    must read it again, not reserve from the old answer: the devices would
    be offered while the guest holds them."""
    from node_agent.runner import DirectRunner

    guest, with_guest, without = holding_guest(tmp_path, host_name)
    store = StateStore(Path(with_guest.state_path))
    syncer = TreeSyncer(client, store)
    runner = DirectRunner(syncer, Reconciler(client, syncer), with_guest, check_version=False)

    def desired():
        return compute_desired(with_guest, None, store.load_or_empty(LOG))

    assert runner.run(desired()).ok
    tree = tree_by_name(client, host_name)
    gpu, vfs = f"{host_name}_{GPU.upper()}", f"{host_name}_{PF.upper()}"
    # Allocated as nova does, while nothing is reserved (the guest stopped).
    assert runner.run(compute_desired(without, None, store.load_or_empty(LOG))).ok
    allocate(client, guest["uuid"], {tree[gpu]["uuid"]: {GPU_RC: 1}, tree[vfs]["uuid"]: {VF_RC: 1}})
    assert runner.run(desired()).ok
    assert reserved_of(client, host_name) == (0, 0)

    syncer.check_owner(desired().tree)  # a cycle's first read; it ends there
    client.delete(f"/allocations/{guest['uuid']}")
    assert runner.run(desired()).ok
    assert reserved_of(client, host_name) == (1, 1)
