"""Shared storage declared, not multiplied (pure).

``[compute] shared_storage_aggregate`` says that ``instances_path`` is one
filesystem several hosts mount, and names the aggregate of those hosts.
Placement's model for this is a sharing provider: a provider of its own
(no parent) that holds the filesystem's DISK_GB, carries the trait
``MISC_SHARES_VIA_AGGREGATE`` and is a member of the aggregate; every host's
root joins the aggregate and reports no DISK_GB of its own. Allocation
candidates then offer the filesystem once, whichever host asks.

One writer, without a race between the hosts: the sharing provider's uuid
is derived from the aggregate's (:func:`provider_uuid`), so every host
names the same provider. Two first creates collide in Placement (409, the
uuid or the name exists) and the loser reads what the winner wrote; every
write after that carries the provider's generation.

Every host measures the same filesystem, but not at the same moment nor
with the same reservation: when the size a host measures differs from the
one Placement holds, the smaller one is written (:func:`total_to_write`),
with the larger reservation and the smaller ratio (:func:`record_to_write`):
two hosts never overstate the filesystem, never undo each other's write in
turn, and a host never grows it past what another host saw. A filesystem
that grew is published larger once an operator sets the sharing provider's
inventory by hand (or deletes it while nothing is allocated).

Where this host's DISK_GB is, Placement says, not the state file: a root
that joined an aggregate whose sharing provider (the derived uuid, with the
trait) exists while the option names another aggregate, or none, has its
consumers' DISK_GB moved from there (:func:`former_providers`): to the
sharing provider the option names now, or back to the root.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Iterable, Mapping, Optional

from node_agent.model.provider_tree import Inventory, Provider

TRAIT = "MISC_SHARES_VIA_AGGREGATE"
DISK_GB = "DISK_GB"
# A fixed namespace: the same aggregate gives the same provider uuid on
# every host and every release. Changing it orphans every sharing provider.
NAMESPACE = uuidlib.UUID("6f1b7b0e-4f3c-5a8e-9d2b-3c4e5f6a7b8c")


def provider_uuid(aggregate: str) -> str:
    """The sharing provider of ``aggregate``: uuid5 of the aggregate's uuid."""
    return str(uuidlib.uuid5(NAMESPACE, str(uuidlib.UUID(aggregate))))


def provider_name(aggregate: str) -> str:
    return f"shared_storage_{uuidlib.UUID(aggregate)}"


def total_to_write(measured: int, held: Optional[int]) -> int:
    """The DISK_GB total to publish: what this host measured, or what
    Placement holds when that is smaller (``held`` None: nothing yet)."""
    return measured if held is None else min(measured, held)


def record_to_write(measured: Mapping, held: Optional[Mapping]) -> dict:
    """The DISK_GB record to publish, from this host's (``measured``, as
    Placement spells it) and the one Placement holds (None: none yet)."""
    if held is None:
        return dict(measured)
    total = total_to_write(int(measured["total"]), int(held["total"]))
    return {
        **measured,
        "total": total,
        "reserved": max(int(measured["reserved"]), int(held.get("reserved", 0))),
        "max_unit": min(int(measured["max_unit"]), total),
        "allocation_ratio": min(
            float(measured["allocation_ratio"]), float(held.get("allocation_ratio", 1.0))
        ),
    }


def sharing_provider(aggregate: str, disk: Inventory) -> Provider:
    """The sharing provider as this host would publish it."""
    return Provider(
        provider_name(aggregate),
        uuid=provider_uuid(aggregate),
        inventories={DISK_GB: disk},
        traits={TRAIT: True},
        aggregates=frozenset({str(uuidlib.UUID(aggregate))}),
    )


def held_disk(inventories: dict) -> Optional[int]:
    """The DISK_GB total Placement holds on the sharing provider."""
    record = inventories.get(DISK_GB)
    return None if record is None else int(record["total"])


def former_providers(root_aggregates: Iterable[str], wanted: Optional[str]) -> dict[str, str]:
    """uuid -> aggregate of the sharing providers the root's aggregates
    (as Placement holds them) may name, other than ``wanted`` (the uuid of
    the one the option names; None without the option). Which of them exist
    and carry :data:`TRAIT` is Placement's to say."""
    found = {provider_uuid(a): str(uuidlib.UUID(a)) for a in root_aggregates if _is_uuid(a)}
    found.pop(wanted or "", None)
    return found


def _is_uuid(value: str) -> bool:
    try:
        uuidlib.UUID(value)
    except ValueError:
        return False
    return True


def report(
    aggregate: Optional[str],
    disk_gb: Optional[int],
    moved: bool,
    moved_from: Optional[Mapping[str, str]] = None,
) -> Optional[dict]:
    """What ``--once``, ``--dry-run``, ``status`` and the metrics show of
    shared storage; None without the option and nothing to move back.
    ``aggregate``: the option's (None: removed); ``disk_gb``: the sharing
    provider's DISK_GB total as Placement holds it after the cycle (or would);
    ``moved``: this host's DISK_GB is where the option says (the sharing
    provider, or the root without the option) and the root offers it once;
    ``moved_from``: uuid -> aggregate of the sharing providers this cycle
    moves (or would move) this host's consumers from."""
    moved_from = moved_from or {}
    if aggregate is None and not moved_from:
        return None
    former = [
        {"aggregate": a, "provider": provider_name(a), "uuid": u}
        for u, a in sorted(moved_from.items(), key=lambda item: item[1])
    ]
    where = "the root" if aggregate is None else provider_name(aggregate)
    lines = []
    if aggregate is not None:
        size = "no DISK_GB yet" if disk_gb is None else f"DISK_GB {disk_gb}"
        lines.append(
            f"aggregate {aggregate}: sharing provider {provider_name(aggregate)} "
            f"[{provider_uuid(aggregate)}], {size}"
        )
    for f in former:
        lines.append(
            f"this host's DISK_GB {'moved' if moved else 'to move'} from {f['provider']} "
            f"[{f['uuid']}] to {where}"
        )
    lines.append(
        f"this host's DISK_GB is on {where}"
        if moved
        else f"this host's DISK_GB is not on {where} yet (see Reshape and Errors)"
    )
    return {
        "aggregate": aggregate,
        "provider": None if aggregate is None else provider_name(aggregate),
        "uuid": None if aggregate is None else provider_uuid(aggregate),
        "disk_gb": disk_gb,
        "moved": moved,
        "moved_from": former,
        "lines": lines,
    }
