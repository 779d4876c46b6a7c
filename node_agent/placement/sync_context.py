"""The working set of one sync and its report: shared by the syncer
(:mod:`node_agent.placement.sync`), the capacity gate
(:mod:`node_agent.placement.capacity_gate`), which fills its holds, and
the writer (:mod:`node_agent.placement.tree_writer`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from node_agent.model.provider_tree import PlacedTree, ProviderTree
from node_agent.placement.planner import Change


@dataclass
class SyncReport:
    """What one :meth:`TreeSyncer.sync` did."""

    applied: list[Change] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reads: int = 0
    writes: int = 0
    full_verify: bool = False
    tree: Optional[ProviderTree] = None  # the desired tree with its uuids
    # The capacity invariant's say (node_agent.policy.capacity), None when not
    # checked: {"ok", "violations", "kept", "closed", "blocking"}.
    capacity: Optional[dict] = None
    # Capacity cuts written below usage (node_agent.placement.usage_guard.Cut):
    # published, not errors; no new claim of the class fits until usage falls.
    cuts: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def requests(self) -> int:
        return self.reads + self.writes

    def summary(self) -> str:
        """The one INFO line of a cycle."""
        if not self.applied and self.ok:
            return f"no change ({self.requests} requests)"
        parts = (
            [c.summary for c in self.applied]
            + [f"below usage: {c}" for c in self.cuts]
            + [f"ERROR {e}" for e in self.errors]
        )
        return f"{'; '.join(parts)} ({self.requests} requests)"


class Replan(Exception):
    """Placement's tree is not what the cache says; read it again."""


@dataclass
class SyncContext:
    """What one plan of a sync knows and decided: the desired tree with its
    uuids, Placement's as read, and what the capacity check held."""

    tree: PlacedTree  # desired, with uuids
    actual: dict  # uuid -> ProviderState, as read for this plan
    created: set = field(default_factory=set)
    failed: set = field(default_factory=set)  # names whose changes are skipped
    # Set by CapacityGate.enforce (only when the host's limits are known):
    planned: Optional[dict[str, dict]] = None  # uuid -> inventories to leave, after every hold
    pre: dict = field(default_factory=dict)  # uuid -> generation of the usages read
    usages: dict = field(default_factory=dict)  # uuid -> usages read this cycle
    grows: set = field(default_factory=set)  # uuids whose PUT grows a class
    closed: set = field(default_factory=set)  # classes published fully reserved
    errors: list = field(default_factory=list)  # holds decided before sending
    cuts: list = field(default_factory=list)  # cuts below usage the plan publishes
    written_cuts: list = field(default_factory=list)  # ... and those the writer wrote
    capacity: Optional[dict] = None
    shrink_failed: bool = False
    # The root does not carry this machine's mark yet: the writer sets it
    # (compare-and-set on the generation) before anything else is written.
    unclaimed: bool = False


def body_of(change: Change) -> dict:
    """The request body of a change that has one (all but deletes and definitions)."""
    if change.body is None:
        raise ValueError(f"{change.summary}: the change has no request body")
    return change.body
