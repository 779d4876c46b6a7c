"""Section 2: Placement requests and wall time per phase, node-agent and nova.

Both agents talk to the same Placement, each with its own host (root + 4
SR-IOV children of the synthetic host), and every request is counted from
placement's request log, so both sides are counted the same way. nova runs
in its own venv (bench/nova_driver.py).

Every phase runs REPETITIONS times, interleaved: in each repetition both
sides run once, in alternating order, so a burst of load on the machine
hits both; a time ratio is computed per repetition and reported as the
median (min–max) of those ratios. Section 6 runs the same phases against a
production-like Placement (``run_phases`` with another server).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import uuid as uuidlib
from pathlib import Path
from typing import Callable, Optional

from bench import common, synthetic_host
from devenv.embedded_placement import LOG_FILE, start_subprocess
from node_agent.cycle import provider_cache
from node_agent.cycle.audit import Auditor
from node_agent.cycle.desired import Desired, desired_from
from node_agent.cycle.reconcile import Reconciler
from node_agent.host.discover import discover
from node_agent.model.cpuset import CpuSet
from node_agent.model.provider_tree import ProviderTree
from node_agent.model.snapshot import Guest
from node_agent.placement.client import PlacementClient
from node_agent.placement.planner import wanted_inventories
from node_agent.placement.sync import TreeSyncer
from node_agent.state import StateStore

REPETITIONS = 5
# Kept small enough for a 2-core machine shared with other work: request
# counts grow linearly with instances and consumers (nova: + 1 GET per
# instance per cycle; a reshape: + 1 GET per consumer on both sides).
INSTANCES = (0, 20)
RESHAPES = (100,)
INTERVAL = 60
FULL_VERIFY = 300
PROJECT, USER = "bench-project", "bench-user"
# Each instance: 1 VCPU and 256 MiB on the root.
INSTANCE = {"VCPU": 1, "MEMORY_MB": 256}
# The reshape host: 1,536 CPUs, so 1,000 pinned guests fit in the dedicated set.
RESHAPE_SHAPE = synthetic_host.Shape(cores_per_socket=384, gpus=0, pfs=4)
RESHAPE_DEDICATED = CpuSet(range(1024))
RESHAPE_SHARED = CpuSet(range(1024, 1536))
SIDES = ("node-agent", "nova")

Step = tuple[str, dict[str, Callable[[], Optional[dict]]]]


def tree_json(tree: ProviderTree) -> list[dict]:
    parents = {p.name: p.uuid for p in tree.providers}
    return [
        {
            "name": p.name,
            "uuid": p.uuid,
            "parent_uuid": parents.get(p.parent),
            "inventories": wanted_inventories(p),
            "traits": sorted(p.wanted_traits),
        }
        for p in tree.providers
    ]


def fresh_uuids(tree: ProviderTree) -> ProviderTree:
    return tree.with_uuids({p.name: str(uuidlib.uuid4()) for p in tree.providers})


class Nova:
    """The nova driver subprocess in .venv-nova."""

    def __init__(self, python: Path, url: str):
        driver = Path(__file__).with_name("nova_driver.py")
        self.proc = subprocess.Popen(
            [str(python), str(driver)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.call({"op": "init", "url": url})

    def call(self, cmd: dict) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def cycle(self, tree: ProviderTree, advance: float = INTERVAL) -> dict:
        return self.call({"op": "cycle", "tree": tree_json(tree), "advance": advance})

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write('{"op": "quit"}\n')
            self.proc.stdin.flush()
            self.proc.wait(30)


class Agent:
    """node-agent's own cycle as the service runs it (node_agent/service/
    daemon.py, direct mode): the maintenance check, the reshape check and
    the sync (node_agent.cycle.reconcile.Reconciler) with the syncer cache kept
    in the state file across restarts, then the allocation
    audit when the sync verified the whole tree; with a simulated clock.
    The bench's hosts keep NUMA out of Placement (the settings' default)."""

    def __init__(self, url: str, state_dir: Path):
        self.client = PlacementClient.for_endpoint(url)
        self.state_dir = state_dir
        self.now = 0.0
        self.restart()

    def restart(self) -> None:
        """A new process (or SIGHUP): a fresh syncer over the same state file."""
        self.syncer = TreeSyncer(
            self.client,
            StateStore(self.state_dir),
            full_verify_interval=FULL_VERIFY,
            clock=lambda: self.now,
        )
        provider_cache.restore(self.syncer)  # the cache the last process kept
        self.reconciler = Reconciler(self.client, self.syncer)
        self.auditor = Auditor(self.syncer, clock=lambda: self.now)

    def cycle(self, desired: Desired, advance: float = INTERVAL) -> dict:
        self.now += advance
        verified_at = self.syncer.verified_at
        desired = self.reconciler.maintained(desired)
        outcome = self.reconciler.apply(desired)
        provider_cache.keep(self.syncer)
        audited = 0
        if self.syncer.verified_at != verified_at:
            self.auditor.run(desired, desired.tree.root.name, numa=False)
            audited = self.auditor.requests
        # The cycle's requests, split for the report: the reshape's, the
        # audit's, and the rest (the sync's and the checks').
        result = {
            "reshaper_requests": getattr(outcome.reshape, "requests", 0),
            "audit_requests": audited,
        }
        if not outcome.ok:
            result["error"] = "; ".join(outcome.errors)
        return result

    def root_uuid(self) -> str:
        return self.syncer.store.load()["root_uuid"]


class Scheduler:
    """Writes instances' allocations, as nova's scheduler would."""

    def __init__(self, url: str):
        self.client = PlacementClient.for_endpoint(url)

    def place(self, root_uuid: str, consumers: list[str], batch: int = 250) -> None:
        for start in range(0, len(consumers), batch):
            self.client.post(
                "/allocations",
                {
                    c: {
                        "allocations": {root_uuid: {"resources": dict(INSTANCE)}},
                        "project_id": PROJECT,
                        "user_id": USER,
                        "consumer_generation": None,
                    }
                    for c in consumers[start : start + batch]
                },
            )

    def resize(self, root_uuid: str, consumer: Optional[str] = None) -> None:
        """Change one instance's allocation (``consumer``, else the first on
        the root): bumps the root's generation."""
        consumer = consumer or next(
            iter(self.client.get(f"/resource_providers/{root_uuid}/allocations")["allocations"])
        )
        current = self.client.get(f"/allocations/{consumer}")
        vcpus = current["allocations"][root_uuid]["resources"]["VCPU"]
        self.client.put(
            f"/allocations/{consumer}",
            {
                "allocations": {root_uuid: {"resources": {**INSTANCE, "VCPU": 3 - vcpus}}},
                "project_id": PROJECT,
                "user_id": USER,
                "consumer_generation": current["consumer_generation"],
            },
        )

    def usages(self, root_uuid: str) -> dict:
        return self.client.get(f"/resource_providers/{root_uuid}/usages")["usages"]


