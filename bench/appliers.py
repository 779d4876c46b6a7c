"""Section 10: two appliers on a real coordination backend against file mode
(issue 18's proof).

One throw-away RabbitMQ, one embedded Placement (PostgreSQL on 127.0.0.1
when it answers, as section 5) and three pairs of ``node-agent-applier``
processes, each pair on its own topic:

- *file*: the default, both processes sharing one ``state_path`` (tooz file
  locks, per-host records in JSON files);
- *redis*: each process its own empty state directory, locks and records in
  a ``redis-server`` the bench starts on a free port;
- *postgresql*: the same through a throw-away PostgreSQL cluster (``initdb``
  in a temporary directory, a free port), when its programs are installed.

Each repetition sends, for every mode in turn (the order rotates from one
repetition to the next), AGENTS fresh hosts (the synthetic host of section 2)
through their pair: the first apply wave, then a steady wave. Messages per
host are the agents' own count; Placement requests per host are counted from
Placement's request log; Redis commands per host from its ``INFO`` counters.
The ratios to file mode are computed per repetition, then summarised.

    .venv/bin/python -m bench.run --only appliers
"""

from __future__ import annotations

import uuid as uuidlib
from pathlib import Path

from bench import common, fleet
from bench.messaging import (
    FULL_VERIFY,
    Appliers,
    Host,
    MessagingAgent,
    Waves,
    _close,
    _database,
    available,
    messaging_conf,
)
from devenv.embedded_placement import LOG_FILE, start_subprocess
from tests.integration.postgres_server import PostgresCluster, _pg_bin
from tests.integration.rabbit import Broker
from tests.integration.redis_server import SERVER as REDIS_SERVER
from tests.integration.redis_server import RedisServer

REPETITIONS = 5
AGENTS = 20
LOCK_EXPIRY = 4  # tooz's lock_timeout on Redis, as the coordination tests use
DATABASE = "na_bench_appliers"
PHASES = ("first apply", "steady cycle")


def _redis_commands(url: str) -> int:
    import redis

    return int(redis.Redis.from_url(url).info("stats")["total_commands_processed"])


def _postgres_version() -> str:
    import subprocess

    done = subprocess.run([str(_pg_bin("postgres")), "--version"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def _wave(waves: Waves, phase: str, agents: list, redis_url: str | None) -> dict:
    before = _redis_commands(redis_url) if redis_url else 0
    row = waves.run(phase, agents, lambda a: a.cycle(), False)
    n = row["agents"]
    return {
        "messages": row["messages_total"] / n,
        "requests": row["requests_per_host"],
        "retries": row["retries"],
        "wall": row["wall"],
        "redis_commands": ((_redis_commands(redis_url) - before) / n if redis_url else None),
        "paths": row["paths"],
    }


def _ratios(reps: list[dict], mode: str, phase: str, key: str) -> dict | None:
    values = [r[mode][phase][key] / r["file"][phase][key] for r in reps if r["file"][phase][key]]
    return common.summary(values) if len(values) == len(reps) else None


def run(work: Path) -> dict:
    missing = available()
    if missing:
        raise RuntimeError(missing)
    if not REDIS_SERVER.exists():
        raise RuntimeError(f"{REDIS_SERVER} is missing (apt-get install redis-server)")
    work.mkdir(parents=True, exist_ok=True)
    host = Host(work)
    (work / "rabbitmq").mkdir()
    (work / "redis").mkdir()
    broker = Broker(work / "rabbitmq").start()
    redis_server = postgres = server = None
    database_url, database = _database(DATABASE)
    pairs: dict[str, Appliers] = {}
    try:
        redis_server = RedisServer(work / "redis").start()
        modes = {
            "file": "",
            "redis": f"coordination_url = {redis_server.url}?lock_timeout={LOCK_EXPIRY}\n"
            "lock_timeout = 3\n",
        }
        if _pg_bin("initdb") and _pg_bin("pg_ctl"):
            postgres = PostgresCluster().start()
            modes["postgresql"] = f"coordination_url = {postgres.url}\nlock_timeout = 3\n"
        server = start_subprocess(
            work / "placement-appliers", timeout=120, database_url=database_url
        )
        log = common.RequestLog(server.workdir / LOG_FILE)
        conf = messaging_conf(broker.url)
        for mode, lines in modes.items():
            topic = f"bench-appliers-{mode}-{uuidlib.uuid4().hex[:6]}"
            pairs[mode] = Appliers(
                work / f"appliers-{mode}",
                broker.url,
                server.url,
                topic,
                full_verify=FULL_VERIFY,
                coordination=lines,
            )
            pairs[mode].topic = topic
            pairs[mode].__enter__()
        reps = []
        order = list(modes)
        for rep in range(REPETITIONS):
            result: dict = {}
            for mode in order[rep % len(order) :] + order[: rep % len(order)]:
                agents = [
                    MessagingAgent(
                        conf, f"bench-ap-{mode[:5]}-{rep}-{n:02d}", pairs[mode].topic, host
                    )
                    for n in range(AGENTS)
                ]
                waves = Waves(log, broker)
                redis_url = redis_server.url if mode == "redis" else None
                try:
                    result[mode] = {
                        phase: _wave(waves, phase, agents, redis_url) for phase in PHASES
                    }
                finally:
                    _close(agents)
            reps.append(result)
    finally:
        for pair in pairs.values():
            pair.__exit__()
        if server is not None:
            server.stop()
        if postgres is not None:
            postgres.stop()
        if redis_server is not None:
            redis_server.stop()
        broker.stop()
        if database_url:
            fleet.admin(f"DROP DATABASE IF EXISTS {DATABASE}")
    summary = {}
    for mode in modes:
        summary[mode] = {}
        for phase in PHASES:
            cell = {
                key: common.summary([r[mode][phase][key] for r in reps])
                for key in ("messages", "requests", "retries")
            }
            if mode == "redis":
                cell["redis_commands"] = common.summary(
                    [r[mode][phase]["redis_commands"] for r in reps]
                )
            if mode != "file":
                cell["ratio"] = {
                    key: _ratios(reps, mode, phase, key) for key in ("messages", "requests")
                }
            cell["paths"] = reps[0][mode][phase]["paths"]
            summary[mode][phase] = cell
    return {
        "modes": summary,
        "repetitions": REPETITIONS,
        "agents": AGENTS,
        "database": database,
        "providers": len(host.desired("probe").tree.providers),
        "postgres": _postgres_version() if "postgresql" in modes else None,
    }


if __name__ == "__main__":  # a quick look without the report
    import json
    import logging
    import os
    import tempfile

    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="node-agent-bench-") as tmp:
        print(json.dumps(run(Path(tmp)), indent=1, default=str))
    os._exit(0)
