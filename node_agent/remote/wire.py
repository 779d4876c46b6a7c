"""The wire format between the agent and node-agent-applier (pure).

Both sides share this one definition: the agent encodes a cycle's
``Desired`` (:func:`body_of`, :func:`full_message`, :func:`heartbeat`) and
checks it before sending (:func:`check_outgoing`); the applier decodes and
validates it (:func:`parse_envelope` checks the version and every field but
the body against the published JSON Schema :mod:`node_agent.remote.schema`
ships; the applier checks the signature then, and only then
:func:`parse_body` the body's size, digest and schema;
:func:`desired_from_body` the rules that span fields). The exchange itself
(heartbeats, digests, ``seq``) is described in :mod:`node_agent.remote.upstream`.

``body`` is plain JSON: ``tree`` (providers, parents first, each with
name, parent, uuid, inventories and the trait -> wanted map) and
``reshape``, exactly what :func:`node_agent.placement.reshape_rules.host_rule` and
:func:`node_agent.placement.reshape_host.host_reshape_inputs` read from a cycle's
``Desired``, so the applier runs the same rule chain as the direct mode:

* ``dedicated``: the cpulist of ``cpu_dedicated_set`` (VCPU -> PCPU);
* ``guests``: each guest's consumer ``uuid``, ``name``, ``vcpus``,
  ``memory_mb`` (since 2.4: libvirt's ``<memory>`` in MiB, rounded down,
  as the rules count it), ``vcpupin`` (``[[vcpu, cpulist], ...]``),
  ``numa_nodes`` (numatune), ``mdevs`` (``[{uuid, parent}]``, parent the
  GPU's PCI address or null) and the ``metadata`` that
  :func:`node_agent.policy.guest_cpu.classify` reads (and the owner, which
  ties a migration's record to its guest). Nothing else: a guest starting
  or stopping changes no digest;
* ``numa``: the host's NUMA nodes, ``[{id, cpus}]`` (what ``node_of``
  reads: flat -> NUMA children by each guest's pinned CPUs and numatune);
* ``gpus``: the host's mdev-capable GPUs, ``[{address, provider}]``, the
  provider being the GPU's child name (VGPU root -> GPU children by each
  mdev's parent).

The tree's root carries ``aggregates`` (since 2.4, only when it joins
any: ``[placement] aggregates``); the applier's syncer adds them and
removes only those it added, recorded in the host's record
(:mod:`node_agent.policy.aggregates`: after that record is lost, it only
adds), as the direct mode's syncer does with the agent's state file.

``body.without_numa`` (since 2.4, optional, with ``numa_in_placement``
on): ``{inventories}``, the root's inventories of the same host without
NUMA children. The tree without them (:func:`flat_of`) is what a cycle
whose NUMA reshape is refused writes instead, as in the direct mode
(``Reconciler._without_numa``), so that refusal holds back no other change.

Since 2.4 the applier so runs every NUMA rule of the direct mode: guests
with no NUMA placement go where their CPUs and memory fit
(:mod:`node_agent.policy.numa_fit`), one that no node can take is refused
by name with its size, and the flat fallback. A body from an older agent
(no ``memory_mb``, no ``without_numa`` on a tree with NUMA children) is
still applied as before: by CPU only, no fallback; the applier says once
per host what it lacks (:func:`lacking`). The stranded-flavor report
(:mod:`node_agent.policy.stranded`) is the agent's own, in both modes:
``--dry-run`` and ``--check-config`` compute it from the host.

An inventory's ``guest_held`` (since 2.5, only when set): ``[[consumer
uuid, units], ...]``, the units of that class running guests hold on the
host (a PCI child's devices they pass through,
:attr:`~node_agent.model.provider_tree.Inventory.guest_held`); the
applier's syncer reserves those no allocation of that consumer covers, as
the direct mode does. An applier before 2.5 ignores it.

``body.limits`` (since 2.1, optional): the host's
:class:`~node_agent.policy.capacity.HostLimits` (``cpus``, ``memory_mb``,
``disk_gb``, ``hugepages`` as class -> pages, ``vgpus``, ``vfs``,
``online_cpus``; since 2.3 ``mem_encryption``, the AMD SEV guests the
firmware has keys for, null when not known), from the facts discovery
found. The applier checks the capacity invariant against them exactly as
the direct mode does (the same
:func:`node_agent.policy.capacity.limits_of`). They are part of the body,
so a change of the host's facts changes the digest. A 2.0 message has no
limits: the applier applies it unchecked, as before 2.1, and says so once
per host.

Version 2.0 added ``numa`` and ``gpus``. It is a major bump on purpose: an
applier that ignored them would move NUMA or GPU inventory to children while
the guests' allocations stayed on the root, so both sides refuse the other
major version, with a reply that says which side to upgrade.

``signature`` (since 2.2, required from 2.2 on): HMAC-SHA256 over
version, host, seq and digest with the sending host's own key
(:mod:`node_agent.remote.signing`, ``[agent] upstream_key_file``), so no
hypervisor can speak for another. The applier refuses a message without
one (a 2.0 or 2.1 agent) unless ``[applier] accept_unsigned`` is set for
an upgrade.

Why one module over 400 lines: the encoder and the validating decoder are
one definition of the format; a change to it touches both, in one diff.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid as uuidlib
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional

from node_agent.model.cpuset import CpuSet, CpuSetSyntaxError, parse_cpulist
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.model.snapshot import Guest, GuestMdev, HostSnapshot, NumaNode, PciGpu
from node_agent.policy import maintenance as maint
from node_agent.policy.capacity import HostLimits, limits_of
from node_agent.remote import schema, signing
from node_agent.tree import child_names
from node_agent.tree.child_names import is_child_name
from node_agent.tree.numa import numa_provider_name
from node_agent.tree.pci import gpu_provider_name

WIRE_VERSION = "2.5"  # bump the minor for an added optional key, the major otherwise
RPC_VERSION = "1.0"
METHOD = "apply"
DEFAULT_TOPIC = "node-agent-applier"

# Reply statuses.
APPLIED = "applied"  # the tree was applied (see "ok" and "errors")
UNCHANGED = "unchanged"  # heartbeat of the applied digest: nothing to do
UNKNOWN_DIGEST = "unknown_digest"  # heartbeat the applier cannot match: send all
STALE = "stale"  # seq not newer than the last applied one
REFUSED = "refused"  # malformed, or names another host's providers
BUSY = "busy"  # another process is applying this host
ERROR = "error"  # Placement could not be used
STATUSES = (APPLIED, UNCHANGED, UNKNOWN_DIGEST, STALE, REFUSED, BUSY, ERROR)

NUMA_CHILD = re.compile(r"_NUMA_([0-9]+)$")
# What the reshape rules read of a guest's metadata (policy/guest_cpu.py,
# the owner); other metadata (names, flavor) would only make the digest
# change without changing any rule.
RULE_METADATA = (
    "hw:cpu_policy",
    "nova:extra_specs",
    "libvirt:emulatorpin",
    "owner:user",
    "owner:project",
)
RULE_METADATA_PREFIXES = (
    "extra_spec:hw:cpu_",
    "extra_spec:hw:emulator_threads_policy",
    "extra_spec:resources:",
    "image:hw_cpu_",
)


def rule_metadata(key: str) -> bool:
    return key in RULE_METADATA or key.startswith(RULE_METADATA_PREFIXES)


class Malformed(ValueError):
    """A message that does not follow the wire format; the text says where."""


# ---------------------------------------------------------------- encode


def inventory_to_wire(inv: Inventory) -> dict:
    wire: dict[str, Any] = {
        "total": inv.total,
        "reserved": inv.reserved,
        "min_unit": inv.min_unit,
        "max_unit": inv.max_unit,
        "step_size": inv.step_size,
        "allocation_ratio": float(inv.allocation_ratio),
    }
    if inv.keep_placement_ratio:  # only when set: older appliers never see it
        wire["keep_placement_ratio"] = True
    if inv.guest_held:  # since 2.5, only when set: a tree without any keeps its digest
        wire["guest_held"] = [[consumer, n] for consumer, n in inv.guest_held]
    return wire


def inventories_to_wire(inventories: Mapping[str, Inventory]) -> dict:
    return {rc: inventory_to_wire(inv) for rc, inv in sorted(inventories.items())}


def provider_to_wire(p: Provider) -> dict:
    wire: dict[str, Any] = {
        "name": p.name,
        "parent": p.parent,
        "uuid": p.uuid,
        "inventories": inventories_to_wire(p.inventories),
        "traits": {t: bool(on) for t, on in sorted(p.traits.items())},
    }
    if p.aggregates:  # since 2.4, only when set: a tree without any keeps its digest
        wire["aggregates"] = sorted(p.aggregates)
    return wire


def tree_to_wire(tree: ProviderTree) -> list[dict]:
    return [provider_to_wire(p) for p in tree.providers]


def guest_to_wire(guest: Guest) -> dict:
    return {
        "uuid": guest.uuid,
        "name": guest.name,
        "vcpus": guest.vcpus,
        # MiB, as the rules count it: a change below one MiB changes no digest.
        "memory_mb": guest.memory_kb // 1024,
        "vcpupin": [[vcpu, str(cpus)] for vcpu, cpus in guest.vcpupin],
        "numa_nodes": sorted(guest.numa_nodes),
        "mdevs": [{"uuid": m.uuid, "parent": m.parent} for m in guest.mdevs],
        "metadata": [[k, v] for k, v in guest.metadata if rule_metadata(k)],
    }


def numa_to_wire(nodes) -> list[dict]:
    return [{"id": n.id, "cpus": str(n.cpus)} for n in sorted(nodes, key=lambda n: n.id)]


def gpus_to_wire(host: str, gpus) -> list[dict]:
    return [
        {"address": g.address, "provider": gpu_provider_name(host, g.address)}
        for g in sorted(gpus, key=lambda g: g.address)
    ]


def limits_to_wire(limits: HostLimits) -> dict:
    return {
        "cpus": limits.cpus,
        "memory_mb": limits.memory_mb,
        "disk_gb": limits.disk_gb,
        "hugepages": dict(sorted(limits.hugepages.items())),
        "vgpus": limits.vgpus,
        "vfs": limits.vfs,
        "online_cpus": limits.online_cpus,
        "mem_encryption": limits.mem_encryption,
    }


def body_of(desired) -> dict:
    """What the applier needs from one cycle's ``Desired``: the tree, the
    reshape inputs and the host's limits (see the module's docstring)."""
    dedicated = desired.partition.dedicated
    host = desired.tree.root.name
    body = {
        "tree": tree_to_wire(desired.tree),
        "reshape": {
            "dedicated": str(dedicated) if dedicated else "",
            "guests": [guest_to_wire(g) for g in desired.host.guests],
            "numa": numa_to_wire(desired.host.nodes),
            "gpus": gpus_to_wire(host, desired.host.gpus),
        },
    }
    limits = limits_of(desired)
    if limits is not None:
        body["limits"] = limits_to_wire(limits)
    flat = getattr(desired, "without_numa", None)
    if flat is not None:
        body["without_numa"] = {"inventories": inventories_to_wire(flat.root.inventories)}
    return body


def canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def digest_of(body: Mapping) -> str:
    return hashlib.sha256(canonical(body).encode("utf-8")).hexdigest()


def full_message(host: str, seq: int, body: dict, key: bytes) -> dict:
    """The full message, signed with the host's ``key``."""
    return signing.sign(
        {"version": WIRE_VERSION, "host": host, "seq": seq, "digest": digest_of(body)}, key
    ) | {"body": body}


