"""Run the real CLI as the unprivileged user ``nobody`` (when we are root).

``nobody`` must be able to reach everything the run needs, wherever the
checkout lives: a clone under ``/root`` (mode 0700) is out of its reach, and
so is the ``.venv`` inside it. So the runtime is staged once per test
process in a world-readable temporary directory: the virtualenv (hard
links where possible, a copy otherwise; nothing is written through them,
as every file stays root-owned and read-only to ``nobody``) and this
checkout's ``node_agent`` package, which ``PYTHONPATH`` puts ahead of the
editable install's link back into the checkout. Fixture trees are staged
by the tests with ``stage_tree``.
"""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Optional

import pytest

from tests.cli.runner import Result

SETPRIV = shutil.which("setpriv")
REPO = Path(__file__).resolve().parents[2]
_AS_NOBODY = ("--reuid=nobody", "--regid=nogroup", "--clear-groups")


def skip_unless_root_with_setpriv() -> None:
    if os.geteuid() != 0 or SETPRIV is None:
        pytest.skip("needs root and setpriv to switch to nobody")


def world_readable_dir() -> Path:
    """A fresh directory nobody can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="node-agent-nobody-"))
    path.chmod(0o755)
    return path


def stage_tree(tree: Path, base: Path) -> Path:
    """A copy of fixture ``tree`` under ``base`` (world-readable), symlinks
    kept, so ``nobody`` can read it wherever the checkout is."""
    staged = base / "fixture" / tree.name
    shutil.copytree(tree, staged, symlinks=True)
    for path in [staged.parent, staged, *staged.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    return staged


def _others_can_run(path: str) -> bool:
    """By the mode bits alone: every directory above ``path`` lets others
    through, and others may execute it. (Some sandboxes let ``nobody``
    through a 0700 /root anyway; that must not be relied on.)"""
    real = Path(os.path.realpath(path))
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in [real, *real.parents])


def _use_a_system_interpreter(venv: Path) -> None:
    """Point the staged virtualenv at the system's Python of the same
    version (the same ABI, so the venv's compiled packages load) when its
    own base interpreter is out of ``nobody``'s reach (a pyenv under /root)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if _others_can_run(sys._base_executable):
        return
    system = Path("/usr/bin") / version
    if not (system.exists() and _others_can_run(str(system))):
        return  # as_nobody's probe skips, saying why
    for name in ("python", "python3", version):
        link = venv / "bin" / name
        if link.is_symlink():
            link.unlink()
            link.symlink_to(system)
    cfg = venv / "pyvenv.cfg"
    lines = [
        line
        for line in cfg.read_text().splitlines()
        if not line.startswith(("home", "executable", "command"))
    ]
    cfg.unlink()  # a hard link to the real venv's file: write a new one
    cfg.write_text("\n".join([f"home = {system.parent}", f"executable = {system}", *lines]) + "\n")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copy2(src, dst)


@lru_cache(maxsize=1)
def _staged_runtime() -> tuple[str, str]:
    """(interpreter, source directory) that ``nobody`` can reach, staged once."""
    base = world_readable_dir()
    atexit.register(shutil.rmtree, base, True)
    python = sys.executable
    if sys.prefix != sys.base_prefix:  # a virtualenv: stage it whole
        venv = base / "venv"
        shutil.copytree(sys.prefix, venv, symlinks=True, copy_function=_link_or_copy)
        _use_a_system_interpreter(venv)
        python = str(venv / Path(sys.executable).relative_to(sys.prefix))
    src = base / "src"
    shutil.copytree(
        REPO / "node_agent", src / "node_agent", ignore=shutil.ignore_patterns("__pycache__")
    )
    for path in [src, *src.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return python, str(src)


def as_nobody(*args: str, env: Optional[dict] = None) -> tuple[list[str], dict]:
    """(argv, environment) running the staged interpreter with ``args`` as
    ``nobody``; run it with ``cwd="/"``. Skips, saying why, when ``nobody``
    cannot start the interpreter at all (for example a Python built under
    ``/root`` with no system Python of its version): switching users is
    then impossible."""
    python, src = _staged_runtime()
    env = {**(os.environ if env is None else env), "HOME": "/nonexistent", "PYTHONPATH": src}
    probe = subprocess.run(
        [SETPRIV, *_AS_NOBODY, python, "-c", "pass"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env=env,
    )
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot run {python}: {probe.stderr.strip()}")
    return [SETPRIV, *_AS_NOBODY, python, *args], env


def open_to_everyone(base: Path) -> None:
    """Let nobody read (and traverse) everything under ``base``."""
    for path in base.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def run_as_nobody(*args: str, timeout: float = 60) -> Result:
    """The CLI run as ``nobody`` from the staged runtime (see :func:`as_nobody`)."""
    command, env = as_nobody("-m", "node_agent.cli.main", *args)
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd="/", env=env
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)
