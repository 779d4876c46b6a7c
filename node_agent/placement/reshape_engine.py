"""The reshape engine: which allocations move where, as one /reshaper body.

Pure. It takes what Placement shows for the providers the rule works on
(generation and each consumer's share of the provider), the full
allocations of the consumers that may move, the desired tree (uuids filled)
and a RULE, and returns a :class:`Reshape`: the exact ``POST /reshaper``
body (or None when nothing moves), the per-consumer moves for
``--dry-run``, warnings, and refusals (the reshape must not be sent).

A rule maps one allocation of one consumer on one provider to its new
place: ``rule(consumer_uuid, provider_uuid, resource_class, amount)`` ->
``[(provider_uuid, resource_class, amount), ...]``. Returning the input
unchanged means "stays". A rule also says where it works (see
:class:`~node_agent.placement.reshape_rules.RuleBase`): ``sources``, the
providers it moves allocations from, ``targets``, those it may move them
to, and ``classes``, the resource classes it moves. Only those providers are read and put in the body:
Placement's /reshaper replaces the inventories of the providers listed in
``inventories`` and leaves every other provider alone. Optional methods:
``refusals(moved, names)`` (reasons the moves of those consumers must not
happen) and ``unplaced(consumer, provider, rc, amount)`` (why an allocation
that has to move cannot be given a place; a refusal even when nothing else
moves), and ``emptied``, providers going away whose inventories the body
must clear even when no allocation moves (so the root never regains a class
while a child still offers it). The rules themselves, and
:func:`~node_agent.placement.reshape_rules.host_rule` that picks them for a
host, are in :mod:`node_agent.placement.reshape_rules`.

Only allocations on the rule's providers go through the rule; the rest of
a moved consumer (other providers, other classes) is carried over as is,
so the body replaces each consumer's allocations whole.

A plan too large for Placement to take in one go on a busy host (each
``POST /reshaper`` is refused when another write lands while Placement
processes it, and that takes a few milliseconds per consumer) can be sent in
stages (:func:`stage`): each moves some consumers whole, in one atomic
body, with inventories in between that hold what is allocated and offer
nothing more.

Why one module over 400 lines: the records, the engine and the body it
builds are one computation; the rules are already apart.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Optional, Sequence

from node_agent.model.provider_tree import Inventory, ProviderTree, placement_inventories

Place = tuple[str, str, int]  # (provider uuid, resource class, amount)
Rule = Callable[[str, str, str, int], Sequence[Place]]
# provider uuid -> resource class -> amount
Resources = Mapping[str, Mapping[str, int]]


@dataclass(frozen=True)
class ProviderAllocations:
    """``GET /resource_providers/{uuid}/allocations``: the provider's
    generation and every consumer's resources on it."""

    uuid: str
    generation: int
    consumers: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @classmethod
    def from_placement(cls, uuid: str, body: Mapping) -> "ProviderAllocations":
        return cls(
            uuid,
            body["resource_provider_generation"],
            {c: dict(a["resources"]) for c, a in body["allocations"].items()},
        )


@dataclass(frozen=True)
class Consumer:
    """``GET /allocations/{uuid}`` (microversion 1.28+): all of one consumer."""

    uuid: str
    generation: Optional[int]
    project_id: Optional[str]
    user_id: Optional[str]
    allocations: Resources
    consumer_type: Optional[str] = None  # only sent when set (1.38+)

    @classmethod
    def from_placement(cls, uuid: str, body: Mapping) -> "Consumer":
        return cls(
            uuid,
            body.get("consumer_generation"),
            body.get("project_id"),
            body.get("user_id"),
            {rp: dict(a["resources"]) for rp, a in body["allocations"].items()},
            body.get("consumer_type"),
        )

    def body(self, allocations: Resources) -> dict:
        """This consumer's entry of a /reshaper body with ``allocations``."""
        entry = {
            "allocations": {
                rp: {"resources": dict(res)} for rp, res in sorted(allocations.items()) if res
            },
            "project_id": self.project_id,
            "user_id": self.user_id,
            "consumer_generation": self.generation,
        }
        if self.consumer_type is not None:
            entry["consumer_type"] = self.consumer_type
        return entry


