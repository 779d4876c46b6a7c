"""Where the real-host fixtures live, and how to mount one as a sysfs root.

The data (libvirt's test suite, LGPL) is in ``tests/data/hostdata``, with its
licence and provenance (``README.md``, ``ORIGIN.md``), so a clone needs
nothing beside it. Set ``NODE_AGENT_HOSTDATA`` to use another copy of it.
"""

from __future__ import annotations

import json
import os
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
