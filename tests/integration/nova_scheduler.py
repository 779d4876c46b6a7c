"""nova 34 scheduling guests onto agent hosts, against the real Placement.

The harness of tests/integration/test_nova_scheduler.py. Who does what:

* nova's code, in ``.venv-nova`` behind the JSON-lines bridge of
  tests/conformance/bridge.py (``nova_scheduler_side.py``, whose docstring
  lists every nova function it calls): the scheduler's queries (the
  request filters, ``ResourceRequest.from_request_spec``, the fallback
  VCPU query for pinned flavors), its claim (``claim_resources``), the
  conductor's and compute's allocation moves of a resize
  (``move_allocations``, ``delete_allocation_for_instance``), the
  compute's CPU claim (``numa_fit_instance_to_host`` on the topology
  ``LibvirtDriver._get_host_numa_topology`` builds), and the guest's
  domain XML: its ``<nova:instance>`` metadata and its ``<cputune>``,
  ``<numatune>`` and guest NUMA cells come from nova's libvirt driver
  (``_get_guest_config_meta``, ``_get_guest_numa_config``), formatted by
  nova's ``LibvirtConfigGuest``; the rest of ``_get_guest_config``
  (devices, disks, CPU model) is not run, and the domain type is set to
  ``test`` for libvirt's test driver.
* ours: the choice among the candidates nova's queries return (the first
  one on an accepted host that nova's NUMATopologyFilter check passes; the
  other filters and the weighers need nova's database),
  the hosts (each a real agent cycle, ``reshape_driver.agent_cycle``, on a
  sysfs fixture tree with a libvirt test-driver URI whose domains are the
  XML file this harness rewrites whenever nova defines or undefines a
  guest), and the ground truth (:class:`Truth`), read from the sysfs tree
  and the host's config by this module, never from the agent.
"""

from __future__ import annotations

import dataclasses
import shutil
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable, Optional

import psutil

from node_agent.placement.client import PlacementClient
from node_agent.state import StateStore
from tests.conformance.bridge import NovaBridge
from tests.hostdata import HOSTDATA, sysfs_root_for
from tests.integration.reshape_driver import HOST_XML, agent_cycle, make_settings

NOVA_SCHEDULER_SIDE = Path(__file__).with_name("nova_scheduler_side.py")


def nova_side(python: Path, running: Optional[NovaBridge] = None) -> NovaBridge:
    """``running`` while it lives, else a new nova process. Importing nova's
    scheduler and libvirt driver is most of a scenario's set-up (about 4 s
    on a loaded machine); the scenarios share one process and each
    :class:`Cloud` resets it."""
    if running is not None and running.alive():
        return running
    return NovaBridge(python, NOVA_SCHEDULER_SIDE)


PROJECT = "8f6c1a2e-0000-4000-8000-00000000000a"
USER = "5d1e7b3c-0000-4000-8000-00000000000b"
TEST_NS = "http://libvirt.org/schemas/domain/test/1.0"
MIB = 1024 * 1024
GIB = 1024 * MIB
CPU_CLASSES = ("VCPU", "PCPU")


def flavor(name, vcpus, memory_mb=512, root_gb=1, **extra_specs) -> dict:
    return {
        "name": name,
        "vcpus": vcpus,
        "memory_mb": memory_mb,
        "root_gb": root_gb,
        "extra_specs": {k.replace("__", ":"): v for k, v in extra_specs.items()},
    }


def pinned(name, vcpus, memory_mb=512, **extra) -> dict:
    return flavor(name, vcpus, memory_mb, hw__cpu_policy="dedicated", **extra)


# ------------------------------------------------------------ the host, read here


