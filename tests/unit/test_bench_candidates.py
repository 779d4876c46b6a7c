"""The allocation-candidates benchmark (bench/candidates.py) asks one host
three ways: the shapes must hold the same capacity, and the requests must be
nova's."""

from collections import Counter
from urllib.parse import parse_qs, urlsplit

from bench import candidates, report


def _totals(tree):
    totals: Counter = Counter()
    for provider in tree.providers:
        for rc, inv in provider.inventories.items():
            totals[rc] += inv.total
    return totals


def test_every_shape_holds_the_same_capacity():
    flat = _totals(candidates.tree("flat", "h"))
    for shape in candidates.SHAPES:
        assert _totals(candidates.tree(shape, "h")) == flat, shape


def test_devices_hang_under_their_numa_node_in_the_nested_shape():
    tree = candidates.tree("numa_gpu_pf", "h")
    nodes = {p.name for p in tree.providers if p.traits.get("HW_NUMA_ROOT")}
    devices = [
        p for p in tree.providers if "VGPU" in p.inventories or "SRIOV_NET_VF" in p.inventories
    ]
    assert len(nodes) == candidates.NODES
    assert devices and all(p.parent in nodes for p in devices)


def test_queries_carry_what_nova_adds():
    for name in candidates.REQUESTS:
        params = parse_qs(urlsplit(candidates.query(name, "agg")).query)
        assert params["root_required"] == ["!COMPUTE_STATUS_DISABLED"]
        assert params["limit"] == [str(candidates.NOVA_LIMIT)]
        assert params["member_of"] == ["agg"]
    same = parse_qs(urlsplit(candidates.query("same_subtree", "agg")).query)
    assert same["same_subtree"] == ["_CPU,_GPU"]


def test_the_section_renders_labelled_figures():
    stat = {"median": 2.0, "min": 1.5, "max": 3.0, "n": 3}
    result = {
        "hosts": 1,
        "repetitions": 3,
        "host_model": {"nodes": 4, "cpus": 64, "memory_mb": 262144, "gpus": 8, "pfs": 4},
        "providers": {"flat": 1, "numa": 5, "numa_gpu_pf": 17},
        "settings": {"default": "defaults"},
        "requests": {"single": "one group"},
        "rows": [
            {
                "setting": "default",
                "shape": "numa",
                "request": "single",
                "candidates": 16,
                "generated": 16,
                "p50_ms": 10.0,
                "p99_ms": 20.0,
                "n": 3,
                "vs_flat": stat,
                "vs_default": None,
            }
        ],
    }
    text = "\n".join(report._candidates(result))
    assert "p50 ms (measured)" in text and "vs flat (computed)" in text
    assert "| default | numa | single | 16 | 16 | 10.0 | 20.0 | 2.00× (1.50–3.00) | – |" in text
