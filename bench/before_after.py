"""Section 11: issue 19's claims, before and after, in the same run.

The pre-change commit (BEFORE) is extracted with ``git archive`` into a
temporary directory and run from there on this venv's interpreter
(``PYTHONPATH`` puts its ``node_agent`` first; its dependencies are a subset
of today's). Each measurement alternates the two checkouts, the order
flipping from one repetition to the next, REPETITIONS times:

(a) the first cycle after a failed one, when nothing moved in Placement:
    the phase host of section 2 (root + 4 SR-IOV children) registered
    through a fault-injecting proxy, a full verify due, one 503 from the
    proxy, then the next cycle's requests (from Placement's log);
(b) ``node-agent --once --dry-run --output json`` on the 384-CPU synthetic
    host: CPU seconds and peak RSS, as ratios to ``python -c pass`` run
    next to it;
(c) a VCPU -> PCPU reshape of RESHAPE_CONSUMERS pinned guests after a
    restart (a new process's objects over the state the last one left),
    the maintenance and reshape checks and the sync, no audit (the old
    commit has none);
(d) discovery of the 384-CPU synthetic host, timed in a process that has
    imported everything already.

Both checkouts are driven by bench/version_driver.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import uuid as uuidlib
from pathlib import Path

from bench import common, memory, synthetic_host
from bench.phases import RESHAPE_DEDICATED, RESHAPE_SHAPE, RESHAPE_SHARED, Scheduler
from devenv.embedded_placement import LOG_FILE, start_subprocess
from tests.reliability.proxy import FaultProxy

BEFORE = "3eee0d0"
REPO = Path(__file__).resolve().parents[1]
REPETITIONS = 5
DISCOVERY_REPETITIONS = 41  # about 30 ms each: cheap, and the median steadier under load
RESHAPE_CONSUMERS = 100
DRIVER = Path(__file__).with_name("version_driver.py")
SIDES = ("before", "after")


def _extract(commit: str, where: Path) -> Path:
    where.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


class Checkout:
    """One driver process of one checkout."""

    def __init__(self, source: Path):
        self.source = source
        env = dict(os.environ, PYTHONPATH=str(source))
        # -P: the driver's own directory (bench/) is not put on sys.path.
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(DRIVER)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, op: str, **args) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.source} driver exited ({self.proc.wait()})")
        answer = json.loads(line)
        if answer.get("failed"):
            raise RuntimeError(f"{self.source}: {op}: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write('{"op": "quit"}\n')
            self.proc.stdin.flush()
            self.proc.wait(30)


def _order(i: int) -> tuple[str, ...]:
    return SIDES if i % 2 == 0 else SIDES[::-1]


def _by_side(runs: dict, key: str) -> dict:
    return {side: common.summary([r[key] for r in runs[side]]) for side in SIDES}


def recovery(
    drivers: dict, proxy: FaultProxy, log: common.RequestLog, host_root: Path, work: Path
) -> dict:
    specs = list(synthetic_host.device_specs(synthetic_host.Shape()))
    runs: dict = {side: [] for side in SIDES}
    for i in range(REPETITIONS):
        for side in _order(i):
            driver = drivers[side]
            driver.call(
                "init",
                url=proxy.url,
                host=f"bench-recover-{side}-{i}",
                sysfs_root=str(host_root),
                work=str(work),
                specs=specs,
            )
            registered = driver.call("register")
            if not registered["ok"]:
                raise RuntimeError(f"{side}: registration failed: {registered['error']}")
            injected = proxy.injected
            proxy.fail_next(1)
            failed = driver.call("fail")
            if failed["ok"] or proxy.injected != injected + 1:
                raise RuntimeError(f"{side}: the injected 503 did not fail the cycle")
            mark = log.mark()
            healed = driver.call("cycle", advance=0)
            requests = log.since(mark)
            runs[side].append(
                {
                    "requests": len(requests),
                    "ok": healed["ok"],
                    "paths": [common.shape(r) for r in requests],
                }
            )
    return {
        **_by_side(runs, "requests"),
        "paths": {side: runs[side][0]["paths"] for side in SIDES},
        "healed": {side: all(r["ok"] for r in runs[side]) for side in SIDES},
    }


def dry_run(sources: dict, synthetic_root: Path, work: Path) -> dict:
    config = {"after": memory._config(work / "dry-run", synthetic_root)}
    # The old commit has the agent's state_path in [DEFAULT] only (today that
    # name is nova's): the same run, spelled as it reads it.
    config["before"] = work / "dry-run" / "dry-run-before.conf"
    config["before"].write_text(
        config["after"]
        .read_text()
        .replace("[DEFAULT]\n", f"[DEFAULT]\nstate_path = {work / 'dry-run' / 'state'}\n", 1)
    )
    entry = {  # the console script each checkout installs, as a file of its own
        "before": "from node_agent.cli import main",
        "after": "from node_agent.cli.main import main",
    }
    commands = {"baseline": [sys.executable, "-c", "pass"]}
    envs = {"baseline": dict(os.environ)}
    for side in SIDES:
        script = work / f"node-agent-{side}"
        script.write_text(f"import sys\n{entry[side]}\nsys.exit(main())\n")
        commands[side] = [
            sys.executable,
            str(script),
            "--config-file",
            str(config[side]),
            "--once",
            "--dry-run",
            "--output",
            "json",
        ]
        envs[side] = dict(os.environ, PYTHONPATH=str(sources[side]))
    runs: dict = {name: [] for name in commands}
    for i in range(REPETITIONS):
        names = ("baseline",) + _order(i)
        for name in names if i % 2 == 0 else names[::-1]:
            runs[name].append(memory._child(commands[name], envs[name]))
    for side in SIDES:
        exits = sorted({r[3] for r in runs[side]})
        if exits != [0]:
            # The figures would be those of a run that stopped early.
            raise RuntimeError(f"the {side} dry run exited {exits}, not 0")
    result: dict = {}
    for name, rows in runs.items():
        result[name] = {
            "seconds": common.summary([r[0] for r in rows]),
            "cpu": common.summary([r[1] for r in rows]),
            "rss_mib": common.summary([r[2] for r in rows]),
            "exits": sorted({r[3] for r in rows}),
        }
        if name != "baseline":
            result[name]["ratio_cpu"] = common.summary(
                [a[1] / b[1] for a, b in zip(rows, runs["baseline"])]
            )
            result[name]["ratio_rss_mib"] = common.summary(
                [a[2] / b[2] for a, b in zip(rows, runs["baseline"])]
            )
    result["after_vs_before_cpu"] = common.summary(
        [a[1] / b[1] for a, b in zip(runs["after"], runs["before"])]
    )
    result["after_vs_before_rss_mib"] = common.summary(
        [a[2] / b[2] for a, b in zip(runs["after"], runs["before"])]
    )
    return result


def reshape(drivers: dict, url: str, log: common.RequestLog, host_root: Path, work: Path) -> dict:
    specs = list(synthetic_host.device_specs(RESHAPE_SHAPE))
    scheduler = Scheduler(url)
    runs: dict = {side: [] for side in SIDES}
    for i in range(REPETITIONS):
        for side in _order(i):
            driver = drivers[side]
            driver.call(
                "init",
                url=url,
                host=f"bench-reshape-{side}-{i}",
                sysfs_root=str(host_root),
                work=str(work),
                specs=specs,
                dedicated=list(RESHAPE_DEDICATED),
                shared=list(RESHAPE_SHARED),
                retries=3,
            )
            root = driver.call("register")["root_uuid"]
            guests = [[str(uuidlib.uuid4()), cpu] for cpu in range(RESHAPE_CONSUMERS)]
            scheduler.place(root, [g for g, _ in guests])
            driver.call("restart")
            mark = log.mark()
            done = driver.call("reshape", guests=guests)
            requests = log.since(mark)
            runs[side].append(
                {
                    "requests": len(requests),
                    "ok": done["ok"],
                    "error": done.get("error"),
                    "pcpu": scheduler.usages(root).get("PCPU"),
                    "paths": [common.shape(r) for r in requests],
                }
            )
    return {
        **_by_side(runs, "requests"),
        "pcpu": {side: sorted({r["pcpu"] for r in runs[side]}, key=str) for side in SIDES},
        "errors": {side: [r["error"] for r in runs[side] if r["error"]][:1] for side in SIDES},
        "paths": {side: runs[side][0]["paths"] for side in SIDES},
    }


def discovery(drivers: dict, synthetic_root: Path, work: Path) -> dict:
    for side in SIDES:
        drivers[side].call(
            "init",
            url="http://127.0.0.1:9",
            host="bench-discover",
            sysfs_root=str(synthetic_root),
            work=str(work),
            specs=list(synthetic_host.device_specs(synthetic_host.Shape())),
        )
        drivers[side].call("discover")  # warm: imports, first touch of the files
    runs: dict = {side: [] for side in SIDES}
    for i in range(DISCOVERY_REPETITIONS):
        for side in _order(i):
            runs[side].append(drivers[side].call("discover"))
    result = _by_side(runs, "seconds")
    ratios = [a["seconds"] / b["seconds"] for a, b in zip(runs["after"], runs["before"])]
    result["ratio"] = common.summary(ratios)
    result["slower"] = sum(1 for r in ratios if r > 1)
    result["regression_at"] = sign_test_threshold(len(ratios))
    return result


def sign_test_threshold(n: int, level: float = 0.05) -> int:
    """The fewest of ``n`` paired repetitions in which *after* must be the
    slower for a one-sided sign test to call it a regression at ``level``."""
    tail = 0.0
    for k in range(n, -1, -1):
        tail += math.comb(n, k) / 2**n
        if tail > level:
            return k + 1
    return 0


def run(work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    sources = {"before": _extract(BEFORE, work / "before"), "after": REPO}
    synthetic_root = synthetic_host.build(work / "synthetic", synthetic_host.Shape())
    reshape_root = synthetic_host.build(work / "reshape-host", RESHAPE_SHAPE)
    server = start_subprocess(work / "placement")
    proxy = FaultProxy(server.url).start()
    drivers = {side: Checkout(sources[side]) for side in SIDES}
    try:
        log = common.RequestLog(server.workdir / LOG_FILE)
        result = {
            "recovery": recovery(drivers, proxy, log, synthetic_root, work / "recovery"),
            "reshape": reshape(drivers, server.url, log, reshape_root, work / "reshape"),
            "discovery": discovery(drivers, synthetic_root, work / "discovery"),
        }
    finally:
        for driver in drivers.values():
            driver.close()
        proxy.stop()
        server.stop()
    result["dry_run"] = dry_run(sources, synthetic_root, work)
    result.update(
        before=BEFORE,
        repetitions=REPETITIONS,
        discovery_repetitions=DISCOVERY_REPETITIONS,
        consumers=RESHAPE_CONSUMERS,
    )
    return result


if __name__ == "__main__":  # a quick look without the report
    import logging

    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="node-agent-bench-") as tmp:
        print(json.dumps(run(Path(tmp)), indent=1, default=str))