class Phases:
    """Requests (from placement's log) and wall time of each repetition of
    each phase and side; :meth:`result` summarises them."""

    def __init__(self, log: common.RequestLog, clock: Callable[[], float] = time.perf_counter):
        self.log = log
        self.clock = clock
        self.runs: dict[str, dict[str, list[dict]]] = {}

    def measure(self, phase: str, side: str, fn) -> None:
        """One repetition of ``phase`` on ``side``, added to the earlier ones."""
        mark = self.log.mark()
        start = self.clock()
        reply = fn() or {}
        seconds = self.clock() - start
        requests = self.log.since(mark)
        self.runs.setdefault(phase, {}).setdefault(side, []).append(
            dict(
                common.count(requests),
                paths=[common.shape(r) for r in requests],
                seconds=seconds,
                error=reply.get("error"),
                reply={k: v for k, v in reply.items() if k not in ("seconds", "error")},
            )
        )

    def repeat(
        self, steps: list[tuple[Optional[Callable], Step]], repetitions: Optional[int] = None
    ) -> None:
        """``repetitions`` times: each step's set-up (not measured), then its
        sides, in alternating order from one repetition to the next."""
        for i in range(repetitions or REPETITIONS):
            for before, (phase, sides) in steps:
                if before is not None:
                    before()
                order = list(sides.items())
                if i % 2:
                    order.reverse()
                for side, fn in order:
                    self.measure(phase, side, fn)

    @property
    def rows(self) -> dict:
        return self.result()

    def result(self) -> dict:
        rows = {}
        for phase, sides in self.runs.items():
            row = {}
            for side, runs in sides.items():
                first = runs[0]
                row[side] = {
                    "requests": common.summary([r["total"] for r in runs]),
                    "seconds": common.summary([r["seconds"] for r in runs]),
                    "first": {
                        k: first[k]
                        for k in ("total", "gets", "writes", "conflicts", "paths", "reply")
                    },
                    "errors": [r["error"] for r in runs if r["error"]],
                }
            if all(s in sides for s in SIDES):
                pairs = list(zip(sides["node-agent"], sides["nova"]))
                row["ratio"] = {
                    "seconds": common.summary([b["seconds"] / a["seconds"] for a, b in pairs]),
                    "requests": common.summary(
                        [b["total"] / a["total"] for a, b in pairs if a["total"]]
                    )
                    if all(a["total"] for a, _ in pairs)
                    else None,
                }
            rows[phase] = row
        return rows


