"""One cycle against Placement: reshape when the tree's shape changed, then sync.

Shared by ``--once``, the service and the central applier, so there is one
order of operations everywhere:

1. if the shape of the desired tree (providers and their classes, and the
   dedicated CPU set) differs from the last one applied -- or this is the
   first cycle of the process -- ask Placement whether allocations must
   move (VCPU -> PCPU for pinned guests, VGPU from the root to GPU children,
   flat -> NUMA children: :func:`node_agent.reshape.host_rule`), and move
   them in one ``POST /reshaper``;
2. sync the tree. The syncer is told the inventories the reshape set, so an
   unchanged tree costs no request; when the reshape had to create children
   it re-reads the tree and adopts them by name.

A refused reshape (a pinned guest outside the new dedicated set, too few
PCPU, a guest that cannot be attributed to a GPU or a NUMA node) keeps the
inventories of the classes it would have moved as Placement has them, and
syncs the rest: offering PCPU while pinned guests still hold VCPU (or VGPU
on children while guests hold it on the root) would let the scheduler
double-book the host.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Optional, Union

from node_agent.cycle import PROVIDERS_KEY, Desired
from node_agent.errors import ReshapeError
from node_agent.provider_tree import ProviderTree
from node_agent.reshape import Reshape, hold_inventories
from node_agent.reshaper import (HostReshape, ReshapeOutcome, ensure_reshaped,
                                 host_reshape_inputs, plan_reshape, read_inventories)
from node_agent.sync import Change, SyncReport, TreeSyncer

LOG = logging.getLogger(__name__)


def shape_of(desired: Desired) -> tuple:
    """What decides whether allocations may have to move."""
    return (tuple((p.name, p.parent, tuple(sorted(p.inventories)))
                  for p in desired.tree.providers),
            str(desired.partition.dedicated))


@dataclass
class CycleOutcome:
    report: SyncReport
    reshape: Optional[Union[ReshapeOutcome, ReshapeError]] = None

    @property
    def ok(self) -> bool:
        return self.report.ok and not isinstance(self.reshape, ReshapeError)

    @property
    def errors(self) -> list[str]:
        refused = [str(self.reshape)] if isinstance(self.reshape, ReshapeError) else []
        return refused + list(self.report.errors)


class Reconciler:
    """Keeps one host's tree in Placement, reshaping first when needed."""

    def __init__(self, client, syncer: TreeSyncer):
        self.client = client
        self.syncer = syncer
        self._applied_shape: Optional[tuple] = None

    def _known_uuids(self) -> Mapping[str, str]:
        return self.syncer.state.get(PROVIDERS_KEY, {})

    def _held_tree(self, inputs: HostReshape) -> ProviderTree:
        rule = inputs.rule
        held = sorted(set(getattr(rule, "providers", ())) - inputs.absent)
        current = read_inventories(self.client, held)
        return hold_inventories(inputs.tree, current, getattr(rule, "classes", ()),
                                getattr(rule, "providers", None))

    def _reshape(self, desired: Desired, before_post=None
                 ) -> tuple[Optional[Union[ReshapeOutcome, ReshapeError]], ProviderTree]:
        inputs = host_reshape_inputs(self.client, desired, self._known_uuids())
        if inputs is None:
            return ReshapeOutcome(False, Reshape(None)), desired.tree
        kw = {"before_post": before_post} if before_post else {}
        try:
            outcome = ensure_reshaped(self.client, inputs.tree, desired.host.guests,
                                      inputs.rule, absent=inputs.absent, **kw)
        except ReshapeError as exc:
            LOG.error("reshape refused, the inventory it would move is kept as it is: %s",
                      exc)
            return exc, self._held_tree(inputs)
        if outcome.created:
            self.syncer.invalidate()  # the sync re-reads the tree and adopts them
        elif outcome.reshaped:
            self.syncer.note_inventories(outcome.inventories)
        return outcome, desired.tree

    def apply(self, desired: Desired, before_post=None) -> CycleOutcome:
        shape = shape_of(desired)
        tree, outcome = desired.tree, None
        if shape != self._applied_shape:
            outcome, tree = self._reshape(desired, before_post)
        report = self.syncer.sync(tree)
        result = CycleOutcome(report, outcome)
        if result.ok:
            self._applied_shape = shape
        return result

    def plan(self, desired: Desired) -> tuple[ProviderTree, list[Change], Optional[dict]]:
        """For ``--dry-run``: the tree with uuids, the sync's requests, the reshape plan."""
        tree, changes = self.syncer.plan_with_tree(desired.tree)
        inputs = host_reshape_inputs(self.client, desired, self._known_uuids())
        if inputs is None:
            return tree, changes, None
        reshape = plan_reshape(self.client, inputs.tree, desired.host.guests, inputs.rule,
                               inputs.absent)
        return tree, changes, (reshape.as_dict() if reshape.needed or reshape.refusals
                               else None)