def heartbeat(host: str, seq: int, digest: str, key: bytes) -> dict:
    return signing.sign({"version": WIRE_VERSION, "host": host, "seq": seq, "digest": digest}, key)


# ---------------------------------------------------------------- decode


@dataclass(frozen=True)
class Message:
    """A validated message. ``body`` is None for a heartbeat."""

    host: str
    seq: int
    digest: str
    body: Optional[dict] = None
    signed: bool = False
    version: str = WIRE_VERSION


@dataclass(frozen=True)
class RemoteHost:
    """The parts of a ``HostSnapshot`` the reshape rules read. Guests carry
    only what the rules read (``running`` is a default, and ``memory_kb`` 0
    from a message older than 2.4); NUMA nodes only their id and CPUs; GPUs
    only their address."""

    guests: tuple[Guest, ...] = ()
    nodes: tuple[NumaNode, ...] = ()
    gpus: tuple[PciGpu, ...] = ()

    # The snapshot's own lookup (it reads only ``nodes``): one definition.
    node_of = HostSnapshot.node_of


@dataclass(frozen=True)
class RemotePartition:
    dedicated: CpuSet = field(default_factory=CpuSet)


@dataclass(frozen=True)
class RemoteDesired:
    """What the applier rebuilds from a body: the parts of a cycle's
    ``Desired`` that the reshape and the sync read (``tree``,
    ``host.guests``, ``partition.dedicated``) and the host's limits (None
    from a 2.0 message: the invariant cannot be checked)."""

    tree: ProviderTree
    host: RemoteHost
    partition: RemotePartition
    applied: Mapping = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    limits: Optional[HostLimits] = None
    # What the agent's maintenance record asked for, as its tree says it
    # (:func:`maintenance_of`); None: no record, Placement's root decides.
    maintenance: Optional[Mapping] = None
    notes: tuple[str, ...] = ()
    # The tree a refused NUMA reshape writes instead (since 2.4; None
    # before, or with numa_in_placement off): see :func:`flat_of`.
    without_numa: Optional[ProviderTree] = None
    # What the rules would read and the body does not carry (a message older
    # than 2.4): :func:`lacking`.
    lacks: tuple[str, ...] = ()
    # The wire carries no sharing provider: shared storage is refused with
    # upstream = messaging (config/settings.py).
    shared: None = None


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise Malformed(f"{where}: {what}")


