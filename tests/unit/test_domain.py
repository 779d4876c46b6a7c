"""parse_domain: libvirt domain XML to Guest, including nova metadata."""

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from node_agent.errors import ParseError
from node_agent.host.domain import NODE_AGENT_NS, parse_domain
from node_agent.model.cpuset import CpuSet
from node_agent.model.snapshot import GuestMdev
from node_agent.policy.guest_cpu import BY_AGENT_METADATA, BY_NO_PINS, BY_PINNING, classify
from tests.hostdata import HOSTDATA

HOST_XML = Path(__file__).resolve().parents[1] / "data" / "libvirt" / "host.xml"
NOVA_HOSTDEVS = Path(__file__).resolve().parents[1] / "data" / "nova_hostdevs"


def domain(body: str, name="vm1", uuid="5f1e2d3c-4b5a-4968-8776-a5b4c3d2e133") -> str:
    return f"<domain type='kvm'><name>{name}</name><uuid>{uuid}</uuid>{body}</domain>"


MINIMAL = "<memory unit='KiB'>1024</memory><vcpu>2</vcpu>"


def inline_domains(path: Path) -> dict[str, str]:
    """The <domain> elements of a test-driver host file, as text, by name."""
    root = ET.parse(path).getroot()
    return {d.findtext("name"): ET.tostring(d, encoding="unicode") for d in root.findall("domain")}


def test_pinned_guest_from_hostdata_example_has_every_vcpu_pinned():
    xml = inline_domains(HOSTDATA / "testdriver-example.xml")["instance-00000001"]
    guest = parse_domain(xml, running=True)
    assert guest.uuid == "8b4a4c0e-1c3d-4c1e-9a52-3c0f8d2b7a11"
    assert guest.vcpus == 4
    assert guest.memory_kb == 4194304
    assert guest.vcpupin == (
        (0, CpuSet({2})),
        (1, CpuSet({10})),
        (2, CpuSet({3})),
        (3, CpuSet({11})),
    )
    cpu = classify(guest)
    assert (cpu.policy, cpu.rule, cpu.pcpu, cpu.vcpu) == ("dedicated", BY_PINNING, 4, 0)
    assert guest.pinned_cpus == CpuSet({2, 3, 10, 11})
    assert guest.hugepages
    assert guest.numa_nodes == frozenset({0})


def test_nova_metadata_gives_instance_and_flavor_keys():
    xml = inline_domains(HOSTDATA / "testdriver-example.xml")["instance-00000001"]
    meta = dict(parse_domain(xml, running=True).metadata)
    assert meta["nova:name"] == "pinned-vm-1"
    assert meta["flavor:name"] == "m1.pinned"
    assert meta["flavor:vcpus"] == "4"
    assert meta["flavor:memory"] == "4096"
    assert "hw:cpu_policy" not in meta


def test_guest_with_only_a_vcpu_cpuset_is_not_pinned():
    xml = inline_domains(HOSTDATA / "testdriver-example.xml")["instance-00000003"]
    guest = parse_domain(xml, running=False)
    assert guest.vcpupin == ()
    assert (classify(guest).policy, classify(guest).rule) == ("shared", BY_NO_PINS)
    assert not guest.running
    assert guest.metadata == ()


def test_node_agent_cpu_policy_marks_guest_dedicated():
    xml = inline_domains(HOST_XML)["instance-00000001"]
    guest = parse_domain(xml, running=True)
    assert ("hw:cpu_policy", "dedicated") in guest.metadata


def test_cpu_policy_alone_makes_an_unpinned_guest_dedicated():
    xml = domain(
        MINIMAL + f"<metadata><na:cpu_policy xmlns:na='{NODE_AGENT_NS}'>"
        "dedicated</na:cpu_policy></metadata>"
    )
    guest = parse_domain(xml, running=True)
    assert guest.vcpupin == ()
    assert (classify(guest).policy, classify(guest).rule) == ("dedicated", BY_AGENT_METADATA)


def test_vcpupin_cpuset_accepts_exclusions():
    xml = domain(
        MINIMAL + "<cputune><vcpupin vcpu='1' cpuset='4-7,^5'/>"
        "<vcpupin vcpu='0' cpuset='0'/></cputune>"
    )
    assert parse_domain(xml, True).vcpupin == ((0, CpuSet({0})), (1, CpuSet({4, 6, 7})))


