"""Golden runs: ``node-agent --once --dry-run --output json`` on every real host tree.

The expected files in tests/golden/ were reviewed by hand; regenerate them
with ``NODE_AGENT_REGEN_GOLDEN=1 make test`` and review the diff. Values
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


def golden_path(system_dir: Path) -> Path:
    return GOLDEN / (tree_name(system_dir).replace("/", "__") + ".json")


def dry_run(system_dir: Path, tmp_path: Path) -> dict:
    config = write_config(tmp_path, system_dir, host=system_dir.parent.name
                          if system_dir.name == "system" else system_dir.name)
    result = run_agent("--config-file", str(config), "--once", "--dry-run", "--output", "json")
    assert result.code == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.json()


def mask_machine_values(report: dict, tmp_path: Path, memory_from_psutil: bool) -> dict:
    root = report["providers"][0]
    disk = root["inventories"].get("DISK_GB")
    expected_disk = psutil.disk_usage(str(tmp_path / "instances")).total // 1024 ** 3
    if disk:
        assert disk["total"] == expected_disk
        disk["total"] = disk["max_unit"] = MASK
    memory = root["inventories"].get("MEMORY_MB")
    if memory_from_psutil and memory:
        assert memory["total"] == psutil.virtual_memory().total // 1024 ** 2
        memory["total"] = memory["max_unit"] = MASK
    root_dir = str(tmp_path / "sysroot")
    report["warnings"] = [w.replace(root_dir, "<sysfs_root>") for w in report["warnings"]]
    return report


def has_node_meminfo(system_dir: Path) -> bool:
    return any((system_dir / "node").glob("node*/meminfo"))


@pytest.mark.parametrize("system_dir", TREES, ids=tree_name)
def test_dry_run_json_matches_reviewed_golden_file(system_dir, tmp_path):
    report = mask_machine_values(dry_run(system_dir, tmp_path), tmp_path,
                                 memory_from_psutil=not has_node_meminfo(system_dir))
    path = golden_path(system_dir)
    if os.environ.get("NODE_AGENT_REGEN_GOLDEN"):
        path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    assert path.exists(), f"no golden file {path}; run with NODE_AGENT_REGEN_GOLDEN=1"
    assert report == json.loads(path.read_text())


def _truth_for(system_dir: Path) -> dict:
    return ground_truth()[tree_name(system_dir)]


@pytest.mark.parametrize("system_dir", TREES, ids=tree_name)
def test_vcpu_total_equals_the_hosts_online_cpu_count(system_dir, tmp_path):
    truth = _truth_for(system_dir)
    report = dry_run(system_dir, tmp_path)
    vcpu = report["providers"][0]["inventories"]["VCPU"]
    assert vcpu["total"] == truth["online_cpus"]
    assert vcpu["max_unit"] == truth["online_cpus"]
