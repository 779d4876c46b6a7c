"""Section 2: Placement requests and wall time per phase, node-agent and nova.

Both agents talk to the same embedded Placement, each with its own host
(root + 4 SR-IOV children of the synthetic host), and every request is
counted from placement's request log, so both sides are counted the same
way. nova runs in its own venv (bench/nova_driver.py).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
import uuid as uuidlib
from pathlib import Path

from bench import common, synthetic_host
from node_agent.model.cpuset import CpuSet
from node_agent.cycle.desired import desired_from
from node_agent.host.discover import discover
from devenv.embedded_placement import LOG_FILE, start_subprocess
from node_agent.placement.client import PlacementClient
from node_agent.model.provider_tree import ProviderTree
from node_agent.cycle.reconcile import Reconciler
from node_agent.state import StateStore
from node_agent.placement.planner import wanted_inventories
from node_agent.placement.sync import TreeSyncer
from node_agent.model.snapshot import Guest

# At most 4: the 5th cycle after a full verify (60 s apart) is the next one.
STEADY_REPEATS = {0: 4, 100: 4, 1000: 3}
INVENTORY_REPEATS = 3
FULL_VERIFY = 300
PROJECT, USER = "bench-project", "bench-user"
# Each instance: 1 VCPU and 256 MiB on the root.
INSTANCE = {"VCPU": 1, "MEMORY_MB": 256}
# The reshape host: 1,536 CPUs, so 1,000 pinned guests fit in the dedicated set.
RESHAPE_SHAPE = synthetic_host.Shape(cores_per_socket=384, gpus=0, pfs=4)
RESHAPE_DEDICATED = CpuSet(range(1024))
RESHAPE_SHARED = CpuSet(range(1024, 1536))


def tree_json(tree: ProviderTree) -> list[dict]:
    parents = {p.name: p.uuid for p in tree.providers}
    return [{"name": p.name, "uuid": p.uuid, "parent_uuid": parents.get(p.parent),
             "inventories": wanted_inventories(p), "traits": sorted(p.wanted_traits)}
            for p in tree.providers]


def fresh_uuids(tree: ProviderTree) -> ProviderTree:
    return tree.with_uuids({p.name: str(uuidlib.uuid4()) for p in tree.providers})


class Nova:
    """The nova driver subprocess in .venv-nova."""

    def __init__(self, python: Path, url: str):
        driver = Path(__file__).with_name("nova_driver.py")
        self.proc = subprocess.Popen([str(python), str(driver)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.call({"op": "init", "url": url})

    def call(self, cmd: dict) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write('{"op": "quit"}\n')
            self.proc.stdin.flush()
            self.proc.wait(30)


class Agent:
    """node-agent's sync shell with a simulated clock (one cycle = 60 s)."""

    def __init__(self, url: str, state_dir: Path):
        self.client = PlacementClient.for_endpoint(url)
        self.now = 0.0
        self.syncer = TreeSyncer(self.client, StateStore(state_dir),
                                 full_verify_interval=FULL_VERIFY, clock=lambda: self.now)

    def sync(self, tree: ProviderTree) -> dict:
        self.now += 60
        report = self.syncer.sync(tree)
        return {"error": "; ".join(report.errors)} if report.errors else {}

    def full_verify(self, tree: ProviderTree) -> dict:
        self.now += FULL_VERIFY
        return self.sync(tree)


class Scheduler:
    """Writes instances' allocations, as nova's scheduler would."""

    def __init__(self, url: str):
        self.client = PlacementClient.for_endpoint(url)

    def place(self, root_uuid: str, consumers: list[str], batch: int = 250) -> None:
        for start in range(0, len(consumers), batch):
            self.client.post("/allocations", {
                c: {"allocations": {root_uuid: {"resources": dict(INSTANCE)}},
                    "project_id": PROJECT, "user_id": USER, "consumer_generation": None}
                for c in consumers[start:start + batch]})

    def resize(self, root_uuid: str, consumer: str) -> None:
        """Change one instance's allocation: bumps the root's generation."""
        current = self.client.get(f"/allocations/{consumer}")
        vcpus = current["allocations"][root_uuid]["resources"]["VCPU"]
        self.client.put(f"/allocations/{consumer}", {
            "allocations": {root_uuid: {"resources": {**INSTANCE, "VCPU": 3 - vcpus}}},
            "project_id": PROJECT, "user_id": USER,
            "consumer_generation": current["consumer_generation"]})

    def usages(self, root_uuid: str) -> dict:
        return self.client.get(f"/resource_providers/{root_uuid}/usages")["usages"]