@dataclass(frozen=True)
class Move:
    consumer: str
    from_provider: str
    from_class: str
    to_provider: str
    to_class: str
    amount: int


@dataclass(frozen=True)
class Reshape:
    """The outcome of :func:`compute_reshape`.

    ``body`` is None when nothing moves. ``refusals`` non-empty means the
    body must not be sent. ``missing_inventories`` names providers whose
    current inventory the engine needs (to keep a class that unmoved
    consumers still use) but was not given; read them and compute again.
    """

    body: Optional[dict]
    moves: tuple[Move, ...] = ()
    warnings: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()
    missing_inventories: frozenset[str] = frozenset()
    provider_names: Mapping[str, str] = field(default_factory=dict)
    consumer_names: Mapping[str, str] = field(default_factory=dict)

    @property
    def needed(self) -> bool:
        return self.body is not None

    @property
    def moved_consumers(self) -> list[str]:
        return sorted({m.consumer for m in self.moves})

    def totals(self) -> dict:
        by_class: dict[str, int] = defaultdict(int)
        for m in self.moves:
            by_class[f"{m.from_class} -> {m.to_class}"] += m.amount
        return {"consumers": len(self.moved_consumers), "moved": dict(sorted(by_class.items()))}

    def as_dict(self) -> dict:
        """The ``reshape`` key of ``--dry-run`` output."""
        consumers = []
        for uuid in self.moved_consumers:
            consumers.append(
                {
                    "consumer": uuid,
                    "name": self.consumer_names.get(uuid),
                    "moves": [
                        {
                            "from_provider": self._rp(m.from_provider),
                            "from_class": m.from_class,
                            "to_provider": self._rp(m.to_provider),
                            "to_class": m.to_class,
                            "amount": m.amount,
                        }
                        for m in self.moves
                        if m.consumer == uuid
                    ],
                }
            )
        return {
            "consumers": consumers,
            "totals": self.totals(),
            "refused": list(self.refusals),
            "lines": self.lines(),
        }

    def lines(self) -> list[str]:
        out = [f"REFUSED: {r}" for r in self.refusals]
        if not self.moves and self.body is not None:
            return out + [
                "nothing to move; one POST /reshaper empties the children "
                "going away and sets the root's inventories"
            ]
        if not self.moves:
            return out + ["nothing to move: current allocations fit the desired tree"]
        for uuid in self.moved_consumers:
            name = self.consumer_names.get(uuid)
            label = f"{uuid} ({name})" if name else uuid
            parts = [
                f"{m.amount} {m.from_class}@{self._rp(m.from_provider)} -> "
                f"{m.to_class}@{self._rp(m.to_provider)}"
                for m in self.moves
                if m.consumer == uuid
            ]
            out.append(f"{label}: {', '.join(parts)}")
        totals = self.totals()
        moved = ", ".join(f"{n} {what}" for what, n in totals["moved"].items())
        out.append(f"total: {totals['consumers']} consumers; {moved}; one POST /reshaper")
        return out

    def _rp(self, uuid: str) -> str:
        return self.provider_names.get(uuid, uuid)


# ---------------------------------------------------------------- engine


def _host_part(allocations: Resources, host: set[str]) -> dict[str, dict[str, int]]:
    return {rp: dict(res) for rp, res in allocations.items() if rp in host and res}


def _apply_rule(
    consumer: str, host_part: Resources, rule: Rule
) -> tuple[dict[str, dict[str, int]], list[Move]]:
    new: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    moves = []
    for rp in sorted(host_part):
        for rc in sorted(host_part[rp]):
            amount = host_part[rp][rc]
            for to_rp, to_rc, to_amount in rule(consumer, rp, rc, amount):
                new[to_rp][to_rc] += to_amount
                if (to_rp, to_rc) != (rp, rc):
                    moves.append(Move(consumer, rp, rc, to_rp, to_rc, to_amount))
    return {rp: dict(res) for rp, res in new.items() if any(res.values())}, moves


def _view_moves(providers: Mapping[str, ProviderAllocations], rule: Rule) -> dict[str, list[Move]]:
    """consumer -> its moves, judged from the providers' view alone."""
    by_consumer: dict[str, dict[str, dict[str, int]]] = defaultdict(dict)
    for rp, state in providers.items():
        for consumer, res in state.consumers.items():
            by_consumer[consumer][rp] = dict(res)
    found = {}
    for consumer, part in by_consumer.items():
        _new, moves = _apply_rule(consumer, _host_part(part, set(providers)), rule)
        if moves:
            found[consumer] = moves
    return found


