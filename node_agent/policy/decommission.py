"""What ``node-agent decommission`` removes, or why it refuses. Pure.

A host leaving the cloud takes its providers with it: the root and the
children the agent made (:func:`node_agent.policy.child_owner.agent_children`,
or those the state file lists). Nothing is removed while anything is
allocated on them, so no consumer loses the resources it holds; and a
provider under the root that is not the agent's (Cyborg's, an operator's)
is its owner's to remove first (Placement refuses to delete a parent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from node_agent.policy.child_owner import ListedChild, agent_children


@dataclass(frozen=True)
class Decommission:
    deletes: tuple[tuple[str, str], ...]  # (uuid, name), children before parents
    blocking: tuple[str, ...]  # why nothing is deleted; empty: go

    @property
    def ok(self) -> bool:
        return not self.blocking


def _depth(uuid: str, parents: Mapping[str, Optional[str]]) -> int:
    depth, seen = 0, set()
    parent = parents.get(uuid)
    while parent and uuid not in seen:
        seen.add(uuid)
        uuid, depth = parent, depth + 1
        parent = parents.get(uuid)
    return depth


def plan(
    host: str,
    root_uuid: str,
    listed: Iterable[ListedChild],
    consumers: Mapping[str, Mapping[str, Mapping[str, int]]],
    owned: Iterable[str] = (),
) -> Decommission:
    """``listed``: the root's tree as Placement lists it (the root too);
    ``consumers``: provider uuid -> consumer uuid -> resources it holds
    there; ``owned``: uuids the state file says are the agent's."""
    listed = list(listed)
    names = {p.uuid: p.name for p in listed}
    parents = {p.uuid: p.parent_uuid for p in listed}
    ours = (
        {root_uuid}
        | set(agent_children(host, root_uuid, listed, owned))
        | (set(owned) & set(names))
    )
    blocking = [
        f"provider {names[u]} ({u}) is not this agent's: its owner must remove it "
        f"first (it is under {names.get(parents[u] or '', parents[u])})"
        for u in sorted(set(names) - ours, key=lambda u: names[u])
    ]
    for uuid in sorted(ours, key=lambda u: names.get(u, u)):
        for consumer, resources in sorted(consumers.get(uuid, {}).items()):
            held = " ".join(f"{rc}={n}" for rc, n in sorted(resources.items()))
            blocking.append(
                f"consumer {consumer} holds {held} on {names.get(uuid, uuid)}; "
                "migrate or delete it first"
            )
    order = sorted(ours & set(names), key=lambda u: (-_depth(u, parents), names[u]))
    return Decommission(tuple((u, names[u]) for u in order), tuple(blocking))