# What follows reads a message the schema accepted (parse_message): types,
# required keys, ranges and patterns are known to hold. What is checked here
# needs more than one field, or a parser.


def _uuid_or_none(value: Optional[str]) -> Optional[str]:
    return None if value is None else str(uuidlib.UUID(value))


def inventory_from_wire(data: dict, where: str) -> Inventory:
    # JSON has no infinity, but Python's json reads one, and NaN passes
    # every comparison a schema can make.
    _need(math.isfinite(data["allocation_ratio"]), where, "allocation_ratio must be finite")
    return Inventory(
        total=data["total"],
        reserved=data["reserved"],
        min_unit=data["min_unit"],
        max_unit=data["max_unit"],
        step_size=data["step_size"],
        allocation_ratio=float(data["allocation_ratio"]),
        keep_placement_ratio=data.get("keep_placement_ratio", False),
        guest_held=_guest_held(data.get("guest_held") or (), where),
    )


def has_guest_held(body: Mapping) -> bool:
    """Whether a body's tree carries units guests hold (2.5 ``guest_held``)."""
    return any(
        inv.get("guest_held")
        for provider in body.get("tree") or ()
        for inv in (provider.get("inventories") or {}).values()
    )


def _guest_held(data, where: str) -> tuple[tuple[str, int], ...]:
    held = tuple((str(uuidlib.UUID(consumer)), n) for consumer, n in data)
    consumers = [consumer for consumer, _ in held]
    _need(len(consumers) == len(set(consumers)), f"{where} guest_held", "a guest appears twice")
    return tuple(sorted(held))


