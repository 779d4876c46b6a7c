"""Section 12: what our trees cost Placement's ``GET /allocation_candidates``.

One host model in three shapes, each registered for HOSTS hosts with the
agent's own syncer:

* ``flat``: every class on the root (the agent's default tree);
* ``numa``: the root keeps DISK_GB; VCPU and MEMORY_MB move to one child per
  NUMA node (``HW_NUMA_ROOT``), as ``[placement] numa_in_placement`` does;
  VGPU and SRIOV_NET_VF stay on the root;
* ``numa_gpu_pf``: as ``numa``, with each node's GPUs (VGPU) and its PF
  (SRIOV_NET_VF) children of that node, so ``same_subtree`` can pair them.

The host: NODES NUMA nodes of CPUS_PER_NODE CPUs and MEM_PER_NODE MiB, GPUS
GPUs and PFS PFs spread over the nodes. The classes' totals are the same in
every shape, so a request asks the same host three ways.

The requests are formed as nova 34 forms them
(``nova.scheduler.utils.ResourceRequest.to_querystring``, microversion 1.36,
``limit`` = nova's ``[scheduler] max_placement_results`` default and
``root_required=!COMPUTE_STATUS_DISABLED`` of its status prefilter). A
request a shape cannot express (``HW_NUMA_ROOT`` groups on a flat host) is
left out for that shape.

Each Placement setting gets its own embedded Placement (SQLite) with every
shape registered in it; a shape's hosts are in one aggregate and its
requests carry ``member_of``, so each request only sees the hosts of its
shape. Every repetition sends every (setting, shape, request) once, in a
shuffled order: the ratios compare times taken side by side.

    .venv/bin/python -m bench.run --only candidates
"""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode

import requests

from bench import common
from devenv.embedded_placement import start_subprocess
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.placement.client import PlacementClient
from node_agent.placement.sync import TreeSyncer
from node_agent.state import StateStore

HOSTS = 10
NODES, CPUS_PER_NODE, MEM_PER_NODE = 4, 16, 65536
GPUS, PFS, VGPUS_PER_GPU, VFS_PER_PF = 8, 4, 4, 16
DISK_GB = 2000
REPETITIONS = 60
MICROVERSION = "1.36"  # nova's SAME_SUBTREE_VERSION, what it sends
NOVA_LIMIT = 1000  # nova's [scheduler] max_placement_results default
NOVA_ROOT = {"root_required": "!COMPUTE_STATUS_DISABLED", "limit": NOVA_LIMIT}

SHAPES = ("flat", "numa", "numa_gpu_pf")
# name -> (placement's [placement] options, what the row says)
SETTINGS = {
    "default": ({}, "max_allocation_candidates = -1, depth-first (placement's defaults)"),
    "max1000_depth": (
        {"max_allocation_candidates": 1000},
        "max_allocation_candidates = 1000, depth-first",
    ),
    "max1000_breadth": (
        {
            "max_allocation_candidates": 1000,
            "allocation_candidates_generation_strategy": "breadth-first",
        },
        "max_allocation_candidates = 1000, breadth-first",
    ),
}

# name -> (query as nova forms it, for which shapes, what it asks)
REQUESTS = {
    "single": (
        {"resources": "DISK_GB:20,MEMORY_MB:8192,VCPU:4"},
        SHAPES,
        "one unnumbered group: a 4-VCPU flavor with no NUMA topology",
    ),
    "granular": (
        {
            "resources": "DISK_GB:20,MEMORY_MB:8192,VCPU:4",
            "resources1": "VGPU:1",
            "resources2": "SRIOV_NET_VF:1",
            "group_policy": "none",
        },
        SHAPES,
        "unnumbered + `resources1=VGPU:1` + `resources2=SRIOV_NET_VF:1`, `group_policy=none`",
    ),
    "numa_nodes_2": (
        {
            "resources": "DISK_GB:20",
            "resources1": "MEMORY_MB:4096,VCPU:2",
            "required1": "HW_NUMA_ROOT",
            "resources2": "MEMORY_MB:4096,VCPU:2",
            "required2": "HW_NUMA_ROOT",
            "group_policy": "isolate",
        },
        ("numa", "numa_gpu_pf"),
        "`hw:numa_nodes=2`: two `HW_NUMA_ROOT` groups, `group_policy=isolate`",
    ),
    "same_subtree": (
        {
            "resources": "DISK_GB:20",
            "resources_CPU": "MEMORY_MB:8192,VCPU:4",
            "required_CPU": "HW_NUMA_ROOT",
            "resources_GPU": "VGPU:1",
            "same_subtree": "_CPU,_GPU",
            "group_policy": "none",
        },
        ("numa_gpu_pf",),
        "VCPU + MEMORY_MB on a NUMA node and a VGPU of that node (`same_subtree=_CPU,_GPU`)",
    ),
}


