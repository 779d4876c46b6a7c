"""Parser for meminfo text: sysfs ``node/nodeN/meminfo`` and ``/proc/meminfo``.

Node files prefix every line with ``Node N``; ``/proc/meminfo`` does not.
Sizes carry a ``kB`` unit (the kernel's kB are KiB); counters such as
``HugePages_Total`` have no unit. Both come back as plain ints.
"""

from __future__ import annotations

import re

from node_agent.errors import ParseError

_LINE = re.compile(
    r"^(?:Node\s+(?P<node>\d+)\s+)?(?P<key>[A-Za-z0-9_()]+):\s*(?P<value>\d+)(?:\s+(?P<unit>\S+))?$"
)


def parse_node_meminfo(text: str) -> dict[str, int]:
    """Map each field to its value in kB (or its count, for unitless fields).

    Raises ParseError when a line is malformed, a unit is not ``kB``, a field
    repeats, lines name different nodes, or no field is found at all; the
    caller adds the file path to the message.
    """
    fields: dict[str, int] = {}
    nodes: set[str | None] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        match = _LINE.match(line)
        if not match:
            raise ParseError(f"line {number} {line!r} is not 'Field: value [kB]'")
        key, unit = match.group("key"), match.group("unit")
        if unit is not None and unit != "kB":
            raise ParseError(f"line {number} {line!r} has unit {unit!r}, expected kB")
        if key in fields:
            raise ParseError(f"line {number}: field {key} appears twice")
        nodes.add(match.group("node"))
        fields[key] = int(match.group("value"))
    if not fields:
        raise ParseError("no meminfo fields found (empty or truncated file)")
    if len(nodes) > 1:
        shown = sorted("none" if n is None else n for n in nodes)
        raise ParseError(f"lines name different nodes: {', '.join(shown)}")
    return fields
