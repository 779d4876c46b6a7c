"""Requests and time of one allocation audit with N consumers on the host.

    python -m tests.integration.audit_bench 100 1000

Against a fresh embedded Placement (SQLite). Setup: the agent's root
provider (one provider that holds allocations) and N consumers allocated on
it the way the scheduler does, each matching a local guest; then again
with N/10 orphans (no local guest), which the audit looks up one by one. Each run is
one :meth:`node_agent.cycle.audit.Auditor.run` after a full read of the
tree (as after a full verify); the tree read is the sync's, not counted.
Prints the median of 5 runs of requests and wall time.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

from devenv.embedded_placement import start_subprocess
from node_agent.cycle.audit import Auditor
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.model.snapshot import Guest
from node_agent.placement.client import PlacementClient
from node_agent.placement.sync import TreeSyncer
from node_agent.state import StateStore
from tests.integration.reshape_driver import allocate

RUNS = 5


def bench(url: str, n: int, tmp: Path, orphan_every: int = 10) -> tuple[float, int, int]:
    name = f"audit-bench-{n}-{uuid.uuid4().hex[:6]}"
    client = PlacementClient.for_endpoint(url)
    syncer = TreeSyncer(client, StateStore(tmp / name))
    tree = ProviderTree((Provider(name, inventories={
        "VCPU": Inventory(128, allocation_ratio=float(n)),
        "MEMORY_MB": Inventory(2048 * n)}),))
    syncer.sync(tree)
    root = syncer.state["root_uuid"]
    scheduler = PlacementClient.for_endpoint(url)
    guests = []
    for i in range(n):
        consumer = str(uuid.uuid4())
        allocate(scheduler, consumer, {root: {"VCPU": 2, "MEMORY_MB": 1024}})
        if not orphan_every or i % orphan_every:  # else no local guest: an orphan
            guests.append(Guest(consumer, f"instance-{i}", vcpus=2, running=True,
                                memory_kb=1024 * 1024))
    desired = SimpleNamespace(host=SimpleNamespace(guests=tuple(guests)))
    auditor = Auditor(syncer)
    times, requests = [], []
    for _ in range(RUNS):
        syncer.invalidate()
        syncer.plan(tree)  # the full verify's read, not the audit's
        start = time.perf_counter()
        result = auditor.run(desired, name, numa=False)
        times.append(time.perf_counter() - start)
        requests.append(auditor.requests)
    assert result.consumers == n, result.consumers
    return statistics.median(times), int(statistics.median(requests)), \
        sum(1 for f in result.findings if f.kind == "orphan")


def main(argv) -> int:
    sizes = [int(a) for a in argv] or [100, 1000]
    with tempfile.TemporaryDirectory() as tmp:
        server = start_subprocess(Path(tmp) / "placement")
        try:
            for n, every in [(n, every) for n in sizes for every in (0, 10)]:
                seconds, requests, orphans = bench(server.url, n, Path(tmp), every)
                print(f"{n} consumers ({orphans} orphans): {requests} requests, "
                      f"median {seconds * 1000:.0f} ms over {RUNS} runs")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
