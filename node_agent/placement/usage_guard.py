"""The usage guard: what an inventory change does to capacity allocations hold.

Placement takes an inventory whose capacity is below what is allocated (it
logs it, and refuses new claims that do not fit); it refuses only to
*delete* a class that allocations hold (409 ``inventory.inuse``). nova's
resource tracker writes such a cut whatever the usage, and so does the
agent: a lower ratio, a raised ``reserved``, fewer CPUs or pages are
published, so no new claim lands until usage falls, and the cut is
reported (:class:`Cut`) with the consumers holding it. Only a class the
new tree no longer has, while in use, keeps Placement's record and is an
error, with what the operator can do. Used by
:class:`node_agent.placement.sync.TreeSyncer` before every inventory PUT
that lowers capacity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from node_agent.placement.planner import capacity

# What an operator can do when a resource class is still in use.
_IN_USE_HINT = {
    "VCPU": "or keep those CPUs in cpu_shared_set",
    "PCPU": "or keep those CPUs in cpu_dedicated_set",
    "MEMORY_MB": "or lower reserved_host_memory_mb / keep the huge pages",
    "MEM_ENCRYPTION_CONTEXT": "or let nova 34 move it to the <host>_amd_sev child "
    "(nova before 2025.2 left it on the root; the agent does "
    "not move allocations of it)",
}


def _in_use_message(rc: str, provider: str, used: int) -> str:
    hint = _IN_USE_HINT.get(rc, "or restore that inventory")
    return (
        f"cannot lower {rc} on {provider} to capacity 0 (the class would be "
        f"removed, which Placement refuses while it is allocated): {used} {rc} "
        f"in use; kept as Placement holds it; migrate or delete instances using "
        f"{used} {rc}, {hint}"
    )


@dataclass(frozen=True)
class Cut:
    """A capacity cut published below usage: ``used - capacity`` units of
    ``rc`` on ``provider`` are allocated beyond the new capacity, so no new
    claim of it fits until that many are freed. ``holders``: who holds it
    (consumer, guest name or None, amount), when read."""

    provider: str
    uuid: str
    rc: str
    used: int
    capacity: int
    old_capacity: int
    holders: tuple[tuple[str, Optional[str], int], ...] = field(default=())

    @property
    def over(self) -> int:
        return self.used - self.capacity

    def __str__(self) -> str:
        text = (
            f"{self.rc} on {self.provider}: capacity {self.capacity} "
            f"(was {self.old_capacity}) below the {self.used} in use, {self.over} over; "
            f"no new {self.rc} claim fits until {self.over} are freed"
        )
        if self.holders:
            text += "; held by " + ", ".join(
                (
                    f"guest {guest} ({consumer})"
                    if guest
                    else f"consumer {consumer} (not a guest of this host)"
                )
                + f" {n}"
                for consumer, guest, n in self.holders
            )
        return text

    def as_dict(self) -> dict:
        return {
            "provider": self.provider,
            "uuid": self.uuid,
            "class": self.rc,
            "used": self.used,
            "capacity": self.capacity,
            "old_capacity": self.old_capacity,
            "over": self.over,
            "holders": [{"consumer": c, "guest": g, "amount": n} for c, g, n in self.holders],
        }


def _is_closed(record: Mapping) -> bool:
    return record["reserved"] >= record["total"]


def lowers(old: Mapping, new: Mapping) -> bool:
    """Whether a PUT of ``new`` over ``old`` removes a class or lowers a
    capacity that is not being closed on purpose (``reserved = total``:
    maintenance, or the invariant's closing): those need the usages read,
    to hold a removal in use and to report a cut below usage."""
    return any(
        rc not in new or (not _is_closed(new[rc]) and capacity(new[rc]) < capacity(old[rc]))
        for rc in old
    )


def cuts(
    provider: str,
    uuid: str,
    old: Mapping[str, Mapping],
    new: Mapping[str, Mapping],
    usages: Optional[Mapping[str, int]],
) -> list[Cut]:
    """The cuts below usage a PUT of ``new`` over ``old`` publishes (pure).
    A record closed on purpose (``reserved >= total``) is not a cut: it is
    reported as maintenance or as the invariant's closing."""
    found = []
    for rc, record in sorted(new.items()):
        used = (usages or {}).get(rc, 0)
        if rc not in old or not used or _is_closed(record):
            continue
        now = capacity(record)
        if now < used and now < capacity(old[rc]):
            found.append(Cut(provider, uuid, rc, used, now, capacity(old[rc])))
    return found


@dataclass(frozen=True)
class Guarded:
    """What the guard lets a PUT write: the inventories, the errors for
    classes held back, and the generation to PUT with."""

    inventories: dict
    errors: list
    generation: int


class UsageGuard:
    """The guard over one Placement client (its ``usages`` read)."""

    def __init__(self, client):
        self.client = client

    def usages(self, uuid: str) -> dict[str, int]:
        """One provider's usages, by class."""
        return self._usages(uuid)[0]

    def _usages(self, uuid: str) -> tuple[dict[str, int], int]:
        """Usages and the provider generation they were read at."""
        body = self.client.usages(uuid)
        return body["usages"], body["resource_provider_generation"]

    @staticmethod
    def _removed_in_use(
        usages: Mapping[str, int], wanted: Mapping[str, Mapping], current: Mapping[str, Mapping]
    ) -> dict[str, int]:
        """rc -> used, for classes the change would remove while allocated."""
        return {
            rc: used for rc, used in usages.items() if used and rc in current and rc not in wanted
        }

    def guard(self, change, state, wanted_all, closed=(), usages_into=None) -> Guarded:
        """What to PUT. A change that lowers capacity (:func:`lowers`) reads
        the usages first; that read also gives a fresh generation, so an
        allocation made since the last cycle costs no 409. A class the
        change would remove while allocated keeps Placement's record
        (Placement would refuse the whole PUT: 409 inventory.inuse), closed
        when every wanted record is closed (maintenance): see
        :func:`_held_record`. Every other cut is written as wanted, below
        usage or not; :func:`cuts` says which. ``closed`` is kept for
        callers: classes the invariant closes are never removed, so never
        held."""
        if not lowers(state.inventories, wanted_all):
            return Guarded(dict(wanted_all), [], state.generation)
        usages, generation = self._usages(state.uuid)
        if usages_into is not None:
            usages_into[state.uuid] = usages
        removed = self._removed_in_use(usages, wanted_all, state.inventories)
        wanted = dict(wanted_all)
        # Every wanted record closed (maintenance): a class the change would
        # remove but usage keeps is closed too.
        closing = bool(wanted_all) and all(_is_closed(r) for r in wanted_all.values())
        for rc in removed:
            wanted[rc] = _held_record(state.inventories[rc], closing)
        return Guarded(
            wanted,
            [_in_use_message(rc, change.provider, used) for rc, used in sorted(removed.items())],
            generation,
        )

    def in_use_errors(self, change, state, wanted_all) -> list[str]:
        """After a 409 inventory.inuse: which classes the PUT would have removed."""
        removed = self._removed_in_use(self._usages(state.uuid)[0], wanted_all, state.inventories)
        return [
            _in_use_message(rc, change.provider, used) for rc, used in sorted(removed.items())
        ] or [f"{change.summary}: Placement reports inventory in use"]


def _held_record(current: Mapping, closing: bool = False) -> Mapping:
    """The record a class keeps when Placement would refuse its removal:
    Placement's current one, closed (``reserved = total``) when the class
    would be removed from a provider whose every wanted record is closed
    (``closing``). Maintenance closes every class whatever the usage, and
    raising ``reserved`` never touches an allocation."""
    if closing:
        return {**current, "reserved": current["total"]}
    return current
