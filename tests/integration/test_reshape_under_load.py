"""A reshape of 150 pinned consumers while a scheduler writes to the host.

The scheduler is a thread with its own HTTP session against the real
Placement: every ``interval`` seconds it boots a guest, deletes one or
resizes one, with consumer generations, as nova's scheduler and conductor
do (every 0.3 s, or slower on a machine slower than that; see Run). Every
such write moves the root's generation, so a ``POST /reshaper`` is refused
when one lands between the agent's reads and Placement's own check of that
generation, which it makes after processing the whole body (0.5-1 s for 150
consumers on the embedded Placement, longer than the 0.3 s between writes).
"""

from __future__ import annotations

import random
import re
import threading
import time
import uuid
from typing import Optional

import pytest

from node_agent.errors import HostBusy
from node_agent.model.cpuset import CpuSet
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.model.snapshot import Guest
from node_agent.placement.client import PlacementClient
from node_agent.placement.errors import GenerationConflict, PlacementError
from node_agent.placement.reshape_rules import pinned_to_pcpu
from node_agent.placement.reshape_stages import ATTEMPTS
from node_agent.placement.reshaper import ensure_reshaped
from node_agent.policy.capacity import HostLimits, Published, check
from tests.integration.reshape_driver import PROJECT, USER, allocate

pytestmark = pytest.mark.integration

PINNED = 150
HOST_CPUS = 256
SHARED = 96  # CPUs 0-95 shared, 96-255 dedicated
DEDICATED = CpuSet(range(SHARED, HOST_CPUS))
CHILDREN = 4
LIMITS = HostLimits(cpus=HOST_CPUS, memory_mb=256 * PINNED * 2, disk_gb=0, vfs=8 * CHILDREN)
KEPT = 5  # unpinned guests the scheduler keeps to resize
WRITES_AT_MOST = 3000  # the scheduler stops by itself, whatever happens
SECONDS_AT_MOST = 300


class Scheduler(threading.Thread):
    """Boots, deletes and resizes unpinned guests on ``root`` every
    ``interval`` seconds until stopped; records what it wrote. A boot the
    host has no room for (the reshape publishes the classes it moves closed
    while it runs) becomes a resize, so the host gets a write every time."""

    def __init__(self, url: str, root: str, interval: float, seed: int):
        super().__init__(daemon=True)
        self.client = PlacementClient.for_endpoint(url)  # its own session
        self.root, self.interval = root, interval
        self.random = random.Random(seed)
        self.memory: dict[str, int] = {}  # consumer -> MEMORY_MB it last wrote
        self.writes = 0
        self.boots_refused = 0
        self.error: Exception | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + SECONDS_AT_MOST
        try:
            for _ in range(KEPT):  # guests to resize while boots are refused
                self.boot()
            while (
                not self.stop.wait(self.interval)
                and self.writes < WRITES_AT_MOST
                and time.monotonic() < deadline
            ):
                self.step()
        except Exception as exc:  # the test fails on it
            self.error = exc
            raise

    def boot(self) -> None:
        consumer = str(uuid.uuid4())
        allocate(self.client, consumer, {self.root: {"VCPU": 1, "MEMORY_MB": 128}})
        self.memory[consumer] = 128
        self.writes += 1

    def step(self) -> None:
        action = self.random.choice(
            ("boot", "delete", "resize") if len(self.memory) > KEPT else ("boot", "resize")
        )
        if action == "boot":
            try:
                self.boot()
            except PlacementError as exc:
                if exc.status != 409:
                    raise
                self.boots_refused += 1
                action = "resize"
            else:
                return
        consumer = self.random.choice(sorted(self.memory))
        memory = 0 if action == "delete" else self.random.choice((64, 128, 256))
        generation = self.client.get(f"/allocations/{consumer}")["consumer_generation"]
        try:
            self.client.put(
                f"/allocations/{consumer}",
                {
                    "allocations": {self.root: {"resources": {"VCPU": 1, "MEMORY_MB": memory}}}
                    if memory
                    else {},
                    "project_id": PROJECT,
                    "user_id": USER,
                    "consumer_generation": generation,
                },
            )
        except GenerationConflict:
            return  # someone else wrote it between the read and the write
        if memory:
            self.memory[consumer] = memory
        else:
            del self.memory[consumer]
        self.writes += 1


def host_tree(name: str, root: str, legacy: bool, children: list[str]) -> ProviderTree:
    """The legacy shape (every CPU as VCPU) or the new one (96 shared, 160
    dedicated), both within LIMITS."""
    cpus = (
        {"VCPU": Inventory(HOST_CPUS, allocation_ratio=4.0)}
        if legacy
        else {
            "VCPU": Inventory(SHARED, allocation_ratio=4.0),
            "PCPU": Inventory(HOST_CPUS - SHARED),
        }
    )
    root_provider = Provider(
        name, uuid=root, inventories={**cpus, "MEMORY_MB": Inventory(LIMITS.memory_mb)}
    )
    return ProviderTree(
        (
            root_provider,
            *(
                Provider(
                    f"{name}_pf_{k}",
                    parent=name,
                    uuid=child,
                    inventories={"SRIOV_NET_VF": Inventory(8)},
                )
                for k, child in enumerate(children)
            ),
        )
    )


