"""Where a guest with no NUMA placement goes when NUMA children appear. Pure.

A floating guest (no CPU pins, no numatune) says nothing about its node, so
when ``numa_in_placement`` turns on, its CPU and memory allocations on the
root have no obvious child to move to. nova's approved NUMA-in-Placement
spec (nova-specs, ussuri, numa-topology-with-rps) makes a host either
NUMA-aware or not and puts a NUMA-agnostic workload "on a specific NUMA
node" of a NUMA-aware host; so does this module: each such guest goes whole
to one node with room for all of its classes (the node with the most room
left, largest guests first, after the guests whose node is known). A guest
no single node can hold (larger than a node, as a flavor stranded by NUMA
children is) is split over the nodes with the most room: Placement takes a
consumer's allocation of one class over several providers, so the host is
neither overstated nor refused; the spec has no case for it, since such a
flavor would never have been scheduled to a NUMA-aware host. A guest that
all nodes together cannot hold is left unplaced (a refusal names it).

Room per node and class is what Placement accepts: ``(total - reserved) *
allocation_ratio`` less what is placed, and no piece above ``max_unit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from node_agent.model.provider_tree import Inventory

# class -> amount
Demand = Mapping[str, int]
# ((node, {class: amount}), ...): one entry placed whole, several split.
Placement = tuple[tuple[int, Mapping[str, int]], ...]


@dataclass
class _Room:
    free: dict[str, int]
    max_unit: dict[str, int]
    capacity: dict[str, int]

    def takes(self, demand: Demand) -> bool:
        return all(
            rc in self.free and amount <= min(self.free[rc], self.max_unit[rc])
            for rc, amount in demand.items()
            if amount
        )

    def share_left(self, demand: Demand) -> float:
        """The smallest fraction of a class's capacity left once ``demand`` is in."""
        return min(
            ((self.free[rc] - amount) / self.capacity[rc] if self.capacity[rc] else 0.0)
            for rc, amount in demand.items()
            if amount
        )

    def take(self, demand: Demand) -> None:
        for rc, amount in demand.items():
            self.free[rc] -= amount


def _rooms(nodes: Mapping[int, Mapping[str, Inventory]]) -> dict[int, _Room]:
    rooms = {}
    for node, inventories in nodes.items():
        capacity = {
            rc: int((inv.total - inv.reserved) * inv.allocation_ratio)
            for rc, inv in inventories.items()
        }
        max_unit = {
            rc: inv.total if inv.max_unit is None else inv.max_unit
            for rc, inv in inventories.items()
        }
        rooms[node] = _Room(dict(capacity), max_unit, capacity)
    return rooms


def _split(demand: Demand, rooms: Mapping[int, _Room]) -> Optional[Placement]:
    """``demand`` over the nodes, the roomiest first, each piece within room."""
    left = {rc: amount for rc, amount in demand.items() if amount}
    pieces = []
    order = sorted(rooms, key=lambda n: (-sum(rooms[n].free.values()), n))
    for node in order:
        room = rooms[node]
        piece = {
            rc: min(amount, max(0, min(room.free.get(rc, 0), room.max_unit.get(rc, 0))))
            for rc, amount in left.items()
        }
        piece = {rc: n for rc, n in piece.items() if n}
        if piece:
            pieces.append((node, piece))
            left = {rc: amount - piece.get(rc, 0) for rc, amount in left.items()}
            left = {rc: amount for rc, amount in left.items() if amount}
        if not left:
            break
    if left:
        return None
    for node, piece in pieces:
        rooms[node].take(piece)
    return tuple(pieces)


def place_floating(
    nodes: Mapping[int, Mapping[str, Inventory]],
    known: Mapping[int, Sequence[Demand]],
    floating: Mapping[str, Demand],
) -> dict[str, Optional[Placement]]:
    """guest uuid -> its placement (None: the nodes together cannot hold it).

    ``nodes``: node id -> the inventories of its child; ``known``: node id
    -> what the guests living there (pins, numatune) need; ``floating``:
    guest uuid -> what a guest with no NUMA placement needs."""
    rooms = _rooms(nodes)
    for node, demands in known.items():
        if node in rooms:
            for demand in demands:
                rooms[node].take({rc: n for rc, n in demand.items() if rc in rooms[node].free})
    placed: dict[str, Optional[Placement]] = {}
    for uuid in sorted(floating, key=lambda u: (-sum(floating[u].values()), u)):
        demand = floating[uuid]
        fitting = [n for n in sorted(rooms) if rooms[n].takes(demand)]
        if fitting:
            node = max(fitting, key=lambda n: (rooms[n].share_left(demand), -n))
            rooms[node].take(demand)
            placed[uuid] = ((node, dict(demand)),)
        else:
            placed[uuid] = _split(demand, rooms)
    return placed


def spread_amount(amount: int, pieces: Sequence[int]) -> list[int]:
    """``amount`` (what Placement holds) over the planned ``pieces``, in
    order, each up to its piece; what is left over goes to the first."""
    shares = []
    left = amount
    for piece in pieces:
        share = min(left, piece)
        shares.append(share)
        left -= share
    if shares:
        shares[0] += left
    return shares