def affected_consumers(
    providers: Mapping[str, ProviderAllocations], rule: Rule, host: Iterable[str] = ()
) -> list[str]:
    """Consumers the rule would move, judged from the providers' view alone
    (so only those need a full ``GET /allocations/{consumer}``). ``host`` is
    accepted for older callers and ignored: the view is what counts."""
    return sorted(_view_moves(providers, rule))


def stale_consumers(
    providers: Mapping[str, ProviderAllocations],
    consumers: Mapping[str, Consumer],
    wanted: Iterable[str],
) -> set[str]:
    """The ``wanted`` consumers whose record (``GET /allocations/{consumer}``)
    is missing or disagrees with the providers' view: created, resized or
    moved since it was read, so it must be read again. The others' records
    still hold what the view shows."""
    stale = set()
    for consumer in wanted:
        record = consumers.get(consumer)
        if record is None or any(
            dict(record.allocations.get(rp, {})) != dict(state.consumers.get(consumer, {}))
            for rp, state in providers.items()
        ):
            stale.add(consumer)
    return stale


def move_targets(providers: Mapping[str, ProviderAllocations], rule: Rule) -> set[str]:
    """Providers the rule would move allocations onto (the shell reads those
    it has not read yet, and creates those Placement does not have)."""
    return {m.to_provider for moves in _view_moves(providers, rule).values() for m in moves}


def rule_sources(rule: Rule, tree: ProviderTree) -> list[str]:
    """The providers whose allocations a rule needs: its ``sources``, or
    every provider of ``tree`` with a uuid for a rule that does not say."""
    sources = getattr(rule, "sources", None)
    if sources is None:
        return [p.uuid for p in tree.providers if p.uuid]
    return sorted(sources)


def _capacity(record: Mapping) -> int:
    return int(
        (record["total"] - record.get("reserved", 0)) * float(record.get("allocation_ratio", 1.0))
    )


def _usage_after(
    providers: Mapping[str, ProviderAllocations],
    consumers: Mapping[str, Consumer],
    new_host: Mapping[str, Resources],
) -> dict:
    """rp -> rc -> consumer -> amount once the reshape is applied."""
    usage: dict = defaultdict(lambda: defaultdict(dict))
    for rp, state in providers.items():
        for consumer, res in state.consumers.items():
            if consumer in consumers:
                continue  # its full record is newer; counted below
            for rc, amount in res.items():
                usage[rp][rc][consumer] = amount
    for uuid, record in consumers.items():
        for rp, res in new_host.get(uuid, record.allocations).items():
            if rp in providers:
                for rc, amount in res.items():
                    usage[rp][rc][uuid] = amount
    return usage


def consumer_label(uuid: str, names: Mapping[str, str]) -> str:
    return f"{names[uuid]} ({uuid})" if uuid in names else uuid


def _unplaced(
    providers: Mapping[str, ProviderAllocations], rule: Rule
) -> tuple[list[str], set[str]]:
    """The rule's reasons why allocations that must move have no place, and
    the consumers concerned."""
    ask = getattr(rule, "unplaced", None)
    found: list[str] = []
    who: set[str] = set()
    if ask is None:
        return found, who
    for rp in sorted(providers):
        for consumer, res in sorted(providers[rp].consumers.items()):
            for rc, amount in sorted(res.items()):
                reasons = ask(consumer, rp, rc, amount)
                if reasons:
                    who.add(consumer)
                found += [r for r in reasons if r not in found]
    return found, who