def inventories_from_wire(data: dict, where: str) -> dict[str, Inventory]:
    return {rc: inventory_from_wire(inv, f"{where} {rc}") for rc, inv in data.items()}


def _provider_from_wire(data: dict, n: int) -> Provider:
    where = f"body.tree[{n}] ({data['name']})"
    aggregates = frozenset(str(uuidlib.UUID(a)) for a in data.get("aggregates", ()))
    _need(
        not aggregates or data["parent"] is None,
        where,
        "only the root joins aggregates ([placement] aggregates)",
    )
    return Provider(
        name=data["name"],
        parent=data["parent"],
        uuid=_uuid_or_none(data["uuid"]),
        inventories=inventories_from_wire(data["inventories"], where),
        traits=dict(data["traits"]),
        aggregates=aggregates,
    )


def tree_from_wire(data: list, host: str) -> ProviderTree:
    """The tree of ``host``, checked: one root named ``host`` first, every
    child named as the agent names its children
    (:func:`node_agent.tree.child_names.is_child_name`: never another
    host's root name) under a provider listed before it."""
    providers = tuple(_provider_from_wire(p, n) for n, p in enumerate(data))
    root = providers[0]
    _need(root.parent is None, "body.tree[0]", "the first provider must be the root")
    _need(
        root.name == host,
        "body.tree[0]",
        f"the root is named {root.name!r}, but the message comes from host {host!r}",
    )
    seen = {root.name}
    for n, provider in enumerate(providers[1:], 1):
        where = f"body.tree[{n}] ({provider.name})"
        _need(provider.name not in seen, where, "a provider name appears twice")
        _need(provider.parent is not None, where, "a second root; a host has one tree")
        _need(
            provider.parent in seen,
            where,
            f"parent {provider.parent!r} is not listed before it in this host's tree",
        )
        _need(
            is_child_name(host, provider.name),
            where,
            f"a child of host {host!r} must be named {child_names.KINDS}; this name is "
            "not this host's (it could be another host's root)",
        )
        seen.add(provider.name)
    uuids = [p.uuid for p in providers if p.uuid]
    _need(len(uuids) == len(set(uuids)), "body.tree", "a uuid appears twice")
    return ProviderTree(providers)


