"""The real ``node-agent`` service process under soak: its config file,
a NOTIFY_SOCKET drained by a thread (Linux queues only
``net.unix.max_dgram_qlen`` datagrams, often 10, and sd_notify blocks the
sender when that queue is full), its log, its control RPC and its
resource use."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

import psutil

from soak.model import Config
from tests.machine_id import isolated_config

AGENT = Path(sys.executable).with_name("node-agent")


class NotifyListener:
    """A unix datagram socket standing in for systemd, read by a thread."""

    def __init__(self, path: Path):
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.2)
        self._cond = threading.Condition()
        self._recent: list[str] = []
        self.counts: Counter = Counter()
        self._stop = False
        self._thread = threading.Thread(target=self._read, name="soak-notify", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop:
            try:
                text = self._sock.recv(4096).decode()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._cond:
                self.counts[text.split("=", 1)[0]] += 1
                self._recent.append(text)
                del self._recent[:-200]
                self._cond.notify_all()

    def mark(self) -> int:
        """A position; :meth:`wait_for` looks only at datagrams after it."""
        with self._cond:
            return sum(self.counts.values())

    def wait_for(self, predicate: Callable[[str], bool], since: int, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                total = sum(self.counts.values())
                fresh = (
                    self._recent[max(0, len(self._recent) - (total - since)) :]
                    if total > since
                    else []
                )
                for text in fresh:
                    if predicate(text):
                        return text
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching datagram; last: {self._recent[-5:]}")
                self._cond.wait(left)

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self._sock.close()


def config_text(
    workdir: Path,
    host: str,
    placement_url: str,
    transport_url: str,
    sysroot: Path,
    libvirt_uri: str,
    config: Config,
    report_interval: int,
    full_verify_interval: int,
    broken: Optional[tuple[str, str]] = None,
) -> str:
    """The agent's config file; ``broken`` = (option, raw value) written in
    place of a valid [compute] option (a reload must refuse it)."""
    compute = {
        "reserved_host_cpus": config.reserved_host_cpus,
        "reserved_host_memory_mb": config.reserved_host_memory_mb,
        "reserved_host_disk_mb": config.reserved_host_disk_mb,
        "cpu_allocation_ratio": config.cpu_allocation_ratio,
        "ram_allocation_ratio": config.ram_allocation_ratio,
        "disk_allocation_ratio": config.disk_allocation_ratio,
    }
    if broken:
        compute[broken[0]] = broken[1]
    lines = "".join(f"{k} = {v}\n" for k, v in compute.items())
    return (
        isolated_config(workdir) + f"[DEFAULT]\nhost = {host}\n"
        f"transport_url = {transport_url}\n"
        f"[agent]\nstate_path = {workdir / 'state'}\n"
        f"[host]\nsysfs_root = {sysroot}\n"
        f"[libvirt]\nconnection_uri = {libvirt_uri}\n"
        f"[compute]\ninstances_path = {workdir}\n{lines}"
        f"[agent]\nreport_interval = {report_interval}\nstartup_splay = 0\n"
        f"interval_jitter = 0\nretry_max_interval = 2\n"
        f"full_verify_interval = {full_verify_interval}\n"
        "[placement]\nauth_type = admin_token\ntoken = admin\n"
        f"endpoint_override = {placement_url}\n"
    )


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class SoakAgent:
    def __init__(self, workdir: Path, host: str):
        self.dir = workdir
        self.host = host
        self.config_path = workdir / "node-agent.conf"
        self.log_path = workdir / "agent.log"
        self.notify = NotifyListener(workdir / "notify.sock")
        self.proc: Optional[subprocess.Popen] = None
        self._ps: Optional[psutil.Process] = None
        self._log_offset = 0
        self._rpc = None

    def write_config(self, text: str) -> None:
        _write(self.config_path, text)

    def start(self) -> None:
        env = dict(os.environ, NOTIFY_SOCKET=str(self.notify.path))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(AGENT), "--config-file", str(self.config_path)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self._ps = psutil.Process(self.proc.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def new_log(self) -> str:
        """Log text written since the last call."""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_offset)
            data = log.read()
        self._log_offset += len(data)
        return data.decode(errors="replace")

    def reload(self, timeout: float = 30) -> str:
        """SIGHUP; wait until the service says it is ready again; return
        what it logged about the reload."""
        since = self.notify.mark()
        self.proc.send_signal(signal.SIGHUP)
        self.notify.wait_for(lambda d: d == "READY=1", since, timeout)
        return self.new_log()

    def reload_with(self, write: Callable[[], None]) -> str:
        """``write()`` the config file, then :meth:`reload`."""
        self.new_log()  # what was logged before is not about this reload
        write()
        return self.reload()

    def rpc(self):
        if self._rpc is None:
            from node_agent.config.files import load_conf
            from node_agent.remote import messaging

            conf = load_conf(["--config-file", str(self.config_path)])
            self._rpc = messaging.client(conf, self.host, timeout=150)
        return self._rpc

    def sync_now(self) -> dict:
        """Run one cycle now (it starts after this call) and wait for it."""
        return self.rpc().call({}, "sync_now")

    def sample(self) -> dict:
        with self._ps.oneshot():
            return {
                "rss": self._ps.memory_info().rss,
                "fds": self._ps.num_fds(),
                "threads": self._ps.num_threads(),
            }

    def stop(self, timeout: float = 30) -> Optional[int]:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.notify.close()
        return self.proc.returncode