class Phases:
    def __init__(self, log: common.RequestLog):
        self.log = log
        self.rows: dict[str, dict] = {}

    def measure(self, phase: str, side: str, fn, repeats: int = 1) -> None:
        totals, seconds, first, errors = [], [], None, []
        for _ in range(repeats):
            mark = self.log.mark()
            start = time.perf_counter()
            reply = fn() or {}
            seconds.append(time.perf_counter() - start)
            requests = self.log.since(mark)
            counted = common.count(requests)
            if first is None:
                first = dict(counted, paths=[common.shape(r) for r in requests],
                             reply={k: v for k, v in reply.items() if k != "seconds"})
            totals.append(counted["total"])
            if reply.get("error"):
                errors.append(reply["error"])
        self.rows.setdefault(phase, {})[side] = {
            "requests": common.summary(totals), "first": first,
            "seconds": common.summary(seconds), "errors": errors}


def _snapshot(work: Path, shape: synthetic_host.Shape, name: str):
    root = synthetic_host.build(work / name, shape)
    settings = _settings(work, root, shape, "probe")
    return root, discover(settings)


def _settings(work: Path, root: Path, shape, host: str, **overrides):
    return common.settings(
        host, str(root), str(work), str(work / "state" / host),
        pci_device_specs=common.device_specs(synthetic_host.device_specs(shape)),
        **overrides)


def _run_main(phases: Phases, work: Path, url: str, nova: Nova) -> None:
    shape = synthetic_host.Shape()
    root, snapshot = _snapshot(work, shape, "phase-host")

    def tree_for(host: str, **overrides) -> ProviderTree:
        return desired_from(_settings(work, root, shape, host, **overrides), snapshot).tree

    scheduler = Scheduler(url)
    agent = Agent(url, work / "state" / "na")
    na_tree = tree_for("bench-na")
    nova_tree = fresh_uuids(tree_for("bench-nova"))
    nova_cycle = lambda t: nova.call({"op": "cycle", "tree": tree_json(t)})  # noqa: E731

    phases.measure("first registration", "node-agent", lambda: agent.sync(na_tree))
    phases.measure("first registration", "nova", lambda: nova_cycle(nova_tree))
    na_root = agent.syncer.store.load()["root_uuid"]
    nova_root = nova_tree.root.uuid

    placed = 0
    for instances in (0, 100, 1000):
        new = [str(uuidlib.uuid4()) for _ in range(instances - placed)]
        scheduler.place(na_root, new)
        scheduler.place(nova_root, [str(uuidlib.uuid4()) for _ in new])
        placed = instances
        phase = f"steady cycle, {instances} instances"
        # The scheduler's writes moved the root's generation: the periodic
        # full verify (every 300 s) is the cycle that notices.
        phases.measure(phase + " (full verify, every 300 s)", "node-agent",
                       lambda: agent.full_verify(na_tree))
        phases.measure(phase, "node-agent", lambda: agent.sync(na_tree),
                       STEADY_REPEATS[instances])
        phases.measure(phase, "nova", lambda: nova_cycle(nova_tree),
                       STEADY_REPEATS[instances])
        if instances == 100:
            _inventory_change(phases, scheduler, agent, nova_cycle, tree_for,
                              na_root, nova_root, nova_tree)


