"""Golden runs: ``node-agent --once --dry-run --output json`` on every real host tree.

The expected files in tests/golden/ were reviewed by hand. Regenerate them
with ``NODE_AGENT_REGEN_GOLDEN=1`` (see CONTRIBUTING.md): the run that
rewrites a file fails, so you review the diff and run again. Values
that depend on the machine running the test (the size of the filesystem
holding instances_path, and memory when the tree has no node meminfo) are
checked against psutil, then masked before the comparison.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from tests.cli.runner import run_agent, write_config
from tests.hostdata import ground_truth, sysfs_trees, tree_name

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
TREES = sysfs_trees()
MASK = "<machine-dependent>"


# Multi-NUMA hosts, also run with numa_in_placement (one child per node).
NUMA_TREES = [
    t
    for t in TREES
    if tree_name(t)
    in {
        "virhostcpudata/linux-test3",
        "virhostcpudata/linux-test8",
        "virhostcpudata/linux-deconf-cpus",
        "virhostcpudata/linux-subcores1",
        "virhostcpudata/linux-subcores2",
        "virhostcpudata/linux-subcores3",
        "vircaps2xmldata/linux-hmat",
        "vircaps2xmldata/linux-resctrl",
    }
]
NUMA_EXTRA = "numa_in_placement = true\n"


def golden_path(system_dir: Path, variant: str = "") -> Path:
    return GOLDEN / (tree_name(system_dir).replace("/", "__") + variant + ".json")


def dry_run(system_dir: Path, tmp_path: Path, extra: str = "") -> dict:
    config = write_config(
        tmp_path,
        system_dir,
        host=system_dir.parent.name if system_dir.name == "system" else system_dir.name,
        extra=extra,
    )
    result = run_agent("--config-file", str(config), "--once", "--dry-run", "--output", "json")
    assert result.code == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.json()


def mask_machine_values(report: dict, tmp_path: Path, memory_from_psutil: bool) -> dict:
    root = report["providers"][0]
    disk = root["inventories"].get("DISK_GB")
    expected_disk = psutil.disk_usage(str(tmp_path / "instances")).total // 1024**3
    if disk:
        assert disk["total"] == expected_disk
        disk["total"] = disk["max_unit"] = MASK
    memory = root["inventories"].get("MEMORY_MB")
    if memory_from_psutil and memory:
        assert memory["total"] == psutil.virtual_memory().total // 1024**2
        memory["total"] = memory["max_unit"] = MASK
    if memory_from_psutil and report.get("numa_stranded"):
        report["numa_stranded"] = MASK  # its MEMORY_MB figures are this machine's
    root_dir = str(tmp_path / "sysroot")
    report["warnings"] = [w.replace(root_dir, "<sysfs_root>") for w in report["warnings"]]
    return report


def has_node_meminfo(system_dir: Path) -> bool:
    return any((system_dir / "node").glob("node*/meminfo"))


@pytest.mark.parametrize("system_dir", TREES, ids=tree_name)
def test_dry_run_json_matches_reviewed_golden_file(system_dir, tmp_path):
    report = mask_machine_values(
        dry_run(system_dir, tmp_path), tmp_path, memory_from_psutil=not has_node_meminfo(system_dir)
    )
    assert_golden(report, golden_path(system_dir))


def assert_golden(report: dict, path: Path) -> None:
    """Compare with the reviewed file. With NODE_AGENT_REGEN_GOLDEN=1 a file that
    differs (or is missing) is rewritten and the test still FAILS: the run that
    writes a golden file never also passes it. Review the diff, commit, rerun."""
    if os.environ.get("NODE_AGENT_REGEN_GOLDEN"):
        text = json.dumps(report, indent=2, sort_keys=True) + "\n"
        if not path.exists() or json.loads(path.read_text()) != report:
            path.write_text(text)
            pytest.fail(
                f"rewrote {path}: review it (git diff {path.parent}), commit it, "
                "then run again without NODE_AGENT_REGEN_GOLDEN"
            )
    assert path.exists(), f"no golden file {path}; run with NODE_AGENT_REGEN_GOLDEN=1"
    assert report == json.loads(path.read_text())


def test_regeneration_rewrites_a_changed_golden_file_but_fails_the_run(tmp_path, monkeypatch):
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"providers": ["old"]}))
    monkeypatch.setenv("NODE_AGENT_REGEN_GOLDEN", "1")

    with pytest.raises(pytest.fail.Exception, match="review it"):
        assert_golden({"providers": ["new"]}, path)

    assert json.loads(path.read_text()) == {"providers": ["new"]}
    assert_golden({"providers": ["new"]}, path)  # unchanged now: passes
    monkeypatch.delenv("NODE_AGENT_REGEN_GOLDEN")
    assert_golden({"providers": ["new"]}, path)


@pytest.mark.parametrize("system_dir", NUMA_TREES, ids=tree_name)
def test_numa_in_placement_dry_run_matches_reviewed_golden_file(system_dir, tmp_path):
    report = mask_machine_values(
        dry_run(system_dir, tmp_path, NUMA_EXTRA),
        tmp_path,
        memory_from_psutil=not has_node_meminfo(system_dir),
    )
    assert_golden(report, golden_path(system_dir, "__numa"))


@pytest.mark.parametrize("system_dir", NUMA_TREES, ids=tree_name)
def test_numa_children_are_the_nodes_with_cpus_or_memory(system_dir, tmp_path):
    truth = _truth_for(system_dir)
    report = dry_run(system_dir, tmp_path, NUMA_EXTRA)
    children = {p["name"]: p for p in report["providers"][1:]}
    host = report["providers"][0]["name"]
    with_cpus = {node for node, facts in truth["nodes"].items() if facts["online_cpus"]}
    assert {f"{host}_NUMA_{n}" for n in with_cpus} <= set(children)
    vcpus = sum(p["inventories"].get("VCPU", {}).get("total", 0) for p in report["providers"])
    assert vcpus == truth["online_cpus"]
    assert all("HW_NUMA_ROOT" in p["traits"] for p in children.values())


def _truth_for(system_dir: Path) -> dict:
    return ground_truth()[tree_name(system_dir)]


@pytest.mark.parametrize("system_dir", TREES, ids=tree_name)
def test_vcpu_total_equals_the_hosts_online_cpu_count(system_dir, tmp_path):
    truth = _truth_for(system_dir)
    report = dry_run(system_dir, tmp_path)
    vcpu = report["providers"][0]["inventories"]["VCPU"]
    assert vcpu["total"] == truth["online_cpus"]
    assert vcpu["max_unit"] == truth["online_cpus"]
