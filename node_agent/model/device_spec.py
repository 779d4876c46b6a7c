"""``[pci] device_spec``: which PCI devices are SR-IOV NICs on which physnet.

Pure. Each option value is one JSON object in nova's ``device_spec`` style::

    {"address": "0000:81:00.0", "physical_network": "physnet1"}
    {"devname": "enp129s0f0", "physical_network": "physnet2"}
    {"address": "*:81:00.*", "vendor_id": "8086", "physical_network": "physnet1"}

``address`` may use shell wildcards (``*``, ``?``) per field, as nova's
string form does. Specs with a ``physical_network`` create SR-IOV
children; with ``[pci] report_in_placement`` the others make the devices
they match children of their own (:mod:`node_agent.tree.pci_placement`),
described by nova's tags ``resource_class``, ``traits``, ``one_time_use``
and ``live_migratable``. Without it they are accepted and ignored, so a
nova config can be reused as is.
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
        "managed",
        "resource_class",
        "traits",
        "one_time_use",
        "live_migratable",
    }
)
# Tags nova reads as booleans (oslo's strict bool_from_string spellings).
_BOOL_TAGS = ("managed", "one_time_use", "live_migratable")
_TRUE = frozenset({"1", "t", "true", "on", "y", "yes"})
_FALSE = frozenset({"0", "f", "false", "off", "n", "no"})
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
    resource_class: Optional[str] = None
    traits: Optional[str] = None  # nova's comma-separated list, as written
    one_time_use: bool = False
    live_migratable: bool = False

    @property
    def single_address(self) -> bool:
        """The address names one function (no wildcard): nova then also
        matches the VFs of that address when it is a PF."""
        return self.address is not None and not any(c in self.address for c in "*?[")

    def matches(
        self,
        address: str,
        netdevs: Iterable[str] = (),
        vendor_id: Optional[str] = None,
        product_id: Optional[str] = None,
    ) -> bool:
        # The id comparisons first: they are cheap and rule out most of a
        # host's hundreds of functions before any glob is matched.
        for wanted, have in ((self.vendor_id, vendor_id), (self.product_id, product_id)):
            if wanted is not None and (have or "").lower() != wanted.lower():
                return False
        if self.address is not None and not fnmatch.fnmatchcase(address, self.address):
            return False
        return self.devname is None or self.devname in tuple(netdevs)


def physnet_trait(physnet: str) -> str:
    """``physnet-1`` -> ``CUSTOM_PHYSNET_PHYSNET_1``."""
    return os_traits.normalize_name("PHYSNET_" + physnet)


_ADDRESS_WIDTHS = (4, 2, 2, 1)  # domain, bus, slot, function (hex digits)


def _normalise_address(address: str) -> str:
    """nova's glob form (``PciAddressGlobSpec``) as one glob: a missing or
    empty field (``81:00.0``, ``0000:81:00.``) is any, a hex field is
    zero-padded lower case (``81:0.1`` -> ``*:81:00.1``)."""
    address = address.strip().lower()
    dbs, _sep, func = address.partition(".")
    fields = dbs.split(":") if dbs else []
    if len(fields) > 3:
        raise ValueError(f"address '{address}' has more than domain:bus:slot.function")
    fields = ["*"] * (3 - len(fields)) + fields + [func]
    out = []
    for text, width in zip(fields, _ADDRESS_WIDTHS):
        text = text.strip() or "*"
        if all(c in "0123456789abcdef" for c in text):
            text = text.zfill(width)
        out.append(text)
    return f"{out[0]}:{out[1]}:{out[2]}.{out[3]}"


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
    flags = {}
    for key, value in data.items():
        if key in _BOOL_TAGS:
            flags[key] = _bool_tag(key, value)
            continue
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
        resource_class=data.get("resource_class"),
        traits=data.get("traits"),
        one_time_use=flags.get("one_time_use", False),
        live_migratable=flags.get("live_migratable", False),
    )


def _bool_tag(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"'{key}' must be true or false, not {value!r}")


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
