"""Damaged copies of real sysfs trees, read through the real CLI.

Each case copies a hostdata tree into ``tmp_path``, damages it, and runs
``node-agent --once --dry-run --output json``. The outcome is decided per
case: either a clear error (exit 69, the damaged file named, no
traceback) or a degraded report whose every inventory total is at least
the intact tree's: a failed read must never shrink what Placement is told.
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from tests.cli.runner import Result, run_agent
from tests.hostdata import HOSTDATA
from tests.machine_id import isolated_config
from tests.reliability.nobody import (
    run_as_nobody,
    skip_unless_root_with_setpriv,
    world_readable_dir,
)

# 48 CPUs, 8 NUMA nodes with meminfo, cpuN entries instead of cpulist.
TEST3 = HOSTDATA / "virhostcpudata" / "linux-test3"
# 12 CPUs, 2 nodes with cpulist, distance and hugepages/ pools.
RESCTRL = HOSTDATA / "vircaps2xmldata" / "linux-resctrl" / "system"

ERROR, DEGRADED = "error", "degraded"


@dataclass(frozen=True)
class Damage:
    id: str
    tree: Path
    target: str  # path under the copied devices/system
    damage: Callable[[Path], None]
    outcome: str  # ERROR or DEGRADED


def truncate_to(size: int):
    def damage(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: size if size >= 0 else len(data) + size])

    return damage


def write(data: bytes):
    return lambda path: path.write_bytes(data)


def remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def directory_instead(path: Path) -> None:
    remove(path)
    path.mkdir()


def dangling_link(path: Path) -> None:
    remove(path)
    path.symlink_to(path.parent / "nowhere")


def link_loop(path: Path) -> None:
    remove(path)
    path.symlink_to(path.name)


CASES = [
    Damage("online-garbage", TEST3, "cpu/online", write(b"zero-three\n"), ERROR),
    Damage("online-binary", TEST3, "cpu/online", write(b"\xff\xfe0-3\n"), ERROR),
    Damage("online-empty", TEST3, "cpu/online", write(b""), ERROR),
    Damage("online-truncated-mid-range", TEST3, "cpu/online", truncate_to(2), ERROR),
    Damage("online-is-directory", TEST3, "cpu/online", directory_instead, ERROR),
    Damage("online-missing", TEST3, "cpu/online", remove, DEGRADED),
    Damage("online-dangling-link", TEST3, "cpu/online", dangling_link, DEGRADED),
    Damage("online-link-loop", TEST3, "cpu/online", link_loop, ERROR),
    Damage("present-empty", TEST3, "cpu/present", write(b"\n"), ERROR),
    Damage("present-garbage", TEST3, "cpu/present", write(b"0-47x\n"), ERROR),
    Damage("present-missing", TEST3, "cpu/present", remove, DEGRADED),
    Damage("cpu-dir-missing", TEST3, "cpu", remove, ERROR),
    Damage("cpu-flag-garbage", TEST3, "cpu/cpu1/online", write(b"yes\n"), ERROR),
    Damage("core-id-garbage", TEST3, "cpu/cpu0/topology/core_id", write(b"zero\n"), ERROR),
    Damage("core-id-is-directory", TEST3, "cpu/cpu0/topology/core_id", directory_instead, ERROR),
    Damage("topology-dir-missing", TEST3, "cpu/cpu0/topology", remove, DEGRADED),
    Damage(
        "siblings-garbage", TEST3, "cpu/cpu0/topology/thread_siblings_list", write(b"0-\n"), ERROR
    ),
    Damage("meminfo-garbage", TEST3, "node/node0/meminfo", write(b"garbage\n"), ERROR),
    Damage("meminfo-nul-bytes", TEST3, "node/node0/meminfo", write(b"\0" * 64), ERROR),
    Damage("meminfo-empty", TEST3, "node/node0/meminfo", write(b""), ERROR),
    Damage("meminfo-cut-mid-line", TEST3, "node/node0/meminfo", truncate_to(40), ERROR),
    Damage(
        "meminfo-no-memtotal",
        TEST3,
        "node/node0/meminfo",
        write(b"Node 0 MemFree:  1024 kB\n"),
        ERROR,
    ),
    Damage("meminfo-is-directory", TEST3, "node/node0/meminfo", directory_instead, ERROR),
    Damage("node-cpulist-garbage", RESCTRL, "node/node1/cpulist", write(b"6-z\n"), ERROR),
    Damage("node-distance-garbage", RESCTRL, "node/node0/distance", write(b"10 x\n"), ERROR),
    Damage(
        "hugepage-count-missing",
        RESCTRL,
        "node/node0/hugepages/hugepages-2048kB/nr_hugepages",
        remove,
        ERROR,
    ),
    Damage(
        "hugepage-count-garbage",
        RESCTRL,
        "node/node0/hugepages/hugepages-2048kB/free_hugepages",
        write(b"-\n"),
        ERROR,
    ),
    Damage(
        "hugepage-pool-is-file",
        RESCTRL,
        "node/node1/hugepages/hugepages-2048kB",
        lambda p: (remove(p), p.write_text("0\n")),
        ERROR,
    ),
    Damage("node-dir-missing", TEST3, "node/node7", remove, ERROR),
    Damage("listed-node-dir-missing", RESCTRL, "node/node1", remove, ERROR),
    Damage("node-meminfo-missing", TEST3, "node/node3/meminfo", remove, ERROR),
]


def damaged_root(case: Damage, tmp_path: Path) -> Path:
    root = tmp_path / "sysroot"
    system = root / "devices" / "system"
    shutil.copytree(case.tree, system, symlinks=True)
    for directory, _dirs, files in os.walk(system):
        os.chmod(directory, 0o755)
        for name in files:  # readable by nobody even from a checkout made with umask 077
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, 0o644)
    target = system / case.target
    case.damage(target)
    return root


def config_for(root: Path, tmp_path: Path) -> Path:
    instances = tmp_path / "instances"
    instances.mkdir(exist_ok=True)
    config = tmp_path / "node-agent.conf"
    config.write_text(
        isolated_config(tmp_path, "damaged")
        + f"[DEFAULT]\nhost = damaged\n[agent]\nstate_path = {tmp_path / 'state'}\n"
        f"[host]\nsysfs_root = {root}\n[libvirt]\nconnection_uri =\n"
        f"[compute]\ninstances_path = {instances}\nnuma_in_placement = true\n"
        f"provider_config_location = {tmp_path / 'provider_config'}\n"
    )
    return config


def dry_run(config: Path) -> Result:
    return run_agent("--config-file", str(config), "--once", "--dry-run", "--output", "json")


def totals(report: dict) -> dict[tuple[str, str], int]:
    """(provider name, class) -> total, for every inventory of the report."""
    return {
        (p["name"], rc): inv["total"]
        for p in report["providers"]
        for rc, inv in p["inventories"].items()
    }


def root_totals(report: dict) -> dict[str, int]:
    found: dict[str, int] = {}
    for (_name, rc), total in totals(report).items():
        found[rc] = found.get(rc, 0) + total
    return found


def run_case(case: Damage, base: Path) -> Result:
    base.mkdir(parents=True)
    return dry_run(config_for(damaged_root(case, base), base))


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """The intact trees' reports and every damaged run, four at a time."""
    base = tmp_path_factory.mktemp("corrupt")
    intact = {}
    for tree in (TEST3, RESCTRL):
        where = base / f"intact-{tree.parent.name if tree.name == 'system' else tree.name}"
        shutil.copytree(tree, where / "sysroot" / "devices" / "system", symlinks=True)
        intact[tree] = dry_run(config_for(where / "sysroot", where))
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = dict(zip([c.id for c in CASES], pool.map(lambda c: run_case(c, base / c.id), CASES)))
    yield intact, runs
    shutil.rmtree(base, ignore_errors=True)


