"""One cycle against Placement: reshape when the tree's shape changed, then sync.

Shared by ``--once``, the service and the central applier, so there is one
order of operations everywhere:

1. if the shape of the desired tree (providers and their classes, and the
   dedicated CPU set) differs from the last one applied -- or this is the
   first cycle of the process -- ask Placement whether allocations must
   move, and move them in one ``POST /reshaper``;
2. sync the tree.

A refused reshape (a pinned guest outside the new dedicated set, too few
PCPU) keeps VCPU and PCPU as Placement has them and syncs the rest: offering
PCPU while pinned guests still hold VCPU would let the scheduler double-book
the host.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Optional, Union

import os_resource_classes as orc

from node_agent.cycle import PROVIDERS_KEY, Desired
from node_agent.errors import ReshapeError
from node_agent.provider_tree import ProviderTree
from node_agent.reshape import hold_inventories
from node_agent.reshaper import ReshapeOutcome, pcpu_reshape, plan_pcpu_reshape, resolve_uuids
from node_agent.sync import Change, SyncReport, TreeSyncer

LOG = logging.getLogger(__name__)
CPU_CLASSES = (orc.VCPU, orc.PCPU)


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

    def _held_tree(self, desired: Desired) -> ProviderTree:
        tree = resolve_uuids(self.client, desired.tree, self._known_uuids())
        root = tree.root.uuid
        current = {root: self.client.get(f"/resource_providers/{root}/inventories")[
            "inventories"]} if root else {}
        return hold_inventories(tree, current, CPU_CLASSES)

    def apply(self, desired: Desired, before_post=None) -> CycleOutcome:
        shape = shape_of(desired)
        tree, outcome = desired.tree, None
        if shape != self._applied_shape:
            try:
                kw = {"before_post": before_post} if before_post else {}
                outcome = pcpu_reshape(self.client, desired, self._known_uuids(), **kw)
                if outcome.reshaped:
                    self.syncer.invalidate()
            except ReshapeError as exc:
                LOG.error("reshape refused, CPU inventory kept as it is: %s", exc)
                outcome, tree = exc, self._held_tree(desired)
        report = self.syncer.sync(tree)
        result = CycleOutcome(report, outcome)
        if result.ok:
            self._applied_shape = shape
        return result

    def plan(self, desired: Desired) -> tuple[ProviderTree, list[Change], Optional[dict]]:
        """For ``--dry-run``: the tree with uuids, the sync's requests, the reshape plan."""
        tree, changes = self.syncer.plan_with_tree(desired.tree)
        reshape = plan_pcpu_reshape(self.client, desired, self._known_uuids())
        return tree, changes, (reshape.as_dict() if reshape.needed or reshape.refusals
                               else None)