def tree(shape: str, host: str) -> ProviderTree:
    """The host in ``shape`` (see the module's docstring)."""
    root_inv = {"DISK_GB": Inventory(DISK_GB)}
    compute = {
        "VCPU": Inventory(CPUS_PER_NODE * NODES, allocation_ratio=4.0),
        "MEMORY_MB": Inventory(MEM_PER_NODE * NODES),
    }
    devices = {
        "VGPU": Inventory(GPUS * VGPUS_PER_GPU),
        "SRIOV_NET_VF": Inventory(PFS * VFS_PER_PF),
    }
    if shape == "flat":
        return ProviderTree((Provider(host, inventories={**root_inv, **compute, **devices}),))
    nodes = [
        Provider(
            f"{host}_numa_{n}",
            parent=host,
            inventories={
                "VCPU": Inventory(CPUS_PER_NODE, allocation_ratio=4.0),
                "MEMORY_MB": Inventory(MEM_PER_NODE),
            },
            traits={"HW_NUMA_ROOT": True},
        )
        for n in range(NODES)
    ]
    if shape == "numa":
        return ProviderTree((Provider(host, inventories={**root_inv, **devices}), *nodes))
    children: list[Provider] = []
    for n, node in enumerate(nodes):
        children.append(node)
        children += [
            Provider(
                f"{host}_gpu_{g}",
                parent=node.name,
                inventories={"VGPU": Inventory(VGPUS_PER_GPU)},
            )
            for g in range(GPUS)
            if g % NODES == n
        ]
        children += [
            Provider(
                f"{host}_pf_{p}",
                parent=node.name,
                inventories={"SRIOV_NET_VF": Inventory(VFS_PER_PF)},
            )
            for p in range(PFS)
            if p % NODES == n
        ]
    return ProviderTree((Provider(host, inventories=root_inv), *children))


def register(url: str, work: Path, hosts: int) -> dict[str, str]:
    """Every shape's ``hosts`` hosts; shape -> its aggregate."""
    aggregates = {}
    for shape in SHAPES:
        aggregate = str(uuid.uuid4())
        aggregates[shape] = aggregate
        for i in range(hosts):
            client = PlacementClient.for_endpoint(url)
            syncer = TreeSyncer(client, StateStore(work / f"{shape}-{i}"))
            syncer.sync(tree(shape, f"cand-{shape}-{i}"))
            root = syncer.state["root_uuid"]
            generation = client.get(f"/resource_providers/{root}")["generation"]
            client.put(
                f"/resource_providers/{root}/aggregates",
                {"aggregates": [aggregate], "resource_provider_generation": generation},
            )
    return aggregates


def query(request: str, aggregate: str, limit: bool = True) -> str:
    params = {**REQUESTS[request][0], "member_of": aggregate, **NOVA_ROOT}
    if not limit:
        params.pop("limit")
    return "/allocation_candidates?" + urlencode(params)


def _get(session: requests.Session, url: str) -> tuple[float, int]:
    start = time.perf_counter()
    response = session.get(url, timeout=600)
    took = time.perf_counter() - start
    response.raise_for_status()
    return took, len(response.json()["allocation_requests"])


def run(
    work: Path,
    repetitions: int = REPETITIONS,
    hosts: int = HOSTS,
    settings: tuple[str, ...] = tuple(SETTINGS),
) -> dict:
    """One embedded Placement per setting, then :func:`measure`."""
    work.mkdir(parents=True, exist_ok=True)
    servers = {}
    try:
        for name in settings:
            servers[name] = start_subprocess(
                work / f"placement-{name}", placement_options=SETTINGS[name][0]
            )
        return measure({n: s.url for n, s in servers.items()}, work, repetitions, hosts)
    finally:
        for server in servers.values():
            server.stop()


def measure(urls: dict[str, str], work: Path, repetitions: int, hosts: int) -> dict:
    """``urls``: setting -> a Placement run with that setting's options."""
    settings = tuple(urls)
    aggregates = {name: register(url, work / f"state-{name}", hosts) for name, url in urls.items()}
    session = requests.Session()
    session.headers.update(
        {"X-Auth-Token": "admin", "OpenStack-API-Version": f"placement {MICROVERSION}"}
    )
    cases = [
        (setting, shape, request)
        for setting in settings
        for shape in SHAPES
        for request, (_q, shapes, _d) in REQUESTS.items()
        if shape in shapes
    ]

    def url(case, limit: bool = True) -> str:
        setting, shape, request = case
        return urls[setting] + query(request, aggregates[setting][shape], limit)

    times: dict[tuple, list[float]] = {case: [] for case in cases}
    counts: dict[tuple, int] = {}
    generated: dict[tuple, int] = {}
    for case in cases:  # not timed: what each case returns, and generates without nova's limit
        _took, counts[case] = _get(session, url(case))
        _took, generated[case] = _get(session, url(case, limit=False))
    order = random.Random(29)
    for _ in range(repetitions):
        for case in order.sample(cases, len(cases)):
            took, _n = _get(session, url(case))
            times[case].append(took)
    rows = []
    for case in cases:
        setting, shape, request = case
        values = [t * 1000 for t in times[case]]
        flat = times.get((setting, "flat", request))
        rows.append(
            {
                "setting": setting,
                "shape": shape,
                "request": request,
                "candidates": counts[case],
                "generated": generated[case],
                "p50_ms": common.percentile(values, 50),
                "p99_ms": common.percentile(values, 99),
                "n": len(values),
                # per repetition, same position in the interleaved run
                "vs_flat": common.summary([a / b for a, b in zip(times[case], flat)])
                if flat and shape != "flat"
                else None,
                "vs_default": common.summary(
                    [a / b for a, b in zip(times[case], times[("default", shape, request)])]
                )
                if setting != "default" and ("default", shape, request) in times
                else None,
            }
        )
    return {
        "hosts": hosts,
        "repetitions": repetitions,
        "host_model": {
            "nodes": NODES,
            "cpus": NODES * CPUS_PER_NODE,
            "memory_mb": NODES * MEM_PER_NODE,
            "gpus": GPUS,
            "pfs": PFS,
        },
        "providers": {shape: len(tree(shape, "h").providers) for shape in SHAPES},
        "settings": {name: SETTINGS[name][1] for name in settings},
        "requests": {name: REQUESTS[name][2] for name in REQUESTS},
        "queries": {name: query(name, "AGGREGATE") for name in REQUESTS},
        "rows": rows,
    }
