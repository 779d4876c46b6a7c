"""``[agent] upstream = messaging``: the agent's side of node-agent-applier.

The agent holds no Placement credentials. Each cycle it sends one RPC call
(topic ``[agent] upstream_topic``, no server: the applier processes on that
topic are competing consumers) and learns the result from the reply:

* when the tree or the reshape inputs changed since the last acknowledged
  apply (their digest differs), or on the first cycle of the process: the
  full message, ``{version, host, seq, digest, body}``;
* otherwise a heartbeat, ``{version, host, seq, digest}`` (about 150
  bytes). The applier answers ``unchanged`` without touching Placement,
  re-applies the tree it keeps when its periodic full verify is due, or
  answers ``unknown_digest``, and the agent sends the full message at once.

``body`` is plain JSON: ``tree`` (providers, parents first, each with
name, parent, uuid, inventories and the trait -> wanted map) and
``reshape``, exactly what :func:`node_agent.reshape.host_rule` and
:func:`node_agent.reshaper.host_reshape_inputs` read from a cycle's
``Desired``, so the applier runs the same rule chain as the direct mode:

* ``dedicated``: the cpulist of ``cpu_dedicated_set`` (VCPU -> PCPU);
* ``guests``: each guest's consumer ``uuid``, ``name``, ``vcpus``,
  ``vcpupin`` (``[[vcpu, cpulist], ...]``), ``numa_nodes`` (numatune),
  ``mdevs`` (``[{uuid, parent}]``, parent the GPU's PCI address or null)
  and the ``metadata`` that :attr:`~node_agent.topology.Guest.pinned`
  reads. Nothing else: a guest starting or stopping changes no digest;
* ``numa``: the host's NUMA nodes, ``[{id, cpus}]`` (what ``node_of``
  reads: flat -> NUMA children by each guest's pinned CPUs and numatune);
* ``gpus``: the host's mdev-capable GPUs, ``[{address, provider}]``, the
  provider being the GPU's child name (VGPU root -> GPU children by each
  mdev's parent).

Version 2.0 added ``numa`` and ``gpus``. It is a major bump on purpose: an
applier that ignored them would move NUMA or GPU inventory to children while
the guests' allocations stayed on the root, so both sides refuse the other
major version, with a reply that says which side to upgrade.

``seq`` grows on every message (microseconds of the wall clock, never
below the last one sent), so the applier can ignore a message older than
one it already applied (``stale``).

No answer within ``[agent] upstream_timeout`` raises :class:`NoApplier`, a
:class:`~node_agent.placement.Unavailable`: the service backs off as for a
Placement outage. Nothing is lost; the next cycle sends the state of then.

The wire format (encode, and the validating decode the applier uses) is
pure and lives here so both sides share one definition.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from node_agent.cpuset import CpuSet, CpuSetSyntaxError, parse_cpulist
from node_agent.errors import ConfigError
from node_agent.numa_tree import numa_provider_name
from node_agent.pci_tree import gpu_provider_name
from node_agent.placement import Unavailable
from node_agent.provider_tree import Inventory, Provider, ProviderTree
from node_agent.topology import Guest, GuestMdev, HostSnapshot, NumaNode, PciGpu

LOG = logging.getLogger(__name__)

WIRE_VERSION = "2.0"   # bump the minor for an added optional key, the major otherwise
RPC_VERSION = "1.0"
METHOD = "apply"
DEFAULT_TOPIC = "node-agent-applier"

# Reply statuses.
APPLIED = "applied"            # the tree was applied (see "ok" and "errors")
UNCHANGED = "unchanged"        # heartbeat of the applied digest: nothing to do
UNKNOWN_DIGEST = "unknown_digest"  # heartbeat the applier cannot match: send all
STALE = "stale"                # seq not newer than the last applied one
REFUSED = "refused"            # malformed, or names another host's providers
BUSY = "busy"                  # another process is applying this host
ERROR = "error"                # Placement could not be used
STATUSES = (APPLIED, UNCHANGED, UNKNOWN_DIGEST, STALE, REFUSED, BUSY, ERROR)

HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
PLACEMENT_NAME = re.compile(r"^[A-Z0-9_]{1,255}$")  # resource classes, traits
MAX_PROVIDERS = 1000
MAX_GUESTS = 10000
MAX_NODES = 1024
MAX_GPUS = 1024
PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
NUMA_CHILD = re.compile(r"_NUMA_([0-9]+)$")
# Guest.pinned reads only this key; other metadata (names, flavor) would
# only make the digest change without changing any rule.
PINNED_METADATA = ("hw:cpu_policy",)
INVENTORY_INTS = ("total", "reserved", "min_unit", "step_size")


class Malformed(ValueError):
    """A message that does not follow the wire format; the text says where."""


class NoApplier(Unavailable):
    """No node-agent-applier answered in time (or it could not use Placement)."""


class Refused(ConfigError):
    """The applier refused the tree (another host's providers, bad format)."""


# ---------------------------------------------------------------- encode (pure)

def inventory_to_wire(inv: Inventory) -> dict:
    return {"total": inv.total, "reserved": inv.reserved, "min_unit": inv.min_unit,
            "max_unit": inv.max_unit, "step_size": inv.step_size,
            "allocation_ratio": float(inv.allocation_ratio)}


def tree_to_wire(tree: ProviderTree) -> list[dict]:
    return [{"name": p.name, "parent": p.parent, "uuid": p.uuid,
             "inventories": {rc: inventory_to_wire(inv)
                             for rc, inv in sorted(p.inventories.items())},
             "traits": {t: bool(on) for t, on in sorted(p.traits.items())}}
            for p in tree.providers]


def guest_to_wire(guest: Guest) -> dict:
    return {"uuid": guest.uuid, "name": guest.name, "vcpus": guest.vcpus,
            "vcpupin": [[vcpu, str(cpus)] for vcpu, cpus in guest.vcpupin],
            "numa_nodes": sorted(guest.numa_nodes),
            "mdevs": [{"uuid": m.uuid, "parent": m.parent} for m in guest.mdevs],
            "metadata": [[k, v] for k, v in guest.metadata if k in PINNED_METADATA]}


def numa_to_wire(nodes) -> list[dict]:
    return [{"id": n.id, "cpus": str(n.cpus)} for n in sorted(nodes, key=lambda n: n.id)]


def gpus_to_wire(host: str, gpus) -> list[dict]:
    return [{"address": g.address, "provider": gpu_provider_name(host, g.address)}
            for g in sorted(gpus, key=lambda g: g.address)]


def body_of(desired) -> dict:
    """What the applier needs from one cycle's ``Desired``: the tree and the
    reshape inputs (see the module's docstring)."""
    dedicated = desired.partition.dedicated
    host = desired.tree.root.name
    return {"tree": tree_to_wire(desired.tree),
            "reshape": {"dedicated": str(dedicated) if dedicated else "",
                        "guests": [guest_to_wire(g) for g in desired.host.guests],
                        "numa": numa_to_wire(desired.host.nodes),
                        "gpus": gpus_to_wire(host, desired.host.gpus)}}


def canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def digest_of(body: Mapping) -> str:
    return hashlib.sha256(canonical(body).encode("utf-8")).hexdigest()


def full_message(host: str, seq: int, body: dict) -> dict:
    return {"version": WIRE_VERSION, "host": host, "seq": seq,
            "digest": digest_of(body), "body": body}


def heartbeat(host: str, seq: int, digest: str) -> dict:
    return {"version": WIRE_VERSION, "host": host, "seq": seq, "digest": digest}


# ---------------------------------------------------------------- decode (pure)

@dataclass(frozen=True)
class Message:
    """A validated message. ``body`` is None for a heartbeat."""

    host: str
    seq: int
    digest: str
    body: Optional[dict] = None


@dataclass(frozen=True)
class RemoteHost:
    """The parts of a ``HostSnapshot`` the reshape rules read. Guests carry
    only what the rules read (``running`` and ``memory_kb`` are defaults);
    NUMA nodes only their id and CPUs; GPUs only their address."""

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
    ``host.guests``, ``partition.dedicated``)."""

    tree: ProviderTree
    host: RemoteHost
    partition: RemotePartition
    applied: Mapping = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise Malformed(f"{where}: {what}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _uuid_or_none(value, where: str) -> Optional[str]:
    if value is None:
        return None
    _need(isinstance(value, str), where, "uuid must be a string or null")
    try:
        return str(uuidlib.UUID(value))
    except ValueError:
        raise Malformed(f"{where}: {value!r} is not a uuid") from None


def inventory_from_wire(data, where: str) -> Inventory:
    _need(isinstance(data, dict), where, "an inventory must be an object")
    for name in INVENTORY_INTS:
        _need(_is_int(data.get(name)) and data[name] >= 0, where,
              f"{name} must be a non-negative integer")
    _need(data["min_unit"] >= 1 and data["step_size"] >= 1, where,
          "min_unit and step_size must be at least 1")
    max_unit = data.get("max_unit")
    _need(max_unit is None or (_is_int(max_unit) and max_unit >= 1), where,
          "max_unit must be null or a positive integer")
    ratio = data.get("allocation_ratio")
    _need(isinstance(ratio, (int, float)) and not isinstance(ratio, bool)
          and math.isfinite(ratio) and ratio > 0, where,
          "allocation_ratio must be a number above 0")
    return Inventory(total=data["total"], reserved=data["reserved"],
                     min_unit=data["min_unit"], max_unit=max_unit,
                     step_size=data["step_size"], allocation_ratio=float(ratio))


def _provider_from_wire(data, n: int) -> Provider:
    where = f"body.tree[{n}]"
    _need(isinstance(data, dict), where, "a provider must be an object")
    name, parent = data.get("name"), data.get("parent")
    _need(isinstance(name, str) and 0 < len(name) <= 200, where,
          "name must be a string of 1 to 200 characters")
    _need(parent is None or isinstance(parent, str), where, "parent must be a name or null")
    inventories = data.get("inventories", {})
    traits = data.get("traits", {})
    _need(isinstance(inventories, dict) and isinstance(traits, dict), where,
          "inventories and traits must be objects")
    for key in list(inventories) + list(traits):
        _need(PLACEMENT_NAME.match(key) is not None, f"{where} ({name})",
              f"{key!r} is not a resource class or trait name")
    _need(all(isinstance(v, bool) for v in traits.values()), f"{where} ({name})",
          "each trait maps to true (wanted) or false (to remove)")
    return Provider(name=name, parent=parent,
                    uuid=_uuid_or_none(data.get("uuid"), f"{where} ({name})"),
                    inventories={rc: inventory_from_wire(inv, f"{where} ({name}) {rc}")
                                 for rc, inv in inventories.items()},
                    traits=dict(traits))


def tree_from_wire(data, host: str) -> ProviderTree:
    """The tree of ``host``, checked: one root named ``host`` first, every
    child named ``<host>_...`` under a provider listed before it."""
    _need(isinstance(data, list) and 0 < len(data) <= MAX_PROVIDERS, "body.tree",
          f"must be a list of 1 to {MAX_PROVIDERS} providers")
    providers = tuple(_provider_from_wire(p, n) for n, p in enumerate(data))
    root = providers[0]
    _need(root.parent is None, "body.tree[0]", "the first provider must be the root")
    _need(root.name == host, "body.tree[0]",
          f"the root is named {root.name!r}, but the message comes from host {host!r}")
    seen = {root.name}
    for n, provider in enumerate(providers[1:], 1):
        where = f"body.tree[{n}] ({provider.name})"
        _need(provider.name not in seen, where, "a provider name appears twice")
        _need(provider.parent is not None, where, "a second root; a host has one tree")
        _need(provider.parent in seen, where,
              f"parent {provider.parent!r} is not listed before it in this host's tree")
        _need(provider.name.startswith(host + "_"), where,
              f"a child of host {host!r} must be named {host}_...; this name is not "
              "this host's")
        seen.add(provider.name)
    uuids = [p.uuid for p in providers if p.uuid]
    _need(len(uuids) == len(set(uuids)), "body.tree", "a uuid appears twice")
    return ProviderTree(providers)


def _cpus(text, where: str) -> CpuSet:
    _need(isinstance(text, str), where, "a cpulist must be a string")
    try:
        return parse_cpulist(text)
    except CpuSetSyntaxError as exc:
        raise Malformed(f"{where}: {exc}") from None


def _list(data, where: str, most: int) -> list:
    _need(isinstance(data, list) and len(data) <= most, where,
          f"must be a list of at most {most} entries")
    return data


def _pci(value, where: str) -> str:
    _need(isinstance(value, str) and PCI_ADDRESS.match(value) is not None, where,
          f"{value!r} is not a PCI address (0000:81:00.0)")
    return value


def _vcpupin(data, where: str) -> tuple[tuple[int, CpuSet], ...]:
    pins, seen = [], set()
    for k, pin in enumerate(_list(data, f"{where}.vcpupin", 4096)):
        here = f"{where}.vcpupin[{k}]"
        _need(isinstance(pin, list) and len(pin) == 2 and _is_int(pin[0]) and pin[0] >= 0,
              here, "must be [vcpu number, cpulist]")
        _need(pin[0] not in seen, here, f"vCPU {pin[0]} is pinned twice")
        seen.add(pin[0])
        pins.append((pin[0], _cpus(pin[1], here)))
    return tuple(pins)


def _mdev(data, where: str) -> GuestMdev:
    _need(isinstance(data, dict), where, "an mdev must be an object {uuid, parent}")
    uuid = _uuid_or_none(data.get("uuid"), where)
    _need(uuid is not None, where, "uuid is required")
    parent = data.get("parent")
    return GuestMdev(uuid, None if parent is None else _pci(parent, f"{where}.parent"))


def guest_from_wire(data, n: int) -> Guest:
    where = f"body.reshape.guests[{n}]"
    _need(isinstance(data, dict), where, "a guest must be an object")
    uuid = _uuid_or_none(data.get("uuid"), where)
    _need(uuid is not None, where, "uuid (the consumer) is required")
    _need(isinstance(data.get("name"), str) and data["name"] != "", where,
          "name must be a non-empty string")
    _need(_is_int(data.get("vcpus")) and data["vcpus"] >= 0, where,
          "vcpus must be a non-negative integer")
    nodes = _list(data.get("numa_nodes", []), f"{where}.numa_nodes", MAX_NODES)
    _need(all(_is_int(x) and x >= 0 for x in nodes), f"{where}.numa_nodes",
          "must hold node ids (non-negative integers)")
    meta = _list(data.get("metadata", []), f"{where}.metadata", 256)
    _need(all(isinstance(kv, list) and len(kv) == 2 and all(isinstance(x, str) for x in kv)
              for kv in meta), f"{where}.metadata", "must hold [key, value] string pairs")
    mdevs = _list(data.get("mdevs", []), f"{where}.mdevs", MAX_GPUS)
    return Guest(uuid=uuid, name=data["name"], vcpus=data["vcpus"], running=True,
                 memory_kb=0, vcpupin=_vcpupin(data.get("vcpupin", []), where),
                 numa_nodes=frozenset(nodes),
                 mdevs=tuple(_mdev(m, f"{where}.mdevs[{k}]") for k, m in enumerate(mdevs)),
                 metadata=tuple((k, v) for k, v in meta))


def numa_from_wire(data) -> tuple[NumaNode, ...]:
    """The host's NUMA nodes; a CPU in two nodes would make ``node_of``
    depend on the order, so it is refused."""
    nodes, owner = [], {}
    for k, node in enumerate(_list(data, "body.reshape.numa", MAX_NODES)):
        where = f"body.reshape.numa[{k}]"
        _need(isinstance(node, dict) and _is_int(node.get("id")) and node["id"] >= 0, where,
              "must be an object {id: node id, cpus: cpulist}")
        _need(node["id"] not in {n.id for n in nodes}, where,
              f"node {node['id']} appears twice")
        cpus = _cpus(node.get("cpus"), f"{where}.cpus")
        for cpu in cpus:
            _need(cpu not in owner, where, f"CPU {cpu} is in node {owner.get(cpu)} too")
            owner[cpu] = node["id"]
        nodes.append(NumaNode(id=node["id"], cpus=cpus, memory_kb=None))
    return tuple(nodes)


def gpus_from_wire(data, host: str) -> tuple[PciGpu, ...]:
    """The host's GPUs. The provider name must be the one the rules look
    for: an agent and an applier naming GPU children differently would
    otherwise leave VGPU on the root without a word."""
    gpus = []
    for k, gpu in enumerate(_list(data, "body.reshape.gpus", MAX_GPUS)):
        where = f"body.reshape.gpus[{k}]"
        _need(isinstance(gpu, dict), where, "must be an object {address, provider}")
        address = _pci(gpu.get("address"), f"{where}.address")
        _need(address not in {g.address for g in gpus}, where,
              f"GPU {address} appears twice")
        expected = gpu_provider_name(host, address)
        _need(gpu.get("provider") == expected, where,
              f"provider {gpu.get('provider')!r} is not {expected!r}, the name this "
              "applier gives the GPU's child (agent and applier disagree on naming: "
              "run the same node-agent release on both)")
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
        if match and provider.name == numa_provider_name(tree.root.name, int(match[1])):
            _need(int(match[1]) in nodes, f"body.tree ({provider.name})",
                  f"NUMA node {match[1]} is not described in body.reshape.numa")
        if provider.name.startswith(f"{tree.root.name}_pci_") and "VGPU" in provider.inventories:
            _need(provider.name in gpus, f"body.tree ({provider.name})",
                  "a GPU child that is not described in body.reshape.gpus")


def desired_from_body(body, host: str) -> RemoteDesired:
    """Rebuild the tree and the reshape inputs; raises :class:`Malformed`."""
    _need(isinstance(body, dict), "body", "must be an object")
    tree = tree_from_wire(body.get("tree"), host)
    reshape = body.get("reshape")
    _need(isinstance(reshape, dict), "body.reshape", "must be an object")
    guests = _list(reshape.get("guests", []), "body.reshape.guests", MAX_GUESTS)
    remote = RemoteHost(tuple(guest_from_wire(g, n) for n, g in enumerate(guests)),
                        numa_from_wire(reshape.get("numa", [])),
                        gpus_from_wire(reshape.get("gpus", []), host))
    uuids = [g.uuid for g in remote.guests]
    _need(len(uuids) == len(set(uuids)), "body.reshape.guests", "a guest uuid appears twice")
    _check_children_described(tree, remote)
    return RemoteDesired(tree, remote,
                         RemotePartition(_cpus(reshape.get("dedicated", ""),
                                               "body.reshape.dedicated")))


def _major(version) -> Optional[int]:
    match = re.fullmatch(r"([0-9]{1,4})\.[0-9]{1,4}", version) if isinstance(version, str) \
        else None
    return int(match[1]) if match else None


def _check_version(version) -> None:
    """Only this major version is read: see the module's docstring."""
    ours, theirs = _major(WIRE_VERSION), _major(version)
    if theirs == ours:
        return
    if theirs is None:
        why = "is not a wire version (MAJOR.MINOR)"
    elif theirs > ours:
        why = "is newer than this applier understands: upgrade node-agent-applier"
    else:
        why = "is older than this applier understands: upgrade node-agent on this host"
    raise Malformed(f"version: wire format {version!r} {why} (this applier reads "
                    f"{ours}.x)")


