"""parse_node_device over libvirt's node-device schema samples."""

import re

import pytest

from node_agent.errors import ParseError
from node_agent.host.nodedev import MdevType, parse_node_device
from tests.hostdata import HOSTDATA

NODEDEV = HOSTDATA / "nodedevschemadata"
MDEVCTL_OUT = HOSTDATA / "nodedevmdevctldata" / "mdevctl-list-multiple.out.xml"


def device(name):
    return parse_node_device((NODEDEV / name).read_text())


def test_pci_device_with_mdev_types_lists_them_with_available_instances():
    dev = device("pci_0000_02_10_7_mdev_types.xml")
    assert dev.pci_address == "0000:02:10.7"
    assert dev.capabilities == ("pci", "mdev_types")
    assert dev.mdev_types == (
        MdevType(id="foo1", name="bar1", device_api="vfio-pci", available_instances=1),
        MdevType(id="foo2", name="bar2", device_api="vfio-pci", available_instances=2),
    )
    assert dev.numa_node == 0


def test_vf_names_its_physical_function():
    dev = device("pci_0000_02_10_7_sriov.xml")
    assert dev.phys_function == "0000:02:00.1"
    assert dev.vf_max_count is None
    assert dev.virt_functions == ()


def test_pf_reports_max_count_and_enabled_vfs():
    dev = device("pci_0000_02_10_7_sriov_pf_vfs_all.xml")
    assert dev.vf_max_count == 7
    assert dev.virt_functions == ("0000:02:00.2", "0000:02:00.3", "0000:02:00.4", "0000:02:00.5")


def test_pf_with_no_vfs_enabled_still_reports_max_count():
    dev = device("pci_0000_02_10_7_sriov_zero_vfs_max_count.xml")
    assert dev.vf_max_count == 3
    assert dev.virt_functions == ()


def test_vf_list_without_max_count_leaves_it_unknown():
    dev = device("pci_0000_02_10_7_sriov_vfs.xml")
    assert dev.vf_max_count is None
    assert len(dev.virt_functions) == 4


def test_bluefield_pf_has_sixteen_vfs_and_vendor_ids():
    dev = device("pci_0000_42_00_0_vpd.xml")
    assert dev.pci_address == "0000:42:00.0"
    assert dev.vf_max_count == 16
    assert (dev.vendor_id, dev.product_id) == ("0x15b3", "0xa2d6")
    assert dev.parent is None


def test_pci_device_numa_node_is_read():
    dev = device("pci_1002_71c4.xml")
    assert dev.numa_node == 1
    assert dev.pci_address == "0000:01:00.0"


def test_pci_device_without_numa_element_has_no_node():
    assert device("pci_8086_4238_pcie_wireless.xml").numa_node is None


def test_mdev_child_gives_type_parent_and_uuid():
    dev = device("mdev_d069d019_36ea_4111_8f0a_8c9a70e21366.xml")
    assert dev.capabilities == ("mdev",)
    assert dev.parent == "pci_0000_00_02_0"
    assert dev.mdev_type == "i915-GVTg_V5_8"
    assert dev.mdev_uuid == "d069d019-36ea-4111-8f0a-8c9a70e21366"


@pytest.mark.parametrize(
    "name, uuid",
    [
        ("mdev_3627463d_b7f0_4fea_b468_f1da537d301b.xml", "3627463d-b7f0-4fea-b468-f1da537d301b"),
        ("mdev_ee0b88c4_f554_4dc1_809d_b2a01e8e48ad.xml", "ee0b88c4-f554-4dc1-809d-b2a01e8e48ad"),
    ],
)
def test_mdev_without_uuid_element_takes_uuid_from_name(name, uuid):
    assert device(name).mdev_uuid == uuid


def test_s390_parents_have_mdev_types_outside_pci():
    (ap_type,) = device("ap_matrix_mdev_types.xml").mdev_types
    assert (ap_type.id, ap_type.available_instances) == ("vfio_ap-passthrough", 65536)
    (ccw_type,) = device("css_0_0_fffe_mdev_types.xml").mdev_types
    assert (ccw_type.device_api, ccw_type.available_instances) == ("vfio-ccw", 1)


def test_non_pci_device_has_no_pci_fields():
    dev = device("computer.xml")
    assert dev.capabilities == ("system",)
    assert dev.pci_address is None and dev.parent is None


def test_mdevctl_built_devices_all_parse():
    # The .out.xml holds several <device> documents back to back.
    chunks = [c + "</device>" for c in MDEVCTL_OUT.read_text().split("</device>") if c.strip()]
    devices = [parse_node_device(chunk) for chunk in chunks]
    assert [d.mdev_type for d in devices] == [
        "i915-GVTg_V5_4",
        "i915-GVTg_V5_4",
        "i915-GVTg_V5_8",
        "vfio_ap-passthrough",
        "vfio_ccw-io",
    ]
    assert devices[2].mdev_uuid == "435722ea-5f43-468a-874f-da34f1217f13"
    assert {d.parent for d in devices[:3]} == {"pci_0000_00_02_0"}


@pytest.mark.parametrize("path", sorted(NODEDEV.glob("*.xml")), ids=lambda p: p.name)
def test_every_schema_sample_parses_or_is_refused_with_a_parse_error(path):
    # One sample has bus 4294967295, which no PCI address can hold.
    try:
        dev = parse_node_device(path.read_text())
    except ParseError as exc:
        assert path.name == "pci_0000_00_02_0_header_type.xml", exc
        return
    assert dev.name
    if dev.pci_address is not None:
        assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", dev.pci_address)


def test_out_of_range_pci_bus_is_refused_naming_device_and_value():
    with pytest.raises(ParseError, match="'pci_0000_00_02_0': PCI bus 4294967295 is outside"):
        device("pci_0000_00_02_0_header_type.xml")


@pytest.mark.parametrize(
    "xml, message",
    [
        ("<device><name>x</name>", "malformed XML"),
        ("<domain/>", "root element is <domain>"),
        ("<device><parent>computer</parent></device>", "no <name>"),
        (
            "<device><name>pci_x</name><capability type='pci'><domain>0</domain><bus>zz</bus>"
            "<slot>0</slot><function>0</function></capability></device>",
            "'pci_x' PCI bus: 'zz' is not a number",
        ),
        (
            "<device><name>pci_x</name><capability type='pci'><domain>0</domain><bus>0</bus>"
            "<slot>0</slot><function>0</function><capability type='virt_functions' maxCount='many'/>"
            "</capability></device>",
            "maxCount",
        ),
        (
            "<device><name>gpu</name><capability type='pci'><domain>0</domain><bus>0</bus>"
            "<slot>0</slot><function>0</function><capability type='mdev_types'><type id='t'>"
            "<availableInstances>-x</availableInstances></type></capability></capability></device>",
            "mdev type t availableInstances",
        ),
    ],
)
def test_bad_node_device_xml_raises_parse_error(xml, message):
    with pytest.raises(ParseError, match=message):
        parse_node_device(xml)