def compute_reshape(
    providers: Mapping[str, ProviderAllocations],
    consumers: Mapping[str, Consumer],
    desired: ProviderTree,
    rule: Rule,
    *,
    current_inventories: Optional[Mapping[str, Mapping[str, dict]]] = None,
    consumer_names: Optional[Mapping[str, str]] = None,
) -> Reshape:
    """The /reshaper body that moves every allocation the rule moves.

    ``providers``: the providers the rule works on, as Placement shows them
    (its sources and the targets moves go to; a provider about to be
    created is an empty view with generation 0). ``consumers``: full records
    of (at least) the consumers :func:`affected_consumers` named. ``desired``
    gives the new inventories; the body carries an entry for each of its
    providers that is in ``providers`` -- and no other, so the rest of the
    tree is untouched. A class that consumers the rule does not move still
    use beyond its new capacity keeps its current record (from
    ``current_inventories``) and is reported as a warning; a class that moved
    allocations would overfill is a refusal, and so is every reason the
    rule's ``unplaced`` gives.

    Raises ValueError if a provider of ``providers`` is not in ``desired``,
    or when a move goes to a provider not in ``providers`` (read or create
    it first).
    """
    names = dict(consumer_names or {})
    rp_names = {p.uuid: p.name for p in desired.providers if p.uuid}
    unknown = sorted(set(providers) - set(rp_names))
    if unknown:
        raise ValueError(f"providers not in the desired tree: {', '.join(unknown)}")
    scope = set(providers)
    refusals, unplaced = _unplaced(providers, rule)

    new_allocations: dict[str, dict] = {}
    new_host: dict[str, Resources] = {}
    moves: list[Move] = []
    for uuid in sorted(consumers):
        consumer = consumers[uuid]
        part = _host_part(consumer.allocations, scope)
        new_part, consumer_moves = _apply_rule(uuid, part, rule)
        if new_part == part:
            continue
        others = {rp: res for rp, res in consumer.allocations.items() if rp not in scope}
        new_allocations[uuid] = {**others, **new_part}
        new_host[uuid] = new_part
        moves += consumer_moves
    if not moves and not set(getattr(rule, "emptied", ())) & scope:
        return Reshape(
            None,
            warnings=tuple(_orphan_warnings(providers, desired, names)),
            refusals=tuple(refusals),
            provider_names=rp_names,
            consumer_names=names,
        )

    absent = sorted({m.to_provider for m in moves} - scope)
    if absent:
        raise ValueError(
            "providers not in Placement yet: " + ", ".join(rp_names.get(u, u) for u in absent)
        )

    if new_allocations:
        refusals += getattr(rule, "refusals", lambda *_: [])(sorted(new_allocations), names)
    usage = _usage_after(providers, consumers, new_host)
    targets = {(m.to_provider, m.to_class) for m in moves}
    inventories, warnings, missing = {}, [], set()
    for provider in desired.providers:
        if provider.uuid not in scope:
            continue
        wanted = placement_inventories(
            provider.inventories, (current_inventories or {}).get(provider.uuid)
        )
        for rc, holders in sorted(usage.get(provider.uuid, {}).items()):
            used = sum(holders.values())
            cap = _capacity(wanted[rc]) if rc in wanted else 0
            if used <= cap:
                continue
            if (provider.uuid, rc) in targets:
                if unplaced & set(holders):
                    continue  # their real problem is already stated
                refusals.append(
                    _overfill(
                        provider.name,
                        rc,
                        used,
                        cap,
                        holders,
                        new_host,
                        names,
                        wanted[rc] if rc in wanted else None,
                    )
                )
                continue
            current = (current_inventories or {}).get(provider.uuid)
            if current is None:
                missing.add(provider.uuid)
            elif rc in current:
                wanted[rc] = dict(current[rc])
                warnings.append(_kept_warning(provider.name, rc, used, cap, holders, names))
        inventories[provider.uuid] = {
            "resource_provider_generation": providers[provider.uuid].generation,
            "inventories": wanted,
        }
    body = {
        "inventories": inventories,
        "allocations": {
            uuid: consumers[uuid].body(alloc) for uuid, alloc in sorted(new_allocations.items())
        },
    }
    return Reshape(
        body, tuple(moves), tuple(warnings), tuple(refusals), frozenset(missing), rp_names, names
    )


