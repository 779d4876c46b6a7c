"""A smoke of the allocation-candidates benchmark (bench/candidates.py,
BENCHMARKS.md section 12) against the session's Placement: one host per
shape, one repetition. The counts are exact, so they are checked: they are
what the section's tree shapes mean to the scheduler."""

import pytest

from bench import candidates

pytestmark = pytest.mark.integration


def test_candidate_counts_of_one_host_per_shape_are_what_the_trees_offer(
    placement_server, tmp_path
):
    result = candidates.measure({"default": placement_server.url}, tmp_path, repetitions=1, hosts=1)
    generated = {(r["shape"], r["request"]): r["generated"] for r in result["rows"]}
    nodes, gpus, pfs = candidates.NODES, candidates.GPUS, candidates.PFS
    assert generated[("flat", "single")] == 1
    assert generated[("flat", "granular")] == 1
    # VCPU and MEMORY_MB of an unnumbered group may come from two nodes.
    assert generated[("numa", "single")] == nodes * nodes
    assert generated[("numa_gpu_pf", "granular")] == nodes * nodes * gpus * pfs
    # hw:numa_nodes=2 with isolate: ordered pairs of distinct nodes.
    assert generated[("numa", "numa_nodes_2")] == nodes * (nodes - 1)
    # same_subtree: a node and one of its own GPUs only.
    assert generated[("numa_gpu_pf", "same_subtree")] == gpus
    assert all(r["n"] == 1 and r["p50_ms"] > 0 for r in result["rows"])
