"""nova 34's own services beside the agent, for tests/integration/test_nova_cloud.py.

Everything nova runs is nova's, unchanged, from ``.venv-nova``: ``nova-manage``
builds its databases (SQLite files, the API database, cell0 and cell1),
``nova-conductor`` and ``nova-compute`` run as processes with one
``nova.conf``. nova-compute runs nova's libvirt driver (``virt_type = qemu``,
QEMU under TCG) against the suite's private libvirtd
(tests/integration/libvirtd.py) over its read-write socket, talks to the
conductor over the suite's RabbitMQ and reports its compute node to a real
Placement (devenv.embedded_placement, ``noauth2``: keystoneauth's
``admin_token`` plugin sends the token ``admin``).

The host name nova-compute gives its compute node provider is libvirt's
``getHostname()``, i.e. this machine's name; ``[DEFAULT] host`` is set to
the same name so the agent finds nova's provider by it, as on a real host.

Every process is ours (started here, stopped by :meth:`NovaCloud.stop`,
also after a failure); every file is under the cloud's base directory.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parents[2]
NOVA_VENV = REPO / ".venv-nova"
NOVA_BIN = NOVA_VENV / "bin"
# Bounded by what nova promises: nova-compute reports its node in the
# start-up resource update (before its first periodic), which on a loaded
# 2-core machine takes nova's imports (~10 s) plus a libvirt round or two.
START_TIMEOUT = 240


def unavailable_reason() -> Optional[str]:
    """Why nova's services cannot run here, or None."""
    missing = [
        n for n in ("nova-compute", "nova-conductor", "nova-manage") if not (NOVA_BIN / n).exists()
    ]
    if missing:
        return f"{NOVA_VENV} has no {', '.join(missing)}: `make nova-venv` builds nova 34 there"
    probe = subprocess.run(
        [str(NOVA_BIN / "python"), "-c", "import libvirt"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return (
            f"{NOVA_VENV} lacks libvirt-python, which nova's libvirt driver imports: "
            "`make nova-venv` installs it (bench/requirements-nova.txt)"
        )
    return None


def nova_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # nothing of ours on nova's path
    env["PATH"] = f"{NOVA_BIN}:{env.get('PATH', '')}"
    return env


class NovaCloud:
    """nova's databases, conductor and compute under ``base``."""

    def __init__(
        self,
        base: Path,
        *,
        placement_url: str,
        transport_url: str,
        libvirt_uri: str,
        compute: str = "",
    ):
        self.base = Path(base)
        self.placement_url = placement_url
        self.transport_url = transport_url
        self.libvirt_uri = libvirt_uri
        self.host = socket.gethostname()
        self.conf = self.base / "nova.conf"
        self.logs = self.base / "log"
        self.procs: dict[str, subprocess.Popen] = {}
        self.write_conf(compute)

    # -- configuration and databases

    def write_conf(self, compute: str = "") -> None:
        """nova.conf as a compute node (and its control plane) has it;
        ``compute``: extra ``[compute]`` lines (the CPU sets)."""
        for sub in ("state", "instances", "locks", "log"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        db = self.base
        self.conf.write_text(
            "[DEFAULT]\n"
            f"host = {self.host}\n"
            "my_ip = 127.0.0.1\n"
            f"state_path = {db / 'state'}\n"
            f"instances_path = {db / 'instances'}\n"
            f"log_dir = {self.logs}\n"
            f"transport_url = {self.transport_url}\n"
            "compute_driver = libvirt.LibvirtDriver\n"
            "allow_resize_to_same_host = True\n"
            "debug = True\n"
            # nova waits up to 60 s for its greenthreads at SIGTERM by default.
            "graceful_shutdown_timeout = 5\n"
            # The memory nova reserves by default (512) is more than a
            # few tiny guests need; left as it is, as on a real host.
            "[api_database]\n"
            f"connection = sqlite:///{db / 'nova_api.sqlite'}\n"
            "[database]\n"
            f"connection = sqlite:///{db / 'nova.sqlite'}\n"
            "[oslo_concurrency]\n"
            f"lock_path = {db / 'locks'}\n"
            f"[compute]\n{compute}"
            "[libvirt]\n"
            "virt_type = qemu\n"
            f"connection_uri = {self.libvirt_uri}\n"
            "[vnc]\nenabled = False\n"
            "[placement]\n"
            "auth_type = admin_token\ntoken = admin\n"
            f"endpoint_override = {self.placement_url}\n"
            "[oslo_messaging_notifications]\ndriver = noop\n"
        )

    def manage(self, *args: str) -> str:
        run = subprocess.run(
            [str(NOVA_BIN / "nova-manage"), "--config-file", str(self.conf), *args],
            capture_output=True,
            text=True,
            env=nova_env(),
            timeout=300,
        )
        if run.returncode != 0:
            raise RuntimeError(
                f"nova-manage {' '.join(args)} exited {run.returncode}:\n"
                f"{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
            )
        return run.stdout

    def create_databases(self) -> None:
        self.manage("api_db", "sync")
        self.manage(
            "cell_v2",
            "map_cell0",
            "--database_connection",
            f"sqlite:///{self.base / 'cell0.sqlite'}",
        )
        self.manage("cell_v2", "create_cell", "--name", "cell1", "--verbose")
        self.manage("db", "sync")

    # -- services

    def start_service(self, name: str) -> subprocess.Popen:
        with open(self.logs / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(
                [str(NOVA_BIN / name), "--config-file", str(self.conf)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=nova_env(),
            )
        self.procs[name] = proc
        return proc

    def stop_service(self, name: str, timeout: float = 30) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        for name in list(self.procs):
            self.stop_service(name)

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            path = self.logs / f"{name}.out"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def wait_for(
        self, ready: Callable[[], object], what: str, service: str, timeout: float = START_TIMEOUT
    ):
        """Poll ``ready`` until it returns something truthy; fail early when
        ``service`` has exited, with its log."""
        deadline = time.monotonic() + timeout
        while True:
            got = ready()
            if got:
                return got
            proc = self.procs.get(service)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(
                    f"{service} exited {proc.returncode} while waiting for {what}:\n"
                    + self.log_tail(service)
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{what}: not after {timeout}s; {service}'s log:\n" + self.log_tail(service)
                )
            time.sleep(0.5)
