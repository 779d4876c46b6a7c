"""Section 4: a fleet of agents against one Placement backed by PostgreSQL.

Each agent is a TreeSyncer with its own PlacementClient (own HTTP session),
state directory, host name and root provider, and a simulated clock: one
cycle is one 60 s report interval, so with the 300 s full verify every
fifth cycle re-reads the tree. A cycle is the pure pipeline (tree from the
host snapshot) plus the sync; discovery is measured in section 1 and left
out here, because on a 2-core machine N discoveries in one process would
measure the benchmark, not Placement. The 10 cycles of all agents run in
waves on a pool of worker threads; a wave is one report interval of the
whole fleet compressed into as little time as the server allows.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import common, synthetic_host
from devenv.embedded_placement import LOG_FILE, start_subprocess
from node_agent.cycle.desired import desired_from
from node_agent.host.discover import discover
from node_agent.placement.client import PlacementClient
from node_agent.placement.sync import TreeSyncer
from node_agent.state import StateStore

CYCLES = 10
INTERVAL = 60
FULL_VERIFY = 300
WORKERS = 32
SIZES = (100, 500, 1000)
DATABASE = "na_bench"
SERVER_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
DATABASE_URL = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{DATABASE}"


def admin(sql: str) -> None:
    import psycopg2

    conn = psycopg2.connect(SERVER_DSN)
    try:
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute(sql)
    finally:
        conn.close()


def postgres_version() -> str:
    import psycopg2

    conn = psycopg2.connect(SERVER_DSN)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SHOW server_version")
            return cursor.fetchone()[0]
    finally:
        conn.close()


class FleetAgent:
    def __init__(self, url: str, state_dir: Path, settings, snapshot):
        self.settings = settings
        self.snapshot = snapshot
        self.client = PlacementClient.for_endpoint(url)
        self.now = 0.0
        self.syncer = TreeSyncer(
            self.client,
            StateStore(state_dir),
            full_verify_interval=FULL_VERIFY,
            clock=lambda: self.now,
        )

    def cycle(self) -> tuple[float, int, bool]:
        """(seconds, requests, ok) of one cycle."""
        self.now += INTERVAL
        before = self.client.stats.total
        start = time.perf_counter()
        try:
            tree = desired_from(self.settings, self.snapshot).tree
            ok = self.syncer.sync(tree).ok
        except Exception:  # noqa: BLE001 - a benchmark reports failures, never stops
            ok = False
        return time.perf_counter() - start, self.client.stats.total - before, ok


def _run_fleet(
    size: int, url: str, work: Path, root: Path, shape, snapshot, log: common.RequestLog
) -> dict:
    agents = [
        FleetAgent(
            url,
            work / f"fleet{size}" / str(i),
            _settings(work, root, shape, f"fleet{size}-{i:04d}"),
            snapshot,
        )
        for i in range(size)
    ]
    waves = []
    with ThreadPoolExecutor(WORKERS) as pool:
        for number in range(1, CYCLES + 1):
            mark = log.mark()
            start = time.perf_counter()
            results = list(pool.map(lambda a: a.cycle(), agents))
            wall = time.perf_counter() - start
            served = len(log.since(mark))
            latencies = [r[0] for r in results]
            waves.append(
                {
                    "cycle": number,
                    "wall": wall,
                    "requests": served,
                    "client_requests": sum(r[1] for r in results),
                    "failed": sum(1 for r in results if not r[2]),
                    "rps": served / wall if wall else 0.0,
                    "p50": common.percentile(latencies, 50),
                    "p99": common.percentile(latencies, 99),
                }
            )
    steady = waves[1:]
    return {
        "size": size,
        "waves": waves,
        "steady_requests_per_agent_cycle": sum(w["requests"] for w in steady)
        / (size * len(steady)),
        "steady_p50": common.summary([w["p50"] for w in steady])["median"],
        "steady_p99": max(w["p99"] for w in steady),
    }


def _settings(work: Path, root: Path, shape, host: str):
    return common.settings(
        host,
        str(root),
        str(work),
        str(work / "state" / host),
        pci_device_specs=common.device_specs(synthetic_host.device_specs(shape)),
    )


def run(work: Path, budget_seconds: float) -> dict:
    """Fleets of SIZES agents; a size is skipped when the previous one
    suggests it cannot finish within what is left of ``budget_seconds``."""
    shape = synthetic_host.Shape()
    root = synthetic_host.build(work / "fleet-host", shape)
    snapshot = discover(_settings(work, root, shape, "probe"))
    admin(f"DROP DATABASE IF EXISTS {DATABASE}")
    admin(f"CREATE DATABASE {DATABASE}")
    server = None
    fleets, skipped = [], []
    started = time.monotonic()
    try:
        server = start_subprocess(
            work / "placement-postgres", timeout=120, database_url=DATABASE_URL
        )
        log = common.RequestLog(server.workdir / LOG_FILE)
        per_agent = None
        for size in SIZES:
            left = budget_seconds - (time.monotonic() - started)
            if per_agent is not None and per_agent * size > left:
                skipped.append({"size": size, "estimate": per_agent * size, "left": left})
                continue
            begin = time.monotonic()
            fleets.append(_run_fleet(size, server.url, work, root, shape, snapshot, log))
            per_agent = (time.monotonic() - begin) / size
    finally:
        if server is not None:
            server.stop()
        admin(f"DROP DATABASE IF EXISTS {DATABASE}")
    return {
        "fleets": fleets,
        "skipped": skipped,
        "workers": WORKERS,
        "cycles": CYCLES,
        "postgres": postgres_version(),
    }