def _snapshot(work: Path, shape: synthetic_host.Shape, name: str):
    root = synthetic_host.build(work / name, shape)
    settings = _settings(work, root, shape, "probe")
    return root, discover(settings)


def _settings(work: Path, root: Path, shape, host: str, **overrides):
    return common.settings(
        host,
        str(root),
        str(work),
        str(work / "state" / host),
        pci_device_specs=common.device_specs(synthetic_host.device_specs(shape)),
        **overrides,
    )


class _Hosts:
    """The phase host's desired state under any name and settings."""

    def __init__(self, work: Path):
        self.work = work
        self.shape = synthetic_host.Shape()
        self.root, self.snapshot = _snapshot(work, self.shape, "phase-host")

    def desired(self, host: str, guests: tuple[Guest, ...] = (), **overrides) -> Desired:
        """``guests``: the instances the host runs, so the audit after a full
        verify finds each allocation explained, as on a real host."""
        return desired_from(
            _settings(self.work, self.root, self.shape, host, **overrides),
            dataclasses.replace(self.snapshot, guests=guests),
        )

    def nova_tree(self, host: str, uuids: dict, **overrides) -> ProviderTree:
        return self.desired(host, **overrides).tree.with_uuids(uuids)


def _run_main(
    phases: Phases, work: Path, url: str, nova: Nova, instances: tuple[int, ...], inventory: bool
) -> None:
    hosts = _Hosts(work)
    scheduler = Scheduler(url)
    sides: dict = {}

    def new_hosts() -> None:
        n = len(phases.runs.get("first registration", {}).get("node-agent", []))
        sides["agent"] = Agent(url, work / "state" / f"na-{n}")
        sides["na_name"] = f"bench-na-{n}"
        sides["na"] = hosts.desired(sides["na_name"])
        nova_tree = fresh_uuids(hosts.desired(f"bench-nova-{n}").tree)
        sides["nova_name"], sides["nova_tree"] = f"bench-nova-{n}", nova_tree
        sides["nova_uuids"] = {p.name: p.uuid for p in nova_tree.providers}
        nova.call({"op": "restart"})

    # A fresh host (and a fresh nova-compute) each repetition; the last
    # repetition's hosts carry on.
    phases.repeat(
        [
            (
                new_hosts,
                (
                    "first registration",
                    {
                        "node-agent": lambda: sides["agent"].cycle(sides["na"]),
                        "nova": lambda: nova.cycle(sides["nova_tree"]),
                    },
                ),
            )
        ]
    )
    agent, na, nova_tree = sides["agent"], sides["na"], sides["nova_tree"]
    na_root, nova_root = agent.root_uuid(), nova_tree.root.uuid

    placed, guests = 0, ()
    for count in instances:
        new = [str(uuidlib.uuid4()) for _ in range(count - placed)]
        scheduler.place(na_root, new)
        scheduler.place(nova_root, [str(uuidlib.uuid4()) for _ in new])
        placed = count
        guests += tuple(_floating(uuid) for uuid in new)
        na = sides["na"] = hosts.desired(sides["na_name"], guests)

        activity_text = " after scheduler activity" if placed else ""

        def activity() -> None:
            if placed:
                scheduler.resize(na_root)
                scheduler.resize(nova_root)

        # The periodic re-read comes every 300 s on both sides: node-agent's
        # full verify, nova's association refresh (the clocks move 360 s).
        # Scheduler activity before it moved the root's generation.
        phases.repeat(
            [
                (
                    activity,
                    (
                        f"periodic re-read (every 300 s){activity_text}, {count} instances",
                        {
                            "node-agent": lambda: agent.cycle(na, FULL_VERIFY + INTERVAL),
                            "nova": lambda: nova.cycle(nova_tree, FULL_VERIFY + INTERVAL),
                        },
                    ),
                ),
                (
                    None,
                    (
                        f"steady cycle, {count} instances",
                        {
                            "node-agent": lambda: agent.cycle(na),
                            "nova": lambda: nova.cycle(nova_tree),
                        },
                    ),
                ),
            ]
        )
        if count == instances[-1] and inventory:
            _inventory_change(phases, hosts, scheduler, nova, sides, na_root, nova_root, placed)


