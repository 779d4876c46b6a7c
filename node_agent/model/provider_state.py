"""What Placement holds of one provider, and when two of its inventory
records are the same. Pure.

The sync planner (:mod:`node_agent.placement.planner`) plans from these and
the companion's drift (:mod:`node_agent.policy.drift`) compares with them,
by the same field equality, so a companion's drift is exactly what the agent
would write. They live here, below both, so that policy/ does not import
placement/.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional

# Allocation ratios are floats in Placement's database (FLOAT columns can
# round 1.1 to 1.10000002); closer than this is the same ratio.
RATIO_TOLERANCE = 1e-6
INVENTORY_FIELDS = ("total", "reserved", "min_unit", "max_unit", "step_size", "allocation_ratio")


@dataclass(frozen=True)
class ProviderState:
    """One provider as Placement holds it (inventories as Placement spells them)."""

    uuid: str
    name: str
    generation: int
    parent_uuid: Optional[str]
    inventories: Mapping[str, dict] = field(default_factory=dict)
    traits: frozenset = frozenset()
    # None: not read (the agent reads a provider's aggregates only when it
    # has aggregates to keep on it).
    aggregates: Optional[frozenset] = None


def inventory_equal(a: Mapping, b: Mapping) -> bool:
    """Two Placement inventory records are the same (ratios compared as floats)."""
    for name in INVENTORY_FIELDS:
        x, y = a.get(name), b.get(name)
        if name == "allocation_ratio":
            if (
                x is None
                or y is None
                or not math.isclose(float(x), float(y), rel_tol=RATIO_TOLERANCE)
            ):
                return False
        elif x != y:
            return False
    return True


def inventories_equal(a: Mapping[str, Mapping], b: Mapping[str, Mapping]) -> bool:
    return set(a) == set(b) and all(inventory_equal(a[rc], b[rc]) for rc in a)
