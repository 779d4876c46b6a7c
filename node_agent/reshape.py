"""The reshape engine: which allocations move where, as one /reshaper body.

Pure. It takes what Placement shows for the host's providers (generation
and each consumer's share of the provider), the full allocations of the
consumers that may move, the desired tree (uuids filled) and a RULE, and
returns a :class:`Reshape`: the exact ``POST /reshaper`` body (or None when
nothing moves), the per-consumer moves for ``--dry-run``, warnings, and
refusals (the reshape must not be sent).

A rule maps one allocation of one consumer on one host provider to its new
place: ``rule(consumer_uuid, provider_uuid, resource_class, amount)`` ->
``[(provider_uuid, resource_class, amount), ...]``. Returning the input
unchanged means "stays". A rule may also have a ``refusals(moved, names)``
method returning reasons the moves of those consumers must not happen.
Rules compose with :func:`chain`. Three are provided:

* :func:`pinned_to_pcpu` -- a pinned guest's VCPU on the root becomes PCPU;
* :func:`vgpu_to_gpu_children` -- VGPU on the root moves to the child
  provider of the GPU that is the parent of the guest's mdev;
* :func:`pcpu_to_numa_children` -- PCPU on the root moves to the NUMA node
  children holding the guest's pinned CPUs.

Only allocations on the host's providers go through the rule; the rest of
a moved consumer (other providers, other classes) is carried over as is,
so the body replaces each consumer's allocations whole.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Optional, Sequence

from node_agent.cpuset import CpuSet
from node_agent.provider_tree import Inventory, ProviderTree
from node_agent.topology import Guest

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
        return cls(uuid, body["resource_provider_generation"],
                   {c: dict(a["resources"]) for c, a in body["allocations"].items()})


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
        return cls(uuid, body.get("consumer_generation"), body.get("project_id"),
                   body.get("user_id"),
                   {rp: dict(a["resources"]) for rp, a in body["allocations"].items()},
                   body.get("consumer_type"))

    def body(self, allocations: Resources) -> dict:
        """This consumer's entry of a /reshaper body with ``allocations``."""
        entry = {"allocations": {rp: {"resources": dict(res)}
                                 for rp, res in sorted(allocations.items()) if res},
                 "project_id": self.project_id, "user_id": self.user_id,
                 "consumer_generation": self.generation}
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
            consumers.append({
                "consumer": uuid, "name": self.consumer_names.get(uuid),
                "moves": [{"from_provider": self._rp(m.from_provider),
                           "from_class": m.from_class,
                           "to_provider": self._rp(m.to_provider),
                           "to_class": m.to_class, "amount": m.amount}
                          for m in self.moves if m.consumer == uuid]})
        return {"consumers": consumers, "totals": self.totals(),
                "refused": list(self.refusals), "lines": self.lines()}

    def lines(self) -> list[str]:
        out = [f"REFUSED: {r}" for r in self.refusals]
        if not self.moves:
            return out + ["nothing to move: current allocations fit the desired tree"]
        for uuid in self.moved_consumers:
            name = self.consumer_names.get(uuid)
            label = f"{uuid} ({name})" if name else uuid
            parts = [f"{m.amount} {m.from_class}@{self._rp(m.from_provider)} -> "
                     f"{m.to_class}@{self._rp(m.to_provider)}"
                     for m in self.moves if m.consumer == uuid]
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