@dataclasses.dataclass(frozen=True)
class Topology:
    """The sysfs tree as read by this module (not by the agent)."""

    nodes: dict  # node id -> sorted host CPUs
    online: frozenset
    node_memory_kib: dict  # node id -> MemTotal kB
    core: dict  # cpu -> (package, core)

    def caps_xml(self) -> str:
        """libvirt's capabilities for these cells, what nova's driver reads."""
        cells = []
        for node, cpus in sorted(self.nodes.items()):
            cpu_lines = []
            for cpu in cpus:
                siblings = sorted(c for c in cpus if self.core[c] == self.core[cpu])
                cpu_lines.append(
                    f"<cpu id='{cpu}' socket_id='{self.core[cpu][0]}' "
                    f"core_id='{self.core[cpu][1]}' "
                    f"siblings='{','.join(map(str, siblings))}'/>"
                )
            mem = self.node_memory_kib[node]
            cells.append(
                f"<cell id='{node}'><memory unit='KiB'>{mem}</memory>"
                f"<pages unit='KiB' size='4'>{mem // 4}</pages>"
                f"<cpus num='{len(cpus)}'>{''.join(cpu_lines)}</cpus></cell>"
            )
        return (
            "<capabilities><host><uuid>00000000-0000-4000-8000-000000000000</uuid>"
            "<cpu><arch>x86_64</arch><model>Skylake-Client-IBRS</model>"
            "<vendor>Intel</vendor></cpu>"
            f"<topology><cells num='{len(cells)}'>{''.join(cells)}</cells></topology>"
            "</host></capabilities>"
        )


def _cpulist(text: str) -> set:
    cpus = set()
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def read_topology(system: Path) -> Topology:
    """``system`` stands for /sys/devices/system."""
    nodes, memory = {}, {}
    for node_dir in sorted((system / "node").glob("node[0-9]*")):
        node = int(node_dir.name[4:])
        listed = node_dir / "cpulist"
        cpus = (
            _cpulist(listed.read_text())
            if listed.exists()
            else {int(p.name[3:]) for p in node_dir.glob("cpu[0-9]*")}
        )
        nodes[node] = sorted(cpus)
        for line in (node_dir / "meminfo").read_text().splitlines():
            if "MemTotal:" in line:
                memory[node] = int(line.split()[-2])
    online = _cpulist((system / "cpu" / "online").read_text())
    core = {}
    for cpu in online:
        topo = system / "cpu" / f"cpu{cpu}" / "topology"
        core[cpu] = (
            int((topo / "physical_package_id").read_text()),
            int((topo / "core_id").read_text()),
        )
    return Topology(nodes, frozenset(online), memory, core)


@dataclasses.dataclass
class Config:
    """The host's nova.conf / node-agent.conf options the scenarios change."""

    dedicated: Optional[str] = None
    shared: Optional[str] = None
    cpu_allocation_ratio: float = 4.0
    reserved_host_memory_mb: int = 512
    numa_in_placement: bool = False

    @property
    def legacy(self) -> bool:
        return self.dedicated is None and self.shared is None


