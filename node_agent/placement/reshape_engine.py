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
:class:`RuleBase`): ``sources``, the providers it moves allocations from,
``targets``, those it may move them to, and ``classes``, the resource
classes it moves. Only those providers are read and put in the body:
Placement's /reshaper replaces the inventories of the providers listed in
``inventories`` and leaves every other provider alone. Optional methods:
``refusals(moved, names)`` (reasons the moves of those consumers must not
happen) and ``unplaced(consumer, provider, rc, amount)`` (why an allocation
that has to move cannot be given a place; a refusal even when nothing else
moves), and ``emptied``, providers going away whose inventories the body
must clear even when no allocation moves (so the root never regains a class
while a child still offers it). Rules compose with :class:`chain`. Five
are provided:

* :class:`pinned_to_pcpu` -- a pinned guest's VCPU becomes PCPU;
* :class:`vgpu_to_gpu_children` -- VGPU on the root moves to the child
  provider of the GPU that is the parent of the guest's mdev;
* :class:`pcpu_to_numa_children` -- CPU and memory on the root move to the
  NUMA node child the guest lives on (its pinned CPUs and numatune nodes);
* :class:`children_to_root` -- the way back: everything on the agent's
  NUMA or GPU children that are going away moves to the root.
* :class:`mem_encryption_to_child` -- MEM_ENCRYPTION_CONTEXT on the root
  (nova's layout before 2025.2) moves to the ``<host>_amd_sev`` child.

:func:`host_rule` chains them to fit a host's desired tree.

Only allocations on the rule's providers go through the rule; the rest of
a moved consumer (other providers, other classes) is carried over as is,
so the body replaces each consumer's allocations whole.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Optional, Sequence

from node_agent.model.cpuset import CpuSet
from node_agent.policy.guest_fit import pinned_misfit
from node_agent.tree.mem_encryption import AMD_SEV, child_name
from node_agent.tree.numa import numa_provider_name
from node_agent.tree.pci import gpu_provider_name
from node_agent.model.provider_tree import (Inventory, Provider, ProviderTree,
                                            placement_inventories)
from node_agent.model.snapshot import Guest, HostSnapshot

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
        if not self.moves and self.body is not None:
            return out + ["nothing to move; one POST /reshaper empties the children "
                          "going away and sets the root's inventories"]
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


def _view_moves(providers: Mapping[str, ProviderAllocations], rule: Rule
                ) -> dict[str, list[Move]]:
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


def affected_consumers(providers: Mapping[str, ProviderAllocations], rule: Rule,
                       host: Iterable[str] = ()) -> list[str]:
    """Consumers the rule would move, judged from the providers' view alone
    (so only those need a full ``GET /allocations/{consumer}``). ``host`` is
    accepted for older callers and ignored: the view is what counts."""
    return sorted(_view_moves(providers, rule))


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


def _unplaced(providers: Mapping[str, ProviderAllocations], rule: Rule
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


def compute_reshape(providers: Mapping[str, ProviderAllocations],
                    consumers: Mapping[str, Consumer],
                    desired: ProviderTree,
                    rule: Rule,
                    *,
                    current_inventories: Optional[Mapping[str, Mapping[str, dict]]] = None,
                    consumer_names: Optional[Mapping[str, str]] = None) -> Reshape:
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
        return Reshape(None, warnings=tuple(_orphan_warnings(providers, desired, names)),
                       refusals=tuple(refusals), provider_names=rp_names,
                       consumer_names=names)

    absent = sorted({m.to_provider for m in moves} - scope)
    if absent:
        raise ValueError("providers not in Placement yet: "
                         + ", ".join(rp_names.get(u, u) for u in absent))

    if new_allocations:
        refusals += getattr(rule, "refusals", lambda *_: [])(sorted(new_allocations), names)
    usage = _usage_after(providers, consumers, new_host)
    targets = {(m.to_provider, m.to_class) for m in moves}
    inventories, warnings, missing = {}, [], set()
    for provider in desired.providers:
        if provider.uuid not in scope:
            continue
        wanted = placement_inventories(provider.inventories,
                                       (current_inventories or {}).get(provider.uuid))
        for rc, holders in sorted(usage.get(provider.uuid, {}).items()):
            used = sum(holders.values())
            cap = _capacity(wanted[rc]) if rc in wanted else 0
            if used <= cap:
                continue
            if (provider.uuid, rc) in targets:
                if unplaced & set(holders):
                    continue  # their real problem is already stated
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


class RuleBase:
    """Where a rule works. ``sources``: providers it moves allocations from;
    ``targets``: providers it may move them to; ``classes``: the resource
    classes it moves (a refused reshape holds these inventories as they are)."""

    sources: frozenset[str] = frozenset()
    targets: frozenset[str] = frozenset()
    classes: frozenset[str] = frozenset()
    emptied: frozenset[str] = frozenset()

    @property
    def providers(self) -> frozenset[str]:
        return self.sources | self.targets

    def refusals(self, moved: Sequence[str], names: Mapping[str, str]) -> list[str]:
        return []

    def unplaced(self, consumer: str, provider: str, rc: str, amount: int) -> list[str]:
        return []


class chain(RuleBase):
    """Apply rules one after the other: each rule sees the places the
    previous one produced. Refusals of all rules are collected."""

    def __init__(self, *rules: Rule):
        self.rules = rules
        self.sources = frozenset().union(*(getattr(r, "sources", ()) for r in rules))
        self.targets = frozenset().union(*(getattr(r, "targets", ()) for r in rules))
        self.classes = frozenset().union(*(getattr(r, "classes", ()) for r in rules))
        self.emptied = frozenset().union(*(getattr(r, "emptied", ()) for r in rules))

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

    def unplaced(self, consumer: str, provider: str, rc: str, amount: int) -> list[str]:
        """Each rule is asked about the places the rules before it produced."""
        found, places = [], [(provider, rc, amount)]
        for rule in self.rules:
            ask = getattr(rule, "unplaced", None)
            if ask is not None:
                found += [r for place in places for r in ask(consumer, *place)]
            places = [out for place in places for out in rule(consumer, *place)]
        return found


def guest_names(guests: Iterable[Guest]) -> dict[str, str]:
    return {g.uuid: g.name for g in guests}


def _who(guest: Guest) -> str:
    return f"guest {guest.name} ({guest.uuid})"


class pinned_to_pcpu(RuleBase):
    """VCPU held by a pinned guest becomes PCPU of the same amount on the
    same provider, once ``dedicated`` (``cpu_dedicated_set``) is non-empty.
    ``providers``: where the VCPU may be (the root, and the NUMA children on
    a host that reports them); the root alone by default.

    Consumers with no guest of that uuid, and unpinned guests, stay. In
    transition mode ``dedicated`` is empty, so nothing moves: the control
    plane still schedules pinned guests as VCPU there.
    """

    classes = frozenset({"VCPU", "PCPU"})

    def __init__(self, guests: Iterable[Guest], root_uuid: str, dedicated: Optional[CpuSet],
                 providers: Iterable[str] = ()):
        self.guests = {g.uuid: g for g in guests}
        self.root_uuid = root_uuid
        self.dedicated = dedicated or CpuSet()
        self.sources = self.targets = frozenset({root_uuid, *providers})

    def _moves(self, consumer: str) -> bool:
        guest = self.guests.get(consumer)
        return bool(self.dedicated) and guest is not None and guest.pinned

    def __call__(self, consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
        if provider in self.sources and rc == "VCPU" and self._moves(consumer):
            return [(provider, "PCPU", amount)]
        return [(provider, rc, amount)]

    def refusals(self, moved: Sequence[str], names: Mapping[str, str]) -> list[str]:
        """Pinned guests whose CPUs lie outside the dedicated set
        (:func:`node_agent.policy.guest_fit.pinned_misfit` decides and words it)."""
        found = []
        for uuid in moved:
            guest = self.guests.get(uuid)
            if guest is None or not self._moves(uuid):
                continue
            reason = pinned_misfit(guest, self.dedicated)
            if reason:
                found.append(reason)
        return found


class vgpu_to_gpu_children(RuleBase):
    """VGPU on the root moves to the child provider of each mdev's parent
    GPU, one VGPU per mdev. ``gpu_providers`` maps the parent's PCI address
    (``0000:81:00.0``) to its provider uuid.

    A guest of this host whose VGPU cannot be attributed (its mdev count
    differs from the amount, an mdev's parent is unknown or is not a GPU
    the tree reports) is refused. A consumer with no guest here stays where
    it is (the engine warns about it)."""

    classes = frozenset({"VGPU"})

    def __init__(self, guests: Iterable[Guest], root_uuid: str,
                 gpu_providers: Mapping[str, str]):
        self.guests = {g.uuid: g for g in guests}
        self.root_uuid = root_uuid
        self.gpu_providers = dict(gpu_providers)
        self.sources = frozenset({root_uuid})
        self.targets = frozenset(self.gpu_providers.values())

    def _why_not(self, guest: Guest, amount: int) -> Optional[str]:
        if len(guest.mdevs) != amount:
            return (f"{_who(guest)} holds {amount} VGPU on the root but its domain has "
                    f"{len(guest.mdevs)} mdev devices")
        for mdev in guest.mdevs:
            if mdev.parent is None:
                return (f"{_who(guest)}: the parent GPU of mdev {mdev.uuid} is unknown "
                        "(no GPU in sysfs lists it under mdev_supported_types/*/devices)")
            if mdev.parent not in self.gpu_providers:
                return (f"{_who(guest)}: mdev {mdev.uuid} lives on GPU {mdev.parent}, which "
                        "the tree does not report (enable its mdev type in [devices] "
                        "enabled_mdev_types)")
        return None

    def _applies(self, provider: str, rc: str) -> bool:
        return provider == self.root_uuid and rc == "VGPU" and bool(self.gpu_providers)

    def __call__(self, consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
        guest = self.guests.get(consumer)
        if (not self._applies(provider, rc) or guest is None
                or self._why_not(guest, amount) is not None):
            return [(provider, rc, amount)]
        per_gpu: dict[str, int] = defaultdict(int)
        for mdev in guest.mdevs:
            per_gpu[self.gpu_providers[mdev.parent]] += 1
        return [(rp, "VGPU", n) for rp, n in sorted(per_gpu.items())]

    def unplaced(self, consumer: str, provider: str, rc: str, amount: int) -> list[str]:
        guest = self.guests.get(consumer)
        if not self._applies(provider, rc) or guest is None:
            return []
        reason = self._why_not(guest, amount)
        return [f"{reason}; its VGPU cannot move to a GPU child"] if reason else []


class pcpu_to_numa_children(RuleBase):
    """CPU and memory on the root move to the NUMA node child the guest
    lives on: the one node holding all its pinned CPUs and all its numatune
    memory nodes. ``node_providers`` maps node id -> provider uuid;
    ``node_of`` maps a host CPU to its node; ``node_classes`` (node id ->
    classes its child holds) keeps a class on the root where the child has
    none of it (its memory could not be read, for example).

    A guest of this host that spans nodes, or has neither pins nor numatune
    to tell its node, is refused: no guessing. A consumer with no guest here
    stays where it is (the engine warns about it)."""

    MOVED = ("PCPU", "VCPU", "MEMORY_MB")

    def __init__(self, guests: Iterable[Guest], root_uuid: str,
                 node_providers: Mapping[int, str], node_of: Callable[[int], Optional[int]],
                 classes: Iterable[str] = MOVED,
                 node_classes: Optional[Mapping[int, Iterable[str]]] = None):
        self.guests = {g.uuid: g for g in guests}
        self.root_uuid = root_uuid
        self.node_providers = dict(node_providers)
        self.node_of = node_of
        self.classes = frozenset(classes)
        self.node_classes = ({n: frozenset(c) for n, c in node_classes.items()}
                             if node_classes is not None else None)
        self.sources = frozenset({root_uuid})
        self.targets = frozenset(self.node_providers.values())

    def node(self, guest: Guest) -> tuple[Optional[int], Optional[str]]:
        """The guest's node, or None and why it has none."""
        cpu_nodes = {cpu: self.node_of(cpu) for cpu in guest.pinned_cpus}
        homeless = CpuSet(c for c, n in cpu_nodes.items() if n is None)
        if homeless:
            return None, f"{_who(guest)} is pinned to CPUs {homeless}, which are in no NUMA node"
        nodes = set(cpu_nodes.values()) | set(guest.numa_nodes)
        if not nodes:
            return None, (f"{_who(guest)} has neither CPU pins nor numatune memory nodes, "
                          "so its NUMA node is unknown")
        if len(nodes) > 1:
            return None, (f"{_who(guest)} spans NUMA nodes {CpuSet(nodes)} (pinned CPUs "
                          f"{guest.pinned_cpus or 'none'}, numatune memory nodes "
                          f"{CpuSet(guest.numa_nodes) or 'none'})")
        node = nodes.pop()
        if node not in self.node_providers:
            return None, f"{_who(guest)} lives on NUMA node {node}, which has no provider"
        return node, None

    def _moves_class(self, provider: str, rc: str, node: Optional[int] = None) -> bool:
        if provider != self.root_uuid or rc not in self.classes or not self.node_providers:
            return False
        if self.node_classes is None:
            return True
        if node is None:  # does any node take this class?
            return any(rc in held for held in self.node_classes.values())
        return rc in self.node_classes.get(node, ())

    def __call__(self, consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
        guest = self.guests.get(consumer)
        if guest is None or not self._moves_class(provider, rc):
            return [(provider, rc, amount)]
        node, _why = self.node(guest)
        if node is None or not self._moves_class(provider, rc, node):
            return [(provider, rc, amount)]
        return [(self.node_providers[node], rc, amount)]

    def unplaced(self, consumer: str, provider: str, rc: str, amount: int) -> list[str]:
        guest = self.guests.get(consumer)
        if guest is None or not self._moves_class(provider, rc):
            return []
        _node, why = self.node(guest)
        return [f"{why}; its allocations cannot move to a NUMA node child"] if why else []


class children_to_root(RuleBase):
    """The way back from :class:`pcpu_to_numa_children` and
    :class:`vgpu_to_gpu_children`: every allocation on ``children`` (the
    agent's own NUMA or GPU children the desired tree no longer has, uuid ->
    name) moves to the root, class and amount unchanged, whoever the
    consumer is -- the child is going away, the root is the only place left.

    ``root_classes``: the classes the root reports in the desired tree. An
    allocation of another class (VGPU, which the root never reports; a huge
    page class, which only NUMA children report) has no place and refuses
    the whole reshape. ``child_classes``: the classes each child offers in
    Placement now; a refused reshape holds them (on the children and the
    root) as they are, so nothing is offered twice. The children are
    ``emptied``: the body clears their inventories even when nothing moves,
    in the same request that sets the root's."""

    def __init__(self, root_uuid: str, children: Mapping[str, str],
                 root_classes: Iterable[str],
                 child_classes: Optional[Mapping[str, Iterable[str]]] = None,
                 guests: Iterable[Guest] = (), hint: str = ""):
        self.root_uuid = root_uuid
        self.children = dict(children)
        self.root_classes = frozenset(root_classes)
        self.names = guest_names(guests)
        self.hint = hint
        child_classes = {u: frozenset(c) for u, c in (child_classes or {}).items()}
        self.sources = frozenset(self.children)
        self.emptied = frozenset(u for u in self.children if child_classes.get(u))
        self.targets = frozenset({root_uuid}) if self.children else frozenset()
        self.classes = frozenset().union(*child_classes.values())

    def __call__(self, consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
        if provider in self.children and rc in self.root_classes:
            return [(self.root_uuid, rc, amount)]
        return [(provider, rc, amount)]

    def unplaced(self, consumer: str, provider: str, rc: str, amount: int) -> list[str]:
        if provider not in self.children or rc in self.root_classes:
            return []
        hint = f" ({self.hint})" if self.hint else ""
        who = (f"guest {_label(consumer, self.names)}" if consumer in self.names
               else f"consumer {consumer} (no guest on this host)")
        return [f"{who} holds {amount} {rc} on "
                f"{self.children[provider]}, "
                f"which is going away{hint}; the root reports no {rc} to move it back to. "
                "Keep the configuration that reports that child, or remove that "
                "allocation (migrate or delete the instance) first."]


class mem_encryption_to_child(RuleBase):
    """MEM_ENCRYPTION_CONTEXT on the root moves to the SEV child, as nova
    34's ``_reshape_memory_encryption_resources`` does on its first start:
    every consumer's, whoever it is (the root offered nothing else of it)."""

    classes = frozenset({"MEM_ENCRYPTION_CONTEXT"})

    def __init__(self, root_uuid: str, child_uuid: str):
        self.root_uuid = root_uuid
        self.sources = frozenset({root_uuid})
        self.targets = frozenset({child_uuid})

    def __call__(self, consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
        if provider == self.root_uuid and rc in self.classes:
            return [(next(iter(self.targets)), rc, amount)]
        return [(provider, rc, amount)]


def _sev_child(tree: ProviderTree) -> Optional[Provider]:
    child = tree.by_name(child_name(tree.root.name, AMD_SEV))
    return child if child is not None and "MEM_ENCRYPTION_CONTEXT" in child.inventories else None


# ``host`` may be a partial snapshot (the central applier rebuilds the guests,
# the NUMA map and the GPUs from the agent's message): no nodes or GPUs then
# means no nested rule.
def _numa_children(tree: ProviderTree, host: HostSnapshot) -> dict[int, Provider]:
    return {n.id: p for n in getattr(host, "nodes", ())
            if (p := tree.by_name(numa_provider_name(tree.root.name, n.id))) is not None}


def _gpu_children(tree: ProviderTree, host: HostSnapshot) -> dict[str, Provider]:
    return {g.address: p for g in getattr(host, "gpus", ())
            if (p := tree.by_name(gpu_provider_name(tree.root.name, g.address))) is not None}


def rule_provider_names(tree: ProviderTree, host: HostSnapshot) -> list[str]:
    """Names of the providers :func:`host_rule` works on, root first."""
    children = [*_numa_children(tree, host).values(), *_gpu_children(tree, host).values()]
    sev = _sev_child(tree)
    children += [sev] if sev is not None else []
    return [tree.root.name] + [p.name for p in children]


def host_rule(tree: ProviderTree, host: HostSnapshot,
              dedicated: Optional[CpuSet], back: Sequence[Rule] = ()) -> chain:
    """The rule chain that fits a host's desired tree: first ``back`` (the
    :class:`children_to_root` rules for the agent's children going away),
    then VCPU -> PCPU for pinned guests, VGPU on the root -> GPU children
    when the tree has GPU children, MEM_ENCRYPTION_CONTEXT on the root -> the
    SEV child when it has one, flat -> NUMA children when it has NUMA
    children. ``tree`` needs uuids for the root and those children (new
    children: fresh ones)."""
    root = tree.root
    numa = _numa_children(tree, host)
    gpus = {address: p.uuid for address, p in _gpu_children(tree, host).items()}
    rules: list[Rule] = [*back, pinned_to_pcpu(host.guests, root.uuid, dedicated,
                                               [p.uuid for p in numa.values()])]
    if gpus:
        rules.append(vgpu_to_gpu_children(host.guests, root.uuid, gpus))
    sev = _sev_child(tree)
    if sev is not None and sev.uuid:
        rules.append(mem_encryption_to_child(root.uuid, sev.uuid))
    if numa:
        rules.append(pcpu_to_numa_children(
            host.guests, root.uuid, {n: p.uuid for n, p in numa.items()}, host.node_of,
            node_classes={n: frozenset(p.inventories) for n, p in numa.items()}))
    return chain(*rules)


def hold_inventories(tree: ProviderTree, current: Mapping[str, Mapping[str, dict]],
                     classes: Iterable[str],
                     providers: Optional[Iterable[str]] = None) -> ProviderTree:
    """``tree`` with ``classes`` kept as Placement has them now (``current``:
    provider uuid -> inventories), for a cycle whose reshape was refused: the
    rest of the tree still syncs, but the inventory of what the reshape
    would have moved must not change while the guests' allocations could
    not follow. Only ``providers`` (default: all) are held; one of them that
    is not in ``current`` (not created yet) gets none of ``classes``, so a
    new child does not offer again what the root still offers."""
    classes = set(classes)
    held_uuids = None if providers is None else set(providers)
    out = []
    for provider in tree.providers:
        if held_uuids is not None and provider.uuid not in held_uuids:
            out.append(provider)
            continue
        held = {rc: rec for rc, rec in current.get(provider.uuid, {}).items() if rc in classes}
        inventories = {rc: inv for rc, inv in provider.inventories.items() if rc not in classes}
        for rc, rec in held.items():
            inventories[rc] = Inventory.from_placement(rec)
        out.append(replace(provider, inventories=inventories))
    return ProviderTree(tuple(out))
