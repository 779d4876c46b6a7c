"""The reshape rules (pure): where each allocation of a guest goes.

A rule maps one allocation of one consumer on one provider to its new
place (see :mod:`node_agent.placement.reshape_engine`, which applies it).
Rules compose with :class:`chain`. Seven are provided:

* :class:`pinned_to_pcpu` -- a pinned guest's VCPU becomes PCPU;
* :class:`vgpu_to_gpu_children` -- VGPU on the root moves to the child
  provider of the GPU that is the parent of the guest's mdev;
* :class:`pcpu_to_numa_children` -- CPU and memory on the root move to the
  NUMA node child the guest lives on (its pinned CPUs and numatune nodes;
  a guest with neither goes where :mod:`node_agent.policy.numa_fit` puts it);
* :class:`children_to_root` -- the way back: everything on the agent's
  NUMA or GPU children that are going away moves to the root.
* :class:`mem_encryption_to_child` -- MEM_ENCRYPTION_CONTEXT on the root
  (nova's layout before 2025.2) moves to the ``<host>_amd_sev`` child.
* :class:`disk_to_sharing_provider` and :class:`local_disk_moved` -- DISK_GB
  between the root and the sharing provider of a shared ``instances_path``,
  or between two sharing providers.

:func:`host_rule` chains them to fit a host's desired tree.

Why one module over 500 lines: seven rules and their chain share one small
protocol (place, refusals, unplaced, migrations); apart, each would repeat it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable, Mapping, Optional, Sequence

from node_agent.model.cpuset import CpuSet
from node_agent.model.provider_tree import Provider, ProviderTree
from node_agent.model.snapshot import Guest, HostSnapshot
from node_agent.placement.reshape_engine import Consumer, Place, Rule, consumer_label
from node_agent.policy import migrations, numa_fit
from node_agent.policy.guest_cpu import classify
from node_agent.tree.mem_encryption import AMD_SEV, child_name
from node_agent.tree.numa import numa_provider_name
from node_agent.tree.pci import gpu_provider_name


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

    def migration_candidates(self, by_consumer: Mapping[str, Mapping[str, int]]) -> list[str]:
        """Consumers whose record decides whether they move (a guest's
        migration record): read them, then :meth:`with_migrations`."""
        return []

    def with_migrations(self, records: Mapping[str, Consumer], here: Iterable[str]) -> Rule:
        return self  # type: ignore[return-value]  # every rule here is callable

    def with_guests(self, guests: Iterable[Guest]) -> Rule:
        """The rule with the guests libvirt lists now (read again mid-cycle)."""
        return self  # type: ignore[return-value]

    def migration_names(self) -> dict[str, str]:
        """consumer -> how to name a migration record the rule moves."""
        return {}


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
        found: list[str] = []
        for rule in self.rules:
            found += getattr(rule, "refusals", lambda *_: [])(moved, names)
        return found

    def migration_candidates(self, by_consumer: Mapping[str, Mapping[str, int]]) -> list[str]:
        return sorted(
            {
                c
                for rule in self.rules
                for c in getattr(rule, "migration_candidates", lambda _: [])(by_consumer)
            }
        )

    def with_migrations(self, records: Mapping[str, Consumer], here: Iterable[str]) -> Rule:
        here = list(here)
        # B023 (here and below): each default is called at once, in its own iteration.
        return chain(
            *(
                getattr(r, "with_migrations", lambda *_: r)(records, here)  # noqa: B023
                for r in self.rules
            )
        )

    def with_guests(self, guests: Iterable[Guest]) -> Rule:
        guests = list(guests)
        return chain(
            *(
                getattr(r, "with_guests", lambda _: r)(guests)  # noqa: B023
                for r in self.rules
            )
        )

    def migration_names(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for rule in self.rules:
            found.update(getattr(rule, "migration_names", dict)())
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

    Only guests nova counts as dedicated move (:mod:`node_agent.policy.guest_cpu`),
    wherever their pins are (nova warns about pins outside the set and
    reshapes them all the same); floating and mixed guests stay, as in
    nova's ``_update_provider_tree_for_pcpu``. Consumers with no guest of
    that uuid stay. In
    transition mode ``dedicated`` is empty, so nothing moves: the control
    plane still schedules pinned guests as VCPU there.
    """

    classes = frozenset({"VCPU", "PCPU"})

    def __init__(
        self,
        guests: Iterable[Guest],
        root_uuid: str,
        dedicated: Optional[CpuSet],
        providers: Iterable[str] = (),
        migrations: Optional[Mapping[str, Sequence[Guest]]] = None,
    ):
        self.guests = {g.uuid: g for g in guests}
        self.root_uuid = root_uuid
        self.dedicated = dedicated or CpuSet()
        self.sources = self.targets = frozenset({root_uuid, *providers})
        # consumer -> the local guests it is a migration record of.
        self.migrations = dict(migrations or {})

    def _moves(self, consumer: str) -> bool:
        if not self.dedicated:
            return False
        guest = self.guests.get(consumer)
        if guest is not None:
            return classify(guest).dedicated
        # A migration's record moves with its instance, as in nova; one that
        # could belong to a floating guest too stays.
        of = self.migrations.get(consumer) or ()
        return bool(of) and all(classify(g).dedicated for g in of)

    def migration_candidates(self, by_consumer: Mapping[str, Mapping[str, int]]) -> list[str]:
        if not self.dedicated:
            return []
        dedicated = [g for g in self.guests.values() if classify(g).dedicated]
        return migrations.candidates(dedicated, by_consumer) if dedicated else []

    def with_migrations(self, records: Mapping[str, Consumer], here: Iterable[str]) -> Rule:
        bodies = {
            c: {
                "allocations": r.allocations,
                "project_id": r.project_id,
                "user_id": r.user_id,
                "consumer_type": r.consumer_type,
            }
            for c, r in records.items()
        }
        found = migrations.match(self.guests.values(), bodies, self.sources, here)
        return pinned_to_pcpu(
            self.guests.values(),
            self.root_uuid,
            self.dedicated,
            self.sources - {self.root_uuid},
            found,
        )

    def with_guests(self, guests: Iterable[Guest]) -> Rule:
        return pinned_to_pcpu(
            guests, self.root_uuid, self.dedicated, self.sources - {self.root_uuid}, self.migrations
        )

    def migration_names(self) -> dict[str, str]:
        return {
            c: "migration record of " + ", ".join(g.name for g in of)
            for c, of in self.migrations.items()
        }

    def __call__(self, consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
        if provider in self.sources and rc == "VCPU" and self._moves(consumer):
            return [(provider, "PCPU", amount)]
        return [(provider, rc, amount)]


class vgpu_to_gpu_children(RuleBase):
    """VGPU on the root moves to the child provider of each mdev's parent
    GPU, one VGPU per mdev. ``gpu_providers`` maps the parent's PCI address
    (``0000:81:00.0``) to its provider uuid.

    A guest of this host whose VGPU cannot be attributed (its mdev count
    differs from the amount, an mdev's parent is unknown or is not a GPU
    the tree reports) is refused. A consumer with no guest here stays where
    it is (the engine warns about it)."""

    classes = frozenset({"VGPU"})

    def __init__(self, guests: Iterable[Guest], root_uuid: str, gpu_providers: Mapping[str, str]):
        self.guests = {g.uuid: g for g in guests}
        self.root_uuid = root_uuid
        self.gpu_providers = dict(gpu_providers)
        self.sources = frozenset({root_uuid})
        self.targets = frozenset(self.gpu_providers.values())

    def _why_not(self, guest: Guest, amount: int) -> Optional[str]:
        if len(guest.mdevs) != amount:
            return (
                f"{_who(guest)} holds {amount} VGPU on the root but its domain has "
                f"{len(guest.mdevs)} mdev devices"
            )
        for mdev in guest.mdevs:
            if mdev.parent is None:
                return (
                    f"{_who(guest)}: the parent GPU of mdev {mdev.uuid} is unknown "
                    "(no GPU in sysfs lists it under mdev_supported_types/*/devices)"
                )
            if mdev.parent not in self.gpu_providers:
                return (
                    f"{_who(guest)}: mdev {mdev.uuid} lives on GPU {mdev.parent}, which "
                    "the tree does not report (enable its mdev type in [devices] "
                    "enabled_mdev_types)"
                )
        return None

    def _applies(self, provider: str, rc: str) -> bool:
        return provider == self.root_uuid and rc == "VGPU" and bool(self.gpu_providers)

    def __call__(self, consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
        guest = self.guests.get(consumer)
        if (
            not self._applies(provider, rc)
            or guest is None
            or self._why_not(guest, amount) is not None
        ):
            return [(provider, rc, amount)]
        per_gpu: dict[str, int] = defaultdict(int)
        for mdev in guest.mdevs:  # each has a parent the tree reports: see _why_not
            per_gpu[self.gpu_providers[mdev.parent or ""]] += 1
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

    A guest with neither pins nor numatune goes where ``floating`` (guest
    uuid -> :data:`node_agent.policy.numa_fit.Placement`, computed by
    :func:`node_agent.policy.numa_fit.place_floating`) puts it: one node,
    or split over several when no node can hold it; one the nodes together
    cannot hold (None), or one ``floating`` does not name, is refused, named.
    A guest that spans nodes is refused: no guessing. A consumer with no
    guest here stays where it is (the engine warns about it)."""

    MOVED = ("PCPU", "VCPU", "MEMORY_MB")

    def __init__(
        self,
        guests: Iterable[Guest],
        root_uuid: str,
        node_providers: Mapping[int, str],
        node_of: Callable[[int], Optional[int]],
        classes: Iterable[str] = MOVED,
        node_classes: Optional[Mapping[int, Iterable[str]]] = None,
        floating: Optional[Mapping[str, Optional[numa_fit.Placement]]] = None,
    ):
        self.guests = {g.uuid: g for g in guests}
        self.root_uuid = root_uuid
        self.floating = dict(floating or {})
        self.node_providers = dict(node_providers)
        self.node_of = node_of
        self.classes = frozenset(classes)
        self.node_classes = (
            {n: frozenset(c) for n, c in node_classes.items()} if node_classes is not None else None
        )
        self.sources = frozenset({root_uuid})
        self.targets = frozenset(self.node_providers.values())

    def node(self, guest: Guest) -> tuple[Optional[int], Optional[str]]:
        """The guest's node, or None and why it has none."""
        cpu_nodes = {cpu: self.node_of(cpu) for cpu in guest.pinned_cpus}
        homeless = CpuSet(c for c, n in cpu_nodes.items() if n is None)
        if homeless:
            return None, f"{_who(guest)} is pinned to CPUs {homeless}, which are in no NUMA node"
        nodes = {n for n in cpu_nodes.values() if n is not None} | set(guest.numa_nodes)
        if not nodes:
            return None, (
                f"{_who(guest)} has neither CPU pins nor numatune memory nodes, "
                "so its NUMA node is unknown"
            )
        if len(nodes) > 1:
            return None, (
                f"{_who(guest)} spans NUMA nodes {CpuSet(nodes)} (pinned CPUs "
                f"{guest.pinned_cpus or 'none'}, numatune memory nodes "
                f"{CpuSet(guest.numa_nodes) or 'none'})"
            )
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
        placed = self._floating(guest)
        if placed is not None:
            return self._split(placed, provider, rc, amount)
        node, _why = self.node(guest)
        if node is None or not self._moves_class(provider, rc, node):
            return [(provider, rc, amount)]
        return [(self.node_providers[node], rc, amount)]

    def _floating(self, guest: Guest) -> Optional[numa_fit.Placement]:
        if guest.pinned_cpus or guest.numa_nodes:
            return None
        return self.floating.get(guest.uuid)

    def _split(
        self, placed: numa_fit.Placement, provider: str, rc: str, amount: int
    ) -> list[Place]:
        pieces = [(n, piece[rc]) for n, piece in placed if piece.get(rc)] or [(placed[0][0], 0)]
        if not all(self._moves_class(provider, rc, n) for n, _ in pieces):
            return [(provider, rc, amount)]
        shares = numa_fit.spread_amount(amount, [piece for _, piece in pieces])
        return [
            (self.node_providers[n], rc, share) for (n, _), share in zip(pieces, shares) if share
        ]

    def unplaced(self, consumer: str, provider: str, rc: str, amount: int) -> list[str]:
        guest = self.guests.get(consumer)
        if guest is None or not self._moves_class(provider, rc) or self._floating(guest):
            return []
        if not guest.pinned_cpus and not guest.numa_nodes and guest.uuid in self.floating:
            return [
                f"{_who(guest)} has no NUMA placement (no CPU pins, no numatune) and the "
                f"NUMA nodes together lack room for its {guest.vcpus} vCPUs and "
                f"{guest.memory_kb // 1024} MiB; its allocations cannot move to a NUMA node "
                "child. Migrate it to another host first, or keep [compute] "
                "numa_in_placement off on this host"
            ]
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

    def __init__(
        self,
        root_uuid: str,
        children: Mapping[str, str],
        root_classes: Iterable[str],
        child_classes: Optional[Mapping[str, Iterable[str]]] = None,
        guests: Iterable[Guest] = (),
        hint: str = "",
    ):
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
        who = (
            f"guest {consumer_label(consumer, self.names)}"
            if consumer in self.names
            else f"consumer {consumer} (no guest on this host)"
        )
        return [
            f"{who} holds {amount} {rc} on "
            f"{self.children[provider]}, "
            f"which is going away{hint}; the root reports no {rc} to move it back to. "
            "Keep the configuration that reports that child, or remove that "
            "allocation (migrate or delete the instance) first."
        ]


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
    return {
        n.id: p
        for n in getattr(host, "nodes", ())
        if (p := tree.by_name(numa_provider_name(tree.root.name, n.id))) is not None
    }


def _gpu_children(tree: ProviderTree, host: HostSnapshot) -> dict[str, Provider]:
    return {
        g.address: p
        for g in getattr(host, "gpus", ())
        if (p := tree.by_name(gpu_provider_name(tree.root.name, g.address))) is not None
    }


def _uuid(provider: Provider) -> str:
    if not provider.uuid:
        raise ValueError(f"the reshape rule needs the uuid of provider {provider.name}")
    return provider.uuid


def rule_provider_names(tree: ProviderTree, host: HostSnapshot) -> list[str]:
    """Names of the providers :func:`host_rule` works on, root first."""
    children = [*_numa_children(tree, host).values(), *_gpu_children(tree, host).values()]
    sev = _sev_child(tree)
    children += [sev] if sev is not None else []
    return [tree.root.name] + [p.name for p in children]


class disk_to_sharing_provider(RuleBase):
    """DISK_GB on the root moves to the sharing provider of a shared
    ``instances_path`` (:mod:`node_agent.policy.shared_storage`): every
    consumer's, the root offers no DISK_GB any more. The way back is
    :class:`local_disk_moved`."""

    classes = frozenset({"DISK_GB"})

    def __init__(self, root_uuid: str, sharing_uuid: str):
        self.root_uuid = root_uuid
        self.sharing_uuid = sharing_uuid
        self.sources = frozenset({root_uuid})
        self.targets = frozenset({sharing_uuid})

    def __call__(self, consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
        if provider == self.root_uuid and rc == "DISK_GB":
            return [(self.sharing_uuid, rc, amount)]
        return [(provider, rc, amount)]


class local_disk_moved(RuleBase):
    """The DISK_GB that this host's consumers (``local``: those with
    allocations in this host's tree, or a guest on it) hold on the sharing
    provider ``source`` moves to ``target``: the root (the way back from
    :class:`disk_to_sharing_provider`) or the sharing provider of another
    aggregate. The other hosts' consumers stay: the sharing provider stays
    theirs."""

    classes = frozenset({"DISK_GB"})

    def __init__(self, source: str, target: str, local: Iterable[str]):
        self.source = source
        self.target = target
        self.local = frozenset(local)
        self.sources = frozenset({source})
        self.targets = frozenset({target})

    def __call__(self, consumer: str, provider: str, rc: str, amount: int) -> list[Place]:
        if provider == self.source and rc == "DISK_GB" and consumer in self.local:
            return [(self.target, rc, amount)]
        return [(provider, rc, amount)]


def host_rule(
    tree: ProviderTree, host: HostSnapshot, dedicated: Optional[CpuSet], back: Sequence[Rule] = ()
) -> chain:
    """The rule chain that fits a host's desired tree: first ``back`` (the
    :class:`children_to_root` rules for the agent's children going away),
    then VCPU -> PCPU for pinned guests, VGPU on the root -> GPU children
    when the tree has GPU children, MEM_ENCRYPTION_CONTEXT on the root -> the
    SEV child when it has one, flat -> NUMA children when it has NUMA
    children. ``tree`` needs uuids for the root and those children (new
    children: fresh ones)."""
    root = _uuid(tree.root)
    numa = _numa_children(tree, host)
    # A GPU child of an [mdev_*] mdev_class holds no VGPU to move to.
    gpus = {
        address: _uuid(p)
        for address, p in _gpu_children(tree, host).items()
        if "VGPU" in p.inventories
    }
    rules: list[Rule] = [
        *back,
        pinned_to_pcpu(host.guests, root, dedicated, [_uuid(p) for p in numa.values()]),
    ]
    if gpus:
        rules.append(vgpu_to_gpu_children(host.guests, root, gpus))
    sev = _sev_child(tree)
    if sev is not None and sev.uuid:
        rules.append(mem_encryption_to_child(root, sev.uuid))
    if numa:
        rule = pcpu_to_numa_children(
            host.guests,
            root,
            {n: _uuid(p) for n, p in numa.items()},
            host.node_of,
            node_classes={n: frozenset(p.inventories) for n, p in numa.items()},
        )
        rule.floating = floating_placements(rule, numa, host.guests)
        rules.append(rule)
    return chain(*rules)


def floating_placements(
    rule: pcpu_to_numa_children, numa: Mapping[int, Provider], guests: Iterable[Guest]
) -> dict[str, Optional[numa_fit.Placement]]:
    """Where the guests with no NUMA placement go (:mod:`node_agent.policy.numa_fit`),
    after the guests whose node their pins or numatune tell."""
    known: dict[int, list[dict[str, int]]] = defaultdict(list)
    floating = {}
    for guest in guests:
        cpu = classify(guest)
        demand = {"VCPU": cpu.vcpu, "PCPU": cpu.pcpu, "MEMORY_MB": guest.memory_kb // 1024}
        if not guest.pinned_cpus and not guest.numa_nodes:
            floating[guest.uuid] = {rc: n for rc, n in demand.items() if n}
            continue
        node, _why = rule.node(guest)
        if node is not None:
            known[node].append(demand)
    nodes = {n: p.inventories for n, p in numa.items()}
    return numa_fit.place_floating(nodes, known, floating)
