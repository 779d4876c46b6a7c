"""Parse one libvirt node-device XML (``virNodeDeviceGetXMLDesc``).

Pure: text in, a frozen record out. Only what GPU (mdev) and SR-IOV
inventory needs is kept; everything else in the document is ignored.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any, Optional

from node_agent.errors import ParseError
from node_agent.host.libvirt_xml import load, optional_int, text_of, to_int


@dataclass(frozen=True)
class MdevType:
    """One mediated-device type a parent device can create."""

    id: str
    name: Optional[str] = None
    device_api: Optional[str] = None
    available_instances: Optional[int] = None


@dataclass(frozen=True)
class NodeDevice:
    name: str
    # The parent device's libvirt name (``computer``, ``pci_0000_81_00_0``...).
    parent: Optional[str] = None
    # Capability types in document order, nested ones included
    # (a GPU is ('pci', 'mdev_types'), a PF ('pci', 'virt_functions')).
    capabilities: tuple[str, ...] = ()
    # PCI devices only: ``0000:02:10.7``.
    pci_address: Optional[str] = None
    vendor_id: Optional[str] = None
    product_id: Optional[str] = None
    numa_node: Optional[int] = None
    mdev_types: tuple[MdevType, ...] = ()
    # SR-IOV PF: how many VFs the device supports (None when not stated)
    # and the PCI addresses of the VFs enabled now.
    vf_max_count: Optional[int] = None
    virt_functions: tuple[str, ...] = ()
    # SR-IOV VF: the PCI address of its PF.
    phys_function: Optional[str] = None
    # mdev devices only: the type it was created with, and its uuid.
    mdev_type: Optional[str] = None
    mdev_uuid: Optional[str] = None


# Older libvirt and mdevctl-defined devices have no <uuid>; the uuid is
# then only in the name (mdev_<uuid with _ or ->[_<parent>]).
_MDEV_NAME = re.compile(
    r"^mdev_([0-9a-f]{8})[_-]([0-9a-f]{4})[_-]([0-9a-f]{4})[_-]([0-9a-f]{4})[_-]([0-9a-f]{12})",
    re.IGNORECASE,
)


def parse_node_device(xml: str) -> NodeDevice:
    """Parse node-device XML; raises ParseError."""
    root = load(xml, "device", "node-device XML")
    name = text_of(root, "name")
    if name is None:
        raise ParseError("node-device XML: no <name>")
    what = f"node device '{name}'"
    caps = root.findall("capability")
    fields: dict = {}
    for cap in caps:
        if cap.get("type") == "pci":
            fields.update(_pci(cap, what))
        elif cap.get("type") == "mdev":
            fields.update(_mdev(cap, name))
    return NodeDevice(
        name=name,
        parent=text_of(root, "parent"),
        capabilities=_capability_types(caps),
        # mdev_types nests in pci and also in s390 ap_matrix and css devices.
        mdev_types=tuple(t for cap in caps for t in _mdev_types(cap, what)),
        **fields,
    )


def _capability_types(caps: list[ET.Element]) -> tuple[str, ...]:
    types = []
    for cap in caps:
        types.append(cap.get("type"))
        types.extend(nested.get("type") for nested in cap.findall("capability"))
    return tuple(t for t in types if t)


def _pci(cap: ET.Element, what: str) -> dict:
    fields: dict[str, Any] = {
        "pci_address": _format_address(
            text_of(cap, "domain"),
            text_of(cap, "bus"),
            text_of(cap, "slot"),
            text_of(cap, "function"),
            what,
        ),
        "vendor_id": _attr(cap.find("vendor"), "id"),
        "product_id": _attr(cap.find("product"), "id"),
        "numa_node": _numa_node(cap, what),
    }
    for nested in cap.findall("capability"):
        kind = nested.get("type")
        if kind == "virt_functions":
            fields["vf_max_count"] = optional_int(
                nested.get("maxCount"), f"{what} virt_functions maxCount"
            )
            fields["virt_functions"] = tuple(
                _address_element(a, what) for a in nested.findall("address")
            )
        elif kind == "phys_function":
            address = nested.find("address")
            if address is not None:
                fields["phys_function"] = _address_element(address, what)
    return fields


def _numa_node(cap: ET.Element, what: str) -> Optional[int]:
    numa = cap.find("numa")
    node = optional_int(_attr(numa, "node"), f"{what} <numa node>")
    # The kernel says -1 for "no affinity"; libvirt usually omits it then.
    return node if node is not None and node >= 0 else None


def _mdev_types(cap: ET.Element, what: str) -> tuple[MdevType, ...]:
    types = []
    for holder in cap.findall("capability"):
        if holder.get("type") != "mdev_types":
            continue
        for element in holder.findall("type"):
            type_id = element.get("id")
            if not type_id:
                raise ParseError(f"{what}: mdev <type> without an id")
            types.append(
                MdevType(
                    id=type_id,
                    name=text_of(element, "name"),
                    device_api=text_of(element, "deviceAPI"),
                    available_instances=optional_int(
                        text_of(element, "availableInstances"),
                        f"{what} mdev type {type_id} availableInstances",
                    ),
                )
            )
    return tuple(types)


def _mdev(cap: ET.Element, name: str) -> dict:
    uuid = text_of(cap, "uuid")
    if uuid is None:
        match = _MDEV_NAME.match(name)
        uuid = "-".join(match.groups()).lower() if match else None
    return {"mdev_type": _attr(cap.find("type"), "id"), "mdev_uuid": uuid}


def _address_element(address: ET.Element, what: str) -> str:
    return _format_address(
        address.get("domain"),
        address.get("bus"),
        address.get("slot"),
        address.get("function"),
        what,
    )


# Field widths of a PCI address (domain:bus:slot.function).
_PCI_LIMITS = (("domain", 0xFFFF), ("bus", 0xFF), ("slot", 0x1F), ("function", 0x7))


def _format_address(domain, bus, slot, function, what: str) -> str:
    parts = []
    for value, (label, limit) in zip((domain, bus, slot, function), _PCI_LIMITS):
        number = to_int(value, f"{what} PCI {label}")
        if not 0 <= number <= limit:
            raise ParseError(f"{what}: PCI {label} {value} is outside 0-{limit:#x}")
        parts.append(number)
    return "{:04x}:{:02x}:{:02x}.{:x}".format(*parts)


def _attr(element: Optional[ET.Element], name: str) -> Optional[str]:
    return element.get(name) if element is not None else None
