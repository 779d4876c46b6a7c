"""The real ``node-agent`` service process for integration tests: its
config file, a fixture host under ``tmp_path``, a real NOTIFY_SOCKET that
collects its sd_notify datagrams, and its log."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.hostdata import HOSTDATA
from tests.machine_id import isolated_config

SMALL_HOST = HOSTDATA / "vircaps2xmldata/linux-basic/system"  # 16 CPUs
OTHER_HOST = HOSTDATA / "virhostcpudata/linux-test1"  # another shape
AGENT = Path(sys.executable).with_name("node-agent")
NOBODY_UID = NOBODY_GID = 65534


def mount_host(system_dir: Path, root: Path) -> None:
    """Make ``root/devices/system`` show ``system_dir`` (replacing what it
    showed): a "host change" the next cycle discovers."""
    system = root / "devices" / "system"
    staging = root / "devices" / "system.new"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for entry in sorted(system_dir.iterdir()):
        (staging / entry.name).symlink_to(entry)
    if system.exists():
        shutil.rmtree(system)
    staging.rename(system)


class NotifySocket:
    """A unix datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.received: list[str] = []

    def wait_for(self, predicate, timeout: float = 20) -> str:
        """Read datagrams until one satisfies ``predicate``; return it."""
        deadline = time.monotonic() + timeout
        for seen in self.received:
            if predicate(seen):
                return seen
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no matching datagram; got {self.received[-10:]}"
            self.sock.settimeout(left)
            try:
                text = self.sock.recv(4096).decode()
            except socket.timeout:
                continue
            self.received.append(text)
            if predicate(text):
                return text

    def drain(self) -> None:
        """Read what is queued without waiting. A test that does not read
        the datagrams must call this now and then: a full queue blocks the
        agent's next sd_notify (systemd never lets it fill)."""
        self.sock.setblocking(False)
        try:
            while True:
                self.received.append(self.sock.recv(4096).decode())
        except BlockingIOError:
            pass
        finally:
            self.sock.setblocking(True)
        del self.received[:-100]

    def close(self):
        self.sock.close()


class AgentProcess:
    """``as_nobody``: the service runs as ``nobody`` (root only, see
    tests/reliability/nobody.py), as under its unit's ``User=``: ``tmp_path``
    must then be a directory others can traverse (``world_readable_dir``);
    the fixture host is copied into it and the state directory is nobody's."""

    def __init__(
        self,
        tmp_path: Path,
        placement_url: str,
        host: str,
        agent_options: str = "report_interval = 1\n",
        extra: str = "",
        system_dir: Path = SMALL_HOST,
        as_nobody: bool = False,
    ):
        self.dir = tmp_path
        self.host = host
        self.placement_url = placement_url
        self.as_nobody = as_nobody
        if as_nobody:
            from tests.reliability.nobody import skip_unless_root_with_setpriv, stage_tree

            skip_unless_root_with_setpriv()
            system_dir = stage_tree(system_dir, tmp_path)
        self.sysroot = tmp_path / "sysroot"
        mount_host(system_dir, self.sysroot)
        self.config = tmp_path / "node-agent.conf"
        self.agent_options = agent_options
        self.extra = extra
        self.write_config()
        self.log_path = tmp_path / "agent.log"
        self.notify = NotifySocket(tmp_path / "notify.sock")
        self.proc: subprocess.Popen | None = None
        if as_nobody:
            from tests.reliability.nobody import open_to_everyone

            open_to_everyone(tmp_path)
            self.notify.path.chmod(0o777)  # sending to a socket needs write access
            state = tmp_path / "state"
            state.mkdir(mode=0o700, exist_ok=True)
            os.chown(state, NOBODY_UID, NOBODY_GID)

    @classmethod
    def with_metrics(
        cls, tmp_path: Path, placement_url: str, host: str, port: int, textfile: Path | None = None
    ) -> "AgentProcess":
        """A service reporting every second with its metrics on ``port``
        (and in ``textfile`` when given)."""
        options = f"report_interval = 1\nmetrics_port = {port}\n"
        if textfile is not None:
            options += f"metrics_textfile = {textfile}\n"
        return cls(tmp_path, placement_url, host, agent_options=options)

    def config_text(self, reserved_memory_mb: int = 512) -> str:
        return (
            isolated_config(self.dir, self.host) + f"[DEFAULT]\nhost = {self.host}\n"
            f"{self.extra}"
            f"[agent]\nstate_path = {self.dir / 'state'}\n"
            f"[host]\nsysfs_root = {self.sysroot}\n"
            "[libvirt]\nconnection_uri =\n"
            f"[compute]\ninstances_path = {self.dir}\n"
            f"reserved_host_memory_mb = {reserved_memory_mb}\n"
            f"[agent]\nstartup_splay = 0\nretry_max_interval = 2\n"
            f"{self.agent_options}"
            "[placement]\nauth_type = admin_token\ntoken = admin\n"
            f"endpoint_override = {self.placement_url}\n"
        )

    def write_config(self, text: str | None = None) -> None:
        self.config.write_text(text if text is not None else self.config_text())

    def start(self) -> "AgentProcess":
        # What a previous process sent is not this one's: a restarted
        # service's first status must not be matched by its predecessor's.
        self.notify.drain()
        self.notify.received.clear()
        env = dict(os.environ, NOTIFY_SOCKET=str(self.notify.path))
        command = [str(AGENT), "--config-file", str(self.config)]
        cwd = None
        if self.as_nobody:
            from tests.reliability.nobody import as_nobody

            command, env = as_nobody("-m", "node_agent.cli.main", *command[1:], env=env)
            cwd = "/"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text()

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def status_after(self, predicate, timeout: float = 20) -> str:
        """The next STATUS= text that satisfies ``predicate``."""
        found = self.notify.wait_for(
            lambda d: d.startswith("STATUS=") and predicate(d[len("STATUS=") :]), timeout
        )
        return found[len("STATUS=") :]

    def new_status(self, predicate, timeout: float = 20) -> str:
        """Like :meth:`status_after`, ignoring datagrams already sent: those
        read, and those still queued (on a loaded machine, several cycles'
        statuses from before the caller's change wait there)."""
        self.notify.drain()
        self.notify.received.clear()
        return self.status_after(predicate, timeout)