def _inventory_change(
    phases: Phases,
    hosts: _Hosts,
    scheduler: Scheduler,
    nova: Nova,
    sides: dict,
    na_root: str,
    nova_root: str,
    placed: int,
) -> None:
    """Scheduler activity (an instance resized) bumps the root's generation,
    then the host's reserved memory changes: 512 -> 4096 MiB shrinks
    MEMORY_MB, 4096 -> 512 grows it back. On the host with the most
    instances."""
    agent, nova_name, uuids = sides["agent"], sides["nova_name"], sides["nova_uuids"]
    trees = {}
    for reserved in (512, 4096):
        trees[reserved] = (
            hosts.desired(
                sides["na_name"], sides["na"].host.guests, reserved_host_memory_mb=reserved
            ),
            hosts.nova_tree(nova_name, uuids, reserved_host_memory_mb=reserved),
        )

    def activity() -> None:
        scheduler.resize(na_root)
        scheduler.resize(nova_root)

    def change(reserved: int) -> dict:
        na, nova_tree = trees[reserved]
        return {"node-agent": lambda: agent.cycle(na), "nova": lambda: nova.cycle(nova_tree)}

    phases.repeat(
        [
            (
                activity,
                (
                    "inventory shrink after scheduler activity (reserved memory "
                    f"512 → 4096 MiB), {placed} instances",
                    change(4096),
                ),
            ),
            (
                activity,
                (
                    "inventory growth after scheduler activity (reserved memory "
                    f"4096 → 512 MiB), {placed} instances",
                    change(512),
                ),
            ),
        ]
    )


def _floating(uuid: str) -> Guest:
    return Guest(
        uuid=uuid,
        name=f"instance-{uuid[:8]}",
        vcpus=INSTANCE["VCPU"],
        running=True,
        memory_kb=INSTANCE["MEMORY_MB"] * 1024,
    )


def _guests(count: int) -> list[Guest]:
    return [
        Guest(
            uuid=str(uuidlib.uuid4()),
            name=f"pinned-{i}",
            vcpus=1,
            running=True,
            memory_kb=INSTANCE["MEMORY_MB"] * 1024,
            vcpupin=((0, CpuSet([i])),),
        )
        for i in range(count)
    ]


