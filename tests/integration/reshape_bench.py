"""Requests and time of a VCPU -> PCPU reshape of N pinned consumers.

    python -m tests.integration.reshape_bench 100 1000

Against a fresh embedded Placement (SQLite). Each run: a root provider in
the legacy shape with four children (SR-IOV PFs; the rule does not work on
them, so they are neither read nor in the body), N pinned guests and N/10
unpinned ones allocated the way the scheduler does, then one
``ensure_reshaped``. Setup requests are not counted; the agent's client
counts only its own. Target: N + 2.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from pathlib import Path

from devenv.embedded_placement import start_subprocess
from node_agent.model.cpuset import CpuSet
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.model.snapshot import Guest
from node_agent.placement.client import PlacementClient
from node_agent.placement.reshape_rules import pinned_to_pcpu
from node_agent.placement.reshaper import ensure_reshaped
from tests.integration.reshape_driver import allocate

HOST_CPUS = 128
CHILDREN = 4


def tree(name, root_uuid, n, legacy, children):
    cpus = (
        {"VCPU": Inventory(HOST_CPUS, allocation_ratio=float(n))}
        if legacy
        else {"VCPU": Inventory(HOST_CPUS // 2, allocation_ratio=4.0), "PCPU": Inventory(n)}
    )
    root = Provider(name, uuid=root_uuid, inventories={**cpus, "MEMORY_MB": Inventory(256 * n * 2)})
    return ProviderTree(
        (
            root,
            *(
                Provider(
                    f"{name}_pf_{k}",
                    parent=name,
                    uuid=uuid_k,
                    inventories={"SRIOV_NET_VF": Inventory(8)},
                )
                for k, uuid_k in enumerate(children)
            ),
        )
    )


def run(url: str, n: int) -> dict:
    scheduler = PlacementClient.for_endpoint(url)
    agent = PlacementClient.for_endpoint(url)
    root = str(uuid.uuid4())
    name = f"bench-{n}"
    children = [str(uuid.uuid4()) for _ in range(CHILDREN)]
    for provider in tree(name, root, n, True, children).providers:
        scheduler.post(
            "/resource_providers",
            {
                "name": provider.name,
                "uuid": provider.uuid,
                **({"parent_provider_uuid": root} if provider.parent else {}),
            },
        )
        scheduler.put(
            f"/resource_providers/{provider.uuid}/inventories",
            {
                "resource_provider_generation": 0,
                "inventories": {rc: inv.as_placement() for rc, inv in provider.inventories.items()},
            },
        )
    guests = []
    for i in range(n + n // 10):
        pinned = i < n
        guest = Guest(
            uuid=str(uuid.uuid4()),
            name=f"guest-{i}",
            vcpus=1,
            running=True,
            memory_kb=256 * 1024,
            vcpupin=((0, CpuSet([i % (HOST_CPUS // 2)])),) if pinned else (),
        )
        guests.append(guest)
        allocate(scheduler, guest.uuid, {root: {"VCPU": 1, "MEMORY_MB": 256}})
    dedicated = CpuSet(range(HOST_CPUS // 2))
    desired = tree(name, root, n, False, children)
    start = time.monotonic()
    outcome = ensure_reshaped(agent, desired, guests, pinned_to_pcpu(guests, root, dedicated))
    elapsed = time.monotonic() - start
    assert outcome.reshaped and outcome.consumers_moved == n
    return {
        "consumers": n,
        "providers": 1 + CHILDREN,
        "requests": agent.stats.total,
        "reads": agent.stats.reads,
        "writes": agent.stats.writes,
        "seconds": round(elapsed, 2),
        "target": n + 2,
    }


def main(argv=None) -> int:
    sizes = [int(a) for a in (argv or sys.argv[1:])] or [100, 1000]
    with tempfile.TemporaryDirectory() as tmp:
        server = start_subprocess(Path(tmp) / "placement")
        try:
            for n in sizes:
                print(run(server.url, n), flush=True)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
