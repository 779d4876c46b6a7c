"""The provider tree the agent wants Placement to hold, as plain immutable data.

A tree is a tuple of providers, parents before children. Each provider says
which traits the agent decides about (``traits``: trait -> wanted?), so a
sync never touches a trait it has no opinion on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Optional


@dataclass(frozen=True)
class Inventory:
    total: int
    reserved: int = 0
    min_unit: int = 1
    max_unit: Optional[int] = None  # None means "= total"
    step_size: int = 1
    allocation_ratio: float = 1.0

    def as_placement(self) -> dict:
        """The record as Placement's inventory API spells it."""
        return {
            "total": self.total,
            "reserved": self.reserved,
            "min_unit": self.min_unit,
            "max_unit": self.total if self.max_unit is None else self.max_unit,
            "step_size": self.step_size,
            "allocation_ratio": float(self.allocation_ratio),
        }


@dataclass(frozen=True)
class Provider:
    name: str
    parent: Optional[str] = None  # parent's name; None for the root
    uuid: Optional[str] = None
    inventories: Mapping[str, Inventory] = field(default_factory=dict)
    # trait -> True (the agent wants it) / False (the agent wants it gone).
    # Traits absent from this map belong to someone else and are left alone.
    traits: Mapping[str, bool] = field(default_factory=dict)

    @property
    def wanted_traits(self) -> frozenset[str]:
        return frozenset(t for t, on in self.traits.items() if on)


@dataclass(frozen=True)
class ProviderTree:
    providers: tuple[Provider, ...]

    @property
    def root(self) -> Provider:
        return self.providers[0]

    def by_name(self, name: str) -> Optional[Provider]:
        for provider in self.providers:
            if provider.name == name:
                return provider
        return None

    def names(self) -> list[str]:
        return [p.name for p in self.providers]

    def with_uuids(self, uuids: Mapping[str, str]) -> "ProviderTree":
        return ProviderTree(tuple(
            replace(p, uuid=uuids.get(p.name, p.uuid)) for p in self.providers))