def _inventory_change(phases, scheduler, agent, nova_cycle, tree_for,
                      na_root, nova_root, nova_tree) -> None:
    """Scheduler activity (an instance resized) bumps the root's generation,
    then the host's reserved memory changes; alternates 512 <-> 4096 MiB."""
    na_consumer = next(iter(scheduler.client.get(
        f"/resource_providers/{na_root}/allocations")["allocations"]))
    nova_consumer = next(iter(scheduler.client.get(
        f"/resource_providers/{nova_root}/allocations")["allocations"]))
    uuids = {p.name: p.uuid for p in nova_tree.providers}
    phase = "inventory change after scheduler activity, 100 instances"
    for i in range(INVENTORY_REPEATS):
        reserved = 4096 if i % 2 == 0 else 512
        scheduler.resize(na_root, na_consumer)
        scheduler.resize(nova_root, nova_consumer)
        na_tree = tree_for("bench-na", reserved_host_memory_mb=reserved)
        new_nova = tree_for("bench-nova", reserved_host_memory_mb=reserved).with_uuids(uuids)
        phases.measure(phase, "node-agent", lambda: agent.sync(na_tree))
        phases.measure(phase, "nova", lambda: nova_cycle(new_nova))
    # Back to the steady tree for the phases that follow.
    agent.sync(tree_for("bench-na"))
    nova_cycle(nova_tree)


def _guests(count: int) -> list[Guest]:
    return [Guest(uuid=str(uuidlib.uuid4()), name=f"pinned-{i}", vcpus=1, running=True,
                  memory_kb=INSTANCE["MEMORY_MB"] * 1024,
                  vcpupin=((0, CpuSet([i])),)) for i in range(count)]


def _run_reshapes(phases: Phases, work: Path, url: str, nova: Nova) -> dict:
    shape = RESHAPE_SHAPE
    root, snapshot = _snapshot(work, shape, "reshape-host")
    checks = {}
    for count in (100, 1000):
        def tree_for(host: str, after: bool) -> ProviderTree:
            extra = ({"cpu_dedicated_set": RESHAPE_DEDICATED,
                      "cpu_shared_set": RESHAPE_SHARED} if after else {})
            return desired_from(_settings(work, root, shape, host, **extra), snapshot).tree

        scheduler = Scheduler(url)
        guests = _guests(count)
        consumers = [g.uuid for g in guests]
        phase = f"reshape, {count} consumers (VCPU → PCPU)"

        agent = Agent(url, work / "state" / f"na-r{count}")
        before = tree_for(f"bench-na-r{count}", after=False)
        agent.sync(before)
        na_root = agent.syncer.store.load()["root_uuid"]
        scheduler.place(na_root, consumers)

        desired_after = desired_from(
            _settings(work, root, shape, f"bench-na-r{count}", cpu_dedicated_set=RESHAPE_DEDICATED,
                      cpu_shared_set=RESHAPE_SHARED),
            dataclasses.replace(snapshot, guests=tuple(guests)))

        def na_reshape():
            # The agent's own cycle (node_agent.cycle.reconcile): reshape, then sync.
            agent.now += 60
            outcome = Reconciler(agent.client, agent.syncer).apply(desired_after)
            result = {"reshaper_requests": getattr(outcome.reshape, "requests", 0)}
            if not outcome.ok:
                result["error"] = "; ".join(outcome.errors)
            return result

        phases.measure(phase, "node-agent", na_reshape)

        nova_before = fresh_uuids(tree_for(f"bench-nova-r{count}", after=False))
        uuids = {p.name: p.uuid for p in nova_before.providers}
        nova_after = tree_for(f"bench-nova-r{count}", after=True).with_uuids(uuids)
        nova.call({"op": "cycle", "tree": tree_json(nova_before)})
        nova_consumers = [str(uuidlib.uuid4()) for _ in range(count)]
        scheduler.place(nova_before.root.uuid, nova_consumers)
        phases.measure(phase, "nova", lambda: nova.call({
            "op": "reshape", "tree": tree_json(nova_after), "consumers": nova_consumers,
            "from": "VCPU", "to": "PCPU"}))
        checks[count] = {"node-agent": scheduler.usages(na_root).get("PCPU"),
                         "nova": scheduler.usages(nova_before.root.uuid).get("PCPU")}
    return checks


def run(work: Path, nova_python: Path) -> dict:
    server = start_subprocess(work / "placement-sqlite")
    nova = None
    try:
        log = common.RequestLog(server.workdir / LOG_FILE)
        phases = Phases(log)
        nova = Nova(nova_python, server.url)
        _run_main(phases, work, server.url, nova)
        checks = _run_reshapes(phases, work, server.url, nova)
        return {"rows": phases.rows, "reshape_check": checks}
    finally:
        if nova is not None:
            nova.close()
        server.stop()