def _apply_rule(consumer: str, host_part: Resources, rule: Rule
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


def affected_consumers(providers: Mapping[str, ProviderAllocations], rule: Rule,
                       host: Iterable[str] = ()) -> list[str]:
    """Consumers the rule would move, judged from the providers' view alone
    (so only those need a full ``GET /allocations/{consumer}``)."""
    host_set = set(host) | set(providers)
    by_consumer: dict[str, dict[str, dict[str, int]]] = defaultdict(dict)
    for rp, state in providers.items():
        for consumer, res in state.consumers.items():
            by_consumer[consumer][rp] = dict(res)
    result = []
    for consumer, part in by_consumer.items():
        new, _moves = _apply_rule(consumer, _host_part(part, host_set), rule)
        if new != _host_part(part, host_set):
            result.append(consumer)
    return sorted(result)


def _capacity(record: Mapping) -> int:
    return int((record["total"] - record.get("reserved", 0))
               * float(record.get("allocation_ratio", 1.0)))


def _usage_after(providers: Mapping[str, ProviderAllocations],
                 consumers: Mapping[str, Consumer],
                 new_host: Mapping[str, Resources]) -> dict:
    """rp -> rc -> consumer -> amount once the reshape is applied."""
    usage: dict = defaultdict(lambda: defaultdict(dict))
    for rp, state in providers.items():
        for consumer, res in state.consumers.items():
            if consumer in consumers:
                continue  # its full record is newer; counted below
            for rc, amount in res.items():
                usage[rp][rc][consumer] = amount
    for uuid, consumer in consumers.items():
        for rp, res in new_host.get(uuid, consumer.allocations).items():
            if rp in providers:
                for rc, amount in res.items():
                    usage[rp][rc][uuid] = amount
    return usage


def _label(uuid: str, names: Mapping[str, str]) -> str:
    return f"{names[uuid]} ({uuid})" if uuid in names else uuid


def compute_reshape(providers: Mapping[str, ProviderAllocations],
                    consumers: Mapping[str, Consumer],
                    desired: ProviderTree,
                    rule: Rule,
                    *,
                    current_inventories: Optional[Mapping[str, Mapping[str, dict]]] = None,
                    consumer_names: Optional[Mapping[str, str]] = None) -> Reshape:
    """The /reshaper body that moves every allocation the rule moves.

    ``providers``: the host's providers as Placement shows them (every
    desired provider that exists). ``consumers``: full records of (at least)
    the consumers :func:`affected_consumers` named. ``desired`` gives the new
    inventories; the body carries an entry for each of its providers with
    the generation from ``providers``. A class that consumers the rule does
    not move still use beyond its new capacity keeps its current record
    (from ``current_inventories``) and is reported as a warning; a class
    that moved allocations would overfill is a refusal.

    Raises ValueError if a desired provider has no uuid or, when something
    moves, is not in ``providers`` (create it first).
    """
    names = dict(consumer_names or {})
    rp_names = {p.uuid: p.name for p in desired.providers}
    missing_uuid = [p.name for p in desired.providers if not p.uuid]
    if missing_uuid:
        raise ValueError(f"providers without uuid: {', '.join(missing_uuid)}")
    host = set(rp_names) | set(providers)

    new_allocations: dict[str, dict] = {}
    new_host: dict[str, Resources] = {}
    moves: list[Move] = []
    for uuid in sorted(consumers):
        consumer = consumers[uuid]
        part = _host_part(consumer.allocations, host)
        new_part, consumer_moves = _apply_rule(uuid, part, rule)
        if new_part == part:
            continue
        others = {rp: res for rp, res in consumer.allocations.items() if rp not in host}
        new_allocations[uuid] = {**others, **new_part}
        new_host[uuid] = new_part
        moves += consumer_moves
    if not moves:
        return Reshape(None, warnings=tuple(_orphan_warnings(providers, desired, names)),
            provider_names=rp_names, consumer_names=names)

    absent = [p.name for p in desired.providers if p.uuid not in providers]
    if absent:
        raise ValueError(f"providers not in Placement yet: {', '.join(absent)}")

    refusals = list(getattr(rule, "refusals", lambda *_: [])(
        sorted(new_allocations), names))
    usage = _usage_after(providers, consumers, new_host)
    targets = {(m.to_provider, m.to_class) for m in moves}
    inventories, warnings, missing = {}, [], set()
    for provider in desired.providers:
        wanted = {rc: inv.as_placement() for rc, inv in provider.inventories.items()}
        for rc, holders in sorted(usage.get(provider.uuid, {}).items()):
            used = sum(holders.values())
            cap = _capacity(wanted[rc]) if rc in wanted else 0
            if used <= cap:
                continue
            if (provider.uuid, rc) in targets:
                refusals.append(_overfill(provider.name, rc, used, cap, holders,
                                          new_host, names))
                continue
            current = (current_inventories or {}).get(provider.uuid)
            if current is None:
                missing.add(provider.uuid)
            elif rc in current:
                wanted[rc] = dict(current[rc])
                warnings.append(_kept_warning(provider.name, rc, used, cap, holders, names))
        inventories[provider.uuid] = {
            "resource_provider_generation": providers[provider.uuid].generation,
            "inventories": wanted}
    body = {"inventories": inventories,
            "allocations": {uuid: consumers[uuid].body(alloc)
                            for uuid, alloc in sorted(new_allocations.items())}}
    return Reshape(body, tuple(moves), tuple(warnings), tuple(refusals),
                   frozenset(missing), rp_names, names)


def _overfill(provider: str, rc: str, used: int, cap: int, holders: Mapping[str, int],
              new_host: Mapping[str, Resources], names: Mapping[str, str]) -> str:
    moved = sorted(c for c in holders if c in new_host)
    who = ", ".join(f"{_label(c, names)} {holders[c]}" for c in moved)
    return (f"{rc} on {provider} would need {used} but the new inventory holds "
            f"{cap}: moved guests {who}. Give the host more {rc} (for PCPU: more "
            f"CPUs in cpu_dedicated_set) or move those guests away first.")


def _kept_warning(provider: str, rc: str, used: int, cap: int,
                  holders: Mapping[str, int], names: Mapping[str, str]) -> str:
    who = ", ".join(f"{_label(c, names)} {n}" for c, n in sorted(holders.items()))
    return (f"{used} {rc} on {provider} are held by consumers the reshape does not "
            f"move ({who}), above the new capacity {cap}; {rc} inventory is kept "
            f"as it is until they are gone (no guest on this host matches those "
            f"consumers, or they are not pinned).")


def _orphan_warnings(providers: Mapping[str, ProviderAllocations], desired: ProviderTree,
                     names: Mapping[str, str]) -> list[str]:
    """Without a reshape: allocations in classes the desired tree dropped."""
    warnings = []
    for provider in desired.providers:
        state = providers.get(provider.uuid)
        if state is None:
            continue
        dropped: dict[str, dict[str, int]] = defaultdict(dict)
        for consumer, res in state.consumers.items():
            for rc, amount in res.items():
                if rc not in provider.inventories and amount:
                    dropped[rc][consumer] = amount
        for rc, holders in sorted(dropped.items()):
            warnings.append(_kept_warning(provider.name, rc, sum(holders.values()), 0,
                                          holders, names))
    return warnings


# ---------------------------------------------------------------- rules

def identity(_consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
    return [(provider, rc, amount)]


class chain:
    """Apply rules one after the other: each rule sees the places the
    previous one produced. Refusals of all rules are collected."""

    def __init__(self, *rules: Rule):
        self.rules = rules

    def __call__(self, consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
        places = [(provider, rc, amount)]
        for rule in self.rules:
            places = [out for place in places for out in rule(consumer, *place)]
        return places

    def refusals(self, moved: Sequence[str], names: Mapping[str, str]) -> list[str]:
        found = []
        for rule in self.rules:
            found += getattr(rule, "refusals", lambda *_: [])(moved, names)
        return found


def guest_names(guests: Iterable[Guest]) -> dict[str, str]:
    return {g.uuid: g.name for g in guests}


class pinned_to_pcpu:
    """VCPU on the root held by a pinned guest becomes PCPU of the same
    amount, once ``dedicated`` (``cpu_dedicated_set``) is non-empty.

    Consumers with no guest of that uuid, and unpinned guests, stay. In
    transition mode ``dedicated`` is empty, so nothing moves: the control
    plane still schedules pinned guests as VCPU there.
    """

    def __init__(self, guests: Iterable[Guest], root_uuid: str, dedicated: Optional[CpuSet]):
        self.guests = {g.uuid: g for g in guests}
        self.root_uuid = root_uuid
        self.dedicated = dedicated or CpuSet()

    def _moves(self, consumer: str) -> bool:
        guest = self.guests.get(consumer)
        return bool(self.dedicated) and guest is not None and guest.pinned

    def __call__(self, consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
        if provider == self.root_uuid and rc == "VCPU" and self._moves(consumer):
            return [(provider, "PCPU", amount)]
        return [(provider, rc, amount)]

    def refusals(self, moved: Sequence[str], names: Mapping[str, str]) -> list[str]:
        """Pinned guests whose CPUs lie outside the dedicated set."""
        found = []
        for uuid in moved:
            guest = self.guests.get(uuid)
            if guest is None or not self._moves(uuid):
                continue
            outside = guest.pinned_cpus - self.dedicated
            if outside:
                found.append(
                    f"pinned guest {guest.name} ({uuid}) runs on CPUs {guest.pinned_cpus}; "
                    f"CPUs {outside} are outside cpu_dedicated_set = '{self.dedicated}'. "
                    "Add them to cpu_dedicated_set or migrate the guest first.")
        return found


class vgpu_to_gpu_children:
    """VGPU on the root moves to the child provider of each mdev's parent
    GPU, one VGPU per mdev. ``gpu_providers`` maps the parent's PCI address
    (``0000:81:00.0``) to its provider uuid."""

    def __init__(self, guests: Iterable[Guest], root_uuid: str,
                 gpu_providers: Mapping[str, str]):
        self.guests = {g.uuid: g for g in guests}
        self.root_uuid = root_uuid
        self.gpu_providers = dict(gpu_providers)

    def _targets(self, consumer: str, amount: int) -> Optional[list[str]]:
        guest = self.guests.get(consumer)
        if guest is None or len(guest.mdevs) != amount:
            return None
        targets = [self.gpu_providers.get(m.parent or "") for m in guest.mdevs]
        return None if None in targets else targets

    def __call__(self, consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
        if provider != self.root_uuid or rc != "VGPU":
            return [(provider, rc, amount)]
        targets = self._targets(consumer, amount)
        if targets is None:
            return [(provider, rc, amount)]
        per_gpu: dict[str, int] = defaultdict(int)
        for target in targets:
            per_gpu[target] += 1
        return [(rp, "VGPU", n) for rp, n in sorted(per_gpu.items())]


class pcpu_to_numa_children:
    """PCPU on the root moves to the NUMA node children holding the guest's
    pinned CPUs, one PCPU per vCPU on the node its pin lies in.
    ``node_providers`` maps node id -> provider uuid; ``node_of`` maps a
    host CPU to its node. Guests with a vCPU pinned across nodes, or whose
    pinned vCPU count differs from the amount, stay on the root."""

    def __init__(self, guests: Iterable[Guest], root_uuid: str,
                 node_providers: Mapping[int, str], node_of: Callable[[int], Optional[int]]):
        self.guests = {g.uuid: g for g in guests}
        self.root_uuid = root_uuid
        self.node_providers = dict(node_providers)
        self.node_of = node_of

    def _per_node(self, consumer: str, amount: int) -> Optional[dict[str, int]]:
        guest = self.guests.get(consumer)
        if guest is None or len(guest.vcpupin) != amount:
            return None
        per_node: dict[str, int] = defaultdict(int)
        for _vcpu, cpus in guest.vcpupin:
            nodes = {self.node_of(cpu) for cpu in cpus}
            if len(nodes) != 1 or next(iter(nodes)) not in self.node_providers:
                return None
            per_node[self.node_providers[nodes.pop()]] += 1
        return per_node

    def __call__(self, consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
        if provider != self.root_uuid or rc != "PCPU":
            return [(provider, rc, amount)]
        per_node = self._per_node(consumer, amount)
        if per_node is None:
            return [(provider, rc, amount)]
        return [(rp, "PCPU", n) for rp, n in sorted(per_node.items())]


def hold_inventories(tree: ProviderTree, current: Mapping[str, Mapping[str, dict]],
                     classes: Iterable[str]) -> ProviderTree:
    """``tree`` with ``classes`` kept as Placement has them now (``current``:
    provider uuid -> inventories), for a cycle whose reshape was refused: the
    rest of the tree still syncs, but the CPU inventory must not change
    while the guests' allocations could not follow."""
    classes = set(classes)
    providers = []
    for provider in tree.providers:
        held = {rc: rec for rc, rec in current.get(provider.uuid, {}).items() if rc in classes}
        inventories = {rc: inv for rc, inv in provider.inventories.items() if rc not in classes}
        for rc, rec in held.items():
            inventories[rc] = Inventory(
                total=rec["total"], reserved=rec["reserved"], min_unit=rec["min_unit"],
                max_unit=rec["max_unit"], step_size=rec["step_size"],
                allocation_ratio=rec["allocation_ratio"])
        providers.append(replace(provider, inventories=inventories))
    return ProviderTree(tuple(providers))