def parse_message(message) -> Message:
    """Check the envelope (and the body's digest); raises :class:`Malformed`."""
    _need(isinstance(message, dict), "message", "must be an object")
    _check_version(message.get("version"))
    host = message.get("host")
    _need(isinstance(host, str) and HOST_NAME.match(host) is not None, "host",
          f"{host!r} is not a host name (letters, digits, '.', '_', '-')")
    _need(_is_int(message.get("seq")) and message["seq"] >= 0, "seq",
          "must be a non-negative integer")
    digest = message.get("digest")
    _need(isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest) is not None,
          "digest", "must be a sha256 in hex")
    body = message.get("body")
    if body is not None:
        _need(digest_of(body) == digest, "digest", "does not match the body")
    return Message(host, message["seq"], digest, body)


# ---------------------------------------------------------------- the reply

@dataclass(frozen=True)
class RemoteChange:
    """A request the applier sent, as the notifications describe it."""

    method: str
    path: str
    summary: str
    provider: Optional[str] = None


@dataclass
class UpstreamReport:
    """The applier's answer, shaped like a SyncReport for the service."""

    status: str
    applied: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    requests: int = 0
    messages: int = 1
    reshape: Optional[dict] = None
    uuids: dict = field(default_factory=dict)
    text: str = ""

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        sent = f"{self.messages} message{'s' if self.messages != 1 else ''}"
        if self.status == UNCHANGED:
            return f"no change (heartbeat; {sent})"
        return f"{self.text or 'applied'} (via applier; {sent})"


