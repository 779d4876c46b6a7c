"""The usage guard: an inventory change never takes capacity that
allocations hold. A shrink reads its provider's usages first; a class whose
usage exceeds the new capacity keeps Placement's record and is reported with
what the operator can do. Used by :class:`node_agent.placement.sync.TreeSyncer`
before every inventory PUT that shrinks."""

from __future__ import annotations

from typing import Mapping, Optional

from node_agent.placement.planner import capacity, guarded_capacity

# What an operator can do when a resource class is still in use.
_IN_USE_HINT = {
    "VCPU": "or keep those CPUs in cpu_shared_set",
    "PCPU": "or keep those CPUs in cpu_dedicated_set",
    "MEMORY_MB": "or lower reserved_host_memory_mb / keep the huge pages",
    "MEM_ENCRYPTION_CONTEXT": "or let nova 34 move it to the <host>_amd_sev child "
                              "(nova before 2025.2 left it on the root; the agent does "
                              "not move allocations of it)",
}


def _in_use_message(rc: str, provider: str, used: int, new_cap: int) -> str:
    hint = _IN_USE_HINT.get(rc, "or restore that inventory")
    return (f"cannot lower {rc} on {provider} to capacity {new_cap}: "
            f"{used} {rc} in use; migrate or delete instances using "
            f"{used} {rc}, {hint}")


class UsageGuard:
    """The guard over one Placement client (its ``usages`` read)."""

    def __init__(self, client):
        self.client = client

    def usages(self, uuid: str) -> dict[str, int]:
        """One provider's usages, by class."""
        return self._usages(uuid)[0]

    def _shrinks(self, old: Mapping, new: Mapping) -> bool:
        return any(rc not in new or guarded_capacity(old[rc], new[rc]) < capacity(old[rc])
                   for rc in old)

    def _usages(self, uuid: str) -> tuple[dict[str, int], int]:
        """Usages and the provider generation they were read at."""
        body = self.client.usages(uuid)
        return body["usages"], body["resource_provider_generation"]

    def _over_used(self, usages: Mapping[str, int], wanted: Mapping[str, Mapping],
                   current: Mapping[str, Mapping]) -> dict[str, tuple[int, int]]:
        """rc -> (used, new capacity) for classes the change would starve."""
        over = {}
        for rc, used in usages.items():
            new_cap = guarded_capacity(current.get(rc), wanted[rc]) if rc in wanted else 0
            if used and used > new_cap:
                over[rc] = (used, new_cap)
        return over

    def guard(self, change, state, wanted_all, closed=(), usages_into=None):
        """(inventories to PUT, errors, generation to PUT with). A shrink reads
        the usages first; that read also gives a fresh generation, so an
        allocation made since the last cycle costs no 409. Classes in
        ``closed`` are fully reserved on purpose (capacity invariant) and
        not held back. A held class whose wanted record is closed
        (maintenance) is held closed: see :func:`_held_record`."""
        if not self._shrinks(state.inventories, wanted_all):
            return wanted_all, [], state.generation
        usages, generation = self._usages(state.uuid)
        if usages_into is not None:
            usages_into[state.uuid] = usages
        over = {rc: v for rc, v in self._over_used(usages, wanted_all,
                                                   state.inventories).items()
                if rc not in closed}
        wanted = dict(wanted_all)
        # Every wanted record closed (maintenance): a class the change would
        # remove but usage keeps is closed too.
        closing = bool(wanted_all) and all(_is_closed(r) for r in wanted_all.values())
        for rc in over:
            if rc in state.inventories:
                wanted[rc] = _held_record(state.inventories[rc], wanted_all.get(rc), closing)
        return wanted, [_in_use_message(rc, change.provider, used, cap)
                        for rc, (used, cap) in sorted(over.items())], generation

    def in_use_errors(self, change, state, wanted_all) -> list[str]:
        over = self._over_used(self._usages(state.uuid)[0], wanted_all, state.inventories)
        return [_in_use_message(rc, change.provider, used, cap)
                for rc, (used, cap) in sorted(over.items())] or [
            f"{change.summary}: Placement reports inventory in use"]


def _is_closed(record: Mapping) -> bool:
    return record["reserved"] >= record["total"]


def _held_record(current: Mapping, wanted: Optional[Mapping], closing: bool = False) -> Mapping:
    """The record a class keeps when usage blocks its change: Placement's
    current one, closed (``reserved = total``) when the wanted record is
    closed, or when the class would be removed from a provider whose every
    wanted record is closed (``closing``). Maintenance closes every class
    whatever the usage, and raising ``reserved`` never touches an
    allocation."""
    if closing or (wanted is not None and _is_closed(wanted)):
        return {**current, "reserved": current["total"]}
    return current
