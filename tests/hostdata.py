"""Where the real-host fixtures live, and how to mount one as a sysfs root.

The data (libvirt's test suite, LGPL) is in ``tests/data/hostdata``, with its
licence and provenance (``README.md``, ``ORIGIN.md``), so a clone needs
nothing beside it. Set ``NODE_AGENT_HOSTDATA`` to use another copy of it.
"""

from __future__ import annotations

import json
import os
import shutil
from functools import lru_cache
from pathlib import Path

HOSTDATA = Path(
    os.environ.get("NODE_AGENT_HOSTDATA", Path(__file__).resolve().parent / "data" / "hostdata")
)

GROUND_TRUTH = HOSTDATA / "ground_truth_sysfs.json"

# A stand-in for a symlink is a tiny file whose text is a relative path.
_PLACEHOLDER_MAX_BYTES = 256


def sysfs_trees() -> list[Path]:
    """Every fixture tree that stands for ``/sys/devices/system``, sorted."""
    trees = [p for p in HOSTDATA.glob("virhostcpudata/linux-*") if p.is_dir()]
    trees += [p for p in HOSTDATA.glob("vircaps2xmldata/linux-*/system") if p.is_dir()]
    return sorted(trees)


def tree_name(system_dir: Path) -> str:
    """A short test id: ``virhostcpudata/linux-test6``, ``vircaps2xmldata/linux-hmat``."""
    rel = system_dir.relative_to(HOSTDATA)
    parts = rel.parts[:-1] if rel.name == "system" else rel.parts
    return "/".join(parts)


def sysfs_root_for(system_dir: Path, tmp_path: Path) -> Path:
    """Build a sysfs root in ``tmp_path`` whose ``devices/system`` shows ``system_dir``.

    ``devices/system`` is a directory of symlinks, one per entry of the
    fixture tree, rather than one symlink to the tree: copies of the
    fixtures (this repository's too, see ``ORIGIN.md``) store libvirt's
    symlinks (``linux-basic-dies/system/cpu``) as small files holding the
    link target, and those entries are linked to their real target here.
    """
    root = tmp_path / "sysroot"
    system = root / "devices" / "system"
    system.mkdir(parents=True)
    for entry in sorted(system_dir.iterdir()):
        (system / entry.name).symlink_to(follow_placeholder(entry))
    return root


def follow_placeholder(entry: Path) -> Path:
    """The directory a symlink stand-in names, else ``entry`` itself."""
    if entry.is_symlink() or not entry.is_file():
        return entry
    if entry.stat().st_size > _PLACEHOLDER_MAX_BYTES:
        return entry
    try:
        text = entry.read_text(encoding="ascii").strip()
    except (UnicodeDecodeError, OSError):
        return entry
    if not text.startswith("../"):
        return entry
    target = (entry.parent / text).resolve()
    return target if target.is_dir() else entry


NODE_MEMORY_KB = 4 * 1024 * 1024


def copy_tree(system_dir: Path, dest: Path) -> Path:
    """A copy of a fixture tree at ``dest`` (its ``devices/system``), stand-ins
    for symlinks followed, plus what a kernel shows and libvirt's fixtures
    leave out because libvirt's test mock does not read it: each node's
    ``cpumap`` (the hex mask of its ``cpulist`` or ``cpuN`` entries), which
    libnuma reads, so a real libvirtd finds the nodes (the agent reads
    ``cpulist`` or the ``cpuN`` entries, never ``cpumap``); and a node
    without ``meminfo`` gets one of ``NODE_MEMORY_KB`` (invented: libvirt's
    fixtures give no figure, and without the file libvirt cannot count the
    host's memory at all)."""
    dest.mkdir(parents=True)
    for entry in sorted(system_dir.iterdir()):
        real = follow_placeholder(entry)
        if real.is_dir():
            shutil.copytree(real, dest / entry.name)
        else:
            shutil.copy(real, dest / entry.name)
    nodes = sorted((dest / "node").glob("node[0-9]*"))
    cpus_of = {node: _node_cpus(node) for node in nodes}
    words = (max((max(c, default=0) for c in cpus_of.values()), default=0) // 32) + 1
    for node, cpus in cpus_of.items():
        if not (node / "cpumap").exists():
            mask = sum(1 << cpu for cpu in cpus)
            text = ",".join(
                f"{(mask >> (32 * w)) & 0xFFFFFFFF:08x}" for w in reversed(range(words))
            )
            (node / "cpumap").write_text(text + "\n")
        if not (node / "meminfo").exists():
            number = node.name[4:]
            (node / "meminfo").write_text(
                f"Node {number} MemTotal: {NODE_MEMORY_KB} kB\n"
                f"Node {number} MemFree: {NODE_MEMORY_KB} kB\n"
            )
    return dest


def kernel_cpulist(text: str) -> list[int]:
    """The CPUs of a kernel cpulist ("0-3,8"), read without the agent's parser."""
    ids: list[int] = []
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        ids += range(int(first), int(last or first) + 1)
    return ids


def _node_cpus(node: Path) -> set[int]:
    listed = node / "cpulist"
    if listed.exists():
        return set(kernel_cpulist(listed.read_text()))
    return {int(p.name[3:]) for p in node.iterdir() if p.name[3:].isdigit() and p.name[:3] == "cpu"}


@lru_cache(maxsize=1)
def ground_truth() -> dict:
    """``ground_truth_sysfs.json`` keyed by ``tree_name``; each value is the
    entry's ``sysfs_analysis`` (several virhostcpudata entries share a tree)."""
    data = json.loads(GROUND_TRUTH.read_text())
    by_tree = {}
    for group in ("virhostcpudata", "vircaps2xmldata"):
        for entry in data[group].values():
            tree = HOSTDATA / entry["sysfs_tree"]
            by_tree[tree_name(tree)] = entry["sysfs_analysis"]
    return by_tree


SYSFS_TREES = sysfs_trees()
