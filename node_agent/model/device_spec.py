"""``[pci] device_spec``: which PCI devices are SR-IOV NICs on which physnet.

Pure. Each option value is one JSON object in nova's ``device_spec`` style,
or a JSON list of them::

    {"address": "0000:81:00.0", "physical_network": "physnet1"}
    {"devname": "enp129s0f0", "physical_network": "physnet2"}
    {"address": "*:81:00.*", "vendor_id": "8086", "physical_network": "physnet1"}
    {"address": {"bus": "8[12]", "function": "[0-3]"}, "physical_network": "p"}
    [{"vendor_id": "10de", "product_id": "1eb8"}, {"product_id": "154c"}]

``address`` is read as nova 34 reads it (``nova/pci/devspec.py``): a string
is ``PciAddressGlobSpec`` (each field a hex number or ``*``, a field left
off is any), an object ``PciAddressRegexSpec`` (``domain``, ``bus``,
``slot``, ``function``: Python regular expressions matched at the start of
the device's field, a field left off is any). Specs with a
``physical_network`` create SR-IOV children; with ``[pci]
report_in_placement`` the others make the devices they match children of
their own (:mod:`node_agent.tree.pci_placement`), described by nova's tags
``resource_class``, ``traits``, ``one_time_use`` and ``live_migratable``.
Without it they are accepted and ignored, so a nova config can be reused as
is.
"""

from __future__ import annotations

import functools
import json
import re
import string
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
# Keys read by nova's own parsing below, not by the non-empty-string rule.
_ADDRESS_KEYS = ("address", "devname", "vendor_id", "product_id")
# Tags nova reads as booleans (oslo's strict bool_from_string spellings).
_BOOL_TAGS = ("managed", "one_time_use", "live_migratable")
_TRUE = frozenset({"1", "t", "true", "on", "y", "yes"})
_FALSE = frozenset({"0", "f", "false", "off", "n", "no"})
EXAMPLE = '{"address": "0000:81:00.0", "physical_network": "physnet1"}'
OPTION = "[pci] device_spec"
ANY = "*"
REGEX_ANY = ".*"
# nova's names and limits (devspec.MAX_*); the function first, as nova checks it.
_FIELDS = ("domain", "bus", "slot", "function")
_MAXIMA = {"domain": 0xFFFF, "bus": 0xFF, "slot": 0x1F, "function": 0x7}
_WIDTHS = {"domain": 4, "bus": 2, "slot": 2, "function": 1}
GLOB_HELP = (
    "each field a hex number or * (no partial wildcards such as 8*), e.g. "
    "'0000:81:00.0' or '*:81:00.*'; for patterns give an object of regular "
    'expressions, e.g. {"bus": "8[12]", "function": "[0-3]"}'
)


@dataclass(frozen=True)
class PciDeviceSpec:
    physical_network: Optional[str]
    # The glob form as nova normalises it: "<domain>:<bus>:<slot>.<function>",
    # each field lower-case zero-padded hex or "*".
    address: Optional[str] = None
    devname: Optional[str] = None
    vendor_id: Optional[str] = None
    product_id: Optional[str] = None
    resource_class: Optional[str] = None
    traits: Optional[str] = None  # nova's comma-separated list, as written
    one_time_use: bool = False
    live_migratable: bool = False
    # The regex form: (domain, bus, slot, function) patterns, as written.
    address_regex: Optional[tuple[str, str, str, str]] = None

    @property
    def pf_address(self) -> Optional[str]:
        """The one address the spec names (nova's ``is_single_address``:
        every field hex digits): nova then also matches the VFs of that
        address when it is a PF. None for a spec naming no single address."""
        fields = self.address_regex or (_glob_fields(self.address) if self.address else None)
        if fields is None or not all(c in string.hexdigits for f in fields for c in f):
            return None
        return f"{fields[0]}:{fields[1]}:{fields[2]}.{fields[3]}"

    def address_text(self) -> Optional[str]:
        """The address as the operator would recognise it, for messages."""
        if self.address_regex is not None:
            return json.dumps(dict(zip(_FIELDS, self.address_regex)))
        return self.address

    def matches(
        self,
        address: str,
        netdevs: Iterable[str] = (),
        vendor_id: Optional[str] = None,
        product_id: Optional[str] = None,
    ) -> bool:
        # The id comparisons first: they are cheap and rule out most of a
        # host's hundreds of functions before any address is compared.
        for wanted, have in ((self.vendor_id, vendor_id), (self.product_id, product_id)):
            if wanted is not None and (have or "").lower() != wanted:
                return False
        if self.address_regex is not None:
            fields = _device_fields(address)
            if not all(re.match(p, f) for p, f in zip(self.address_regex, fields)):
                return False
        elif self.address is not None:
            fields = _device_fields(address)
            if not all(w in (ANY, f) for w, f in zip(_glob_fields(self.address), fields)):
                return False
        return self.devname is None or self.devname in tuple(netdevs)


