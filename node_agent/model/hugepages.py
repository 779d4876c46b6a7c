"""Huge pages as Placement sees them: the page classes and nova's
``reserved_huge_pages`` grammar.

Pure. A pool of pages of one size on one NUMA node is reported as the
custom class ``CUSTOM_MEMORY_PAGE_<size in KiB>`` (``CUSTOM_MEMORY_PAGE_2048``,
``CUSTOM_MEMORY_PAGE_1048576``): KiB is the unit sysfs names the pools in
(``hugepages-2048kB``), so the name is exact for every size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

import os_resource_classes as orc

PAGE_CLASS_PREFIX = orc.CUSTOM_NAMESPACE + "MEMORY_PAGE_"

# Units nova accepts in ``size:`` (binary multiples); a bare number is KiB.
_UNITS_KB = {
    "": 1,
    "k": 1,
    "kb": 1,
    "kib": 1,
    "m": 1024,
    "mb": 1024,
    "mib": 1024,
    "g": 1024**2,
    "gb": 1024**2,
    "gib": 1024**2,
}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")
EXAMPLE = "node:0,size:2048,count:64 (size in KiB, or with a unit: 2M, 1G)"


@dataclass(frozen=True)
class ReservedPages:
    node: int
    size_kb: int
    count: int


def page_class(size_kb: int) -> str:
    return f"{PAGE_CLASS_PREFIX}{size_kb}"


def parse_size_kb(text: str) -> int:
    """``2048`` / ``2M`` / ``1GiB`` -> KiB. Raises ValueError."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS_KB:
        raise ValueError(f"size '{text}' is not a number of KiB or a number with a unit K, M or G")
    return int(match.group(1)) * _UNITS_KB[unit]


def parse_reservation(text: str) -> ReservedPages:
    """One ``node:N,size:S,count:C`` value. Raises ValueError saying what is wrong."""
    fields: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition(":")
        key = key.strip()
        if not sep or key not in ("node", "size", "count") or key in fields:
            raise ValueError(f"'{item.strip()}' is not one of node:N, size:S, count:C (each once)")
        fields[key] = value.strip()
    missing = [k for k in ("node", "size", "count") if k not in fields]
    if missing:
        raise ValueError(f"{', '.join(missing)} missing")
    node, count = fields["node"], fields["count"]
    if not node.isdigit() or not count.isdigit():
        raise ValueError("node and count must be whole numbers")
    size_kb = parse_size_kb(fields["size"])
    if size_kb <= 0:
        raise ValueError("size must be above 0")
    return ReservedPages(node=int(node), size_kb=size_kb, count=int(count))


def parse_reserved_huge_pages(
    values: Iterable[str], problems: list[str], option: str = "[compute] reserved_huge_pages"
) -> tuple[ReservedPages, ...]:
    """Every value of the option; each bad one is appended to ``problems``."""
    parsed: dict[tuple[int, int], ReservedPages] = {}
    for text in values or ():
        try:
            entry = parse_reservation(text)
        except ValueError as exc:
            problems.append(f"{option} = '{text}' is invalid: {exc}. Write {EXAMPLE}.")
            continue
        key = (entry.node, entry.size_kb)
        if key in parsed:
            problems.append(
                f"{option} = '{text}' repeats node {entry.node} size "
                f"{entry.size_kb} KiB. Keep one line per node and size."
            )
        parsed[key] = entry
    return tuple(sorted(parsed.values(), key=lambda r: (r.node, r.size_kb)))
