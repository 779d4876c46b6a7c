"""``make soak``: thousands of cycles of the real agent service with random
host changes against a real Placement.

    .venv/bin/python -m soak.run [--cycles 2000] [--seed N] [--report FILE]

It starts the embedded Placement and a throw-away RabbitMQ, copies a real
sysfs fixture tree (``linux-test4``: 16 CPUs, 2 nodes) and a libvirt
test-driver XML into a temporary directory, and runs ``node-agent`` as a
service (``report_interval = 1``, so timer cycles interleave with the
soak's). Each step of the soak:

1. acts as the scheduler (guests boot and are deleted: a domain added to or
   removed from the libvirt XML together with its allocation; consumers that
   are not guests get and lose allocations), only placing what fits;
2. makes at most one change to the agent's inputs: a CPU (or a few) goes
   offline or online in the tree, or the config file is edited and SIGHUP
   sent -- a valid edit, a refused one (the old configuration must keep
   running), or one that does not fit the host (cycles must fail and
   Placement keep what it had);
3. runs one cycle through the control RPC (``sync_now`` starts a cycle
   after the call and waits for it);
4. checks Placement against :mod:`soak.model` (every inventory field, the
   traits -- the agent's plus the operator's -- usages, every allocation,
   freed consumers staying freed) and the agent's own status;
5. every ``--sample-every`` cycles, records the agent's RSS, open fds and
   threads.

One input change per step (made atomically) keeps the expectation exact
even when a timer cycle runs in the middle of a step. Exit 0 when every
check held and RSS and fds stayed flat; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from devenv.embedded_placement import start_subprocess
from node_agent.errors import NodeAgentError
from soak import model
from soak.agent import SoakAgent, config_text
from soak.host import SoakHost
from soak.world import SoakFailure, World

MIN_ONLINE = 2
MAX_CONSUMERS = 14
# Flat means: after warm-up, less growth than this over the whole run.
RSS_GROWTH_LIMIT_MIB = 10.0
FD_GROWTH_LIMIT = 3
WARMUP_FRACTION = 0.1

VALID_VALUES = {
    "reserved_host_cpus": (0, 0, 1, 2, 3),
    "reserved_host_memory_mb": (0, 512, 1024, 2048, 4096),
    "reserved_host_disk_mb": (0, 1024, 2048, 5000),
    "cpu_allocation_ratio": (1.0, 1.5, 2.0, 4.0, 16.0),
    "ram_allocation_ratio": (1.0, 1.0, 1.5),
}
# (option, value as written, what the refusal must mention)
REFUSED_VALUES = (
    ("cpu_allocation_ratio", "-1.0", "cpu_allocation_ratio"),
    ("cpu_allocation_ratio", "0", "cpu_allocation_ratio"),
    ("ram_allocation_ratio", "nan", "ram_allocation_ratio"),
    ("cpu_allocation_ratio", "many", "cpu_allocation_ratio"),
    ("reserved_host_memory_mb", "-512", "reserved_host_memory_mb"),
    ("reserved_host_cpus", "-1", "reserved_host_cpus"),
    ("reserved_host_disk_mb", "2G", "reserved_host_disk_mb"),
    ("cpu_dedicated_set", "2-x", "cpu_dedicated_set"),
    ("cpu_shared_set", "^0", "cpu_shared_set"),
)


@dataclass
class Options:
    cycles: int = 2000
    seed: int = 1
    sample_every: int = 20
    report_interval: int = 1
    full_verify_interval: int = 5
    workdir: Optional[Path] = None
    # Servers already running (the test suite's); started here when None.
    placement_url: Optional[str] = None
    transport_url: Optional[str] = None


@dataclass
class Soak:
    """The soak's view of the world: what it changed and what it expects."""

    opts: Options
    work: Path
    rng: random.Random
    host: SoakHost
    world: World
    agent: SoakAgent
    placement_url: str
    transport_url: str
    running: model.Config = field(default_factory=model.Config)
    records: Optional[dict] = None
    changes: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    checks: int = 0
    samples: list = field(default_factory=list)
    guests: list = field(default_factory=list)  # booted guest uuids
    others: list = field(default_factory=list)  # consumers that are no guest
    cycle_seconds: list = field(default_factory=list)

    # -- facts and config

    def facts(self) -> model.HostFacts:
        import psutil

        return model.HostFacts(
            len(self.host.online),
            self.host.memory_mb,
            psutil.disk_usage(str(self.work)).total // 1024**3,
        )

    def write_config(self, config: model.Config, broken=None) -> None:
        self.agent.write_config(
            config_text(
                self.work,
                self.agent.host,
                self.placement_url,
                self.transport_url,
                self.host.sysroot,
                self.host.uri,
                config,
                self.opts.report_interval,
                self.opts.full_verify_interval,
                broken,
            )
        )

    # -- the scheduler

    def _fits(self, request) -> bool:
        return model.fits(self.records, self.world.usages(), request)

    def _request(self) -> dict:
        return {
            "VCPU": self.rng.randint(1, 4),
            "MEMORY_MB": self.rng.choice((512, 1024, 2048, 4096)),
            "DISK_GB": self.rng.randint(1, 20),
        }

    def boot_guest(self) -> Optional[str]:
        if len(self.world.allocations) >= MAX_CONSUMERS:
            return None
        request = self._request()
        if not self._fits(request):
            return "guest_refused_by_scheduler"
        guest = str(uuid.uuid4())
        self.world.allocate(guest, request)
        self.host.boot(guest, f"soak-{guest[:8]}")
        self.guests.append(guest)
        return "guest_boot"

    def delete_guest(self) -> Optional[str]:
        if not self.guests:
            return None
        guest = self.guests.pop(self.rng.randrange(len(self.guests)))
        self.host.destroy(guest)
        self.world.free(guest)
        return "guest_delete"

    def allocate_other(self) -> Optional[str]:
        """A consumer the hypervisor may not show: a fixture guest of the
        XML, or one that is not (yet) on this host at all."""
        if len(self.world.allocations) >= MAX_CONSUMERS:
            return None
        idle = [g for g in self.host.fixture_guests if g not in self.world.allocations]
        consumer = self.rng.choice(idle) if idle and self.rng.random() < 0.5 else str(uuid.uuid4())
        request = self._request()
        if not self._fits(request):
            return "allocation_refused_by_scheduler"
        self.world.allocate(consumer, request)
        self.others.append(consumer)
        return "allocation_other"

    def free_other(self) -> Optional[str]:
        if not self.others:
            return None
        self.world.free(self.others.pop(self.rng.randrange(len(self.others))))
        return "free_other"

    # -- the host and the operator

    def cpus_offline(self) -> Optional[str]:
        candidates = sorted(self.host.online & set(self.host.hotpluggable))
        room = len(self.host.online) - MIN_ONLINE
        if room <= 0 or not candidates:
            return None
        count = min(room, self.rng.choice((1, 1, 1, 2, 4)))
        self.host.set_online(self.host.online - set(self.rng.sample(candidates, count)))
        return "cpu_offline"

    def cpus_online(self) -> Optional[str]:
        offline = sorted(set(self.host.present) - self.host.online)
        if not offline:
            return None
        count = min(len(offline), self.rng.choice((1, 1, 2, 3, 16)))
        self.host.set_online(self.host.online | set(self.rng.sample(offline, count)))
        return "cpu_online"

    def config_edit(self) -> Optional[str]:
        option = self.rng.choice(sorted(VALID_VALUES))
        try:
            model.wanted(self.facts(), self.running)
        except model.Unfit:
            option = self._unfit_option() or option  # the operator fixes it
        new = self.running.with_value(option, self.rng.choice(VALID_VALUES[option]))
        self._reload(new)
        return "config_edit"

    def _unfit_option(self) -> Optional[str]:
        if self.running.reserved_host_memory_mb >= self.host.memory_mb:
            return "reserved_host_memory_mb"
        if self.running.reserved_host_cpus >= len(self.host.online):
            return "reserved_host_cpus"
        return None

    def config_unfit(self) -> Optional[str]:
        option, value = self.rng.choice(
            (
                ("reserved_host_memory_mb", self.host.memory_mb + 1),
                ("reserved_host_cpus", len(self.host.present) + 4),
            )
        )
        self._reload(self.running.with_value(option, value))
        return "config_unfit_for_host"

    def config_refused(self) -> Optional[str]:
        option, raw, named = self.rng.choice(REFUSED_VALUES)
        log = self.agent.reload_with(lambda: self.write_config(self.running, (option, raw)))
        if "reload refused, the running configuration stays" not in log or named not in log:
            raise SoakFailure(f"SIGHUP with {option} = {raw}: no refusal naming it:\n{log}")
        return "config_refused"

    def _reload(self, config: model.Config) -> None:
        log = self.agent.reload_with(lambda: self.write_config(config))
        if "configuration reloaded" not in log or "reload refused" in log:
            raise SoakFailure(f"SIGHUP with a valid file was not applied:\n{log}")
        self.running = config

    # -- one step

    SCHEDULER = (("boot_guest", 3), ("delete_guest", 2.5), ("allocate_other", 1), ("free_other", 1))
    INPUTS = (
        ("cpus_offline", 3),
        ("cpus_online", 3),
        ("config_edit", 1.5),
        ("config_refused", 0.6),
        ("config_unfit", 0.3),
        (None, 2),
    )

    def _pick(self, table):
        names, weights = zip(*table)
        return self.rng.choices(names, weights)[0]

    def step(self) -> list[str]:
        applied = []
        # The scheduler first: it places against what Placement holds now.
        for _ in range(self.rng.choice((0, 1, 1, 2))):
            applied.append(getattr(self, self._pick(self.SCHEDULER))())
        change = self._pick(self.INPUTS)
        if self._unfit_option() and self.rng.random() < 0.5:
            change = "config_edit"  # the operator notices the failing cycles
        if change:
            applied.append(getattr(self, change)())
        applied = [a for a in applied if a]
        self.changes.update(applied)
        return applied

    def cycle_and_check(self, number: int, applied: list[str]) -> None:
        began = time.monotonic()
        status = self.agent.sync_now()
        self.cycle_seconds.append(time.monotonic() - began)
        if status.get("triggered_cycle") is None:
            raise SoakFailure(f"sync_now did not finish a cycle: {status}")
        expected = model.after_cycle(self.records, self.facts(), self.running, self.world.usages())
        self._check_status(status, expected)
        self.checks += self.world.check(expected.records) + 1
        self.records = dict(expected.records)
        self.outcomes[expected.outcome] += 1
        if not self.agent.alive():
            raise SoakFailure("the agent exited")

    def _check_status(self, status: dict, expected: model.Expected) -> None:
        problem = status.get("problem")
        if expected.outcome == "unfit":
            if not problem or problem["kind"] != "config":
                raise SoakFailure(
                    f"config does not fit ({expected.why}) but the agent reports {problem}"
                )
            return
        if problem:
            raise SoakFailure(f"the agent reports a problem: {problem}")
        ok = status["last_sync"]["ok"]
        if ok != (expected.outcome == "ok"):
            raise SoakFailure(
                f"agent says ok={ok}, model says {expected.outcome} "
                f"(kept {expected.kept}); errors: "
                f"{status['last_sync']['errors']}"
            )

    def sample(self, number: int) -> None:
        self.samples.append({"cycle": number, **self.agent.sample()})


