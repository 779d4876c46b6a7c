"""``[pci] device_spec``: which PCI devices are SR-IOV NICs on which physnet.

Pure. Each option value is one JSON object in nova's ``device_spec`` style::

    {"address": "0000:81:00.0", "physical_network": "physnet1"}
    {"devname": "enp129s0f0", "physical_network": "physnet2"}
    {"address": "*:81:00.*", "vendor_id": "8086", "physical_network": "physnet1"}

``address`` may use shell wildcards (``*``, ``?``) per field, as nova's
string form does. Only specs with a ``physical_network`` create SR-IOV
children; others (GPU or NVMe passthrough in a nova config) are accepted
and ignored so a nova config can be reused as is.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from typing import Iterable, Optional

import os_traits

_KNOWN_KEYS = frozenset(
    {
        "address",
        "devname",
        "vendor_id",
        "product_id",
        "physical_network",
        "trusted",
        "remote_managed",
    }
)
_HEX4 = re.compile(r"^[0-9a-fA-F]{4}$")
EXAMPLE = '{"address": "0000:81:00.0", "physical_network": "physnet1"}'
OPTION = "[pci] device_spec"


@dataclass(frozen=True)
class PciDeviceSpec:
    physical_network: Optional[str]
    address: Optional[str] = None  # a glob over the full address
    devname: Optional[str] = None
    vendor_id: Optional[str] = None
    product_id: Optional[str] = None

    def matches(
        self,
        address: str,
        netdevs: Iterable[str] = (),
        vendor_id: Optional[str] = None,
        product_id: Optional[str] = None,
    ) -> bool:
        if self.address is not None and not fnmatch.fnmatchcase(address, self.address):
            return False
        if self.devname is not None and self.devname not in tuple(netdevs):
            return False
        for wanted, have in ((self.vendor_id, vendor_id), (self.product_id, product_id)):
            if wanted is not None and (have or "").lower() != wanted.lower():
                return False
        return True


def physnet_trait(physnet: str) -> str:
    """``physnet-1`` -> ``CUSTOM_PHYSNET_PHYSNET_1``."""
    return os_traits.normalize_name("PHYSNET_" + physnet)


def _normalise_address(address: str) -> str:
    """Lower case, and a 4-digit domain when only bus:slot.function is given."""
    address = address.strip().lower()
    return address if address.count(":") >= 2 else "0000:" + address


def parse_spec(text: str) -> PciDeviceSpec:
    """One option value. Raises ValueError saying what is wrong."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    unknown = sorted(set(data) - _KNOWN_KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}")
    for key, value in data.items():
        if key in ("trusted", "remote_managed"):
            continue
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"'{key}' must be a non-empty string")
    if "address" in data and "devname" in data:
        raise ValueError("give either address or devname, not both")
    for key in ("vendor_id", "product_id"):
        if key in data and not _HEX4.match(data[key]):
            raise ValueError(f"{key} '{data[key]}' is not 4 hex digits")
    if "physical_network" in data and len(physnet_trait(data["physical_network"])) > 255:
        raise ValueError(
            f"physical_network makes the trait "
            f"{physnet_trait(data['physical_network'])[:40]}..., longer than "
            "Placement's 255 characters; shorten it"
        )
    return PciDeviceSpec(
        physical_network=data.get("physical_network"),
        address=_normalise_address(data["address"]) if "address" in data else None,
        devname=data.get("devname"),
        vendor_id=data.get("vendor_id"),
        product_id=data.get("product_id"),
    )


def parse_device_specs(values: Iterable[str], problems: list[str]) -> tuple[PciDeviceSpec, ...]:
    specs = []
    for text in values or ():
        try:
            specs.append(parse_spec(text))
        except ValueError as exc:
            problems.append(
                f"{OPTION} = '{text}' is invalid: {exc}. Write one JSON "
                f"object per line, for example {EXAMPLE}."
            )
    return tuple(specs)
