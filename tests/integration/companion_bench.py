"""Requests and time of companion-mode checks on a nova host.

    python -m tests.integration.companion_bench [PLACEMENT_URL]

Without a URL it starts a fresh embedded Placement (SQLite). The host is the
fixture of tests/integration/test_companion.py: nova-compute's provider
(OWNER_NOVA) and five scheduled test-driver guests, nova.conf read as is.
For the legacy nova.conf and for one with a new cpu_dedicated_set (the
restart preview then reads the two pinned guests' consumers), it prints the
requests and the median wall time over 5 runs of: a steady check (no verify
due), a verify where nothing moved, and a verify after nova-compute wrote
the provider (its generation moved).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from devenv.embedded_placement import start_subprocess
from node_agent.cycle.companion import Companion
from node_agent.cycle.desired import compute_desired
from node_agent.placement.client import PlacementClient
from node_agent.state import StateStore
from tests.integration.test_companion import DEDICATED, LEGACY, NovaHost

RUNS = 5


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def measure(companion, desired, settings, before=None) -> tuple[int, float]:
    requests, times = [], []
    for _ in range(RUNS):
        if before:
            before()
        start = time.perf_counter()
        report = companion.check(desired, settings)
        times.append(time.perf_counter() - start)
        requests.append(report.requests)
    return int(statistics.median(requests)), statistics.median(times)


def bench(url: str, tmp: Path, compute: str) -> list[tuple[str, int, float]]:
    host = NovaHost(tmp, url, f"companion-bench-{uuid.uuid4().hex[:6]}")
    host.nova_starts()
    host.schedule_every_guest()
    settings = host.settings(compute)
    desired = compute_desired(settings)
    clock = Clock()
    companion = Companion(PlacementClient.for_endpoint(url),
                          StateStore(Path(settings.state_path)),
                          full_verify_interval=300, clock=clock)
    companion.check(desired, settings)  # the first read

    def due():
        clock.now += 300

    def nova_writes():
        due()
        # A trait of nova's own (no drift) comes or goes: the generation moves.
        body = host.nova.get(f"/resource_providers/{host.root}/traits")
        body["traits"] = sorted(set(body["traits"]) ^ {"COMPUTE_VOLUME_EXTEND"})
        host.nova.put(f"/resource_providers/{host.root}/traits", body)

    return [("steady (no verify due)", *measure(companion, desired, settings)),
            ("verify, nothing moved", *measure(companion, desired, settings, due)),
            ("verify, nova-compute wrote", *measure(companion, desired, settings,
                                                    nova_writes))]


def main(argv) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        url = argv[0] if argv else None
        if url is None:
            server = start_subprocess(Path(tmp) / "placement")
            url = server.url
        try:
            for label, compute in (("legacy nova.conf", LEGACY),
                                   ("new cpu_dedicated_set", DEDICATED)):
                where = Path(tmp) / uuid.uuid4().hex[:6]
                where.mkdir()
                for what, requests, seconds in bench(url, where, compute):
                    print(f"{label}: {what}: {requests} requests, "
                          f"median {seconds * 1000:.0f} ms over {RUNS} runs")
        finally:
            if server is not None:
                server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