def legacy_host(url: str, name: str):
    """A root in the legacy shape with four children, and PINNED pinned
    guests holding VCPU on it."""
    setup = PlacementClient.for_endpoint(url)
    root = str(uuid.uuid4())
    children = [str(uuid.uuid4()) for _ in range(CHILDREN)]
    for provider in host_tree(name, root, True, children).providers:
        setup.post(
            "/resource_providers",
            {
                "name": provider.name,
                "uuid": provider.uuid,
                **({"parent_provider_uuid": root} if provider.parent else {}),
            },
        )
        setup.put(
            f"/resource_providers/{provider.uuid}/inventories",
            {
                "resource_provider_generation": 0,
                "inventories": {rc: inv.as_placement() for rc, inv in provider.inventories.items()},
            },
        )
    guests = [
        Guest(
            uuid=str(uuid.uuid4()),
            name=f"pinned-{i}",
            vcpus=1,
            running=True,
            memory_kb=256 * 1024,
            vcpupin=((0, CpuSet([SHARED + i % (HOST_CPUS - SHARED)])),),
        )
        for i in range(PINNED)
    ]
    for guest in guests:
        allocate(setup, guest.uuid, {root: {"VCPU": 1, "MEMORY_MB": 256}})
    return setup, root, children, guests


def staged_post_window(setup: PlacementClient, root: str, guest: str) -> float:
    """Seconds this machine's Placement takes, at the slowest of three, for
    what one staged POST of one consumer costs: a read of the root's view,
    a read of the consumer, a ``POST /reshaper`` of it (as it holds, so
    nothing changes but the generations)."""
    slowest = 0.0
    for _ in range(3):
        started = time.monotonic()
        setup.get(f"/resource_providers?in_tree={root}")
        held = setup.get(f"/allocations/{guest}")
        provider = setup.get(f"/resource_providers/{root}/inventories")
        setup.reshape(
            {
                "inventories": {
                    root: {
                        "resource_provider_generation": provider["resource_provider_generation"],
                        "inventories": provider["inventories"],
                    }
                },
                "allocations": {
                    guest: {
                        "allocations": {
                            rp: {"resources": a["resources"]}
                            for rp, a in held["allocations"].items()
                        },
                        "project_id": PROJECT,
                        "user_id": USER,
                        "consumer_generation": held["consumer_generation"],
                    }
                },
            }
        )
        slowest = max(slowest, time.monotonic() - started)
    return slowest


class Run:
    """One reshape against a scheduler, and every body the agent sent.
    ``interval`` None: writes come at least 0.3 s apart, and at least four
    times the :func:`staged_post_window` this machine shows right now."""

    def __init__(self, url: str, name: str, interval: Optional[float]):
        self.setup, self.root, self.children, self.guests = legacy_host(url, name)
        if interval is None:
            window = staged_post_window(self.setup, self.root, self.guests[0].uuid)
            interval = max(0.3, 4 * window)
        self.interval = interval
        self.desired = host_tree(name, self.root, False, self.children)
        self.names = {p.uuid: p.name for p in self.desired.providers}
        self.held_before = {
            u: self.setup.get(f"/resource_providers/{u}/inventories")["inventories"]
            for u in self.names
        }
        self.bodies: list[dict] = []
        rule = pinned_to_pcpu(self.guests, self.root, DEDICATED)
        self.scheduler = Scheduler(url, self.root, interval, seed=len(name))
        self.agent = PlacementClient.for_endpoint(url)
        self.scheduler.start()
        try:
            time.sleep(interval * 2)  # the scheduler is writing before the reads start
            try:
                self.outcome = ensure_reshaped(
                    self.agent, self.desired, self.guests, rule, before_post=self.bodies.append
                )
            except HostBusy as exc:
                self.outcome = exc
        finally:
            self.scheduler.stop.set()
            self.scheduler.join(timeout=60)
        assert not self.scheduler.is_alive()
        assert self.scheduler.error is None, self.scheduler.error

    def held(self, consumer: str) -> dict:
        return {
            rp: a["resources"]
            for rp, a in self.setup.get(f"/allocations/{consumer}")["allocations"].items()
        }

    def inventories_after_each_post(self) -> list[dict]:
        """What Placement held after each POST /reshaper that went through:
        the bodies, in order, applied to what it held before."""
        statuses = [
            status
            for method, path, status in self.agent.stats.log
            if method == "POST" and path == "/reshaper" and status < 500
        ]  # the client sent the same body again
        assert len(statuses) == len(self.bodies)
        held, states = dict(self.held_before), []
        for body, status in zip(self.bodies, statuses):
            if status == 204:
                held.update({u: e["inventories"] for u, e in body["inventories"].items()})
                states.append(dict(held))
        return states

    def verdict(self, inventories: dict):
        return check(
            [Published(self.names[u], u == self.root, inv) for u, inv in inventories.items()],
            LIMITS,
        )