def test_guest_with_some_vcpus_unpinned_is_not_dedicated():
    xml = domain(MINIMAL + "<cputune><vcpupin vcpu='0' cpuset='3'/></cputune>")
    cpu = classify(parse_domain(xml, True))
    assert (cpu.policy, cpu.dedicated, cpu.pcpu, cpu.vcpu) == ("mixed", False, 1, 1)


def test_current_vcpus_attribute_wins_over_maximum():
    xml = domain("<memory>1024</memory><vcpu placement='static' current='2'>8</vcpu>")
    assert parse_domain(xml, True).vcpus == 2


@pytest.mark.parametrize(
    "amount, unit, kib",
    [
        ("1073741824", "b", 1048576),
        ("1073741824", "bytes", 1048576),
        ("1000", "KB", 977),  # 1,000,000 bytes rounds up to whole KiB
        ("2048", "k", 2048),
        ("2048", "KiB", 2048),
        ("512", "M", 524288),
        ("512", "MiB", 524288),
        ("2", "G", 2097152),
        ("2", "GiB", 2097152),
        ("1", "TiB", 1073741824),
        ("1", "T", 1073741824),
        ("1", "GB", 976563),
        ("4096", None, 4096),  # libvirt's default unit is KiB
    ],
)
def test_memory_units_are_converted_to_kib(amount, unit, kib):
    unit_attr = f" unit='{unit}'" if unit else ""
    xml = domain(f"<memory{unit_attr}>{amount}</memory><vcpu>1</vcpu>")
    assert parse_domain(xml, True).memory_kb == kib


def test_numatune_memory_and_memnode_nodesets_are_combined():
    xml = domain(
        MINIMAL + "<numatune><memory mode='strict' nodeset='0-2,^1'/>"
        "<memnode cellid='0' mode='strict' nodeset='3'/></numatune>"
    )
    assert parse_domain(xml, True).numa_nodes == frozenset({0, 2, 3})


def test_auto_numa_placement_names_no_nodes():
    xml = domain(MINIMAL + "<numatune><memory mode='strict' placement='auto'/></numatune>")
    assert parse_domain(xml, True).numa_nodes == frozenset()


def test_mdev_hostdevs_give_uuids_without_parent():
    xml = domain(
        MINIMAL + "<devices>"
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>"
        "<address uuid='c2177883-f1bb-47f0-914d-32a22e3a8804'/></source></hostdev>"
        "<hostdev mode='subsystem' type='pci'><source>"
        "<address domain='0' bus='2' slot='16' function='0'/></source></hostdev>"
        "</devices>"
    )
    assert parse_domain(xml, True).mdevs == (
        GuestMdev(uuid="c2177883-f1bb-47f0-914d-32a22e3a8804", parent=None),
    )


def test_pci_hostdevs_nova_writes_give_the_host_addresses_sorted():
    # nova 34's LibvirtDriver._get_guest_pci_device (tests/data/nova_hostdevs).
    guest = parse_domain((NOVA_HOSTDEVS / "pci-passthrough.xml").read_text(), True)
    assert guest.pci_devices == ("0000:3b:02.1", "0000:81:00.0", "0001:0a:1f.7")
    assert guest.mdevs == ()


def pci_hostdev(domain_="0x0000", bus="0x81", slot="0x00", function="0x1", extra="") -> str:
    fields = {"domain": domain_, "bus": bus, "slot": slot, "function": function}
    attributes = " ".join(f"{k}='{v}'" for k, v in fields.items() if v is not None)
    return (
        f"<hostdev mode='subsystem' type='pci' managed='yes'><source><address {attributes}/>"
        f"</source>{extra}</hostdev>"
    )


def test_pci_hostdev_numbers_are_read_as_libvirt_reads_them():
    # libvirt reads them with strtoul base 0: decimal, 0x hex, leading-0 octal.
    xml = domain(
        MINIMAL
        + "<devices>"
        + pci_hostdev("0", "129", "0x1f", "07")
        + pci_hostdev("0x0000", "0201", "037", "0x7")
        + pci_hostdev("0", "2", "16", "0")
        + "</devices>"
    )
    assert parse_domain(xml, True).pci_devices == ("0000:02:10.0", "0000:81:1f.7")