def report_from_reply(reply: Mapping, messages: int) -> UpstreamReport:
    return UpstreamReport(
        status=reply.get("status", ERROR),
        applied=[RemoteChange(c.get("method", ""), c.get("path", ""), c.get("summary", ""),
                              c.get("provider")) for c in reply.get("applied", [])],
        errors=list(reply.get("errors", [])), requests=int(reply.get("requests", 0)),
        messages=messages, reshape=reply.get("reshape"),
        uuids=dict(reply.get("uuids") or {}), text=reply.get("summary", ""))


def remember(store, report: UpstreamReport, desired) -> None:
    """Keep in the agent's state file what the direct mode's syncer keeps
    for the cycle: the operator-file traits applied (once applied cleanly)
    and the providers' uuids, so provider files may name them by uuid.
    Written only when something changed."""
    from node_agent.cycle import APPLIED_KEY, PROVIDERS_KEY

    state = store.load_or_empty(LOG)
    new = dict(state)
    if report.ok:
        new[APPLIED_KEY] = {k: list(v) for k, v in desired.applied.items()}
    if report.uuids:
        new[PROVIDERS_KEY] = dict(report.uuids)
    if new != state:
        store.save(new)


# ---------------------------------------------------------------- the shell

class MessagingUpstream:
    """The agent's RPC client of node-agent-applier. One per process: it
    remembers the last sequence number and the last acknowledged digest."""

    def __init__(self, conf, host: str, topic: str = DEFAULT_TOPIC,
                 timeout: float = 60.0, clock=time.time):
        from node_agent import messaging

        rpc_url, _ = messaging.urls(conf)
        if not rpc_url:
            raise ConfigError("[agent] upstream = messaging needs [DEFAULT] transport_url "
                              "(the bus node-agent-applier listens on)")
        self._om = messaging.oslo_messaging()
        self._transport = self._om.get_rpc_transport(conf, url=rpc_url)
        target = self._om.Target(topic=topic, version=RPC_VERSION)
        self._client = self._om.get_rpc_client(self._transport, target, timeout=timeout)
        self.host, self.topic, self.timeout = host, topic, timeout
        self.clock = clock
        self.seq = 0
        self.acked: Optional[str] = None
        self.messages_sent = 0

    def _next_seq(self) -> int:
        self.seq = max(self.seq + 1, int(self.clock() * 1_000_000))
        return self.seq

    def _call(self, message: dict, timeout: float) -> dict:
        self.messages_sent += 1
        try:
            reply = self._client.prepare(timeout=timeout).call({}, METHOD, message=message)
        except self._om.MessagingTimeout:
            raise NoApplier(f"no node-agent-applier answered on topic {self.topic} "
                            f"within {timeout:g}s; the next cycle sends the tree "
                            "again") from None
        except self._om.MessagingException as exc:
            raise NoApplier(f"the message bus refused the call to node-agent-applier: "
                            f"{exc}") from exc
        if not isinstance(reply, dict) or reply.get("status") not in STATUSES:
            raise NoApplier(f"node-agent-applier answered {reply!r}, not a reply")
        return reply

    def send(self, desired, timeout: Optional[float] = None) -> UpstreamReport:
        """Send this cycle's state; returns what the applier did.

        Raises :class:`NoApplier` (no answer, or the applier could not use
        Placement) and :class:`Refused` (the applier will not apply this tree).
        """
        timeout = timeout or self.timeout
        body = body_of(desired)
        digest = digest_of(body)
        sent = 1
        if digest == self.acked:
            reply = self._call(heartbeat(self.host, self._next_seq(), digest), timeout)
            if reply["status"] == UNKNOWN_DIGEST:
                reply, sent = self._call(full_message(self.host, self._next_seq(), body),
                                         timeout), 2
        else:
            reply = self._call(full_message(self.host, self._next_seq(), body), timeout)
        if reply["status"] == STALE:
            LOG.warning("node-agent-applier already applied sequence %s for %s, newer "
                        "than ours (%s): the clock went back, or another agent uses "
                        "this host name; sending again after it", reply.get("last_seq"),
                        self.host, self.seq)
            self.seq = max(self.seq, int(reply.get("last_seq") or 0))
            reply = self._call(full_message(self.host, self._next_seq(), body), timeout)
            sent += 1
        return self._outcome(reply, digest, sent)

    def _outcome(self, reply: dict, digest: str, sent: int) -> UpstreamReport:
        status = reply["status"]
        if status == REFUSED:
            raise Refused(f"node-agent-applier refused the tree of {self.host}: "
                          f"{reply.get('error')}")
        if status in (ERROR, BUSY, STALE, UNKNOWN_DIGEST):
            raise NoApplier(f"node-agent-applier could not apply the tree of "
                            f"{self.host} ({status}): {reply.get('error', '')}".rstrip(": "))
        self.acked = digest
        return report_from_reply(reply, sent)

    def close(self) -> None:
        self._transport.cleanup()
