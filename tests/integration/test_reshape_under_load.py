"""A reshape of 150 pinned consumers while a scheduler writes to the host.

The scheduler is a thread with its own HTTP session against the real
Placement: every ``interval`` seconds it boots a guest, deletes one or
resizes one, with consumer generations, as nova's scheduler and conductor
do. Every such write moves the root's generation, so a reshape whose reads
are older than the write gets a 409.
"""

from __future__ import annotations

import random
import threading
import time
import uuid

import pytest

from node_agent.errors import HostBusy
from node_agent.model.cpuset import CpuSet
from node_agent.model.snapshot import Guest
from node_agent.placement.client import PlacementClient
from node_agent.placement.errors import GenerationConflict
from node_agent.placement.reshape_rules import pinned_to_pcpu
from node_agent.placement.reshaper import ATTEMPTS, ensure_reshaped
from tests.integration.reshape_bench import HOST_CPUS, tree
from tests.integration.reshape_driver import PROJECT, USER, allocate

pytestmark = pytest.mark.integration

PINNED = 150
WRITES_AT_MOST = 3000   # the scheduler stops by itself, whatever happens
SECONDS_AT_MOST = 300


class Scheduler(threading.Thread):
    """Boots, deletes and resizes unpinned guests on ``root`` every
    ``interval`` seconds until stopped; records what it wrote."""

    def __init__(self, url: str, root: str, interval: float, seed: int):
        super().__init__(daemon=True)
        self.client = PlacementClient.for_endpoint(url)  # its own session
        self.root, self.interval = root, interval
        self.random = random.Random(seed)
        self.memory: dict[str, int] = {}   # consumer -> MEMORY_MB it last wrote
        self.writes = 0
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + SECONDS_AT_MOST
        while (not self.stop.wait(self.interval) and self.writes < WRITES_AT_MOST
               and time.monotonic() < deadline):
            self.step()

    def step(self) -> None:
        action = self.random.choice(("boot", "delete", "resize") if self.memory else ("boot",))
        if action == "boot":
            consumer = str(uuid.uuid4())
            allocate(self.client, consumer, {self.root: {"VCPU": 1, "MEMORY_MB": 128}})
            self.memory[consumer] = 128
        else:
            consumer = self.random.choice(sorted(self.memory))
            memory = 0 if action == "delete" else self.random.choice((64, 128, 256))
            generation = self.client.get(f"/allocations/{consumer}")["consumer_generation"]
            try:
                self.client.put(f"/allocations/{consumer}", {
                    "allocations": {self.root: {"resources": {"VCPU": 1, "MEMORY_MB": memory}}}
                    if memory else {},
                    "project_id": PROJECT, "user_id": USER,
                    "consumer_generation": generation})
            except GenerationConflict:
                return  # someone else wrote it between the read and the write
            if memory:
                self.memory[consumer] = memory
            else:
                del self.memory[consumer]
        self.writes += 1


def legacy_host(url: str, name: str):
    """A root in the legacy shape (VCPU only) with four children, and
    PINNED pinned guests holding VCPU on it."""
    setup = PlacementClient.for_endpoint(url)
    root = str(uuid.uuid4())
    children = [str(uuid.uuid4()) for _ in range(4)]
    for provider in tree(name, root, PINNED, True, children).providers:
        setup.post("/resource_providers", {
            "name": provider.name, "uuid": provider.uuid,
            **({"parent_provider_uuid": root} if provider.parent else {})})
        setup.put(f"/resource_providers/{provider.uuid}/inventories", {
            "resource_provider_generation": 0,
            "inventories": {rc: inv.as_placement() for rc, inv in provider.inventories.items()}})
    guests = [Guest(uuid=str(uuid.uuid4()), name=f"pinned-{i}", vcpus=1, running=True,
                    memory_kb=256 * 1024, vcpupin=((0, CpuSet([i % (HOST_CPUS // 2)])),))
              for i in range(PINNED)]
    for guest in guests:
        allocate(setup, guest.uuid, {root: {"VCPU": 1, "MEMORY_MB": 256}})
    return setup, root, children, guests


def reshape_under(url: str, name: str, interval: float):
    setup, root, children, guests = legacy_host(url, name)
    desired = tree(name, root, PINNED, False, children)
    rule = pinned_to_pcpu(guests, root, CpuSet(range(HOST_CPUS // 2)))
    scheduler = Scheduler(url, root, interval, seed=len(name))
    agent = PlacementClient.for_endpoint(url)
    scheduler.start()
    try:
        time.sleep(interval * 2)  # the scheduler is writing before the reads start
        try:
            result = ensure_reshaped(agent, desired, guests, rule)
        except HostBusy as exc:
            result = exc
    finally:
        scheduler.stop.set()
        scheduler.join(timeout=60)
    assert not scheduler.is_alive()
    return result, scheduler, setup, guests, agent


def held(client, consumer: str) -> dict:
    return {rp: a["resources"] for rp, a in
            client.get(f"/allocations/{consumer}")["allocations"].items()}


def test_reshape_under_a_write_every_0_3_s_rereads_only_what_changed_and_is_all_or_nothing(
        placement_server, host_name):
    """Whether the POST gets through depends on how long Placement takes to
    process 150 consumers (it checks the root's generation again after
    that, so a write meanwhile refuses it): the agent's part is the window
    before the POST and the cost of each retry, and that a refused reshape
    leaves every allocation as it was."""
    outcome, scheduler, setup, guests, agent = reshape_under(placement_server.url, host_name,
                                                             0.3)

    assert scheduler.writes >= 3, "the scheduler must have written during the reshape"
    root = next(iter(held(setup, guests[0].uuid)))
    if isinstance(outcome, HostBusy):
        assert f"every one of {ATTEMPTS} attempts" in str(outcome)
        for guest in guests:
            assert held(setup, guest.uuid) == {root: {"VCPU": 1, "MEMORY_MB": 256}}
    else:
        assert outcome.reshaped and outcome.consumers_moved == PINNED
        for guest in guests:
            assert held(setup, guest.uuid) == {root: {"PCPU": 1, "MEMORY_MB": 256}}
    for consumer, memory in scheduler.memory.items():  # no scheduler write was lost
        assert held(setup, consumer) == {root: {"VCPU": 1, "MEMORY_MB": memory}}
    # The scheduler never touches the pinned guests: a retry after a 409
    # reads the root's view again, not them.
    agent_reads = [path for method, path, _status in agent.stats.log
                   if method == "GET" and path.startswith("/allocations/")]
    for guest in guests:
        assert agent_reads.count(f"/allocations/{guest.uuid}") == 1


def test_a_host_written_every_0_05_s_is_reported_too_busy_and_nothing_moves(
        placement_server, host_name):
    outcome, scheduler, setup, guests, _agent = reshape_under(placement_server.url, host_name,
                                                              0.05)

    assert isinstance(outcome, HostBusy), outcome
    assert outcome.exit_code == 75
    assert "this host is too busy" in str(outcome)
    assert f"every one of {ATTEMPTS} attempts" in str(outcome)
    for guest in guests:   # all or nothing: no consumer was moved
        assert "VCPU" in next(iter(held(setup, guest.uuid).values()))
