"""Whose root this is: the syncer's owner check before any write.

The verdict is :func:`node_agent.policy.root_owner.judge`'s, on the root's
traits as Placement holds them; this module refuses a root that nova-compute
or another machine manages, says once when the agent takes a root over or
adopts an unmarked one, and returns the desired tree with the owner mark.
"""

from __future__ import annotations

import logging
from typing import Optional

from node_agent.errors import ProviderOwned
from node_agent.model.provider_state import ProviderState
from node_agent.model.provider_tree import ProviderTree
from node_agent.policy import root_owner

# Under the syncer's name, as before the split: operators filter on it.
LOG = logging.getLogger("node_agent.placement.sync")


class RootClaim:
    """This machine's claim on its root (``owner``: its identity)."""

    def __init__(self, owner: root_owner.Identity, state_file: str = ""):
        self.owner = owner
        self.state_file = state_file  # named in a refusal that says to remove it
        self._judged: Optional[str] = None  # the last verdict's owner, logged on change

    def claimed(
        self, desired: ProviderTree, root: Optional[ProviderState], from_state: bool = False
    ) -> ProviderTree:
        """``desired`` with this machine's mark, judged against ``root``
        (None: Placement does not hold it yet; ``from_state``: the state
        file named it). Raises ProviderOwned when the root is not this
        machine's to write."""
        elsewhere = from_state and root is not None and root.name != desired.root.name
        verdict = root_owner.judge(None if root is None else root.traits, self.owner, elsewhere)
        # judge() lets the agent write a root that Placement does not hold yet.
        if root is not None and not verdict.may_write:
            raise ProviderOwned(
                root_owner.refusal(
                    verdict, desired.root.name, root.uuid, root.name, self.state_file
                )
            )
        if verdict.owner != self._judged and root is not None:
            if verdict.owner in (
                root_owner.OWNED_BY_NOVA,
                root_owner.OTHER_MACHINE,
                root_owner.NAMED_ELSEWHERE,
            ):
                LOG.warning(
                    "taking over provider %s (%s) from %s ([agent] take_over_provider)",
                    desired.root.name,
                    root.uuid,
                    verdict.owner,
                )
            elif verdict.owner == root_owner.UNMARKED:
                LOG.info(
                    "adopting provider %s (%s), which no machine has marked",
                    desired.root.name,
                    root.uuid,
                )
        self._judged = verdict.owner
        return root_owner.claimed(desired, verdict)

    def needs_mark(self, root: Optional[ProviderState]) -> bool:
        """True when the writer must set this machine's mark (by
        :meth:`recheck`) before anything else is written on ``root``."""
        if self.owner.mark is None:
            return False
        return root is None or root_owner.marks_in(root.traits) != {self.owner.mark}

    def recheck(self, traits, host: str, uuid: str) -> dict[str, bool]:
        """The owner traits to set on the root whose traits are read now as
        ``traits``; ProviderOwned when another machine (or nova-compute)
        marked it since the plan was made."""
        verdict = root_owner.judge(traits, self.owner)
        if not verdict.may_write:
            raise ProviderOwned(root_owner.refusal(verdict, host, uuid))
        return dict(verdict.traits)