def assert_clear_error(result: Result, *names: str) -> None:
    assert result.code == 69, (result.code, result.stderr, result.stdout[:300])
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == ""
    assert any(name in result.stderr for name in names), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def assert_not_smaller(intact: Result, result: Result) -> None:
    assert intact.code == 0, intact.stderr
    assert result.code == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    before, after = root_totals(intact.json()), root_totals(result.json())
    assert set(after) >= set(before)
    for rc, total in before.items():
        assert after[rc] >= total, (rc, total, after[rc])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_damaged_tree_is_a_clear_error_or_never_shrinks_inventory(case, outcomes):
    intact, runs = outcomes
    result = runs[case.id]
    if case.outcome == ERROR:
        parts = case.target.split("/")
        assert_clear_error(result, *("/".join(parts[: i + 1]) for i in range(len(parts))))
    else:
        assert_not_smaller(intact[case.tree], result)


def test_permission_denied_on_a_sysfs_file_is_a_clear_error():
    skip_unless_root_with_setpriv()
    base = world_readable_dir()
    try:
        case = Damage("online-unreadable", TEST3, "cpu/online", lambda p: p.chmod(0o000), ERROR)
        config = config_for(damaged_root(case, base), base)
        result = run_as_nobody("--config-file", str(config), "--once", "--dry-run")
        assert_clear_error(result, "cpu/online")
        assert "Permission denied" in result.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)