def test_reshape_under_writes_slower_than_a_staged_post_completes_in_stages_each_within_the_host(
    placement_server, host_name
):
    """Placement refuses a 150-consumer POST whenever a write lands while it
    processes it (longer than the 0.3 s or more between writes): the agent
    halves the POST after such a refusal. Each POST moves its consumers
    whole; in between the moved classes are published closed at what is
    allocated, never more than the host has; the last POST sets the new
    inventories. Writes come four staged POSTs apart on this machine, so a
    loaded CI machine (one-consumer POSTs of 0.9 s seen) tests the same
    race as a quiet one, where they are 0.3 s apart."""
    run = Run(placement_server.url, host_name, None)

    outcome, scheduler = run.outcome, run.scheduler
    assert scheduler.writes >= KEPT + 3, "the scheduler must have written during the reshape"
    assert ("POST", "/reshaper", 409) in run.agent.stats.log, "and refused a POST"
    assert not isinstance(outcome, HostBusy), f"writes every {run.interval:.2f} s: {outcome}"
    assert outcome.reshaped and outcome.consumers_moved == PINNED
    assert outcome.attempts < ATTEMPTS + PINNED  # bounded: refusals < ATTEMPTS
    for guest in run.guests:
        assert run.held(guest.uuid) == {run.root: {"PCPU": 1, "MEMORY_MB": 256}}
    for consumer, memory in scheduler.memory.items():  # no scheduler write was lost
        assert run.held(consumer) == {run.root: {"VCPU": 1, "MEMORY_MB": memory}}
    # Each body replaced its consumers' allocations whole, each consumer in one body.
    moved = [c for body in run.bodies for c in body["allocations"]]
    assert sorted(set(moved)) == sorted(g.uuid for g in run.guests)
    for body in run.bodies:
        for entry in body["allocations"].values():
            assert entry["allocations"] == {run.root: {"resources": {"PCPU": 1, "MEMORY_MB": 256}}}
    # After every POST that went through, Placement held a tree within the host.
    states = run.inventories_after_each_post()
    for state in states:
        assert run.verdict(state).ok, run.verdict(state).lines()
    held_now = {
        u: run.setup.get(f"/resource_providers/{u}/inventories")["inventories"] for u in run.names
    }
    assert states[-1] == held_now
    assert held_now[run.root]["PCPU"]["reserved"] == 0  # the last POST opened PCPU
    assert held_now[run.root]["VCPU"]["total"] == SHARED
    # The scheduler never touches the pinned guests: a retry after a 409
    # reads the root's view again, not them.
    agent_reads = [
        path
        for method, path, _status in run.agent.stats.log
        if method == "GET" and path.startswith("/allocations/")
    ]
    for guest in run.guests:
        assert agent_reads.count(f"/allocations/{guest.uuid}") == 1
    # The consumers once, then per POST the root's view and the POST, and
    # the inventories once, and the view once more after the last POST (the
    # VCPU -> PCPU re-check); plus what the client sent again after a 5xx.
    again = sum(1 for _m, _p, status in run.agent.stats.log if status >= 500)
    assert outcome.requests <= PINNED + 2 * outcome.attempts + 1 + 1 + again


def test_a_host_written_every_0_05_s_is_reported_too_busy_and_keeps_each_consumer_whole(
    placement_server, host_name
):
    run = Run(placement_server.url, host_name, 0.05)

    outcome = run.outcome
    assert isinstance(outcome, HostBusy), outcome
    assert outcome.exit_code == 75
    assert "this host is too busy" in str(outcome)
    refused = re.search(r"(\d+) POST /reshaper refused", str(outcome))
    assert refused and int(refused.group(1)) >= ATTEMPTS, str(outcome)
    # Each pinned guest holds what it held, or what the reshape gives it: never a mix.
    moved = 0
    for guest in run.guests:
        held = run.held(guest.uuid)
        assert held in (
            {run.root: {"VCPU": 1, "MEMORY_MB": 256}},
            {run.root: {"PCPU": 1, "MEMORY_MB": 256}},
        ), held
        moved += "PCPU" in held[run.root]
    assert f"{moved} consumers were moved" in str(outcome) or moved == 0
    for state in run.inventories_after_each_post():
        assert run.verdict(state).ok, run.verdict(state).lines()