def _cpus(text: str, where: str) -> CpuSet:
    try:
        return parse_cpulist(text)
    except CpuSetSyntaxError as exc:
        raise Malformed(f"{where}: {exc}") from None


def _vcpupin(data: list, where: str) -> tuple[tuple[int, CpuSet], ...]:
    pins, seen = [], set()
    for k, (vcpu, cpus) in enumerate(data):
        here = f"{where}.vcpupin[{k}]"
        _need(vcpu not in seen, here, f"vCPU {vcpu} is pinned twice")
        seen.add(vcpu)
        pins.append((vcpu, _cpus(cpus, here)))
    return tuple(pins)


def guest_from_wire(data: dict, n: int) -> Guest:
    where = f"body.reshape.guests[{n}]"
    return Guest(
        uuid=str(uuidlib.UUID(data["uuid"])),
        name=data["name"],
        vcpus=data["vcpus"],
        running=True,
        # Before 2.4 no memory: the NUMA rules then place by CPU only (lacking).
        memory_kb=data.get("memory_mb", 0) * 1024,
        vcpupin=_vcpupin(data["vcpupin"], where),
        numa_nodes=frozenset(data["numa_nodes"]),
        mdevs=tuple(GuestMdev(str(uuidlib.UUID(m["uuid"])), m["parent"]) for m in data["mdevs"]),
        metadata=tuple((k, v) for k, v in data["metadata"]),
    )


def numa_from_wire(data: list) -> tuple[NumaNode, ...]:
    """The host's NUMA nodes; a CPU in two nodes would make ``node_of``
    depend on the order, so it is refused."""
    nodes: list[NumaNode] = []
    owner: dict[int, int] = {}
    for k, node in enumerate(data):
        where = f"body.reshape.numa[{k}]"
        _need(node["id"] not in {n.id for n in nodes}, where, f"node {node['id']} appears twice")
        cpus = _cpus(node["cpus"], f"{where}.cpus")
        for cpu in cpus:
            _need(cpu not in owner, where, f"CPU {cpu} is in node {owner.get(cpu)} too")
            owner[cpu] = node["id"]
        nodes.append(NumaNode(id=node["id"], cpus=cpus, memory_kb=None))
    return tuple(nodes)


def gpus_from_wire(data: list, host: str) -> tuple[PciGpu, ...]:
    """The host's GPUs. The provider name must be the one the rules look
    for: an agent and an applier naming GPU children differently would
    otherwise leave VGPU on the root without a word."""
    gpus: list[PciGpu] = []
    for k, gpu in enumerate(data):
        where = f"body.reshape.gpus[{k}]"
        address = gpu["address"]
        _need(address not in {g.address for g in gpus}, where, f"GPU {address} appears twice")
        expected = gpu_provider_name(host, address)
        _need(
            gpu["provider"] == expected,
            where,
            f"provider {gpu['provider']!r} is not {expected!r}, the name this "
            "applier gives the GPU's child (agent and applier disagree on naming: "
            "run the same node-agent release on both)",
        )
        gpus.append(PciGpu(address=address, mdev_types=()))
    return tuple(gpus)


