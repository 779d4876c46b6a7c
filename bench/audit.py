"""Section 8: requests and time of one allocation audit (issue 17's cost).

Against a fresh embedded Placement (SQLite): the agent's root provider (the
one provider that holds allocations) and N consumers allocated on it the way
the scheduler does, each matching a local guest; then the same with every
tenth consumer an orphan (no local guest), which the audit looks up one by
one. Each repetition is one :meth:`node_agent.cycle.audit.Auditor.run` after
a full read of the tree, as after a full verify; that read is the sync's and
is not counted. Requests are counted from Placement's request log and
checked against the auditor's own count.

    .venv/bin/python -m bench.run --only audit
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from types import SimpleNamespace

from bench import common
from devenv.embedded_placement import LOG_FILE, start_subprocess
from node_agent.cycle.audit import Auditor
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.model.snapshot import Guest
from node_agent.placement.client import PlacementClient
from node_agent.placement.sync import TreeSyncer
from node_agent.state import StateStore

REPETITIONS = 5
SIZES = (100, 1000)
ORPHAN_EVERY = (0, 10)  # 0: no orphan; 10: every tenth consumer
PROJECT, USER = "bench-project", "bench-user"
BATCH = 250  # consumers per POST /allocations of the set-up


def _place(client: PlacementClient, root: str, consumers: list[str]) -> None:
    for start in range(0, len(consumers), BATCH):
        client.post(
            "/allocations",
            {
                c: {
                    "allocations": {root: {"resources": {"VCPU": 2, "MEMORY_MB": 1024}}},
                    "project_id": PROJECT,
                    "user_id": USER,
                    "consumer_generation": None,
                }
                for c in consumers[start : start + BATCH]
            },
        )


def measure(
    url: str,
    log: common.RequestLog,
    n: int,
    work: Path,
    orphan_every: int,
    repetitions: int = REPETITIONS,
) -> dict:
    """One host with ``n`` consumers; ``repetitions`` audits."""
    name = f"audit-bench-{n}-{orphan_every}-{uuid.uuid4().hex[:6]}"
    client = PlacementClient.for_endpoint(url)
    syncer = TreeSyncer(client, StateStore(work / name))
    tree = ProviderTree(
        (
            Provider(
                name,
                inventories={
                    "VCPU": Inventory(128, allocation_ratio=float(n)),
                    "MEMORY_MB": Inventory(2048 * n),
                },
            ),
        )
    )
    syncer.sync(tree)
    consumers = [str(uuid.uuid4()) for _ in range(n)]
    _place(PlacementClient.for_endpoint(url), syncer.state["root_uuid"], consumers)
    guests = tuple(
        Guest(c, f"instance-{i}", vcpus=2, running=True, memory_kb=1024 * 1024)
        for i, c in enumerate(consumers)
        if not orphan_every or i % orphan_every
    )  # else an orphan
    desired = SimpleNamespace(host=SimpleNamespace(guests=guests))
    auditor = Auditor(syncer)
    runs = []
    for _ in range(repetitions):
        syncer.invalidate()
        syncer.plan(tree)  # the full verify's read, not the audit's
        mark = log.mark()
        start = time.perf_counter()
        result = auditor.run(desired, name, numa=False)
        seconds = time.perf_counter() - start
        requests = log.since(mark)
        if result.consumers != n:
            raise RuntimeError(f"the audit saw {result.consumers} consumers, not {n}")
        runs.append(
            {
                "seconds": seconds,
                "requests": len(requests),
                "auditor_requests": auditor.requests,
                "orphans": sum(1 for f in result.findings if f.kind == "orphan"),
                "paths": [common.shape(r) for r in requests],
            }
        )
    return {
        "consumers": n,
        "orphans": runs[0]["orphans"],
        "requests": common.summary([r["requests"] for r in runs]),
        "auditor_requests": common.summary([r["auditor_requests"] for r in runs]),
        "seconds": common.summary([r["seconds"] for r in runs]),
        "paths": runs[0]["paths"],
    }


def run(work: Path, sizes: tuple[int, ...] = SIZES) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    server = start_subprocess(work / "placement")
    try:
        log = common.RequestLog(server.workdir / LOG_FILE)
        rows = [measure(server.url, log, n, work, every) for n in sizes for every in ORPHAN_EVERY]
    finally:
        server.stop()
    return {"rows": rows, "repetitions": REPETITIONS}


if __name__ == "__main__":  # a quick look without the report: python -m bench.audit 100
    import json
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        sizes = tuple(int(a) for a in sys.argv[1:]) or SIZES
        print(json.dumps(run(Path(tmp), sizes), indent=1))
