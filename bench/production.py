"""Section 6: the phases of section 2 against a production-like Placement.

uWSGI (``WORKERS`` processes behind its HTTP router, keep-alive on) serving
the installed openstack-placement, on a throw-away PostgreSQL cluster:
``initdb`` in a temporary directory, started on a free loopback port, and
removed afterwards. Nothing of the machine's own PostgreSQL is used.

The server is uWSGI's ``--http`` router with keep-alive, which speaks
keep-alive to clients (keystoneauth's session keeps its connections) and
plain requests to the workers. Issue 19 reports that ``--http-keepalive`` on
a plain ``--http-socket`` stalls; a short check with PlacementClient (four
GETs on one session, 2026-11-23) did not stall: the router is used as the
issue advises, not because a stall was measured here.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from devenv.embedded_placement import LOG_FILE, prepare

WORKERS = 4
DATABASE = "placement"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for version in sorted(Path("/usr/lib/postgresql").glob("*"), reverse=True):
        if (version / "bin" / name).exists():
            return str(version / "bin" / name)
    raise RuntimeError(f"PostgreSQL's {name} not found (Debian: apt-get install postgresql)")


class PostgresCluster:
    """A private PostgreSQL cluster; as root, run by the ``postgres`` user
    (PostgreSQL refuses to run as root)."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="node-agent-bench-pg-"))
        self.port = free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres")

    def _run(self, *command: str) -> str:
        done = subprocess.run(
            self.as_user + list(command), capture_output=True, text=True, cwd=self.dir
        )
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {done.stderr.strip() or done.stdout}")
        return done.stdout

    def start(self) -> "PostgresCluster":
        data = self.dir / "data"
        self._run(
            _pg_bin("initdb"),
            "-D",
            str(data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self._run(
            _pg_bin("pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(self.dir / "server.log"),
            "-w",
            "-o",
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c max_connections=200",
            "start",
        )
        self._run(
            _pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", DATABASE
        )
        return self

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def version(self) -> str:
        return self._run(_pg_bin("postgres"), "--version").strip()

    def stop(self) -> None:
        try:
            self._run(_pg_bin("pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class UwsgiPlacement:
    """placement under uWSGI; ``stop`` and ``start`` keep port and database."""

    def __init__(self, workdir: Path, database_url: str, workers: int = WORKERS):
        self.workdir = Path(workdir).resolve()
        self.workers = workers
        prepare(self.workdir, database_url)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / LOG_FILE

    def start(self, timeout: float = 120) -> "UwsgiPlacement":
        uwsgi = Path(sys.executable).with_name("uwsgi")
        command = [
            str(uwsgi),
            "--http",
            f"127.0.0.1:{self.port}",
            "--http-keepalive",
            "--master",
            "--processes",
            str(self.workers),
            "--lazy-apps",
            "--module",
            "placement.wsgi.api:application",
            "--need-app",
            "--die-on-term",
            "--disable-logging",
        ]  # placement's own request log counts requests
        with open(self.workdir / "uwsgi.out", "ab") as out:
            self.proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(os.environ, OS_PLACEMENT_CONFIG_DIR=str(self.workdir)),
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + "/", timeout=5):
                    return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"uWSGI placement did not answer; see {self.workdir / 'uwsgi.out'}"
                    ) from None
                time.sleep(0.1)

    def stop(self, timeout: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def uwsgi_version() -> str:
    uwsgi = Path(sys.executable).with_name("uwsgi")
    return subprocess.run([str(uwsgi), "--version"], capture_output=True, text=True).stdout.strip()


def run(work: Path, nova_python: Path) -> dict:
    from bench import phases

    cluster = PostgresCluster().start()
    server = None
    try:
        server = UwsgiPlacement(work / "placement-uwsgi", cluster.url).start()
        # Registration, steady cycles and the reshape; the inventory change
        # is section 2's only, to keep the run short on a shared machine.
        result = phases.run_phases(work, nova_python, server.url, server.log, inventory=False)
        return dict(
            result, workers=server.workers, postgres=cluster.version(), uwsgi=uwsgi_version()
        )
    finally:
        if server is not None:
            server.stop()
        cluster.stop()
