"""Section 9: requests and time of companion-mode checks on a nova host.

The host is the fixture of tests/integration/test_companion.py: nova-compute's
provider (OWNER_NOVA) and five scheduled test-driver guests, nova.conf read
as is, against a fresh embedded Placement (SQLite). For the legacy nova.conf
and for one with a new ``cpu_dedicated_set`` (the restart preview then reads
the pinned guests' consumers): a steady check (no verify due), a verify where
nothing moved, and a verify after nova-compute wrote the provider (its
generation moved). Requests are counted from Placement's request log and
checked against the companion's own count.

    .venv/bin/python -m bench.run --only companion
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from bench import common
from devenv.embedded_placement import LOG_FILE, start_subprocess
from node_agent.cycle.companion import Companion
from node_agent.cycle.desired import compute_desired
from node_agent.placement.client import PlacementClient
from node_agent.state import StateStore
from tests.integration.test_companion import DEDICATED, LEGACY, NovaHost

REPETITIONS = 5
CONFIGS = (("legacy (no CPU sets)", LEGACY), ("new `cpu_dedicated_set`", DEDICATED))
STEADY, NOTHING_MOVED, NOVA_WROTE = (
    "steady cycle, no verify due",
    "verify, nothing moved",
    "verify after nova-compute wrote the provider",
)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _measure(companion, desired, settings, log: common.RequestLog, before=None) -> dict:
    runs = []
    for _ in range(REPETITIONS):
        if before:
            before()
        mark = log.mark()
        start = time.perf_counter()
        report = companion.check(desired, settings)
        seconds = time.perf_counter() - start
        requests = log.since(mark)
        runs.append(
            {
                "seconds": seconds,
                "requests": len(requests),
                "own": report.requests,
                "paths": [common.shape(r) for r in requests],
            }
        )
    return {
        "requests": common.summary([r["requests"] for r in runs]),
        "own_requests": common.summary([r["own"] for r in runs]),
        "seconds": common.summary([r["seconds"] for r in runs]),
        "paths": runs[0]["paths"],
    }


def measure(url: str, log: common.RequestLog, tmp: Path, compute: str) -> dict:
    host = NovaHost(tmp, url, f"companion-bench-{uuid.uuid4().hex[:6]}")
    host.nova_starts()
    host.schedule_every_guest()
    settings = host.settings(compute)
    desired = compute_desired(settings)
    clock = Clock()
    companion = Companion(
        PlacementClient.for_endpoint(url),
        StateStore(Path(settings.state_path)),
        full_verify_interval=300,
        clock=clock,
    )
    companion.check(desired, settings)  # the first read

    def due():
        clock.now += 300

    def nova_writes():
        due()
        # A trait of nova's own (no drift) comes or goes: the generation moves.
        body = host.nova.get(f"/resource_providers/{host.root}/traits")
        body["traits"] = sorted(set(body["traits"]) ^ {"COMPUTE_VOLUME_EXTEND"})
        host.nova.put(f"/resource_providers/{host.root}/traits", body)

    return {
        STEADY: _measure(companion, desired, settings, log),
        NOTHING_MOVED: _measure(companion, desired, settings, log, due),
        NOVA_WROTE: _measure(companion, desired, settings, log, nova_writes),
    }


def run(work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    server = start_subprocess(work / "placement")
    try:
        log = common.RequestLog(server.workdir / LOG_FILE)
        rows = {}
        for label, compute in CONFIGS:
            where = work / uuid.uuid4().hex[:6]
            where.mkdir()
            rows[label] = measure(server.url, log, where, compute)
    finally:
        server.stop()
    return {"rows": rows, "repetitions": REPETITIONS}


if __name__ == "__main__":  # a quick look without the report
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(Path(tmp)), indent=1))
