"""What every test config starts with, so that no run reads the machine's
own files under /etc:

* the machine identity (``[agent] machine_id_path``), never the host's
  /etc/machine-id: that is empty in a container or an image prepared for
  cloning, and the agent then refuses every writing command (exit 78). One
  id per host name, the same for a config and for settings built in the
  test process: the suite shares one Placement, and one machine's mark on
  two host names' roots is refused as a renamed host or a clone (a config
  written without its host name gets the suite's one id);
* the operator's provider files (``[compute] provider_config_location``),
  never /etc/node-agent/provider_config/: on a machine where node-agent is
  installed that directory is root's and the service group's only (mode
  0750), so a test running as ``nobody`` failed with exit 78, and on any
  machine its files would change what the tests see."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Optional

MACHINE_ID = "7e57ab1e00000000000000000000cafe"
# For Settings built in the test process (tests/snapshots.py, reshape_driver).
MACHINE_ID_FILE = Path(__file__).resolve().parent / "data" / "machine-id"


def machine_id_of(key: str) -> str:
    """A machine id of its own for ``key`` (a directory, a host name)."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def machine_id_file(directory: Path, host: Optional[str] = None) -> Path:
    """A machine-id file in ``directory`` (beside a test's config file, so a
    process running as another user reads it where it reads the config),
    with ``host``'s own id (the suite's one id without a host)."""
    value = MACHINE_ID if host is None else machine_id_of(host)
    path = Path(directory) / ("test-machine-id" if host is None else f"test-machine-id-{value}")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    return path


_HOST_IDS: list[Path] = []


def machine_id_file_of_host(host: str) -> Path:
    """A machine-id file holding an id of ``host``'s own, for settings built
    in the test process (one directory per test process)."""
    if not _HOST_IDS:
        _HOST_IDS.append(Path(tempfile.mkdtemp(prefix="node-agent-test-ids-")))
    path = _HOST_IDS[0] / machine_id_of(host)
    if not path.exists():
        path.write_text(machine_id_of(host) + "\n")
    return path


def isolated_config(directory: Path, host: Optional[str] = None) -> str:
    """Config text setting ``[agent] machine_id_path`` to a file in
    ``directory`` (``host``'s id, see :func:`machine_id_file`) and
    ``[compute] provider_config_location`` to a directory there (none need
    exist). Put it first: a test's own later lines win."""
    return (
        f"[agent]\nmachine_id_path = {machine_id_file(directory, host)}\n"
        f"[compute]\nprovider_config_location = {Path(directory) / 'provider_config'}\n"
    )