def physnet_trait(physnet: str) -> str:
    """``physnet-1`` -> ``CUSTOM_PHYSNET_PHYSNET_1``."""
    return os_traits.normalize_name("PHYSNET_" + physnet)


@functools.lru_cache(maxsize=1024)
def _glob_fields(address: str) -> tuple[str, ...]:
    dbs, _sep, func = address.partition(".")
    return (*dbs.split(":"), func)


def _device_fields(address: str) -> tuple[str, ...]:
    """A device's address (sysfs' canonical form) as its four fields."""
    dbs, _sep, func = address.lower().partition(".")
    return (*dbs.split(":", 2), func)


def _hex_field(name: str, text: str, limit: int, width: int) -> str:
    """nova's ``_set_pci_dev_info``: ``*`` stays any; anything else is read
    as ``int(text, 16)`` (so ``0x81`` and `` 81`` are 81 too) and written
    back zero-padded; above ``limit`` it is refused."""
    if text == ANY:
        return ANY
    try:
        value = int(text, 16)
    except ValueError:
        raise ValueError(f"{name} '{text}' is not a hex number or *") from None
    if value > limit:
        raise ValueError(f"{name} '{text}' is above {limit:X}, the highest {name}")
    return f"%0{width}x" % value


def _normalise_address(address: str) -> str:
    """nova's glob form (``PciAddressGlobSpec``) as its four fields: a
    missing or empty field (``81:00.0``, ``0000:81:00.``) is any, a hex
    field is zero-padded lower case (``81:0.1`` -> ``*:81:00.1``)."""
    dbs, _sep, func = address.partition(".")
    fields = dict.fromkeys(_FIELDS, ANY)
    try:
        if func:
            fields["function"] = _hex_field("function", func.strip(), _MAXIMA["function"], 1)
        if dbs:
            given = dbs.split(":")
            if len(given) > 3:
                raise ValueError("has more than domain:bus:slot.function")
            given = [ANY] * (3 - len(given)) + given
            for name, text in zip(_FIELDS, given):
                fields[name] = _hex_field(name, text.strip() or ANY, _MAXIMA[name], _WIDTHS[name])
    except ValueError as exc:
        raise ValueError(f"address '{address}': {exc}; {GLOB_HELP}") from None
    return "{domain}:{bus}:{slot}.{function}".format(**fields)


def _address_regex(address: dict) -> tuple[str, str, str, str]:
    """nova's regex form (``PciAddressRegexSpec``): each field a Python
    regular expression, ``.*`` when left off."""
    shown = json.dumps(address)
    unknown = sorted(set(address) - set(_FIELDS))
    if unknown:
        raise ValueError(
            f"address {shown} has unknown key(s) {', '.join(unknown)} (nova would "
            "ignore them and match every value of the field meant); the keys "
            "are domain, bus, slot and function"
        )
    patterns = []
    for name in _FIELDS:
        pattern = address.get(name, REGEX_ANY)
        if not isinstance(pattern, str):
            raise ValueError(f"address {shown}: {name} must be a string (a regular expression)")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(
                f"address {shown}: {name} '{pattern}' is not a regular expression ({exc})"
            ) from None
        patterns.append(pattern)
    return (patterns[0], patterns[1], patterns[2], patterns[3])


