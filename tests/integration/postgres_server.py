"""A throw-away PostgreSQL cluster for the appliers' coordination tests:
``initdb`` in a temporary directory, ``pg_ctl`` on a free loopback port with
its unix socket in that directory; removed afterwards. The machine's own
PostgreSQL (5432) is never used.

``postgres_url`` (per test) yields ``postgresql://postgres@127.0.0.1:PORT/coordination``.
PostgreSQL refuses to run as root: as root, the cluster is the ``postgres``
user's (``runuser``), in a directory of its own outside pytest's (whose
parents are root's, mode 0700).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.integration.rabbit import free_port
from tests.real_parts import skip_or_fail

DATABASE = "coordination"
START_TIMEOUT = 120


def _pg_bin(name: str) -> str | None:
    for version in sorted(Path("/usr/lib/postgresql").glob("*"), reverse=True):
        if (version / "bin" / name).exists():
            return str(version / "bin" / name)
    return shutil.which(name)


class PostgresCluster:
    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="node-agent-coordination-pg-"))
        self.port = free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def _run(self, name: str, *args: str) -> None:
        done = subprocess.run(
            self.as_user + [str(_pg_bin(name)), *args],
            cwd=self.dir,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{name} failed: {done.stderr.strip() or done.stdout}")

    def start(self) -> "PostgresCluster":
        data = self.dir / "data"
        self._run(
            "initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(data),
            "-l",
            str(self.dir / "server.log"),
            "-w",
            "-t",
            str(START_TIMEOUT),
            "-o",
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c fsync=off",
            "start",
        )
        self.createdb(DATABASE)
        return self

    def createdb(self, name: str) -> None:
        self._run("createdb", "-h", str(self.dir), "-p", str(self.port), "-U", "postgres", name)

    def log(self) -> str:
        path = self.dir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        try:
            if (self.dir / "data" / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def postgres_cluster():
    if _pg_bin("initdb") is None or _pg_bin("pg_ctl") is None:
        skip_or_fail("PostgreSQL's server binaries are not installed (apt-get install postgresql)")
    cluster = PostgresCluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def postgres_url(postgres_cluster) -> str:
    return postgres_cluster.url
