"""Nested reshapes through the agent's cycle, against the real Placement.

The host is the 16-CPU fixture virhostcpudata/linux-test4 (NUMA node 0 =
CPUs 0-7, node 1 = CPUs 8-15). Two GPUs with an enabled mdev type are built
as a sysfs tree in tmp_path, and the guests -- with vcpupin, numatune and
mdev hostdevs -- come from libvirt's test driver, on a copy of
tests/data/libvirt/host.xml whose domains are replaced by the ones below.
The "scheduler" writes allocations through its own client; request counts
are the agent's.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from node_agent.cycle.desired import compute_desired
from node_agent.cycle.reconcile import Reconciler, ReshapeRefused
from node_agent.placement.client import PlacementClient
from node_agent.placement.sync import TreeSyncer
from node_agent.state import StateStore
from tests.hostdata import HOSTDATA, sysfs_root_for
from tests.integration.reshape_driver import (
    HOST_XML,
    agent_cycle,
    allocate,
    make_settings,
    reshaper_posts,
)
from tests.unit.test_pci import add_device, add_mdev_type

pytestmark = pytest.mark.integration
LOG = logging.getLogger(__name__)

DEDICATED, SHARED = "2-5,10-13", "0-1,6-9,14-15"
GPU1, GPU2 = "0000:81:00.0", "0000:82:00.0"
MDEV_TYPE = "nvidia-222"
TRAIT = "CUSTOM_OPERATOR_SAYS_GOLD"
FOREIGN_RC = "CUSTOM_FOREIGN_WIDGET"
TEST_NS = "http://libvirt.org/schemas/domain/test/1.0"


def domain_xml(guest: dict) -> str:
    """A test-driver domain: ``pins`` (host CPU per vCPU), ``nodes``
    (numatune memory nodeset), ``mdevs`` (mdev uuids), ``hostdevs`` (more
    ``<hostdev>`` elements, as XML text)."""
    pins = "".join(
        f'<vcpupin vcpu="{n}" cpuset="{cpu}"/>' for n, cpu in enumerate(guest.get("pins", ()))
    )
    numatune = (
        f'<numatune><memory mode="strict" nodeset="{guest["nodes"]}"/></numatune>'
        if guest.get("nodes")
        else ""
    )
    hostdevs = "".join(
        '<hostdev mode="subsystem" type="mdev" managed="no" model="vfio-pci">'
        f'<source><address uuid="{m}"/></source></hostdev>'
        for m in guest.get("mdevs", ())
    ) + guest.get("hostdevs", "")
    return (
        f'<domain type="test" xmlns:test="{TEST_NS}"><name>{guest["name"]}</name>'
        f'<uuid>{guest["uuid"]}</uuid><memory unit="MiB">{guest["memory"]}</memory>'
        f'<vcpu placement="static">{guest["vcpus"]}</vcpu>'
        f"{'<cputune>' + pins + '</cputune>' if pins else ''}{numatune}"
        f"<os><type>hvm</type></os><devices>{hostdevs}</devices>"
        f"<test:runstate>1</test:runstate></domain>"
    )


def host_xml(path: Path, guests: list[dict]) -> str:
    """host.xml with its domains replaced by ``guests``; returns the URI."""
    ET.register_namespace("test", TEST_NS)
    node = ET.parse(HOST_XML).getroot()
    for domain in node.findall("domain"):
        node.remove(domain)
    for n, guest in enumerate(guests):
        node.insert(2 + n, ET.fromstring(domain_xml(guest)))
    path.write_text(ET.tostring(node, encoding="unicode"))
    return f"test://{path}"


class NestedHost:
    """linux-test4 + two GPUs in sysfs + the guests given; Placement clients."""

    def __init__(self, tmp_path, url, name, guests, gpus=None):
        self.tmp, self.url, self.name = tmp_path, url, name
        self.sysroot = sysfs_root_for(HOSTDATA / "virhostcpudata" / "linux-test4", tmp_path)
        for address, mdevs in (gpus or {}).items():
            add_mdev_type(
                add_device(self.sysroot, address),
                MDEV_TYPE,
                available=2,
                name="GRID T4-2B",
                mdevs=mdevs,
            )
        self.guests = guests
        self.uri = host_xml(tmp_path / "host.xml", guests)
        self.state_dir = str(tmp_path / "state")
        self.agent = PlacementClient.for_endpoint(url)
        self.scheduler = PlacementClient.for_endpoint(url)

    def settings(self, dedicated=DEDICATED, shared=SHARED, **kw):
        base = make_settings(
            self.name, str(self.sysroot), self.uri, self.state_dir, str(self.tmp), dedicated, shared
        )
        return dataclasses.replace(base, **kw)

    def cycle(self, client=None, **kw):
        return agent_cycle(client or self.agent, self.settings(**kw))

    def uuid_of(self, name: str) -> str:
        found = self.scheduler.get(f"/resource_providers?name={name}")["resource_providers"]
        assert len(found) == 1, f"{name}: {found}"
        return found[0]["uuid"]

    @property
    def root(self) -> str:
        return self.uuid_of(self.name)

    def tree(self) -> dict:
        """name -> (uuid, parent uuid) of every provider in the host's tree."""
        listed = self.scheduler.get(f"/resource_providers?in_tree={self.root}")[
            "resource_providers"
        ]
        return {rp["name"]: (rp["uuid"], rp["parent_provider_uuid"]) for rp in listed}

    def inventories(self, rp: str) -> dict:
        found = self.scheduler.get(f"/resource_providers/{rp}/inventories")["inventories"]
        return {rc: inv["total"] for rc, inv in found.items()}

    def allocations(self) -> dict:
        """guest uuid -> provider uuid -> resources."""
        found = {}
        for guest in self.guests:
            body = self.scheduler.get(f"/allocations/{guest['uuid']}")["allocations"]
            found[guest["uuid"]] = {rp: a["resources"] for rp, a in body.items()}
        return found

    def root_traits(self) -> set:
        return set(self.scheduler.get(f"/resource_providers/{self.root}/traits")["traits"])

    def add_operator_trait(self) -> None:
        self.scheduler.put(f"/traits/{TRAIT}", None)
        current = self.scheduler.get(f"/resource_providers/{self.root}/traits")
        self.scheduler.put(
            f"/resource_providers/{self.root}/traits",
            {
                "resource_provider_generation": current["resource_provider_generation"],
                "traits": current["traits"] + [TRAIT],
            },
        )

    def add_foreign_child(self) -> str:
        child = str(uuid.uuid4())
        self.scheduler.put(f"/resource_classes/{FOREIGN_RC}", None)
        self.scheduler.post(
            "/resource_providers",
            {
                "name": f"{self.name}-foreign-widget",
                "uuid": child,
                "parent_provider_uuid": self.root,
            },
        )
        self.scheduler.put(
            f"/resource_providers/{child}/inventories",
            {"resource_provider_generation": 0, "inventories": {FOREIGN_RC: {"total": 10}}},
        )
        return child

    def add_root_vgpu(self, total: int) -> None:
        """What a host reporting VGPU on the root (nova before nested GPUs) had."""
        current = self.scheduler.get(f"/resource_providers/{self.root}/inventories")
        self.scheduler.put(
            f"/resource_providers/{self.root}/inventories",
            {
                "resource_provider_generation": current["resource_provider_generation"],
                "inventories": {**current["inventories"], "VGPU": {"total": total}},
            },
        )


