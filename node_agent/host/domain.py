"""Parse one libvirt domain XML (``virDomainGetXMLDesc``) into a ``Guest``.

Pure: text in, a frozen record out. Pinning is read here, from the XML,
because libvirt's ``vcpuPinInfo`` cpumaps are sized by the host CPU map and
can silently drop CPUs (the test driver's covers only CPUs 0-7).

Metadata keys emitted in ``Guest.metadata`` (sorted by key):

* ``nova:name``       nova's display name of the instance
* ``flavor:name``     the flavor name attribute
* ``flavor:<child>``  each child of ``<nova:flavor>`` by local name, as nova
                      writes them: ``flavor:memory`` (MiB), ``flavor:vcpus``,
                      ``flavor:disk``, ``flavor:swap``, ``flavor:ephemeral``
* ``extra_spec:<name>`` each ``<nova:extraSpec name>`` of the flavor, and
                      ``nova:extra_specs`` (empty) when nova wrote the
                      ``<nova:extraSpecs>`` element at all (nova 34 does,
                      even for a flavor without extra specs)
* ``image:<name>``    each ``<nova:image><nova:properties><nova:property>``
* ``owner:user``, ``owner:project``  the uuids of ``<nova:owner>``
* ``libvirt:emulatorpin``  ``<cputune><emulatorpin cpuset>``
* ``hw:cpu_policy``   from ``<na:cpu_policy>`` in the node-agent namespace
                      (``NODE_AGENT_NS``) inside ``<metadata>``, for guests
                      written by something other than nova

PCI functions the guest passes through (``<hostdev mode='subsystem'
type='pci'>``, as nova's ``LibvirtConfigGuestHostdevPCI`` writes them) are
``Guest.pci_devices``, normalised to ``0000:81:00.1``.

Nova's namespaces 1.0, 1.1 and 1.2 are all read. How these keys decide a
guest's CPU policy is :mod:`node_agent.policy.guest_cpu`'s business.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Optional

from node_agent.errors import ParseError
from node_agent.host.libvirt_xml import cpu_spec, load, text_of, to_int, to_kib
from node_agent.model.cpuset import CpuSet
from node_agent.model.snapshot import Guest, GuestMdev

NOVA_NAMESPACES = tuple(
    f"http://openstack.org/xmlns/libvirt/nova/{version}" for version in ("1.0", "1.1", "1.2")
)
NODE_AGENT_NS = "https://node-agent.example/xmlns/1.0"

# Used only to name the domain in the error when the XML does not parse.
_NAME_IN_TEXT = re.compile(r"<name>\s*([^<]+?)\s*</name>")


def parse_domain(xml: str, running: bool) -> Guest:
    """Parse domain XML; ``running`` comes from libvirt, not from the XML.

    Raises ParseError naming the domain (when its name can be found).
    """
    root = load(xml, "domain", _describe_unparsed(xml))
    name = text_of(root, "name")
    what = f"domain '{name}'" if name else "domain XML"
    uuid = text_of(root, "uuid")
    if name is None or uuid is None:
        raise ParseError(f"{what}: <name> and <uuid> are required")
    return Guest(
        uuid=uuid,
        name=name,
        vcpus=_vcpus(root, what),
        running=bool(running),
        memory_kb=_memory_kb(root, what),
        vcpupin=_vcpupin(root, what),
        numa_nodes=_numa_nodes(root, what),
        hugepages=root.find("memoryBacking/hugepages") is not None,
        mdevs=_mdevs(root, what),
        pci_devices=_pci_devices(root, what),
        metadata=_metadata(root),
    )


def _describe_unparsed(xml) -> str:
    match = _NAME_IN_TEXT.search(xml) if isinstance(xml, str) else None
    return f"domain '{match.group(1)}'" if match else "domain XML"


def _vcpus(root: ET.Element, what: str) -> int:
    vcpu = root.find("vcpu")
    if vcpu is None:
        raise ParseError(f"{what}: no <vcpu> element")
    # 'current' is how many vCPUs are online now; the text is the maximum.
    current = vcpu.get("current")
    if current is not None:
        return to_int(current, f"{what} <vcpu current>")
    return to_int(vcpu.text, f"{what} <vcpu>")


def _memory_kb(root: ET.Element, what: str) -> int:
    memory = root.find("memory")
    if memory is None:
        raise ParseError(f"{what}: no <memory> element")
    return to_kib(memory.text, memory.get("unit"), f"{what} <memory>")


def _vcpupin(root: ET.Element, what: str) -> tuple[tuple[int, CpuSet], ...]:
    pins = {}
    for pin in root.findall("cputune/vcpupin"):
        vcpu = to_int(pin.get("vcpu"), f"{what} <vcpupin vcpu>")
        pins[vcpu] = cpu_spec(pin.get("cpuset"), f"{what} <vcpupin vcpu='{vcpu}' cpuset>")
    return tuple(sorted(pins.items()))


def _numa_nodes(root: ET.Element, what: str) -> frozenset[int]:
    nodes: set[int] = set()
    numatune = root.find("numatune")
    if numatune is None:
        return frozenset()
    # placement='auto' leaves nodeset out; numad picks nodes at start time.
    for element in [numatune.find("memory"), *numatune.findall("memnode")]:
        if element is not None and element.get("nodeset") is not None:
            nodes.update(cpu_spec(element.get("nodeset"), f"{what} <numatune> nodeset"))
    return frozenset(nodes)


def _mdevs(root: ET.Element, what: str) -> tuple[GuestMdev, ...]:
    mdevs = []
    for hostdev in root.findall("devices/hostdev"):
        if hostdev.get("mode") != "subsystem" or hostdev.get("type") != "mdev":
            continue
        address = hostdev.find("source/address")
        uuid = address.get("uuid") if address is not None else None
        if not uuid:
            raise ParseError(f"{what}: mdev <hostdev> without <source><address uuid>")
        mdevs.append(GuestMdev(uuid=uuid))
    return tuple(mdevs)


# <source><address>'s fields of a PCI hostdev, with the bits each may use
# (libvirt's virPCIDeviceAddress: domain 16, bus 8, slot 5, function 3).
_PCI_FIELDS = (
    ("domain", 0xFFFF, "{:04x}"),
    ("bus", 0xFF, "{:02x}"),
    ("slot", 0x1F, "{:02x}"),
    ("function", 0x7, "{:x}"),
)


def _pci_devices(root: ET.Element, what: str) -> tuple[str, ...]:
    """The host PCI functions passed through, as ``dddd:bb:ss.f``. libvirt
    writes ``0x``-prefixed hex (nova does too); it reads numbers as C's
    strtoul with base 0, so ``0x81``, ``129`` and ``0201`` are one bus."""
    found = set()
    for hostdev in root.findall("devices/hostdev"):
        if hostdev.get("mode") != "subsystem" or hostdev.get("type") != "pci":
            continue
        address = hostdev.find("source/address")
        if address is None:
            raise ParseError(f"{what}: PCI <hostdev> without <source><address>")
        parts = [
            form.format(_pci_field(address.get(name), top, name, what))
            for name, top, form in _PCI_FIELDS
        ]
        found.add("{}:{}:{}.{}".format(*parts))
    return tuple(sorted(found))


def _pci_field(text: Optional[str], top: int, name: str, what: str) -> int:
    where = f"{what} PCI <hostdev> <source><address {name}>"
    if text is None:
        raise ParseError(f"{where}: missing")
    value = text.strip().lower()
    try:
        if value.startswith("0x"):
            number = int(value[2:], 16)
        elif value.startswith("0") and len(value) > 1:
            number = int(value[1:], 8)
        else:
            number = int(value, 10)
    except ValueError:
        raise ParseError(f"{where}: {text!r} is not a number") from None
    if not 0 <= number <= top:
        raise ParseError(f"{where}: {text!r} is out of range (at most {top:#x})")
    return number


def _emulatorpin(root: ET.Element) -> dict[str, str]:
    pin = root.find("cputune/emulatorpin")
    cpuset = pin.get("cpuset") if pin is not None else None
    return {"libvirt:emulatorpin": cpuset} if cpuset else {}


def _metadata(root: ET.Element) -> tuple[tuple[str, str], ...]:
    metadata = root.find("metadata")
    if metadata is None:
        return tuple(sorted(_emulatorpin(root).items()))
    found: dict[str, str] = {}
    for ns in NOVA_NAMESPACES:
        instance = metadata.find(f"{{{ns}}}instance")
        if instance is not None:
            found.update(_nova_instance(instance, ns))
    found.update(_emulatorpin(root))
    policy = text_of(metadata, f"{{{NODE_AGENT_NS}}}cpu_policy")
    if policy is not None:
        found["hw:cpu_policy"] = policy
    return tuple(sorted(found.items()))


def _nova_instance(instance: ET.Element, ns: str) -> dict[str, str]:
    found = {}
    name = text_of(instance, f"{{{ns}}}name")
    if name is not None:
        found["nova:name"] = name
    flavor = instance.find(f"{{{ns}}}flavor")
    if flavor is not None:
        flavor_name = flavor.get("name")
        if flavor_name:
            found["flavor:name"] = flavor_name
        for child in flavor:
            value = _text(child)
            if value is not None:
                found[f"flavor:{_local_name(child.tag)}"] = value
        specs = flavor.find(f"{{{ns}}}extraSpecs")
        if specs is not None:
            found["nova:extra_specs"] = ""
            found.update(_named(specs, f"{{{ns}}}extraSpec", "extra_spec:"))
    image = instance.find(f"{{{ns}}}image/{{{ns}}}properties")
    if image is not None:
        found.update(_named(image, f"{{{ns}}}property", "image:"))
    for who in ("user", "project"):
        element = instance.find(f"{{{ns}}}owner/{{{ns}}}{who}")
        if element is not None and element.get("uuid"):
            found[f"owner:{who}"] = element.get("uuid", "")
    return found


def _named(parent: ET.Element, tag: str, prefix: str) -> dict[str, str]:
    """``<tag name="k">v</tag>`` children as ``{prefix + k: v}``."""
    return {
        prefix + child.get("name", ""): (child.text or "").strip()
        for child in parent.findall(tag)
        if child.get("name")
    }


def _text(element: ET.Element) -> Optional[str]:
    return (element.text.strip() or None) if element.text else None


def _local_name(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]