def _overfill(
    provider: str,
    rc: str,
    used: int,
    cap: int,
    holders: Mapping[str, int],
    new_host: Mapping[str, Resources],
    names: Mapping[str, str],
    record: Optional[Mapping] = None,
) -> str:
    moved = sorted(c for c in holders if c in new_host)
    who = ", ".join(f"{consumer_label(c, names)} {holders[c]}" for c in moved)
    if (
        record is not None
        and record["reserved"] >= record["total"]
        and used <= _capacity({**record, "reserved": 0})
    ):
        # Closed, not short: Placement moves no allocation onto a fully
        # reserved inventory, and opening it for the move would let the
        # scheduler in.
        return (
            f"{rc} on {provider} is fully reserved (reserved = total = "
            f"{record['total']}, as maintenance publishes it): Placement moves no "
            f"allocation onto a closed inventory, and the moved guests hold {used} "
            f"({who}). The layout change waits until `node-agent maintenance off` "
            f"(or the provider file that reserves it all is changed)."
        )
    return (
        f"{rc} on {provider} would need {used} but the new inventory holds "
        f"{cap}: moved guests {who}. Give the host more {rc} (for PCPU: more "
        f"CPUs in cpu_dedicated_set) or move those guests away first."
    )


def _kept_warning(
    provider: str,
    rc: str,
    used: int,
    cap: int,
    holders: Mapping[str, int],
    names: Mapping[str, str],
) -> str:
    """Why ``holders`` keep ``rc``, by what is true of each: a guest of this
    host (or its migration record) stays in ``rc`` by nova's rule; any other
    consumer has no guest here."""
    local = [f"{consumer_label(c, names)} {n}" for c, n in sorted(holders.items()) if c in names]
    other = [f"{c} {n}" for c, n in sorted(holders.items()) if c not in names]
    why = []
    if local:
        rule = (
            "only guests nova counts as dedicated move to PCPU; shared and mixed "
            "guests keep their VCPU, whatever their pins"
            if rc == "VCPU"
            else "nova's rule leaves them where they are"
        )
        why.append(f"guests of this host that stay in {rc} ({rule}): {', '.join(local)}")
    if other:
        why.append(f"consumers with no guest on this host: {', '.join(other)}")
    return (
        f"{used} {rc} on {provider} are held by consumers the reshape does not "
        f"move, above the new capacity {cap}: {'; '.join(why)}. {rc} inventory is "
        "kept as it is until they are gone."
    )


def _orphan_warnings(
    providers: Mapping[str, ProviderAllocations], desired: ProviderTree, names: Mapping[str, str]
) -> list[str]:
    """Without a reshape: allocations in classes the desired tree dropped."""
    warnings = []
    for provider in desired.providers:
        state = providers.get(provider.uuid) if provider.uuid else None
        if state is None:
            continue
        dropped: dict[str, dict[str, int]] = defaultdict(dict)
        for consumer, res in state.consumers.items():
            for rc, amount in res.items():
                if rc not in provider.inventories and amount:
                    dropped[rc][consumer] = amount
        for rc, holders in sorted(dropped.items()):
            warnings.append(
                _kept_warning(provider.name, rc, sum(holders.values()), 0, holders, names)
            )
    return warnings


def hold_inventories(
    tree: ProviderTree,
    current: Mapping[str, Mapping[str, dict]],
    classes: Iterable[str],
    providers: Optional[Iterable[str]] = None,
) -> ProviderTree:
    """``tree`` with ``classes`` kept as Placement has them now (``current``:
    provider uuid -> inventories), for a cycle whose reshape was refused: the
    rest of the tree still syncs, but the inventory of what the reshape
    would have moved must not change while the guests' allocations could
    not follow. Only ``providers`` (default: all) are held; one of them that
    is not in ``current`` (not created yet) gets none of ``classes``, so a
    new child does not offer again what the root still offers. When every
    inventory of ``tree`` is closed (maintenance), the held ones are closed
    too (``reserved = total``)."""
    classes = set(classes)
    held_uuids = None if providers is None else set(providers)
    # A tree with every inventory closed (maintenance) closes what it holds
    # too: maintenance holds whatever a refused reshape keeps.
    records = [inv for p in tree.providers for inv in p.inventories.values()]
    closing = bool(records) and all(inv.reserved >= inv.total for inv in records)
    out = []
    for provider in tree.providers:
        if held_uuids is not None and provider.uuid not in held_uuids:
            out.append(provider)
            continue
        now = current.get(provider.uuid, {}) if provider.uuid else {}
        held = {rc: rec for rc, rec in now.items() if rc in classes}
        inventories = {rc: inv for rc, inv in provider.inventories.items() if rc not in classes}
        for rc, rec in held.items():
            inventories[rc] = Inventory.from_placement(
                {**rec, "reserved": rec["total"]} if closing else rec
            )
        out.append(replace(provider, inventories=inventories))
    return ProviderTree(tuple(out))


