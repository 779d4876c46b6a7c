"""The agent side of the nova conformance bridge.

nova 34 lives in its own virtualenv (``.venv-nova``, built by ``make``);
its dependencies never enter the agent's. :class:`NovaBridge` starts one
long-lived ``nova_side.py`` under that venv's Python and talks JSON lines
to it over stdin/stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
NOVA_SIDE = Path(__file__).with_name("nova_side.py")
NOVA_VENV = Path(os.environ.get("NODE_AGENT_NOVA_VENV", REPO / ".venv-nova"))
# The stamp make writes once the venv is complete (the .venv pattern).
NOVA_STAMP = NOVA_VENV / ".installed"


class BridgeError(RuntimeError):
    """The nova side failed (not: nova refused an input, which is an answer)."""


def nova_python() -> Optional[Path]:
    """The nova venv's Python, or None when ``make`` has not built it."""
    python = NOVA_VENV / "bin" / "python"
    return python if NOVA_STAMP.exists() and python.exists() else None


class NovaBridge:
    def __init__(self, python: Path, script: Path = NOVA_SIDE):
        # Open for the bridge's life: nova's stderr, read when a call fails.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [str(python), str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONPATH": ""},
        )

    def call(self, op: str, **args):
        """nova's answer to ``op``; BridgeError when the nova side broke."""
        try:
            self._proc.stdin.write(json.dumps({"op": op, "args": args}) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self._stderr.seek(0)
            raise BridgeError(f"the nova side exited during {op}: {self._stderr.read()[-2000:]}")
        answer = json.loads(line)
        if "error" in answer:
            raise BridgeError(f"{op}: {answer['error']}")
        return answer["ok"]

    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._stderr.close()
