"""A state directory the file system refuses: read-only, or full.

Both work as root and as an ordinary user, or skip saying why: as root a
read-only bind mount (root ignores a directory's mode), otherwise the
directory's mode; a full disk needs a small tmpfs, which only root mounts.
"""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mount {' '.join(args)} refused: {done.stderr.strip()}")


@contextmanager
def read_only(directory: Path) -> Iterator[str]:
    """``directory`` read-only for this process and its children while the
    block runs; yields the errno name a write gets (EROFS or EACCES)."""
    if os.geteuid() != 0:
        mode = directory.stat().st_mode
        directory.chmod(0o500)
        try:
            yield "EACCES"
        finally:
            directory.chmod(mode)
        return
    _mount("--bind", str(directory), str(directory))
    try:
        _mount("-o", "remount,bind,ro", str(directory))
        yield "EROFS"
    finally:
        subprocess.run(["umount", str(directory)], check=True)


@contextmanager
def full(directory: Path) -> Iterator[None]:
    """``directory`` on a 64 KiB tmpfs filled to the last block (root only)."""
    if os.geteuid() != 0:
        pytest.skip("a full file system needs a tmpfs mount, which only root can make")
    directory.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(directory))
    try:
        filler = directory / "filler"
        with open(filler, "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(b"\0" * 4096)
            except OSError:
                pass
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)