def _run_reshapes(
    phases: Phases, work: Path, url: str, nova: Nova, counts: tuple[int, ...]
) -> dict:
    """node-agent takes the path a reshape takes in production: the CPU sets
    changed, so the agent restarted (or got SIGHUP) and its first cycle,
    with a fresh syncer, reshapes (the cold path). nova reshapes at
    start-up, with an empty cache, the only time it does."""
    shape = RESHAPE_SHAPE
    root, snapshot = _snapshot(work, shape, "reshape-host")
    scheduler = Scheduler(url)
    checks: dict = {}

    def desired(host: str, guests=(), after: bool = False) -> Desired:
        extra = (
            {"cpu_dedicated_set": RESHAPE_DEDICATED, "cpu_shared_set": RESHAPE_SHARED}
            if after
            else {}
        )
        return desired_from(
            _settings(work, root, shape, host, **extra),
            dataclasses.replace(snapshot, guests=tuple(guests)),
        )

    for count, seen in [(n, seen) for n in counts for seen in (False, True)]:
        # seen: the agent's last cycle before the restart was a full verify
        # after the scheduler placed the consumers, so nothing moved since;
        # else the scheduler placed them while the agent was down.
        phase = f"reshape, {count} consumers (VCPU → PCPU), after a restart" + (
            ", nothing moved since the agent's last read" if seen else ""
        )
        state: dict = {}
        checks.setdefault(count, [])

        def prepare() -> None:
            n = len(phases.runs.get(phase, {}).get("node-agent", []))
            host = f"bench-na-r{count}{'s' if seen else ''}-{n}"
            guests = _guests(count)
            agent = Agent(url, work / "state" / host)
            agent.cycle(desired(host))
            scheduler.place(agent.root_uuid(), [g.uuid for g in guests])
            if seen:
                agent.cycle(desired(host, guests), advance=FULL_VERIFY)
            agent.restart()
            state["agent"], state["after"] = agent, desired(host, guests, after=True)

            nova_host = f"bench-nova-r{count}{'s' if seen else ''}-{n}"
            before = fresh_uuids(desired(nova_host).tree)
            uuids = {p.name: p.uuid for p in before.providers}
            nova.call({"op": "restart"})
            nova.cycle(before)
            consumers = [str(uuidlib.uuid4()) for _ in range(count)]
            scheduler.place(before.root.uuid, consumers)
            state["nova"] = {
                "op": "reshape",
                "consumers": consumers,
                "tree": tree_json(desired(nova_host, after=True).tree.with_uuids(uuids)),
                "from": "VCPU",
                "to": "PCPU",
            }
            state["nova_root"] = before.root.uuid

        def check() -> None:
            if "agent" in state:
                checks[count].append(
                    {
                        "node-agent": scheduler.usages(state["agent"].root_uuid()).get("PCPU"),
                        "nova": scheduler.usages(state["nova_root"]).get("PCPU"),
                    }
                )

        def prepare_and_check() -> None:
            check()
            prepare()

        phases.repeat(
            [
                (
                    prepare_and_check,
                    (
                        phase,
                        {
                            "node-agent": lambda: state["agent"].cycle(state["after"]),
                            "nova": lambda: nova.call(state["nova"]),
                        },
                    ),
                )
            ]
        )
        check()
    return checks


def cli_registration(work: Path, url: str, log: common.RequestLog) -> dict:
    """The real ``node-agent --once`` process registering the phase host:
    what it sends beyond the in-process cycle (the microversion check)."""
    shape = synthetic_host.Shape()
    root = synthetic_host.build(work / "cli-host", shape)
    agent = Path(sys.executable).with_name("node-agent")
    specs = "".join(f"device_spec = {s}\n" for s in synthetic_host.device_specs(shape))
    runs = []
    for i in range(REPETITIONS):
        config = work / f"cli-{i}.conf"
        config.write_text(
            f"[DEFAULT]\nhost = bench-cli-{i}\n[agent]\nstate_path = {work / 'cli-state' / str(i)}\n"
            f"[host]\nsysfs_root = {root}\n[libvirt]\nconnection_uri =\n"
            f"[compute]\ninstances_path = {work}\n[pci]\n{specs}"
            f"[placement]\nauth_type = admin_token\ntoken = admin\n"
            f"endpoint_override = {url}\n"
        )
        mark = log.mark()
        start = time.perf_counter()
        done = subprocess.run(
            [str(agent), "--config-file", str(config), "--once"], capture_output=True, text=True
        )
        seconds = time.perf_counter() - start
        requests = log.since(mark)
        runs.append(
            dict(
                common.count(requests),
                seconds=seconds,
                exit=done.returncode,
                paths=[common.shape(r) for r in requests],
            )
        )
    return {
        "requests": common.summary([r["total"] for r in runs]),
        "seconds": common.summary([r["seconds"] for r in runs]),
        "exits": sorted({r["exit"] for r in runs}),
        "first": runs[0],
    }


def run_phases(
    work: Path,
    nova_python: Path,
    url: str,
    log_path: Path,
    instances: tuple[int, ...] = INSTANCES,
    reshapes: tuple[int, ...] = RESHAPES,
    inventory: bool = True,
) -> dict:
    log = common.RequestLog(log_path)
    phases = Phases(log)
    nova = Nova(nova_python, url)
    try:
        _run_main(phases, work, url, nova, instances, inventory)
        checks = _run_reshapes(phases, work, url, nova, reshapes)
        cli = cli_registration(work, url, log)
    finally:
        nova.close()
    return {
        "rows": phases.result(),
        "reshape_check": checks,
        "cli": cli,
        "repetitions": REPETITIONS,
    }


def run(work: Path, nova_python: Path) -> dict:
    server = start_subprocess(work / "placement-sqlite")
    try:
        return run_phases(work, nova_python, server.url, server.workdir / LOG_FILE)
    finally:
        server.stop()