def _check_children_described(tree: ProviderTree, host: RemoteHost) -> None:
    """Every NUMA child of the tree has its node in ``numa``, and every GPU
    child offering VGPU its GPU in ``gpus``: the rules find children only
    through them, and a child they miss would get inventory the guests'
    allocations never follow."""
    nodes = {n.id for n in host.nodes}
    gpus = {gpu_provider_name(tree.root.name, g.address) for g in host.gpus}
    for provider in tree.providers[1:]:
        match = NUMA_CHILD.search(provider.name)
        if match and is_numa_child(tree, provider):
            _need(
                int(match[1]) in nodes,
                f"body.tree ({provider.name})",
                f"NUMA node {match[1]} is not described in body.reshape.numa",
            )
        if provider.name.startswith(f"{tree.root.name}_pci_") and "VGPU" in provider.inventories:
            _need(
                provider.name in gpus,
                f"body.tree ({provider.name})",
                "a GPU child that is not described in body.reshape.gpus",
            )


def limits_from_wire(data: Optional[dict]) -> Optional[HostLimits]:
    """The host's limits (the schema checked every field), None when absent."""
    if data is None:
        return None
    return HostLimits(
        cpus=data["cpus"],
        memory_mb=data["memory_mb"],
        disk_gb=data["disk_gb"],
        hugepages=dict(data["hugepages"]),
        vgpus=data["vgpus"],
        vfs=data["vfs"],
        online_cpus=data["online_cpus"],
        mem_encryption=data.get("mem_encryption"),
    )


def maintenance_of(tree: ProviderTree) -> Optional[dict]:
    """The agent's maintenance record as its tree shows it: the root's
    ``COMPUTE_STATUS_DISABLED`` wanted (on), unwanted (an ``off`` to apply),
    or absent: the agent has no record (say its state file was lost), and,
    as in the direct mode, the trait on the root in Placement keeps
    maintenance on (:func:`node_agent.policy.maintenance.from_placement`)."""
    wanted = tree.root.traits.get(maint.TRAIT)
    if wanted is None:
        return None
    return maint.record(bool(wanted), None, "")


def is_numa_child(tree: ProviderTree, provider: Provider) -> bool:
    match = NUMA_CHILD.search(provider.name)
    return match is not None and provider.name == numa_provider_name(tree.root.name, int(match[1]))


def flat_of(tree: ProviderTree, root_inventories: Mapping[str, Inventory]) -> ProviderTree:
    """The host's tree without NUMA children, as the agent builds it
    (:attr:`node_agent.cycle.desired.Desired.without_numa`) and the
    reconciler then closes as the host's maintenance says: ``tree`` less its
    NUMA children, the devices under them (GPU, SR-IOV children) under the
    root, and the root with ``root_inventories``. Built here rather than
    sent whole: the children keep what the agent sent for them (their
    per-device maintenance included), and the body grows by one provider's
    inventories."""
    gone = {p.name for p in tree.providers[1:] if is_numa_child(tree, p)}
    root = replace(tree.root, inventories=dict(root_inventories))
    kept = tuple(
        replace(p, parent=root.name) if p.parent in gone else p
        for p in tree.providers[1:]
        if p.name not in gone
    )
    return ProviderTree((root,) + kept)


# What a message older than 2.4 leaves out, and what the applier then does
# otherwise than the direct mode (logged once per host).
LACKS_MEMORY = (
    "each guest's memory: guests with no NUMA placement go to NUMA children by "
    "their CPUs only, and a migration record is not matched to its guest"
)
LACKS_FLAT = (
    "the tree without NUMA children: a refused NUMA reshape holds back the "
    "whole reshape (no flat fallback)"
)


def lacking(body: dict, tree: ProviderTree) -> tuple[str, ...]:
    """What the rules would read that ``body`` does not carry (a body of an
    agent older than 2.4, which 2.4 made required or added): none from a
    2.4 agent."""
    lacks = []
    if any("memory_mb" not in g for g in body["reshape"]["guests"]):
        lacks.append(LACKS_MEMORY)
    if "without_numa" not in body and any(is_numa_child(tree, p) for p in tree.providers[1:]):
        lacks.append(LACKS_FLAT)
    return tuple(lacks)