def _id_field(key: str, value) -> Optional[str]:
    """vendor_id, product_id as nova reads them: hex up to FFFF (``*`` is
    any); nova strips the vendor_id only."""
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string of 4 hex digits, not {json.dumps(value)}")
    text = value.strip() if key == "vendor_id" else value
    try:
        normal = _hex_field(key, text, 0xFFFF, 4)
    except ValueError as exc:
        raise ValueError(f"{exc}, write 4 hex digits such as 8086") from None
    return None if normal == ANY else normal


def parse_spec(text: str) -> PciDeviceSpec:
    """One option value holding one object. Raises ValueError saying what
    is wrong."""
    specs = parse_value(text)
    if len(specs) != 1:
        raise ValueError(f"holds {len(specs)} specs, not one")
    return specs[0]


def parse_value(text: str) -> tuple[PciDeviceSpec, ...]:
    """One option value: an object, or a list of objects (nova's
    ``Whitelist`` takes both). Raises ValueError saying what is wrong."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if isinstance(data, dict):
        return (_parse_object(data),)
    if not isinstance(data, list):
        raise ValueError("not a JSON object (nor a list of them)")
    specs = []
    for n, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValueError(f"item {n} of the list is not a JSON object")
        try:
            specs.append(_parse_object(item))
        except ValueError as exc:
            raise ValueError(f"item {n} of the list: {exc}") from None
    return tuple(specs)


def _parse_object(data: dict) -> PciDeviceSpec:
    unknown = sorted(set(data) - _KNOWN_KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}")
    flags = {}
    for key, value in data.items():
        if key in _BOOL_TAGS:
            flags[key] = _bool_tag(key, value)
            continue
        if key in ("trusted", "remote_managed") or key in _ADDRESS_KEYS:
            continue
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"'{key}' must be a non-empty string")
    # nova reads a false-like address or devname ("", null, {}) as absent.
    address, devname = data.get("address") or None, data.get("devname") or None
    if address is not None and devname is not None:
        raise ValueError("give either address or devname, not both")
    if devname is not None and not isinstance(devname, str):
        raise ValueError(f"devname must be a network interface name, not {json.dumps(devname)}")
    if address is not None and not isinstance(address, (str, dict)):
        raise ValueError(
            f"address {json.dumps(address)} is neither a string (glob) nor an "
            f"object (regular expressions); {GLOB_HELP}"
        )
    ids = {key: _id_field(key, data[key]) for key in ("vendor_id", "product_id") if key in data}
    if "physical_network" in data and len(physnet_trait(data["physical_network"])) > 255:
        raise ValueError(
            f"physical_network makes the trait "
            f"{physnet_trait(data['physical_network'])[:40]}..., longer than "
            "Placement's 255 characters; shorten it"
        )
    return PciDeviceSpec(
        physical_network=data.get("physical_network"),
        address=_normalise_address(address) if isinstance(address, str) else None,
        address_regex=_address_regex(address) if isinstance(address, dict) else None,
        devname=devname,
        vendor_id=ids.get("vendor_id"),
        product_id=ids.get("product_id"),
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
    specs: list[PciDeviceSpec] = []
    for text in values or ():
        try:
            specs.extend(parse_value(text))
        except ValueError as exc:
            problems.append(
                f"{OPTION} = '{text}' is invalid: {exc}. Write one JSON "
                f"object per line, for example {EXAMPLE}."
            )
    return tuple(specs)