def guest(n: int, prefix: str, **kw) -> dict:
    return {
        "name": f"instance-{n:08x}",
        "uuid": f"{prefix}{n:02d}",
        "memory": 1024,
        "vcpus": len(kw.get("pins", ())) or 2,
        **kw,
    }


def prefix() -> str:
    return str(uuid.uuid4())[:-2]


MDEVS = [str(uuid.uuid4()) for _ in range(3)]


@pytest.fixture
def gpu_numa_host(tmp_path, placement_server, host_name):
    p = prefix()
    guests = [
        guest(1, p, pins=(2, 3), nodes="0", mdevs=MDEVS[:1]),  # node 0, GPU1
        guest(2, p, pins=(10, 11), nodes="1", mdevs=MDEVS[1:], memory=2048),  # node 1, both
        guest(3, p, nodes="1"),  # floating on node 1
    ]
    return NestedHost(
        tmp_path, placement_server.url, host_name, guests, gpus={GPU1: MDEVS[:2], GPU2: MDEVS[2:]}
    )


def test_vgpu_moves_to_gpu_children_then_the_host_goes_numa_keeping_everything_else(gpu_numa_host):
    host = gpu_numa_host
    a, b, c = (g["uuid"] for g in host.guests)
    # A host reporting VGPU on the root, with guests the scheduler placed there.
    outcome, report, _ = host.cycle()
    assert report.ok and not outcome.reshaped
    root = host.root
    host.add_root_vgpu(6)
    host.add_operator_trait()
    foreign = host.add_foreign_child()
    allocate(host.scheduler, a, {root: {"PCPU": 2, "MEMORY_MB": 1024, "VGPU": 1, "DISK_GB": 5}})
    allocate(host.scheduler, b, {root: {"PCPU": 2, "MEMORY_MB": 2048, "VGPU": 2}})
    allocate(host.scheduler, c, {root: {"VCPU": 2, "MEMORY_MB": 1024}, foreign: {FOREIGN_RC: 1}})
    before = host.allocations()

    # 1. enabled_mdev_types: the GPUs become children; VGPU follows each mdev.
    # --dry-run first: the plan names the children to be created, writes nothing.
    gpu_settings = host.settings(enabled_mdev_types=(MDEV_TYPE,))
    store = StateStore(Path(host.state_dir))
    host.agent.stats.reset()
    _tree, _changes, plan = Reconciler(host.agent, TreeSyncer(host.agent, store)).plan(
        compute_desired(gpu_settings, state=store.load_or_empty(LOG))
    )
    assert host.agent.stats.writes == 0 and host.allocations() == before
    assert plan["totals"] == {"consumers": 2, "moved": {"VGPU -> VGPU": 3}}
    assert (
        f"1 VGPU@{host.name} -> VGPU@{host.name}_pci_0000_81_00_0 (to be created)"
        in plan["lines"][0]
    )
    host.agent.stats.reset()
    outcome, report, _ = host.cycle(enabled_mdev_types=(MDEV_TYPE,))
    assert outcome.reshaped and report.ok, report.errors
    assert len(reshaper_posts(host.agent)) == 1
    tree = host.tree()
    gpu1 = tree[f"{host.name}_pci_0000_81_00_0"][0]
    gpu2 = tree[f"{host.name}_pci_0000_82_00_0"][0]
    assert sorted(tree) == sorted(
        [
            host.name,
            f"{host.name}-foreign-widget",
            f"{host.name}_pci_0000_81_00_0",
            f"{host.name}_pci_0000_82_00_0",
        ]
    )  # no duplicates
    assert host.inventories(gpu1) == {"VGPU": 4} and host.inventories(gpu2) == {"VGPU": 3}
    assert "VGPU" not in host.inventories(root)
    after_gpu = host.allocations()
    assert after_gpu == {
        a: {root: {"PCPU": 2, "MEMORY_MB": 1024, "DISK_GB": 5}, gpu1: {"VGPU": 1}},
        b: {root: {"PCPU": 2, "MEMORY_MB": 2048}, gpu1: {"VGPU": 1}, gpu2: {"VGPU": 1}},
        c: before[c],
    }
    assert TRAIT in host.root_traits()
    assert host.inventories(foreign) == {FOREIGN_RC: 10}
    owned = StateStore(Path(host.state_dir)).load()["owned_children"]
    assert {gpu1, gpu2} <= set(owned) and foreign not in owned

    # 2. numa_in_placement: CPU and memory move to the node each guest lives on.
    host.agent.stats.reset()
    outcome, report, _ = host.cycle(enabled_mdev_types=(MDEV_TYPE,), numa_in_placement=True)
    assert outcome.reshaped and report.ok, report.errors
    assert len(reshaper_posts(host.agent)) == 1
    tree = host.tree()
    node0, node1 = tree[f"{host.name}_NUMA_0"][0], tree[f"{host.name}_NUMA_1"][0]
    assert len(tree) == 6
    assert host.allocations() == {
        a: {root: {"DISK_GB": 5}, node0: {"PCPU": 2, "MEMORY_MB": 1024}, gpu1: {"VGPU": 1}},
        b: {node1: {"PCPU": 2, "MEMORY_MB": 2048}, gpu1: {"VGPU": 1}, gpu2: {"VGPU": 1}},
        c: {node1: {"VCPU": 2, "MEMORY_MB": 1024}, foreign: {FOREIGN_RC: 1}},
    }
    assert set(host.inventories(root)) == {"DISK_GB"}
    assert host.inventories(node0)["PCPU"] == 4 and host.inventories(node1)["VCPU"] == 4
    assert TRAIT in host.root_traits()
    assert host.inventories(foreign) == {FOREIGN_RC: 10}
    assert tree[f"{host.name}-foreign-widget"] == (foreign, root)

    # 3. A rerun, and a fresh process with an empty state dir, do nothing.
    settled = host.allocations()
    numa = host.settings(enabled_mdev_types=(MDEV_TYPE,), numa_in_placement=True)
    for state_dir in (host.state_dir, str(host.tmp / "fresh-state")):
        fresh = PlacementClient.for_endpoint(host.url)
        outcome, report, _ = agent_cycle(fresh, dataclasses.replace(numa, state_path=state_dir))
        assert not outcome.reshaped and report.ok and report.applied == []
        assert reshaper_posts(fresh) == []
    assert host.allocations() == settled
    assert len(host.tree()) == 6 and TRAIT in host.root_traits()


