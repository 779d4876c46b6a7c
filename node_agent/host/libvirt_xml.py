"""Small helpers the libvirt XML parsers share: load, numbers, sizes.

Each helper turns bad input into ``ParseError`` whose message starts with
``what`` (e.g. "domain 'instance-1'"), so no ExpatError or ValueError leaks.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from typing import Optional

from node_agent.errors import ParseError
from node_agent.model.cpuset import CpuSet, CpuSetSyntaxError, parse_cpu_spec, parse_cpulist


def load(xml: str, root: str, what: str) -> ET.Element:
    """Parse ``xml`` and check that its root element is ``<root>``."""
    if not isinstance(xml, (str, bytes)):
        raise ParseError(f"{what}: expected XML text, got {type(xml).__name__}")
    try:
        element = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise ParseError(f"{what}: malformed XML: {exc}") from exc
    except UnicodeError as exc:  # lone surrogates cannot be fed to expat
        raise ParseError(f"{what}: not encodable text: {exc}") from exc
    if element.tag != root:
        raise ParseError(f"{what}: root element is <{element.tag}>, expected <{root}>")
    return element


def to_int(value: Optional[str], what: str) -> int:
    """Decimal, or hexadecimal with ``0x`` (libvirt writes PCI addresses so)."""
    if value is None:
        raise ParseError(f"{what}: missing number")
    text = value.strip()
    try:
        if text.lower().startswith(("0x", "-0x")):
            return int(text, 16)
        return int(text, 10)
    except ValueError:
        raise ParseError(f"{what}: '{value}' is not a number") from None


def optional_int(value: Optional[str], what: str) -> Optional[int]:
    return None if value is None else to_int(value, what)


def text_of(parent: ET.Element, path: str, namespaces=None) -> Optional[str]:
    """Stripped text of the first match, or None when absent or empty."""
    found = parent.find(path, namespaces)
    if found is None or found.text is None:
        return None
    return found.text.strip() or None


# libvirt's scaled-integer units (virScaleInteger): case-insensitive; a bare
# letter or "<letter>iB" is a power of 1024, "<letter>B" a power of 1000.
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}


def _unit_bytes(unit: str, what: str) -> int:
    lowered = unit.strip().lower()
    if lowered in ("b", "byte", "bytes"):
        return 1
    power = _POWERS.get(lowered[:1])
    rest = lowered[1:]
    if power is not None and rest in ("", "ib"):
        return 1024**power
    if power is not None and rest == "b":
        return 1000**power
    raise ParseError(f"{what}: unknown size unit '{unit}'")


def to_kib(value: Optional[str], unit: Optional[str], what: str) -> int:
    """A size in ``unit`` (libvirt's default for memory is KiB) as KiB,
    rounded up as libvirt itself does."""
    amount = to_int(value, what)
    if amount < 0:
        raise ParseError(f"{what}: size {amount} is negative")
    scale = _unit_bytes(unit or "KiB", what)
    return math.ceil(amount * scale / 1024)


def cpu_spec(value: Optional[str], what: str) -> CpuSet:
    """libvirt's cpuset/nodeset grammar: ranges plus ``^`` exclusions."""
    if value is None:
        raise ParseError(f"{what}: missing CPU or node set")
    try:
        return parse_cpu_spec(value)
    except CpuSetSyntaxError as exc:
        raise ParseError(f"{what}: {exc}") from exc


def cpulist(value: str, what: str) -> CpuSet:
    """The kernel's cpulist, which capabilities ``siblings`` copy from sysfs."""
    try:
        return parse_cpulist(value)
    except CpuSetSyntaxError as exc:
        raise ParseError(f"{what}: {exc}") from exc
