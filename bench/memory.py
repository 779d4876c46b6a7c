"""Section 3: memory and start-up.

Every figure comes from a fresh subprocess: import time and RSS of
node-agent and of nova's report client, the wall time of
``node-agent --once --dry-run``, and a soak of SOAK_CYCLES cycles (discovery,
tree, plan, steady sync against the embedded Placement) sampling RSS.

``python -m bench.memory soak URL SYSFS_ROOT WORKDIR CYCLES`` is the soak
itself; it prints one JSON line.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common

IMPORT_REPEATS = 7
# Each repetition runs every command of dry_run once; 15 keeps a loaded
# machine's medians within a few per cent.
DRY_RUN_REPEATS = 15
SOAK_CYCLES = 5_000
SOAK_SAMPLES = (0, 1_250, 2_500, 3_750, 5_000)

# Printed by the probe: seconds to import, then RSS in KiB from /proc.
_PROBE = """
import time
start = time.perf_counter()
{imports}
took = time.perf_counter() - start
rss = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS:'))
print(took, rss)
"""
NODE_AGENT_IMPORTS = (
    "import node_agent.cli.main, node_agent.cycle.desired, node_agent.placement.sync, "
    "node_agent.placement.client, node_agent.placement.reshaper, node_agent.service.daemon"
)
NOVA_IMPORTS = "import nova.scheduler.client.report, nova.compute.provider_tree"
# Every third-party module a dry run without libvirt or Placement loads
# (tests/cli/test_start_cost.py keeps the rest off its path), loaded as
# node-agent loads them: `import node_agent` first defers what oslo.config
# imports and the run never uses (node_agent/deferred_imports.py). The floor
# no node-agent change can go under without dropping one of these libraries.
DRY_RUN_LIBRARIES = (
    "import node_agent, oslo_config.cfg, oslo_log._options, os_traits, os_resource_classes, psutil"
)
# Seconds spent building the frozen dataclasses of DRY_RUN_MODULES (their
# generated methods are compiled in every process), and how many.
_DATACLASS_PROBE = """
import dataclasses, time
spent, count, build = [0.0], [0], dataclasses._process_class
def timed(*args):
    start = time.perf_counter()
    try:
        return build(*args)
    finally:
        spent[0] += time.perf_counter() - start
        count[0] += 1