def test_guest_pinned_across_numa_nodes_refuses_the_numa_reshape(
    tmp_path, placement_server, host_name
):
    p = prefix()
    guests = [
        guest(1, p, pins=(2, 3), nodes="0"),
        guest(2, p, pins=(4, 12), nodes="0-1"),
    ]  # one vCPU on each node
    host = NestedHost(tmp_path, placement_server.url, host_name, guests)
    host.cycle()
    root = host.root
    host.add_operator_trait()
    foreign = host.add_foreign_child()
    for g in guests:
        allocate(host.scheduler, g["uuid"], {root: {"PCPU": 2, "MEMORY_MB": 1024}})
    before, inventories = host.allocations(), host.inventories(root)

    outcome, report, _ = host.cycle(numa_in_placement=True)

    assert isinstance(outcome, ReshapeRefused)
    assert f"guest instance-00000002 ({guests[1]['uuid']}) spans NUMA nodes 0-1" in str(outcome)
    assert "instance-00000001" not in str(outcome)
    assert reshaper_posts(host.agent) == []
    assert host.allocations() == before
    assert host.inventories(root) == inventories
    # The children exist, but offer none of what the root still offers.
    for name, (rp, _parent) in host.tree().items():
        if "_NUMA_" in name:
            assert not {"VCPU", "PCPU", "MEMORY_MB"} & set(host.inventories(rp))
    assert report.ok
    assert TRAIT in host.root_traits() and host.inventories(foreign) == {FOREIGN_RC: 10}


