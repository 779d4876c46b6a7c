"""GPUs (mdev) and SR-IOV PFs read from sysfs trees built in tmp_path, and
the children built from them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import os_resource_classes as orc
import pytest

from node_agent.errors import DiscoveryError
from node_agent.host.sysfs import SysFS
from node_agent.host.sysfs_pci import read_pci, with_mdev_parents
from node_agent.model.device_spec import parse_spec
from node_agent.model.settings import MdevTypeSettings
from node_agent.model.snapshot import Guest, GuestMdev
from node_agent.policy.partition import partition_cpus
from node_agent.tree.build import build_tree
from node_agent.tree.pci import chosen_mdev_type, gpu_provider_name
from tests.snapshots import settings, snapshot

GPU = "0000:81:00.0"
GPU2 = "0000:82:00.0"
PF = "0000:3b:00.0"
MDEV1 = "4b20d080-1b54-4048-85b3-a6a62d165c01"
MDEV2 = "8a6d1f9e-77b2-4c43-9f8e-2e3c1c7d0b02"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def add_device(root: Path, address: str, vendor="0x10de", device="0x1eb8", numa_node="-1") -> Path:
    """Like the kernel: the device lives under devices/pci..., bus/pci/devices links to it."""
    real = root / "devices" / "pci0000:80" / address
    real.mkdir(parents=True)
    write(real / "vendor", vendor)
    write(real / "device", device)
    write(real / "numa_node", numa_node)
    link = root / "bus" / "pci" / "devices" / address
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(real)
    return real


def add_mdev_type(device: Path, type_id: str, available: int, name: str, mdevs=()) -> None:
    base = device / "mdev_supported_types" / type_id
    write(base / "available_instances", str(available))
    write(base / "name", name)
    write(base / "device_api", "vfio-pci")
    (base / "devices").mkdir()
    for uuid in mdevs:
        mdev = device / uuid
        mdev.mkdir()
        (mdev / "mdev_type").symlink_to(base)
        (base / "devices" / uuid).symlink_to(mdev)
        bus = device.parents[1] / "bus" / "mdev" / "devices" / uuid
        bus.parent.mkdir(parents=True, exist_ok=True)
        bus.symlink_to(mdev)


@pytest.fixture
def sysroot(tmp_path) -> Path:
    root = tmp_path / "sys"
    gpu = add_device(root, GPU, numa_node="1")
    add_mdev_type(gpu, "nvidia-222", available=2, name="GRID T4-2B", mdevs=(MDEV1, MDEV2))
    add_mdev_type(gpu, "nvidia-223", available=0, name="GRID T4-4B")
    gpu2 = add_device(root, GPU2, numa_node="-1")
    add_mdev_type(gpu2, "nvidia-222", available=0, name="GRID T4-2B")
    add_mdev_type(gpu2, "nvidia-223", available=4, name="GRID T4-4B")
    pf = add_device(root, PF, vendor="0x8086", device="0x158b", numa_node="0")
    write(pf / "sriov_totalvfs", "64")
    write(pf / "sriov_numvfs", "8")
    (pf / "net" / "ens1f0").mkdir(parents=True)
    nic = add_device(root, "0000:00:19.0", vendor="0x8086", device="0x1502")
    write(nic / "sriov_totalvfs", "0")
    add_device(root, "0000:00:02.0", vendor="0x8086", device="0x0046")
    return root


def host_with(sysroot, tmp_path):
    gpus, pfs = read_pci(SysFS(str(sysroot)))
    return snapshot("virhostcpudata/linux-test4", tmp_path, gpus=gpus, sriov_pfs=pfs)


def tree_for(host, **overrides):
    conf = settings(**overrides)
    return build_tree(conf, host, partition_cpus(conf, host))


def test_reads_gpus_with_their_types_and_created_mdevs(sysroot):
    gpus, _pfs = read_pci(SysFS(str(sysroot)))
    assert [g.address for g in gpus] == [GPU, GPU2]
    first = gpus[0]
    assert first.numa_node == 1 and first.vendor_id == "10de" and first.product_id == "1eb8"
    by_id = {t.id: t for t in first.mdev_types}
    assert by_id["nvidia-222"].available_instances == 2
    assert by_id["nvidia-222"].name == "GRID T4-2B"
    assert by_id["nvidia-222"].device_api == "vfio-pci"
    assert set(by_id["nvidia-222"].mdevs) == {MDEV1, MDEV2}
    assert by_id["nvidia-223"].mdevs == ()
    assert gpus[1].numa_node is None  # -1: no affinity


def test_reads_only_pfs_with_vfs(sysroot):
    _gpus, pfs = read_pci(SysFS(str(sysroot)))
    assert len(pfs) == 1
    pf = pfs[0]
    assert (pf.address, pf.total_vfs, pf.num_vfs, pf.numa_node, pf.netdevs) == (
        PF,
        64,
        8,
        0,
        ("ens1f0",),
    )


def test_devices_that_are_neither_gpu_nor_pf_are_not_read(sysroot):
    # A VF (or any plain device) is skipped before its files are read, so a
    # damaged file there cannot fail discovery; it is not reported anyway.
    write(sysroot / "bus/pci/devices/0000:00:02.0/numa_node", "garbage")
    gpus, pfs = read_pci(SysFS(str(sysroot)))
    assert [g.address for g in gpus] == [GPU, GPU2] and [p.address for p in pfs] == [PF]


def test_damaged_file_on_a_gpu_is_still_a_read_error(sysroot):
    write(sysroot / "bus/pci/devices" / GPU / "numa_node", "garbage")
    with pytest.raises(DiscoveryError, match="numa_node"):
        read_pci(SysFS(str(sysroot)))


def test_host_without_pci_bus_has_no_devices(tmp_path):
    assert read_pci(SysFS(str(tmp_path))) == ((), ())


def test_mdev_type_without_available_instances_is_a_read_error(sysroot):
    (
        sysroot
        / "bus/pci/devices"
        / GPU
        / "mdev_supported_types/nvidia-223"
        / "available_instances"
    ).unlink()
    with pytest.raises(DiscoveryError, match="nvidia-223 has no available_instances"):
        read_pci(SysFS(str(sysroot)))


def test_malformed_numvfs_is_a_read_error(sysroot):
    write(sysroot / "bus/pci/devices" / PF / "sriov_numvfs", "lots")
    with pytest.raises(DiscoveryError, match="sriov_numvfs: 'lots' is not a number"):
        read_pci(SysFS(str(sysroot)))


def test_vgpu_total_counts_created_mdevs_and_what_is_left(sysroot, tmp_path):
    tree = tree_for(host_with(sysroot, tmp_path), enabled_mdev_types=("nvidia-222",))
    name = gpu_provider_name("fixture", GPU)
    assert name == "fixture_pci_0000_81_00_0"
    child = tree.by_name(name)
    assert child.parent == "fixture"
    assert child.inventories[orc.VGPU].total == 4  # 2 available + 2 created
    # The second GPU offers nvidia-222 with nothing left and none created:
    # total 0, no child (nova removes it).
    assert gpu_provider_name("fixture", GPU2) not in tree.names()


def test_gpus_serve_the_first_type_without_device_addresses(sysroot, tmp_path):
    # nova's default type: the first enabled type without device_addresses;
    # the second is not used, even on a GPU that has mdevs of it.
    host = host_with(sysroot, tmp_path)
    types = (MdevTypeSettings("nvidia-223"), MdevTypeSettings("nvidia-222"))
    assert chosen_mdev_type(host.gpus[0], types).id == "nvidia-223"
    tree = tree_for(host, enabled_mdev_types=("nvidia-223", "nvidia-222"))
    assert tree.names() == ["fixture", "fixture_pci_0000_82_00_0"]
    assert tree.by_name("fixture_pci_0000_82_00_0").inventories[orc.VGPU].total == 4


def test_device_addresses_give_a_gpu_its_type_and_class(sysroot, tmp_path):
    host = host_with(sysroot, tmp_path)
    types = (
        MdevTypeSettings("nvidia-222", device_addresses=(GPU,)),
        MdevTypeSettings("nvidia-223", device_addresses=(GPU2,), mdev_class="CUSTOM_T4_4B"),
    )
    tree = tree_for(host, enabled_mdev_types=("nvidia-222", "nvidia-223"), mdev_types=types)
    assert tree.by_name("fixture_pci_0000_81_00_0").inventories[orc.VGPU].total == 4
    assert tree.by_name("fixture_pci_0000_82_00_0").inventories["CUSTOM_T4_4B"].total == 4


def test_max_instances_drops_the_gpu_that_would_pass_it(sysroot, tmp_path):
    host = host_with(sysroot, tmp_path)
    types = (MdevTypeSettings("nvidia-223", max_instances=3),)
    tree = tree_for(host, enabled_mdev_types=("nvidia-223",), mdev_types=types)
    assert tree.names() == ["fixture"]  # GPU2's 4 left would pass 3


def test_a_gpu_given_a_type_it_does_not_offer_has_no_child(sysroot, tmp_path):
    host = host_with(sysroot, tmp_path)
    types = (MdevTypeSettings("nvidia-999", device_addresses=(GPU,)),)
    tree = tree_for(host, enabled_mdev_types=("nvidia-999",), mdev_types=types)
    assert tree.names() == ["fixture"]


def test_no_enabled_types_means_no_gpu_children(sysroot, tmp_path):
    tree = tree_for(host_with(sysroot, tmp_path))
    assert tree.names() == ["fixture"]


def test_guest_mdevs_learn_their_parent_gpu(sysroot):
    gpus, _ = read_pci(SysFS(str(sysroot)))
    guest = Guest(
        uuid="g",
        name="g",
        vcpus=1,
        running=True,
        memory_kb=1024,
        mdevs=(GuestMdev(MDEV2), GuestMdev("unknown")),
    )
    (updated,) = with_mdev_parents((guest,), gpus)
    assert updated.mdevs == (GuestMdev(MDEV2, GPU), GuestMdev("unknown", None))


def test_pf_in_device_spec_becomes_a_child_with_physnet_trait(sysroot, tmp_path):
    spec = parse_spec('{"address": "0000:3b:00.0", "physical_network": "phys-net.1"}')
    tree = tree_for(host_with(sysroot, tmp_path), pci_device_specs=(spec,))
    child = tree.by_name("fixture_0000:3b:00.0")
    assert child.parent == "fixture"
    assert child.inventories[orc.SRIOV_NET_VF].total == 8  # enabled VFs, by default
    assert child.traits == {"CUSTOM_PHYSNET_PHYS_NET_1": True}


def test_report_sriov_numvfs_uses_enabled_vfs(sysroot, tmp_path):
    spec = parse_spec('{"devname": "ens1f0", "physical_network": "physnet1"}')
    tree = tree_for(
        host_with(sysroot, tmp_path), pci_device_specs=(spec,), report_sriov_numvfs=True
    )
    assert tree.by_name("fixture_0000:3b:00.0").inventories[orc.SRIOV_NET_VF].total == 8


@pytest.mark.parametrize(
    "spec",
    [
        '{"address": "0000:3b:00.1", "physical_network": "physnet1"}',
        '{"devname": "ens9", "physical_network": "physnet1"}',
        '{"address": "0000:3b:00.0"}',
        '{"address": "*:3b:00.*", "vendor_id": "15b3", "physical_network": "physnet1"}',
    ],
)
def test_pf_not_matched_by_a_physnet_spec_is_not_reported(spec, sysroot, tmp_path):
    tree = tree_for(host_with(sysroot, tmp_path), pci_device_specs=(parse_spec(spec),))
    assert tree.names() == ["fixture"]


def test_wildcard_address_with_vendor_matches(sysroot, tmp_path):
    spec = parse_spec(
        '{"address": "*:3b:00.*", "vendor_id": "8086", "physical_network": "physnet1"}'
    )
    tree = tree_for(host_with(sysroot, tmp_path), pci_device_specs=(spec,))
    assert tree.names() == ["fixture", "fixture_0000:3b:00.0"]


def test_devices_and_numa_children_together(sysroot, tmp_path):
    spec = parse_spec('{"address": "0000:3b:00.0", "physical_network": "physnet1"}')
    host = dataclasses.replace(host_with(sysroot, tmp_path))
    tree = tree_for(
        host, pci_device_specs=(spec,), enabled_mdev_types=("nvidia-222",), numa_in_placement=True
    )
    assert tree.names() == [
        "fixture",
        "fixture_NUMA_0",
        "fixture_NUMA_1",
        "fixture_pci_0000_81_00_0",
        "fixture_0000:3b:00.0",
    ]


def test_with_numa_children_each_device_sits_under_its_nodes_child(sysroot, tmp_path):
    # sysfs numa_node: the GPU at 81:00.0 is on node 1, the PF on node 0,
    # the GPU at 82:00.0 reports no affinity (-1).
    spec = parse_spec('{"address": "0000:3b:00.0", "physical_network": "physnet1"}')
    host = host_with(sysroot, tmp_path)
    both = ("nvidia-222", "nvidia-223")
    types = dict(enabled_mdev_types=both, mdev_types=(MdevTypeSettings("nvidia-223", (GPU2,)),))
    tree = tree_for(host, pci_device_specs=(spec,), numa_in_placement=True, **types)
    assert tree.by_name("fixture_pci_0000_81_00_0").parent == "fixture_NUMA_1"
    assert tree.by_name("fixture_0000:3b:00.0").parent == "fixture_NUMA_0"
    assert tree.by_name("fixture_pci_0000_82_00_0").parent == "fixture"
    flat = tree_for(host, pci_device_specs=(spec,), **types)
    assert {p.parent for p in flat.providers[1:]} == {"fixture"}


def test_discovery_reads_devices_only_when_options_ask(sysroot, tmp_path):
    from node_agent.host.discover import discover
    from tests.hostdata import HOSTDATA

    system = HOSTDATA / "virhostcpudata" / "linux-test4"
    (sysroot / "devices" / "system").mkdir(parents=True)
    for entry in system.iterdir():
        (sysroot / "devices" / "system" / entry.name).symlink_to(entry)
    base = dict(sysfs_root=str(sysroot), instances_path=str(tmp_path))
    assert discover(settings(**base)).gpus == ()
    host = discover(settings(enabled_mdev_types=("nvidia-222",), **base))
    assert [g.address for g in host.gpus] == [GPU, GPU2]
    assert [p.address for p in host.sriov_pfs] == [PF]
