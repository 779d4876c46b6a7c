"""What the syncer knows Placement holds of one provider tree.

Each provider is kept at the generation of the answer it came from, so a
verify's listing tells which providers moved and only those are read again.
A provider whose parts (inventories, traits) were read at different
generations is marked partial: the next verify reads it whatever its
generation. The cache also keeps when the tree was last read whole and when
the next full verify is due, and travels as plain data (:meth:`TreeCache.export`,
:meth:`TreeCache.load`) in the state file and the applier's record.

No request here: :class:`node_agent.placement.sync.TreeSyncer` reads and
writes Placement and tells the cache what it saw.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Callable, Mapping, Optional

from node_agent.model.provider_state import ProviderState
from node_agent.placement.planner import verify_phase

# Under the syncer's name, as before the split: operators filter on it.
LOG = logging.getLogger("node_agent.placement.sync")


class TreeCache:
    """uuid -> :class:`ProviderState` (None before the first read), the
    partial-read marks and the verify schedule."""

    def __init__(self) -> None:
        self.providers: Optional[dict[str, ProviderState]] = None
        # Providers whose cached generation came from a read of one part of
        # the record (traits, inventories or usages) after someone else
        # changed it: the other part may be stale, so the next full verify
        # reads them whatever their generation.
        self.partial: set[str] = set()
        self.verified_at: Optional[float] = None
        self.due_at: Optional[float] = None  # None: verify at the next sync
        self._anchor: Optional[float] = None  # a point of the spread grid

    # -- the verify schedule

    def verify_due(self, clock: Callable[[], float], interval: float) -> bool:
        # An interval of 0 means every sync verifies, also when it was set
        # after the last verify scheduled the next one.
        return (
            self.providers is None or self.due_at is None or interval <= 0 or clock() >= self.due_at
        )

    def next_due(self, now: float, host: str, interval: float, spread: bool) -> float:
        """When the verify after one at ``now`` is due: one interval later,
        or with ``spread`` the next point of this host's grid."""
        if not spread or interval <= 0:
            return now + interval
        if self._anchor is None:
            self._anchor = now - interval * (1.0 - verify_phase(host))
        return self._anchor + (math.floor((now - self._anchor) / interval) + 1) * interval

    def read_whole(self, actual: Mapping[str, ProviderState], now: float, due_at: float) -> None:
        """The tree was read whole at ``now``; the next verify is due at ``due_at``."""
        self.providers, self.verified_at = dict(actual), now
        self.due_at = due_at

    @property
    def next_verify_at(self) -> Optional[float]:
        return None if self.providers is None else self.due_at

    def suspect(self) -> None:
        """Unknown how far the last requests got: the next sync verifies.

        The cache stays. It only ever holds what Placement answered, each
        provider at the generation of that answer, so the verify's listing
        tells which providers moved (a write that landed but whose answer
        was lost, or someone else's) and only those are read again: a
        recovery costs what a verify costs, not a re-read of the tree.
        """
        self.verified_at = self.due_at = None

    def invalidate(self) -> None:
        """Forget the cache: the next sync re-reads the whole tree."""
        self.providers = None
        self.partial.clear()

    # -- providers

    @property
    def held(self) -> dict[str, ProviderState]:
        """The cache, while a sync writes: the syncer reads before it writes."""
        if self.providers is None:
            raise RuntimeError("no provider cache: the tree is read before it is written")
        return self.providers

    def copy(self) -> Optional[dict[str, ProviderState]]:
        return None if self.providers is None else dict(self.providers)

    def fresh(self, uuid: str, generation: int) -> Optional[ProviderState]:
        """The cached provider when the listing shows it unchanged (same
        generation, read whole), else None: read it again."""
        known = (self.providers or {}).get(uuid)
        if known is None or known.generation != generation or uuid in self.partial:
            return None
        return known

    def note_generation(self, uuid: str, inventories_at: int, traits_at: int) -> None:
        """A full read is consistent only if both parts were read at one
        generation; otherwise the next verify reads the provider again."""
        if inventories_at != traits_at:
            self.partial.add(uuid)
        else:
            self.partial.discard(uuid)

    def mark_if_moved(self, uuid: str, generation: int) -> None:
        """A part of the record read at ``generation``: partial if it moved."""
        if generation != self.held[uuid].generation:
            self.partial.add(uuid)

    def known_inventories(self) -> dict[str, tuple[int, dict]]:
        """uuid -> (generation, inventories) of the providers whose
        inventories were read at their cached generation."""
        return {
            uuid: (state.generation, dict(state.inventories))
            for uuid, state in (self.providers or {}).items()
            if uuid not in self.partial
        }

    def note_inventories(self, inventories_by_uuid: Mapping[str, Mapping]) -> None:
        """Someone else (the reshape) set these providers' inventories.

        The cache takes them, so an unchanged tree costs nothing next sync.
        The cached generations are now old: a later write gets a 409 and
        re-reads that provider, as after any concurrent change.
        """
        if self.providers is None:
            return
        for uuid, inventories in inventories_by_uuid.items():
            if uuid in self.providers:
                self.providers[uuid] = replace(self.providers[uuid], inventories=dict(inventories))

    # -- as plain data

    def export(self) -> Optional[dict]:
        """The cache as JSON-able data (each provider's uuid, name,
        generation, parent, inventories and traits) with ``verified_at``,
        the syncer's clock at its last full read; None when it has none."""
        if self.providers is None or self.verified_at is None:
            return None
        return {
            "verified_at": self.verified_at,
            # A partly known provider is exported with no usable
            # generation, so the importer reads it at its next verify.
            "providers": [
                {
                    "uuid": s.uuid,
                    "name": s.name,
                    "generation": -1 if s.uuid in self.partial else s.generation,
                    "parent_uuid": s.parent_uuid,
                    "inventories": {rc: dict(inv) for rc, inv in s.inventories.items()},
                    "traits": sorted(s.traits),
                    "aggregates": None if s.aggregates is None else sorted(s.aggregates),
                }
                for s in self.providers.values()
            ],
        }

    def load(
        self,
        data: Optional[Mapping],
        clock: Callable[[], float],
        interval: float,
        verify_now: bool = False,
    ) -> bool:
        """Take over what :meth:`export` gave; False (and no cache) when
        ``data`` is None or malformed. The full verify is due ``interval``
        after ``verified_at`` (a time ahead of ``clock`` counts as now), or
        at the next read with ``verify_now``."""
        self.providers = self.verified_at = self.due_at = None
        self.partial.clear()
        if data is None:
            return False
        try:
            cache = {
                p["uuid"]: ProviderState(
                    str(p["uuid"]),
                    str(p["name"]),
                    int(p["generation"]),
                    p["parent_uuid"],
                    {rc: dict(inv) for rc, inv in p["inventories"].items()},
                    frozenset(p["traits"]),
                    None if p.get("aggregates") is None else frozenset(p["aggregates"]),
                )
                for p in data["providers"]
            }
            verified_at = min(float(data["verified_at"]), clock())
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            LOG.warning("ignoring a malformed provider cache (%s); the tree will be read", exc)
            return False
        self.providers, self.verified_at = cache, verified_at
        self.due_at = None if verify_now else verified_at + interval
        return True