# ---------------------------------------------------------------- stages


def _closed_at(record: Mapping, used: int) -> dict:
    """``record`` with reserved raised so that its capacity is ``used``:
    what consumers hold stays allocated, nothing more can be scheduled."""
    ratio = float(record.get("allocation_ratio", 1.0))
    units = math.ceil(used / ratio) if used > 0 else 0
    while int(units * ratio) < used:  # float rounding
        units += 1
    return {**record, "reserved": record["total"] - units}


def _usage_with(
    providers: Mapping[str, ProviderAllocations], body: Mapping, batch: Iterable[str]
) -> dict[str, dict[str, int]]:
    """rp -> rc -> amount held once the ``batch`` consumers of ``body`` moved."""
    usage: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for rp, state in providers.items():
        for res in state.consumers.values():
            for rc, amount in res.items():
                usage[rp][rc] += amount
    for consumer in batch:
        for rp, state in providers.items():
            for rc, amount in state.consumers.get(consumer, {}).items():
                usage[rp][rc] -= amount
        for rp, entry in body["allocations"][consumer]["allocations"].items():
            if rp in providers:
                for rc, amount in entry["resources"].items():
                    usage[rp][rc] += amount
    return usage


def stage(
    plan: Reshape,
    providers: Mapping[str, ProviderAllocations],
    current: Mapping[str, Mapping[str, Mapping]],
    batch: Iterable[str],
) -> Optional[Reshape]:
    """The part of ``plan`` that moves only the ``batch`` consumers, as a
    body of its own; ``plan`` itself when the batch is all of them.

    Each consumer in the batch moves whole and the others keep what they
    hold, so a stage is as atomic per consumer as the plan. In between, the
    classes the plan moves allocations from and to are published closed at
    what is allocated once the stage is in (reserved = total - used, from
    the new record, or the current one when the new one cannot hold that):
    the scheduler can place nothing new on them until the last stage sets
    the plan's inventories. Every other class keeps its record as
    ``current`` (provider uuid -> Placement's inventories) has it; a
    provider whose records do not change is left out of the body, so its
    generation is not checked. ``providers``: the view ``plan`` was computed
    from.

    None when the plan cannot be staged: a move that changes provider (the
    class would be offered on two levels in between), a provider not in
    ``current``, or a class neither record can hold.
    """
    batch = set(batch) & set(plan.moved_consumers)
    if plan.body is None or not batch:
        return None
    if batch == set(plan.moved_consumers):
        return plan
    if any(m.from_provider != m.to_provider for m in plan.moves):
        return None
    touched: dict[str, set[str]] = defaultdict(set)
    for m in plan.moves:
        touched[m.from_provider] |= {m.from_class, m.to_class}
    usage = _usage_with(providers, plan.body, batch)
    inventories = {}
    for uuid, entry in sorted(plan.body["inventories"].items()):
        held = current.get(uuid)
        if held is None:
            return None
        final = entry["inventories"]
        records = {rc: dict(record) for rc, record in held.items()}
        for rc in sorted(touched.get(uuid, ())):
            used = usage[uuid][rc]
            if used <= 0 and rc not in held:
                continue  # not offered yet, nothing to hold
            base = next(
                (
                    r
                    for r in (final.get(rc), held.get(rc))
                    if r is not None and _capacity(r) >= used
                ),
                None,
            )
            if base is None:
                return None
            records[rc] = _closed_at(base, used)
        if records != held:
            inventories[uuid] = {
                "resource_provider_generation": entry["resource_provider_generation"],
                "inventories": records,
            }
    if not inventories:  # Placement wants at least one provider in a reshape
        uuid, entry = min(plan.body["inventories"].items())
        inventories[uuid] = {**entry, "inventories": dict(current[uuid])}
    body = {
        "inventories": inventories,
        "allocations": {c: plan.body["allocations"][c] for c in sorted(batch)},
    }
    return Reshape(
        body,
        tuple(m for m in plan.moves if m.consumer in batch),
        provider_names=plan.provider_names,
        consumer_names=plan.consumer_names,
    )
