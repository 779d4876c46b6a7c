"""One immutable CPU-set type with two named parsers and a canonical string.

Two grammars produce a CpuSet:

* the kernel's cpulist (``/sys/devices/system/cpu/online``): ``0-3,8``;
* the operator's spec (nova's ``cpu_dedicated_set``): the same, plus
  ``^N`` and ``^A-B`` exclusions and free whitespace.

``str(cpuset)`` is always the canonical sorted-range form, which both
parsers read back to the same set.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator

from node_agent.errors import NodeAgentError

# The kernel's NR_CPUS tops out at 8192; a larger id is a typo, and refusing
# it keeps "0-999999999" from allocating a billion-element set.
MAX_CPU_ID = 65535

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class CpuSetSyntaxError(NodeAgentError, ValueError):
    """A CPU list or spec is malformed; the message says where."""


class CpuSet:
    """An immutable, hashable set of CPU ids."""

    __slots__ = ("_ids",)
    _ids: frozenset[int]

    def __init__(self, ids: Iterable[int] = ()):
        frozen = frozenset(int(i) for i in ids)
        for cpu in frozen:
            if cpu < 0 or cpu > MAX_CPU_ID:
                raise CpuSetSyntaxError(f"CPU id {cpu} is outside 0-{MAX_CPU_ID}")
        object.__setattr__(self, "_ids", frozen)

    def __setattr__(self, name, value):
        raise AttributeError("CpuSet is immutable")

    # set protocol -----------------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._ids))

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, cpu: object) -> bool:
        return cpu in self._ids

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CpuSet):
            return self._ids == other._ids
        if isinstance(other, (set, frozenset)):
            return self._ids == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._ids)

    def __bool__(self) -> bool:
        return bool(self._ids)

    def __or__(self, other: "CpuSet") -> "CpuSet":
        return CpuSet(self._ids | frozenset(other))

    def __and__(self, other: "CpuSet") -> "CpuSet":
        return CpuSet(self._ids & frozenset(other))

    def __sub__(self, other: "CpuSet") -> "CpuSet":
        return CpuSet(self._ids - frozenset(other))

    def issubset(self, other: "CpuSet") -> bool:
        return self._ids <= frozenset(other)

    def __repr__(self) -> str:
        return f"CpuSet('{self}')"

    def __str__(self) -> str:
        return format_cpulist(self._ids)

    def to_list(self) -> list[int]:
        return sorted(self._ids)


def format_cpulist(ids: Iterable[int]) -> str:
    """Canonical form: sorted, runs of two or more joined as ``A-B``."""
    ordered = sorted(set(ids))
    parts = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def _parse_range(token: str, text: str) -> range:
    match = _RANGE.match(token)
    if not match:
        raise CpuSetSyntaxError(
            f"'{token}' in '{text}' is not a CPU number or range (expected N or A-B)"
        )
    start = int(match.group(1))
    end = int(match.group(2)) if match.group(2) is not None else start
    if end < start:
        raise CpuSetSyntaxError(f"range '{token}' in '{text}' runs backwards")
    if end > MAX_CPU_ID:
        raise CpuSetSyntaxError(f"'{token}' in '{text}' names a CPU above {MAX_CPU_ID}")
    return range(start, end + 1)


def parse_cpulist(text: str) -> CpuSet:
    """Parse the kernel's cpulist format (sysfs). Empty text is the empty set."""
    if not isinstance(text, str):
        raise CpuSetSyntaxError(f"cpulist must be text, not {type(text).__name__}")
    body = text.strip()
    if not body:
        return CpuSet()
    ids: set[int] = set()
    for token in body.split(","):
        ids.update(_parse_range(token.strip(), body))
    return CpuSet(ids)


def parse_cpu_spec(text: str) -> CpuSet:
    """Parse an operator CPU spec: ``N``, ``A-B``, ``^N``, ``^A-B``, comma separated.

    Exclusions apply to the union of the inclusions, whatever their order,
    as in nova's ``parse_cpu_spec``. An empty result is the caller's to judge.
    """
    if not isinstance(text, str):
        raise CpuSetSyntaxError(f"CPU spec must be text, not {type(text).__name__}")
    include: set[int] = set()
    exclude: set[int] = set()
    body = text.strip()
    if not body:
        raise CpuSetSyntaxError("the CPU spec is empty")
    for raw in body.split(","):
        # Whitespace may surround items, '-' and '^', never split a number.
        token = re.sub(r"\s*-\s*", "-", raw.strip())
        token = re.sub(r"^\^\s*", "^", token)
        if not token:
            raise CpuSetSyntaxError(f"empty item between commas in '{body}'")
        if token.startswith("^"):
            exclude.update(_parse_range(token[1:], body))
        else:
            include.update(_parse_range(token, body))
    return CpuSet(include - exclude)