def test_guest_side_address_and_other_hostdevs_are_not_host_devices():
    # libvirt adds the guest's own PCI address beside <source> when it runs.
    guest_side = "<address type='pci' domain='0x0000' bus='0x05' slot='0x00' function='0x0'/>"
    xml = domain(
        MINIMAL
        + "<devices>"
        + pci_hostdev(extra=guest_side)
        + "<hostdev mode='subsystem' type='usb'><source><vendor id='0x1234'/></source></hostdev>"
        + "<hostdev mode='capabilities' type='net'><source><interface>eth0</interface></source>"
        "</hostdev></devices>"
    )
    assert parse_domain(xml, True).pci_devices == ("0000:81:00.1",)


def test_guest_without_hostdevs_holds_no_pci_device():
    assert parse_domain(domain(MINIMAL), True).pci_devices == ()


@pytest.mark.parametrize(
    "hostdev, message",
    [
        (pci_hostdev(bus="0x1g1"), "<address bus>: '0x1g1' is not a number"),
        (pci_hostdev(bus="0x100"), "<address bus>: '0x100' is out of range"),
        (pci_hostdev(slot="0x20"), "<address slot>: '0x20' is out of range"),
        (pci_hostdev(function="8"), "<address function>: '8' is out of range"),
        (pci_hostdev(domain_="-1"), "<address domain>: '-1' is out of range"),
        (pci_hostdev(domain_="08"), "<address domain>: '08' is not a number"),
        (pci_hostdev(function=None), "<address function>: missing"),
        (
            "<hostdev mode='subsystem' type='pci'><source/></hostdev>",
            "PCI <hostdev> without <source><address>",
        ),
    ],
)
def test_malformed_pci_hostdev_address_is_a_parse_error_naming_the_domain(hostdev, message):
    xml = domain(MINIMAL + "<devices>" + hostdev + "</devices>")
    with pytest.raises(ParseError, match=re.escape(message)) as raised:
        parse_domain(xml, True)
    assert str(raised.value).startswith("domain 'vm1'")


def test_older_nova_namespace_is_read_too():
    xml = domain(
        MINIMAL + "<metadata><nova:instance "
        "xmlns:nova='http://openstack.org/xmlns/libvirt/nova/1.0'>"
        "<nova:name>old</nova:name><nova:flavor name='m1.tiny'/>"
        "</nova:instance></metadata>"
    )
    assert dict(parse_domain(xml, True).metadata) == {"nova:name": "old", "flavor:name": "m1.tiny"}


def test_malformed_xml_error_names_the_domain():
    with pytest.raises(ParseError, match="domain 'instance-0000002a': malformed XML"):
        parse_domain("<domain><name>instance-0000002a</name><uuid>", True)


@pytest.mark.parametrize(
    "xml, message",
    [
        ("not xml at all", "domain XML: malformed XML"),
        ("<capabilities/>", "root element is <capabilities>"),
        ("<domain><name>x</name><memory>1</memory><vcpu>1</vcpu></domain>", "<uuid> are required"),
        (domain("<memory>1024</memory>"), "domain 'vm1': no <vcpu>"),
        (domain("<vcpu>1</vcpu>"), "domain 'vm1': no <memory>"),
        (domain("<memory>1024</memory><vcpu>two</vcpu>"), "'two' is not a number"),
        (domain("<memory unit='parsec'>1</memory><vcpu>1</vcpu>"), "unknown size unit 'parsec'"),
        (
            domain(MINIMAL + "<cputune><vcpupin vcpu='0' cpuset='3-1'/></cputune>"),
            "vcpupin vcpu='0' cpuset.*runs backwards",
        ),
        (domain(MINIMAL + "<cputune><vcpupin vcpu='0'/></cputune>"), "missing CPU or node set"),
        (domain(MINIMAL + "<numatune><memory nodeset='a'/></numatune>"), "numatune"),
        (
            domain(
                MINIMAL + "<devices><hostdev mode='subsystem' type='mdev'><source/>"
                "</hostdev></devices>"
            ),
            "without <source><address uuid>",
        ),
    ],
)
def test_bad_domain_xml_raises_parse_error(xml, message):
    with pytest.raises(ParseError, match=message):
        parse_domain(xml, True)