dataclasses._process_class = timed
{imports}
print(spent[0], count[0])
"""
# Every node-agent module the dry run loads, its own code not run.
DRY_RUN_MODULES = "import node_agent.cli.main, node_agent.runner, node_agent.policy.capacity"
FIXTURE = "virhostcpudata/linux-test8"
GNU_TIME = "/usr/bin/time"  # Debian's package "time"


def rss_kib() -> int:
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))


def _probe_once(python: Path, imports: str) -> tuple[float, float]:
    out = subprocess.run(
        [str(python), "-c", _PROBE.format(imports=imports)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0]), int(out[1]) / 1024


def import_probes(nova_python: Path) -> dict:
    """node-agent's and nova's imports, interleaved (alternating order), with
    the per-repetition ratios nova / node-agent."""
    runs: dict[str, list[tuple[float, float]]] = {"node_agent": [], "nova": []}
    probes = [
        ("node_agent", Path(sys.executable), NODE_AGENT_IMPORTS),
        ("nova", nova_python, NOVA_IMPORTS),
    ]
    for i in range(IMPORT_REPEATS):
        for name, python, imports in probes if i % 2 == 0 else probes[::-1]:
            runs[name].append(_probe_once(python, imports))
    result = {
        f"{name}_import": {
            "seconds": common.summary([s for s, _ in r]),
            "rss_mib": common.summary([m for _, m in r]),
        }
        for name, r in runs.items()
    }
    pairs = list(zip(runs["node_agent"], runs["nova"]))
    result["import_ratio"] = {
        "seconds": common.summary([b[0] / a[0] for a, b in pairs]),
        "rss_mib": common.summary([b[1] / a[1] for a, b in pairs]),
    }
    return result


def _child(command: list[str], env: dict | None = None) -> tuple[float, float, float, int]:
    """Wall s, CPU s (user + system) and peak RSS (MiB) of one process.

    Peak RSS through GNU time (Debian's ``time``): a child forked by this
    (large) process would report this process's peak RSS as its own, since
    the kernel keeps the high-water mark across exec. CPU from the kernel's
    account of the children this process waited for, in microseconds (GNU
    time prints hundredths: ``python -c pass`` would read 0.00 or 0.01 s);
    GNU time's own, about 1.5 ms, is in it, the same for every command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
        done = subprocess.run(
            [GNU_TIME, "-f", "%M", "-o", out.name] + command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        rss_kib = out.read().split()[-1]
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, int(rss_kib) / 1024, done.returncode


def _config(work: Path, sysfs_root: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    config = work / "dry-run.conf"
    config.write_text(
        f"[DEFAULT]\nhost = bench-dry-run\n[agent]\nstate_path = {work / 'state'}\n"
        f"[host]\nsysfs_root = {sysfs_root}\n[libvirt]\nconnection_uri =\n"
        f"[compute]\ninstances_path = {work}\n"
    )
    return config


def dry_run(work: Path, sysfs_root: Path, label: str) -> dict:
    """``--once --dry-run`` interleaved with ``python -c pass`` (the same
    interpreter): wall, CPU and peak RSS, and their per-repetition ratios."""
    agent = Path(sys.executable).with_name("node-agent")
    config = _config(work, sysfs_root)
    commands = {
        "agent": [
            str(agent),
            "--config-file",
            str(config),
            "--once",
            "--dry-run",
            "--output",
            "json",
        ],
        "baseline": [sys.executable, "-c", "pass"],
        # What reading a config file costs before any node-agent code: the
        # floor of the dry run's ratio (issue 28), in any process, then as
        # node-agent loads it.
        "floor": [sys.executable, "-c", "import oslo_config.cfg"],
        "floor_deferred": [sys.executable, "-c", "import node_agent, oslo_config.cfg"],
        "libraries": [sys.executable, "-c", DRY_RUN_LIBRARIES],
        "modules": [sys.executable, "-c", DRY_RUN_MODULES],
    }
    runs: dict[str, list] = {name: [] for name in commands}
    for i in range(DRY_RUN_REPEATS):
        for name in list(commands) if i % 2 == 0 else list(commands)[::-1]:
            runs[name].append(_child(commands[name]))
    result: dict = {"host": label, "exit": runs["agent"][-1][3]}
    for index, key in enumerate(("seconds", "cpu", "rss_mib")):
        result[key] = common.summary([r[index] for r in runs["agent"]])
        result[f"baseline_{key}"] = common.summary([r[index] for r in runs["baseline"]])
        result[f"ratio_{key}"] = common.summary(
            [a[index] / b[index] for a, b in zip(runs["agent"], runs["baseline"])]
        )
    for name in ("floor", "floor_deferred", "libraries", "modules"):
        result[f"{name}_cpu"] = common.summary([r[1] for r in runs[name]])
        result[f"ratio_{name}_cpu"] = common.summary(
            [a[1] / b[1] for a, b in zip(runs[name], runs["baseline"])]
        )
    return result


def dataclass_cost() -> dict:
    """In-process seconds of building DRY_RUN_MODULES' dataclasses (median
    of IMPORT_REPEATS fresh interpreters), and their number."""
    runs = []
    for _ in range(IMPORT_REPEATS):
        out = subprocess.run(
            [sys.executable, "-c", _DATACLASS_PROBE.format(imports=DRY_RUN_MODULES)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        runs.append((float(out[0]), int(out[1])))
    return {"seconds": common.summary([s for s, _ in runs]), "classes": runs[-1][1]}


def soak(url: str, sysfs_root: str, work: str, cycles: int) -> dict:
    """In this process: ``cycles`` full cycles, RSS sampled at SOAK_SAMPLES."""
    import logging

    from node_agent.cycle.desired import compute_desired
    from node_agent.placement.client import PlacementClient
    from node_agent.placement.sync import TreeSyncer
    from node_agent.state import StateStore

    logging.disable(logging.WARNING)
    settings = common.settings("bench-soak", sysfs_root, work, f"{work}/state")
    clock = [0.0]
    client = PlacementClient.for_endpoint(url)
    syncer = TreeSyncer(
        client, StateStore(Path(work) / "state"), full_verify_interval=300, clock=lambda: clock[0]
    )
    samples = {0: rss_kib()}
    start = time.perf_counter()
    for cycle in range(1, cycles + 1):
        clock[0] += 60  # one report interval per cycle: a full verify every 5th
        syncer.sync(compute_desired(settings).tree)
        if cycle in SOAK_SAMPLES:
            samples[cycle] = rss_kib()
    return {
        "samples_kib": samples,
        "seconds": time.perf_counter() - start,
        "requests": client.stats.total,
        "cycles": cycles,
    }


def run_soak(work: Path, url: str, sysfs_root: Path, cycles: int = SOAK_CYCLES) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.memory",
            "soak",
            url,
            str(sysfs_root),
            str(work),
            str(cycles),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["samples_kib"] = {int(k): v for k, v in result["samples_kib"].items()}
    return result


def run(work: Path, nova_python: Path, fixture_root: Path, synthetic_root: Path, url: str) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    return {
        **import_probes(nova_python),
        "dataclasses": dataclass_cost(),
        "dry_run": [
            dry_run(work / "dry-fixture", fixture_root, FIXTURE.split("/")[-1]),
            dry_run(work / "dry-synthetic", synthetic_root, "synthetic 384 CPUs"),
        ],
        "soak": dict(run_soak(work / "soak", url, fixture_root), fixture=FIXTURE),
    }


if __name__ == "__main__":
    if sys.argv[1] == "soak":
        url, root, work, cycles = sys.argv[2:6]
        print(json.dumps(soak(url, root, work, int(cycles))))