@dataclasses.dataclass(frozen=True)
class Truth:
    """What the host physically has, from its sysfs tree and its config:
    PCPU = |cpu_dedicated_set|, VCPU = |cpu_shared_set| x ratio (every
    online CPU when neither set is configured), MEMORY_MB = (RAM -
    reserved) x 1.0, DISK_GB = the instances filesystem x 1.0."""

    capacity: dict
    dedicated: frozenset
    shared: frozenset
    node_cpus: dict
    node_memory_mb: dict
    cpu_allocation_ratio: float

    def node_capacity(self, node: int) -> dict:
        """What NUMA node ``node`` physically has: its dedicated CPUs, its
        shared CPUs x ratio, its RAM (reserved memory not taken off: a
        bound, the node's share of it is the agent's choice)."""
        cpus = self.node_cpus.get(node, frozenset())
        return {
            "PCPU": len(cpus & self.dedicated),
            "VCPU": int(len(cpus & self.shared) * self.cpu_allocation_ratio),
            "MEMORY_MB": self.node_memory_mb.get(node, 0),
        }

    @classmethod
    def of(cls, topology: Topology, config: Config, instances_path: str) -> "Truth":
        online = topology.online
        dedicated = (
            frozenset(_cpulist(config.dedicated) & online) if config.dedicated else frozenset()
        )
        shared = (
            _cpulist(config.shared) & online
            if config.shared
            else (set() if config.dedicated else set(online))
        )
        # On a fixture root the node sums are the host's RAM (psutil
        # describes the machine running the tests, not the fixture).
        memory_mb = (
            sum(topology.node_memory_kib.values()) // 1024
            if topology.node_memory_kib
            else psutil.virtual_memory().total // MIB
        )
        capacity = {
            "VCPU": int(len(shared) * config.cpu_allocation_ratio),
            "PCPU": len(dedicated),
            "MEMORY_MB": memory_mb - config.reserved_host_memory_mb,
            "DISK_GB": shutil.disk_usage(instances_path).total // GIB,
        }
        return cls(
            capacity,
            dedicated,
            frozenset(shared),
            {n: frozenset(c) for n, c in topology.nodes.items()},
            {n: kib // 1024 for n, kib in topology.node_memory_kib.items()},
            config.cpu_allocation_ratio,
        )


# ------------------------------------------------------------------ one host


class AgentHost:
    """A compute host: a sysfs fixture tree, the domains nova defined on it
    (a libvirt test-driver XML file), its config, and the agent's state."""

    def __init__(
        self,
        tmp: Path,
        url: str,
        name: str,
        tree: Path = HOSTDATA / "virhostcpudata" / "linux-test4",
    ):
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp, self.url, self.name = tmp, url, name
        self.sysfs = str(sysfs_root_for(tree, tmp))
        self.topology = read_topology(tree)
        self.config = Config()
        self.domains: dict[str, str] = {}  # instance uuid -> domain XML
        self.xml_path = tmp / "host.xml"
        self.state_dir = str(tmp / "state")
        (tmp / "provider_config").mkdir(exist_ok=True)
        self.agent = PlacementClient.for_endpoint(url)
        self.write_domains()

    @property
    def uri(self) -> str:
        return f"test://{self.xml_path}"

    def write_domains(self) -> None:
        """host.xml's node (CPUs, memory, node devices) with nova's domains."""
        ET.register_namespace("test", TEST_NS)
        node = ET.parse(HOST_XML).getroot()
        for domain in node.findall("domain"):
            node.remove(domain)
        for n, xml in enumerate(self.domains.values()):
            node.insert(2 + n, ET.fromstring(xml))
        self.xml_path.write_text(ET.tostring(node, encoding="unicode"))

    def settings(self):
        cfg = self.config
        base = make_settings(
            self.name,
            self.sysfs,
            self.uri,
            self.state_dir,
            str(self.tmp),
            cfg.dedicated,
            cfg.shared,
        )
        return dataclasses.replace(
            base,
            cpu_allocation_ratio=cfg.cpu_allocation_ratio,
            reserved_host_memory_mb=cfg.reserved_host_memory_mb,
            numa_in_placement=cfg.numa_in_placement,
            provider_config_location=str(self.tmp / "provider_config"),
        )

    def cycle(self, before_post: Optional[Callable] = None):
        """One agent cycle: (reshape outcome or refusal, sync report, desired)."""
        self.write_domains()
        return agent_cycle(self.agent, self.settings(), before_post)

    def truth(self) -> Truth:
        return Truth.of(self.topology, self.config, str(self.tmp))

    def nova_options(self) -> dict:
        cfg = self.config
        return {
            "cpu_dedicated_set": cfg.dedicated,
            "cpu_shared_set": cfg.shared,
            "cpu_allocation_ratio": cfg.cpu_allocation_ratio,
        }

    @property
    def root(self) -> str:
        return StateStore(Path(self.state_dir)).load()["root_uuid"]


# ----------------------------------------------------------------- the cloud


@dataclasses.dataclass
class Guest:
    uuid: str
    name: str
    flavor: dict
    host: str
    pins: dict = dataclasses.field(default_factory=dict)  # vcpu -> [host cpus]
    migration: Optional[str] = None
    source: Optional[str] = None  # resize in flight: the source host
    old_flavor: Optional[dict] = None
    old_pins: dict = dataclasses.field(default_factory=dict)

    def dedicated_vcpus(self, pins=None) -> int:
        """vCPUs pinned one to one (PCPU in nova's accounting)."""
        pins = self.pins if pins is None else pins
        policy = self.flavor["extra_specs"].get("hw:cpu_policy")
        if policy not in ("dedicated", "mixed"):
            return 0
        return (
            sum(1 for cpus in pins.values() if len(cpus) == 1) if policy == "mixed" else len(pins)
        )


class Cloud:
    """nova's scheduler, conductor and computes over the agent hosts."""

    def __init__(self, nova: NovaBridge, url: str):
        """``nova``: a process of nova_scheduler_side.py (:func:`nova_side`),
        which ``init`` starts afresh: no host, no guest, a new report client."""
        self.url = url
        self.nova = nova
        self.nova.call("init", url=url)
        self.placement = PlacementClient.for_endpoint(url)
        self.hosts: dict[str, AgentHost] = {}
        self.guests: dict[str, Guest] = {}
        self.refused_on_host: list[str] = []  # nova's compute claim failed
        self.queries: list[list[str]] = []
        # (host, from the first query) of each candidate of the last select
        self.last_candidates: list[tuple[str, bool]] = []
        self._count = 0

    # ------------------------------------------------------------- hosts

    def add_host(self, host: AgentHost) -> AgentHost:
        self.hosts[host.name] = host
        self.configure(host)
        return host

    def configure(self, host: AgentHost, **changes) -> None:
        """The operator edits the host's config (nova-compute's and the agent's)."""
        host.config = dataclasses.replace(host.config, **changes)
        self.nova.call(
            "host_config",
            host=host.name,
            caps=host.topology.caps_xml(),
            online=sorted(host.topology.online),
            options=host.nova_options(),
        )

    def tree_of(self, host: AgentHost) -> list[dict]:
        return self.placement.get(f"/resource_providers?in_tree={host.root}")["resource_providers"]

    def provider_hosts(self) -> dict:
        """provider uuid -> the host whose tree holds it."""
        owner = {}
        for host in self.hosts.values():
            if self._has_root(host):
                for rp in self.tree_of(host):
                    owner[rp["uuid"]] = host
        return owner

    @staticmethod
    def _has_root(host: "AgentHost") -> bool:
        try:
            return bool(host.root)
        except Exception:  # no cycle ran yet: no state file
            return False

    # ------------------------------------------------------------ boot

    def _spec_args(self, instance: str, fl: dict, image_properties=None) -> dict:
        return {
            "instance": instance,
            "flavor": fl,
            "image_properties": image_properties or {},
            "project_id": PROJECT,
            "user_id": USER,
        }

    def select(
        self, instance: str, fl: dict, accept: Callable[[AgentHost], bool], image_properties=None
    ):
        """nova's queries; the first allocation request all on one accepted host."""
        answer = self.nova.call("select", **self._spec_args(instance, fl, image_properties))
        self.queries.append(answer["queries"])
        self.last_candidates = []
        owner = self.provider_hosts()
        for n, request in enumerate(answer["allocation_requests"]):
            hosts = {owner.get(rp) for rp in request["allocations"]}
            host = hosts.pop() if len(hosts) == 1 else None
            if host is not None and accept(host):
                first = n < answer["from_first_query"]
                self.last_candidates.append((host.name, first))
        for request in answer["allocation_requests"]:
            hosts = {owner.get(rp) for rp in request["allocations"]}
            if len(hosts) == 1:
                host = hosts.pop()
                if (
                    host is not None
                    and accept(host)
                    and self.nova.call(
                        "fits", host=host.name, flavor=fl, image_properties=image_properties or {}
                    )
                ):
                    return host, request, answer["version"]
        return None, None, answer["version"]

    def _spawn(self, guest: Guest, host: AgentHost, runstate: int = 1) -> bool:
        answer = self.nova.call(
            "spawn",
            host=host.name,
            instance=guest.uuid,
            name=guest.name,
            display_name=guest.name,
            flavor=guest.flavor,
            owner={"project_id": PROJECT, "user_id": USER},
            runstate=runstate,
        )
        if "refused" in answer:
            self.refused_on_host.append(f"{guest.name} on {host.name}: {answer['refused']}")
            return False
        host.domains[guest.uuid] = answer["xml"]
        host.write_domains()
        guest.pins = {int(k): v for k, v in answer["pins"].items()}
        return True

    def boot(self, fl: dict, on: Optional[list] = None, image_properties=None) -> Optional[Guest]:
        """Schedule, claim and spawn one guest. None when nova's queries
        return no candidate on the accepted hosts (NoValidHost). A guest
        whose compute claim fails is recorded in ``refused_on_host``, its
        allocation removed (what a failed build does) and None returned."""
        self._count += 1
        instance = str(uuid.uuid4())
        names = {h.name for h in on} if on else set(self.hosts)
        host, request, version = self.select(
            instance, fl, lambda h: h.name in names, image_properties
        )
        if host is None:
            return None
        claimed = self.nova.call(
            "claim",
            allocation_request=request,
            version=version,
            **self._spec_args(instance, fl, image_properties),
        )
        assert claimed is True, f"nova's claim of {instance} failed: {claimed}"
        guest = Guest(instance, f"instance-{self._count:08x}", fl, host.name)
        if not self._spawn(guest, host):
            self.nova.call("delete", consumer=instance)
            return None
        self.guests[instance] = guest
        return guest

    # ----------------------------------------------------------- resize

    def resize(self, guest: Guest, new_flavor: dict) -> Optional[AgentHost]:
        """Conductor + scheduler + dest compute of a resize to another host,
        stopped at VERIFY_RESIZE: the instance's allocations on the source
        moved to the migration uuid, new ones claimed on the destination,
        the guest defined on both (shut off on the source)."""
        source = self.hosts[guest.host]
        migration = str(uuid.uuid4())
        moved = self.nova.call("move", source=guest.uuid, target=migration)
        assert moved is True, f"move_allocations to the migration: {moved}"
        host, request, version = self.select(
            guest.uuid, new_flavor, lambda h: h.name != source.name
        )
        if host is None:
            assert self.nova.call("move", source=migration, target=guest.uuid) is True
            return None
        claimed = self.nova.call(
            "claim",
            allocation_request=request,
            version=version,
            **self._spec_args(guest.uuid, new_flavor),
        )
        assert claimed is True, f"claim on the destination: {claimed}"
        guest.migration, guest.source = migration, source.name
        guest.old_flavor, guest.old_pins = guest.flavor, guest.pins
        # The source guest is powered off but stays defined until confirm.
        source.domains[guest.uuid] = source.domains[guest.uuid].replace(
            "<test:runstate>1</test:runstate>", "<test:runstate>5</test:runstate>"
        )
        source.write_domains()
        guest.flavor, guest.host = new_flavor, host.name
        if not self._spawn(guest, host):
            raise AssertionError(f"nova's compute refused the resize: {self.refused_on_host}")
        return host

    def confirm(self, guest: Guest) -> None:
        """The source compute drops the guest and the migration's allocations."""
        source = self.hosts[guest.source]
        source.domains.pop(guest.uuid)
        source.write_domains()
        self.nova.call("destroy", host=source.name, instance=guest.uuid)
        self.nova.call("delete", consumer=guest.migration, type="migration")
        guest.migration = guest.source = guest.old_flavor = None
        guest.old_pins = {}

    def revert(self, guest: Guest):
        """Dest compute destroys the guest, then moves the migration's
        allocations back to the instance; the source starts it again.
        Returns move_allocations' answer."""
        dest, source = self.hosts[guest.host], self.hosts[guest.source]
        dest.domains.pop(guest.uuid)
        dest.write_domains()
        self.nova.call("destroy", host=dest.name, instance=guest.uuid)
        moved = self.nova.call("move", source=guest.migration, target=guest.uuid)
        source.domains[guest.uuid] = source.domains[guest.uuid].replace(
            "<test:runstate>5</test:runstate>", "<test:runstate>1</test:runstate>"
        )
        source.write_domains()
        guest.flavor, guest.pins, guest.host = guest.old_flavor, guest.old_pins, source.name
        guest.migration = guest.source = guest.old_flavor = None
        guest.old_pins = {}
        return moved

    # ------------------------------------------------------ ground truth

    def consumers(self) -> list[str]:
        out = []
        for guest in self.guests.values():
            out.append(guest.uuid)
            if guest.migration:
                out.append(guest.migration)
        return out

    def allocations(self) -> dict:
        """consumer -> provider -> resources on the hosts' trees, for every
        consumer there and every one nova made ({} when it holds nothing)."""
        found: dict = {consumer: {} for consumer in self.consumers()}
        for host in self.hosts.values():
            if not self._has_root(host):
                continue
            for rp in self.tree_of(host):
                body = self.placement.get(f"/resource_providers/{rp['uuid']}/allocations")
                for consumer, alloc in body["allocations"].items():
                    found.setdefault(consumer, {})[rp["uuid"]] = dict(alloc["resources"])
        return found

    def usage(self, host: AgentHost) -> dict:
        """rc -> (used, capacity) summed over the host's tree, and per provider."""
        per_rp, total = {}, {}
        for rp in self.tree_of(host):
            inv = self.placement.get(f"/resource_providers/{rp['uuid']}/inventories")["inventories"]
            used = self.placement.get(f"/resource_providers/{rp['uuid']}/usages")["usages"]
            per_rp[rp["name"]] = {}
            for rc, record in inv.items():
                cap = int((record["total"] - record["reserved"]) * record["allocation_ratio"])
                per_rp[rp["name"]][rc] = (used.get(rc, 0), cap)
                u, c = total.get(rc, (0, 0))
                total[rc] = (u + used.get(rc, 0), c + cap)
        return {"total": total, "providers": per_rp}

    def pcpu_held(self, host: AgentHost, consumer: str, allocations=None, rps=None) -> dict:
        """What ``consumer`` holds on ``host``'s tree, rc -> amount."""
        rps = rps if rps is not None else {rp["uuid"] for rp in self.tree_of(host)}
        if allocations is not None:
            by_rp = allocations.get(consumer, {})
        else:
            body = self.placement.get(f"/allocations/{consumer}")["allocations"]
            by_rp = {rp: a["resources"] for rp, a in body.items()}
        held = {}
        for rp, resources in by_rp.items():
            if rp in rps:
                for rc, amount in resources.items():
                    held[rc] = held.get(rc, 0) + amount
        return held

    def holder_on(self, guest: Guest, host: AgentHost) -> str:
        """Who holds the guest's resources on ``host``: the migration on a
        resize's source, else the instance."""
        return guest.migration if guest.migration and guest.source == host.name else guest.uuid

    def domains_on(self, host: AgentHost):
        """(guest, its pins on this host) for every domain defined there."""
        for guest in self.guests.values():
            if guest.uuid in host.domains:
                if guest.source == host.name:
                    flavor_pins = (
                        dataclasses.replace(guest, flavor=guest.old_flavor),
                        guest.old_pins,
                    )
                else:
                    flavor_pins = (guest, guest.pins)
                yield flavor_pins


def check_host(cloud: Cloud, host: AgentHost, over: Optional[dict] = None) -> list[str]:
    """What is wrong on ``host`` now; [] when nothing. ``over`` (rc -> used)
    allows usage that was already there before a cut, never more.

    * allocated <= physical per class (the :class:`Truth`), and per NUMA
      child when children are on: a child's CPUs are those of its node;
    * on a host with cpu_dedicated_set, PCPU held on it plus the dedicated
      vCPUs of pinned guests defined on it whose holder holds no PCPU there
      never exceed |cpu_dedicated_set| (a pinned guest counted as VCPU
      leaves its CPUs to be claimed again);
    * nova's compute never found a claimed guest without room.
    """
    problems = []
    truth = host.truth()
    usage = cloud.usage(host)
    for rc, (used, _cap) in usage["total"].items():
        physical = truth.capacity.get(rc)
        if physical is None:
            continue
        allowed = max(physical, (over or {}).get(rc, 0))
        if used > allowed:
            problems.append(f"{host.name}: {rc} allocated {used} > physical {physical}")
    if host.config.numa_in_placement:
        for name, classes in usage["providers"].items():
            node = _node_of(name)
            if node is None:
                continue
            physical = truth.node_capacity(node)
            for rc, (used, _cap) in classes.items():
                if rc in physical and used > max(physical[rc], (over or {}).get(rc, 0)):
                    problems.append(
                        f"{name}: {rc} allocated {used} > physical "
                        f"{physical[rc]} of NUMA node {node}"
                    )
    if not host.config.legacy:
        pcpu_used = usage["total"].get("PCPU", (0, 0))[0]
        uncounted = _uncounted(cloud, host)
        if pcpu_used + sum(n for _, n in uncounted) > len(truth.dedicated):
            problems.append(
                f"{host.name}: PCPU double-booked: {pcpu_used} held in Placement plus "
                f"pinned vCPUs held as no PCPU {uncounted} > "
                f"{len(truth.dedicated)} dedicated CPUs"
            )
    problems.extend(cloud.refused_on_host)
    return problems


def _uncounted(cloud: Cloud, host: AgentHost) -> list[tuple[str, int]]:
    """(guest name, dedicated vCPUs its holder on ``host`` holds no PCPU for)."""
    found = []
    allocations = cloud.allocations()
    rps = {rp["uuid"] for rp in cloud.tree_of(host)}
    for guest, pins in cloud.domains_on(host):
        wanted = guest.dedicated_vcpus(pins)
        held = cloud.pcpu_held(host, cloud.holder_on(guest, host), allocations, rps).get("PCPU", 0)
        if wanted and held < wanted:
            found.append((guest.name, wanted - held))
    return found


def pinned_not_on_pcpu(cloud: Cloud, host: AgentHost) -> list[str]:
    """Pinned guests defined on a host with cpu_dedicated_set whose holder
    there (the instance, or the migration on a resize's source) holds fewer
    PCPU than the guest has dedicated vCPUs: nova counts every dedicated
    vCPU as PCPU (its reshape moves them; its scheduler claims them)."""
    if host.config.legacy:
        return []
    return [
        f"{name}: {n} dedicated vCPUs not held as PCPU on {host.name}"
        for name, n in _uncounted(cloud, host)
    ]


def _node_of(provider_name: str) -> Optional[int]:
    tail = provider_name.rsplit("_NUMA", 1)
    if len(tail) == 2 and tail[1].lstrip("_").isdigit():
        return int(tail[1].lstrip("_"))
    return None


def moved_whole(before: dict, after: dict, skip=()) -> list[str]:
    """Every consumer's allocations are unchanged, or moved whole: the same
    amount of every class, with VCPU renamed PCPU as a whole, possibly on
    other providers of the same host. Returns the consumers that lost or
    half-moved resources."""
    bad = []
    for consumer, by_rp in before.items():
        if consumer in skip:
            continue
        old = _totals(by_rp)
        new = _totals(after.get(consumer, {}))
        renamed = dict(old)
        if "VCPU" in renamed:
            renamed["PCPU"] = renamed.get("PCPU", 0) + renamed.pop("VCPU")
        if new not in (old, renamed):
            bad.append(f"{consumer}: {old} -> {new}")
    return bad


def _totals(by_rp: dict) -> dict:
    out: dict = {}
    for res in by_rp.values():
        for rc, amount in res.items():
            out[rc] = out.get(rc, 0) + amount
    return out
