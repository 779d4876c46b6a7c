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
    # nova's ratio rule (ComputeDriver._get_allocation_ratios): True when
    # allocation_ratio is only the initial_*_allocation_ratio, which applies
    # when the class is new on the provider; once Placement has the class,
    # its ratio is kept, because operators manage ratios through the API.
    keep_placement_ratio: bool = False
    # (consumer uuid, units) that running guests hold on the host itself,
    # whether or not Placement has an allocation for them (a PCI device
    # passed through): the sync reserves what no allocation of this class
    # to that consumer covers (node_agent.tree.pci_placement.at_guest_holds).
    guest_held: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_placement(cls, record) -> "Inventory":
        """A record as Placement's inventory API spells it."""
        return cls(
            total=record["total"],
            reserved=record.get("reserved", 0),
            min_unit=record.get("min_unit", 1),
            max_unit=record.get("max_unit"),
            step_size=record.get("step_size", 1),
            allocation_ratio=record.get("allocation_ratio", 1.0),
        )

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


def placement_inventories(
    inventories: Mapping[str, Inventory], current: Optional[Mapping[str, Mapping]] = None
) -> dict[str, dict]:
    """``inventories`` as Placement's API spells them, given what Placement
    holds now (``current``, class -> record): a class whose ratio is only the
    initial one keeps the ratio Placement already has."""
    return {rc: inv.as_placement() for rc, inv in with_held_ratios(inventories, current).items()}


def with_held_ratios(
    inventories: Mapping[str, Inventory], held: Optional[Mapping[str, Mapping]]
) -> dict[str, Inventory]:
    """``inventories`` with the ratio Placement holds (``held``, class ->
    record) wherever nova's rule keeps it: what would be published."""
    out = dict(inventories)
    for rc, inv in inventories.items():
        record = (held or {}).get(rc)
        if inv.keep_placement_ratio and record and record.get("allocation_ratio") is not None:
            out[rc] = replace(inv, allocation_ratio=float(record["allocation_ratio"]))
    return out


@dataclass(frozen=True)
class Provider:
    name: str
    parent: Optional[str] = None  # parent's name; None for the root
    uuid: Optional[str] = None
    inventories: Mapping[str, Inventory] = field(default_factory=dict)
    # trait -> True (the agent wants it) / False (the agent wants it gone).
    # Traits absent from this map belong to someone else and are left alone.
    traits: Mapping[str, bool] = field(default_factory=dict)
    # Aggregate uuids the agent wants this provider in ([placement]
    # aggregates, on the root); others' aggregates are left alone.
    aggregates: frozenset[str] = frozenset()

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
        return ProviderTree(
            tuple(replace(p, uuid=uuids.get(p.name, p.uuid)) for p in self.providers)
        )

    def placed(self, uuids: Mapping[str, str]) -> "PlacedTree":
        """:meth:`with_uuids`, checked: every provider must then have one."""
        return PlacedTree(self.with_uuids(uuids).providers)


@dataclass(frozen=True)
class PlacedTree(ProviderTree):
    """A tree whose every provider has its uuid: what is planned against
    and sent to Placement. The desired tree is built without uuids (they
    come from Placement, the state file, or are made up for new providers);
    this type says where they are known."""

    def __post_init__(self) -> None:
        missing = [p.name for p in self.providers if not p.uuid]
        if missing:
            raise ValueError(f"providers without uuid: {', '.join(missing)}")

    @classmethod
    def of(cls, tree: ProviderTree) -> "PlacedTree":
        return tree if isinstance(tree, PlacedTree) else cls(tree.providers)

    @property
    def root_uuid(self) -> str:
        return self.uuid(self.root)

    def uuid(self, provider: Provider) -> str:
        """The uuid of ``provider``, one of this tree's."""
        if not provider.uuid:
            raise ValueError(f"provider {provider.name} is not in this tree")
        return provider.uuid

    def parent_uuid(self, provider: Provider) -> Optional[str]:
        """The uuid of ``provider``'s parent; None for the root."""
        if provider.parent is None:
            return None
        parent = self.by_name(provider.parent)
        if parent is None:
            raise ValueError(f"{provider.name}: parent {provider.parent} is not in the tree")
        return self.uuid(parent)
