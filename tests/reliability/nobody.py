"""Run the real CLI as the unprivileged user ``nobody`` (when we are root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.cli.runner import Result

SETPRIV = shutil.which("setpriv")


def skip_unless_root_with_setpriv() -> None:
    if os.geteuid() != 0 or SETPRIV is None:
        pytest.skip("needs root and setpriv to switch to nobody")


def world_readable_dir() -> Path:
    """A fresh directory nobody can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="node-agent-nobody-"))
    path.chmod(0o755)
    return path


def run_as_nobody(*args: str, timeout: float = 60) -> Result:
    command = [SETPRIV, "--reuid=nobody", "--regid=nogroup", "--clear-groups",
               sys.executable, "-m", "node_agent.cli", *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          cwd="/", env={**os.environ, "HOME": "/nonexistent"})
    return Result(proc.returncode, proc.stdout, proc.stderr)