def desired_from_body(body: dict, host: str) -> RemoteDesired:
    """Rebuild the tree and the reshape inputs from a body that
    :func:`parse_message` accepted (or the applier's record of one); raises
    :class:`Malformed`."""
    tree = tree_from_wire(body["tree"], host)
    reshape = body["reshape"]
    remote = RemoteHost(
        tuple(guest_from_wire(g, n) for n, g in enumerate(reshape["guests"])),
        numa_from_wire(reshape["numa"]),
        gpus_from_wire(reshape["gpus"], host),
    )
    uuids = [g.uuid for g in remote.guests]
    _need(len(uuids) == len(set(uuids)), "body.reshape.guests", "a guest uuid appears twice")
    _check_children_described(tree, remote)
    flat = body.get("without_numa")
    return RemoteDesired(
        tree,
        remote,
        RemotePartition(_cpus(reshape["dedicated"], "body.reshape.dedicated")),
        limits=limits_from_wire(body.get("limits")),
        maintenance=maintenance_of(tree),
        without_numa=None
        if flat is None
        else flat_of(tree, inventories_from_wire(flat["inventories"], "body.without_numa")),
        lacks=lacking(body, tree),
    )


def _version(version) -> Optional[tuple[int, int]]:
    match = (
        re.fullmatch(r"([0-9]{1,4})\.([0-9]{1,4})", version) if isinstance(version, str) else None
    )
    return (int(match[1]), int(match[2])) if match else None


def _check_version(version) -> tuple[int, int]:
    """Only this major version is read: see the module's docstring."""
    ours, theirs = _version(WIRE_VERSION), _version(version)
    assert ours is not None
    if theirs is not None and theirs[0] == ours[0]:
        return theirs
    if theirs is None:
        why = "is not a wire version (MAJOR.MINOR)"
    elif theirs[0] > ours[0]:
        why = "is newer than this applier understands: upgrade node-agent-applier"
    else:
        why = "is older than this applier understands: upgrade node-agent on this host"
    raise Malformed(f"version: wire format {version!r} {why} (this applier reads {ours[0]}.x)")


# A real host's body is tens of KiB; schema validation costs about 3
# CPU-seconds per MiB, so a body past this is refused before it.
MAX_BODY_BYTES = 4 * 1024 * 1024


def parse_message(message) -> Message:
    """:func:`parse_envelope`, then :func:`parse_body`: the whole check, as
    the agent runs it on what it sends. The applier runs the two apart, with
    the signature check between them."""
    return parse_body(message, parse_envelope(message))


def parse_envelope(message) -> tuple[int, int]:
    """Check the version, then every field but the body against the
    published schema (:mod:`node_agent.remote.schema`): what the signature
    check reads, at a cost that does not grow with the body. Returns the
    version (major, minor); raises :class:`Malformed` naming the first
    error's path."""
    _need(isinstance(message, dict), "message", "must be an object")
    major, minor = _check_version(message.get("version"))
    envelope = {key: value for key, value in message.items() if key != "body"}
    _check_schema(envelope, major, minor)
    return major, minor


def parse_body(message: dict, version: tuple[int, int]) -> Message:
    """The message whose envelope :func:`parse_envelope` accepted, its body
    checked: the size limit and the digest (both one serialisation), then the
    schema. Raises :class:`Malformed`."""
    body = message.get("body")
    if body is not None:
        try:
            text = canonical(body)
        except (ValueError, TypeError, RecursionError):
            raise Malformed("body: is not JSON data this applier can read") from None
        size = len(text.encode("utf-8"))
        _need(
            size <= MAX_BODY_BYTES,
            "body",
            f"is {size} bytes, more than the {MAX_BODY_BYTES} a host's tree needs",
        )
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        _need(digest == message["digest"], "digest", "does not match the body")
        _check_schema(message, *version)
    return Message(
        message["host"],
        message["seq"],
        message["digest"],
        body,
        signed="signature" in message,
        version=message["version"],
    )


def _check_schema(message: dict, major: int, minor: int) -> None:
    error = schema.first_error(
        message, major, newer_minor=minor > schema.minor_of(major), minor=minor
    )
    if error:
        raise Malformed(error)


def sender_of(raw) -> str:
    """The host a refused message names, for the log: only a valid host
    name, never another value (it may be anything, a secret included)."""
    host = raw.get("host") if isinstance(raw, dict) else None
    if isinstance(host, str) and schema.first_error(host, 2, at="host") is None:
        return host
    return "a sender with no valid host name"


def check_outgoing(message: dict) -> None:
    """What the applier will check, checked before sending: a message this
    agent built wrong is a bug here, reported here, and never sent. Raises
    :class:`Malformed`."""
    parsed = parse_message(message)
    if parsed.body is not None:
        desired_from_body(parsed.body, parsed.host)
