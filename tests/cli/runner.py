"""Run the real ``node-agent`` entry point in a subprocess against a fixture host."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.hostdata import sysfs_root_for
from tests.machine_id import isolated_config


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        return json.loads(self.stdout)


def write_config(
    tmp_path: Path, system_dir: Path, host: str = "fixture-host", extra: str = ""
) -> Path:
    root = sysfs_root_for(system_dir, tmp_path)
    instances = tmp_path / "instances"
    instances.mkdir(exist_ok=True)
    path = tmp_path / "node-agent.conf"
    path.write_text(
        isolated_config(tmp_path, host)
        + f"[DEFAULT]\nhost = {host}\n[agent]\nstate_path = {tmp_path / 'state'}\n"
        f"[host]\nsysfs_root = {root}\n"
        "[libvirt]\nconnection_uri =\n"
        f"[compute]\ninstances_path = {instances}\n"
        # Not the host's /etc/node-agent: runs must not depend on what is installed.
        f"provider_config_location = {tmp_path / 'provider_config'}\n" + extra
    )
    return path


def run_agent(*args: str, timeout: float = 60) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "node_agent.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)