def flatness(samples: list[dict], key: str, total_cycles: int) -> dict:
    warm = [s for s in samples if s["cycle"] >= total_cycles * WARMUP_FRACTION] or samples
    values = [s[key] for s in warm]
    return {
        "first": samples[0][key],
        "after_warmup": values[0],
        "last": samples[-1][key],
        "max": max(s[key] for s in samples),
        "min_after_warmup": min(values),
        "growth_after_warmup": values[-1] - values[0],
        "slope_per_1000_cycles": round(model.trend([(s["cycle"], s[key]) for s in warm]), 2),
    }


def run(opts: Options) -> dict:
    from tests.integration.rabbit import Broker

    started = time.monotonic()
    work = Path(opts.workdir or tempfile.mkdtemp(prefix="node-agent-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "cycles_requested": opts.cycles,
        "seed": opts.seed,
        "workdir": str(work),
        "failure": None,
    }
    placement = broker = None
    if opts.placement_url is None:
        placement = start_subprocess(work / "placement")
    if opts.transport_url is None:
        (work / "rabbit").mkdir(exist_ok=True)
        broker = Broker(work / "rabbit").start()
    placement_url = opts.placement_url or placement.url
    transport_url = opts.transport_url or broker.url
    agent = None
    done = 0
    try:
        host = SoakHost(work / "host")
        name = f"soak-{uuid.uuid4().hex[:8]}"
        agent = SoakAgent(work / "host", name)
        soak = Soak(
            opts,
            work / "host",
            random.Random(opts.seed),
            host,
            World(placement_url, name),
            agent,
            placement_url,
            transport_url,
        )
        soak.write_config(soak.running)
        agent.start()
        agent.notify.wait_for(lambda d: d.startswith("STATUS=ok:"), 0, timeout=60)
        try:
            soak.world.find_root()
            soak.records = dict(model.after_cycle(None, soak.facts(), soak.running, {}).records)
            soak.world.remember_traits()
            soak.world.add_operator_trait()
            soak.checks += soak.world.check(soak.records)
            soak.sample(0)
            for number in range(1, opts.cycles + 1):
                applied = soak.step()
                try:
                    soak.cycle_and_check(number, applied)
                except SoakFailure as exc:
                    raise SoakFailure(f"cycle {number} after {applied}: {exc}") from exc
                done = number
                if number % opts.sample_every == 0 or number == opts.cycles:
                    soak.sample(number)
                if number % 100 == 0:
                    print(
                        f"[soak] {number} cycles, {soak.checks} checks, "
                        f"rss {soak.samples[-1]['rss'] / 2**20:.1f} MiB, "
                        f"fds {soak.samples[-1]['fds']}",
                        flush=True,
                    )
        except (SoakFailure, TimeoutError, NodeAgentError) as exc:
            result["failure"] = f"{type(exc).__name__}: {exc}"
        status = agent.rpc().call({}, "get_status")
        result.update(_summary(soak, done, status))
    finally:
        if agent is not None:
            result["agent_exit_code"] = agent.stop()
        for server in (broker, placement):
            if server is not None:
                server.stop()
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    result["passed"] = (
        result["failure"] is None
        and result.get("flat", False)
        and result.get("agent_exit_code") == 0
    )
    return result


def _summary(soak: Soak, done: int, status: dict) -> dict:
    if not soak.samples:
        soak.sample(done)
    seconds = sorted(soak.cycle_seconds) or [0.0]
    rss = flatness(soak.samples, "rss", done)
    fds = flatness(soak.samples, "fds", done)
    threads = flatness(soak.samples, "threads", done)
    flat = (
        rss["growth_after_warmup"] < RSS_GROWTH_LIMIT_MIB * 2**20
        and fds["growth_after_warmup"] <= FD_GROWTH_LIMIT
        and threads["growth_after_warmup"] <= FD_GROWTH_LIMIT
    )
    return {
        "cycles_checked": done,
        "agent_cycles_total": status.get("cycles"),
        "timer_cycles": (status.get("cycles") or 0) - done - 1,
        "changes": dict(sorted(soak.changes.items())),
        "outcomes": dict(soak.outcomes),
        "checks_passed": soak.checks,
        "cycle_seconds": {
            "median": round(seconds[len(seconds) // 2], 3),
            "p99": round(seconds[min(len(seconds) - 1, math.ceil(len(seconds) * 0.99) - 1)], 3),
            "max": round(seconds[-1], 3),
        },
        "rss_bytes": rss,
        "open_fds": fds,
        "threads": threads,
        "limits": {"rss_growth_mib": RSS_GROWTH_LIMIT_MIB, "fd_growth": FD_GROWTH_LIMIT},
        "flat": flat,
        "notify": dict(soak.agent.notify.counts),
        "samples": soak.samples,
    }


def summary_text(result: dict) -> str:
    mib = 2**20
    lines = [
        f"soak: {'PASSED' if result['passed'] else 'FAILED'} -- "
        f"{result.get('cycles_checked', 0)} of {result['cycles_requested']} cycles "
        f"checked, seed {result['seed']}, {result['wall_seconds']} s"
    ]
    if "checks_passed" in result:
        rss, fds = result["rss_bytes"], result["open_fds"]
        lines += [
            f"  agent cycles in all: {result['agent_cycles_total']} "
            f"({result['timer_cycles']} by its own timer)",
            f"  changes: {result['changes']}",
            f"  outcomes: {result['outcomes']}",
            f"  checks passed: {result['checks_passed']}",
            f"  cycle via RPC: median {result['cycle_seconds']['median']} s, "
            f"p99 {result['cycle_seconds']['p99']} s",
            f"  RSS MiB: first {rss['first'] / mib:.1f}, after warm-up "
            f"{rss['after_warmup'] / mib:.1f}, last {rss['last'] / mib:.1f}, max "
            f"{rss['max'] / mib:.1f}, slope {rss['slope_per_1000_cycles'] / mib:.2f}/1000 cycles",
            f"  open fds: first {fds['first']}, after warm-up {fds['after_warmup']}, "
            f"last {fds['last']}, max {fds['max']}",
            f"  threads: last {result['threads']['last']}, max {result['threads']['max']}",
            f"  flat: {result['flat']}, agent exit code {result.get('agent_exit_code')}",
        ]
    if result["failure"]:
        lines.append(f"  FAILURE: {result['failure']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m soak.run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument(
        "--seed", type=int, default=None, help="random seed (default: chosen and printed)"
    )
    parser.add_argument("--report", type=Path, help="write the results as JSON here")
    parser.add_argument("--sample-every", type=int, default=20)
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep everything here (default: a "
        "new temporary directory, left in place for inspection)",
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    result = run(
        Options(cycles=args.cycles, seed=seed, sample_every=args.sample_every, workdir=args.workdir)
    )
    print(summary_text(result))
    if args.report:
        args.report.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
