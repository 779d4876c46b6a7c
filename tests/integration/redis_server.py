"""A throw-away Redis for the appliers' coordination tests: Debian's
redis-server on a free loopback port, nothing saved to disk.

``redis_url`` (per test) yields ``redis://127.0.0.1:PORT``.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.rabbit import free_port
from tests.real_parts import skip_or_fail

SERVER = Path("/usr/bin/redis-server")
START_TIMEOUT = 30


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            sock.settimeout(2)
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, base: Path):
        self.base = base
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> "RedisServer":
        # The server holds its own copy of the descriptor; ours closes here.
        with open(self.base / "redis.out", "wb") as out:
            self.proc = subprocess.Popen(
                [
                    str(SERVER),
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.base),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers_ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start; see {self.base}/redis.out")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def redis_url(tmp_path):
    if not SERVER.exists() or shutil.which("redis-server") is None:
        skip_or_fail("Debian's redis-server is not installed (apt-get install redis-server)")
    base = tmp_path / "redis"
    base.mkdir()
    server = RedisServer(base).start()
    yield server.url
    server.stop()