def test_reshape_cycle_on_a_host_with_a_child_costs_consumers_plus_two_and_the_recheck(
    tmp_path, placement_server, host_name
):
    p = prefix()
    pinned = [guest(n, p, pins=(2 + n, 10 + n)) for n in range(3)]
    guests = pinned + [guest(9, p)]
    host = NestedHost(tmp_path, placement_server.url, host_name, guests, gpus={GPU1: ()})
    store = StateStore(Path(host.state_dir))
    syncer = TreeSyncer(host.agent, store)
    reconciler = Reconciler(host.agent, syncer)  # one long-lived agent
    legacy = host.settings(dedicated=None, shared=None, enabled_mdev_types=(MDEV_TYPE,))
    assert reconciler.apply(compute_desired(legacy, state=store.load_or_empty(LOG))).ok
    root, gpu = host.root, host.uuid_of(f"{host.name}_pci_0000_81_00_0")
    for g in guests:
        allocate(host.scheduler, g["uuid"], {root: {"VCPU": 2, "MEMORY_MB": 1024}})
    gpu_before = host.scheduler.get(f"/resource_providers/{gpu}/inventories")

    host.agent.stats.reset()
    desired = compute_desired(
        host.settings(enabled_mdev_types=(MDEV_TYPE,)), state=store.load_or_empty(LOG)
    )
    result = reconciler.apply(desired)

    assert result.ok and result.reshape.consumers_moved == len(pinned)
    assert result.report.requests == 0  # the syncer was told the new inventories
    log = [entry[:2] for entry in host.agent.stats.log]
    # The root's allocations are read again after a VCPU -> PCPU POST (a
    # pinned guest nova's fallback query placed meanwhile moves too).
    assert sorted(log) == sorted(
        [
            ("GET", f"/resource_providers/{root}/allocations"),
            *[("GET", f"/allocations/{g['uuid']}") for g in pinned],
            ("POST", "/reshaper"),
            ("GET", f"/resource_providers/{root}/allocations"),
        ]
    )
    assert host.agent.stats.total == len(pinned) + 2 + 1
    # The GPU child was left out of the body: its inventory and generation are untouched.
    assert host.scheduler.get(f"/resource_providers/{gpu}/inventories") == gpu_before
    assert host.inventories(root)["PCPU"] == 8 and host.inventories(root)["VCPU"] == 8
    assert all(
        host.allocations()[g["uuid"]] == {root: {"PCPU": 2, "MEMORY_MB": 1024}} for g in pinned
    )
    # The next cycle with nothing changed costs nothing.
    host.agent.stats.reset()
    assert reconciler.apply(desired).ok and host.agent.stats.total == 0
