"""Which consumers on this host are a local guest's migration record. Pure.

When nova moves an instance off a host (resize, cold or live migration) it
moves the instance's allocation on the source to a new consumer, the
migration's uuid (``SchedulerReportClient.move_allocations``), and claims
for the instance on the destination. Until the move is confirmed the
source keeps the guest's domain and the migration consumer keeps its CPUs.
nova's PCPU reshape moves those records with their instances
(``_update_provider_tree_for_pcpu``), reading them from its database.

The agent has no database. nova does not type the consumer in Placement
(no ``consumer_type``: ``UNKNOWN`` at 1.38), so a record is taken for a
guest's migration when all of these hold:

* the guest's domain is on this host and its own uuid holds nothing on
  this host's providers (its allocation went with it);
* the consumer is not a guest of this host and is not typed ``INSTANCE``;
* it has the guest's owner (nova writes ``<nova:owner>``: project and user);
* it holds on this host what the guest's flavor holds: its CPUs (VCPU +
  PCPU, as nova claims them for the flavor) and its memory.

One consumer matching several guests is a migration of any of them; the
caller decides what that means (the reshape moves it only when every
guest it matches is dedicated).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from node_agent.model.snapshot import Guest
from node_agent.policy.guest_cpu import classify

INSTANCE = "INSTANCE"
CPU = ("VCPU", "PCPU")


def _id(value: object) -> str:
    """Keystone ids as Placement and the domain XML may spell them."""
    return str(value or "").replace("-", "").lower()


def _owner(guest: Guest) -> tuple[str, str]:
    meta = dict(guest.metadata)
    return _id(meta.get("owner:project")), _id(meta.get("owner:user"))


def away(guests: Iterable[Guest], here: Iterable[str]) -> list[Guest]:
    """Guests of this host whose own uuid holds nothing here (``here``: the
    consumers on this host's providers), with an owner to match on."""
    held = set(here)
    return [g for g in guests if g.uuid not in held and all(_owner(g))]


def _on_host(record: Mapping, host: frozenset[str]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for provider, entry in (record.get("allocations") or {}).items():
        if provider in host:
            resources = entry.get("resources", entry) if isinstance(entry, Mapping) else {}
            for rc, amount in resources.items():
                totals[rc] = totals.get(rc, 0) + int(amount)
    return totals


def fits(guest: Guest, held: Mapping[str, int]) -> bool:
    """``held`` (class -> amount on this host) is the size of ``guest``: its
    vCPUs (as claimed before the PCPU upgrade) or what nova claims for its
    flavor now (an isolated emulator's PCPU, a ``resources:`` override)."""
    cpus = sum(int(held.get(rc, 0)) for rc in CPU)
    cpu = classify(guest)
    return (
        cpus in (guest.vcpus, cpu.vcpu + cpu.pcpu)
        and int(held.get("MEMORY_MB", 0)) == guest.memory_kb // 1024
    )


def candidates(guests: Iterable[Guest], by_consumer: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Consumers that may be a migration record, judged from a provider
    view alone (consumer -> class -> amount on this host): not a guest of
    this host, and the size of a guest that holds nothing here. Only these
    need their owner read."""
    guests = list(guests)
    local = {g.uuid for g in guests}
    gone = away(guests, by_consumer)
    return sorted(
        c for c, held in by_consumer.items() if c not in local and any(fits(g, held) for g in gone)
    )


def match(
    guests: Iterable[Guest],
    records: Mapping[str, Mapping],
    host_providers: Iterable[str],
    here: Iterable[str],
) -> dict[str, list[Guest]]:
    """consumer -> the local guests it is a migration record of.

    ``records``: consumer -> body of ``GET /allocations/{consumer}`` (or a
    reshape engine's record: ``allocations`` by provider, ``project_id``,
    ``user_id``, ``consumer_type``) for consumers on this host that are not
    local guests. ``host_providers``: this host's tree; ``here``: every
    consumer holding something on it."""
    guests = list(guests)
    host = frozenset(host_providers)
    gone = away(guests, here)
    return _matching(
        guests,
        records,
        lambda owner, record: [
            g for g in gone if _owner(g) == owner and fits(g, _on_host(record, host))
        ],
    )


def _matching(guests: list[Guest], records: Mapping[str, Mapping], guests_of) -> dict:
    """consumer -> ``guests_of(owner, record)`` when not empty, for the
    records that may be a migration: not a local guest, not an instance."""
    local = {g.uuid for g in guests}
    found: dict[str, list[Guest]] = {}
    for consumer, record in sorted(records.items()):
        if consumer in local or (record.get("consumer_type") or "").upper() == INSTANCE:
            continue
        matched = guests_of((_id(record.get("project_id")), _id(record.get("user_id"))), record)
        if matched:
            found[consumer] = matched
    return found


def resize_sources(
    guests: Iterable[Guest], records: Mapping[str, Mapping], here: Iterable[str]
) -> dict[str, list[Guest]]:
    """consumer -> the local guests it may be the source half of a
    same-host resize of.

    nova resizing a guest onto its own host moves the old flavor's
    allocation to the migration's uuid and claims the new flavor for the
    guest here too, until the resize is confirmed (maybe never:
    ``resize_confirm_window`` is 0 by default). The domain then describes
    the new flavor only, so the old size cannot be checked: the owner alone
    matches. Weaker than :func:`match`, so only the audit uses it (as in
    flight, up to its grace); the reshape never moves a consumer on it."""
    guests, held = list(guests), set(here)
    staying = [g for g in guests if g.uuid in held and all(_owner(g))]
    return _matching(
        guests, records, lambda owner, _record: [g for g in staying if _owner(g) == owner]
    )
