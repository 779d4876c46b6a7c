"""A throw-away RabbitMQ for the messaging tests: Debian's rabbitmq-server,
started by the suite on free ports with its own data, logs, node name and
Erlang cookie, so it never touches the machine's own broker (5672).

``rabbitmq`` (session) yields the transport URL,
``rabbit://guest:guest@127.0.0.1:PORT/`` (guest may log in from loopback).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.real_parts import skip_or_fail

SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
CTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
START_TIMEOUT = 60
# AMQP 0-9-1 protocol header; a ready broker answers it with Connection.Start.
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _environment(base: Path, node: str, port: int, dist_port: int, extra: str = "") -> dict:
    home = base / "home"
    home.mkdir(parents=True)
    cookie = home / ".erlang.cookie"
    cookie.write_text(f"natest{os.getpid()}{port}")
    cookie.chmod(0o400)
    (base / "rabbitmq.conf").write_text(
        f"listeners.tcp.1 = 127.0.0.1:{port}\nloopback_users.guest = true\n" + extra
    )
    (base / "enabled_plugins").write_text("[].\n")
    (base / "env.conf").write_text("")
    env = dict(os.environ)
    env.update(
        {
            "HOME": str(home),
            "RABBITMQ_NODENAME": node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "env.conf"),
            "RABBITMQ_PID_FILE": str(base / "rabbit.pid"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
    )
    return env


def _answers_amqp(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(AMQP_HEADER)
            sock.settimeout(2)
            return len(sock.recv(8)) > 0
    except OSError:
        return False


def make_ca(base: Path) -> dict:
    """A private CA and a server certificate for 127.0.0.1 signed by it
    (openssl); paths by role."""
    files = {k: base / f"{k}.pem" for k in ("ca", "ca_key", "cert", "key", "csr")}

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=node-agent test CA",
        "-keyout",
        str(files["ca_key"]),
        "-out",
        str(files["ca"]),
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        str(files["key"]),
        "-out",
        str(files["csr"]),
    )
    extensions = base / "san.cnf"
    extensions.write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")
    openssl(
        "x509",
        "-req",
        "-in",
        str(files["csr"]),
        "-CA",
        str(files["ca"]),
        "-CAkey",
        str(files["ca_key"]),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        str(extensions),
        "-out",
        str(files["cert"]),
    )
    return files


class Broker:
    def __init__(self, base: Path, tls: dict | None = None):
        """``tls``: :func:`make_ca`'s files; the broker then also listens
        with TLS on ``tls_port`` (the plain port stays for the readiness
        check)."""
        self.base = base
        self.port = free_port()
        self.tls_port = free_port() if tls else None
        self.node = f"na-test-{os.getpid()}-{self.port}@localhost"
        extra = (
            ""
            if not tls
            else (
                f"listeners.ssl.1 = 127.0.0.1:{self.tls_port}\n"
                f"ssl_options.cacertfile = {tls['ca']}\n"
                f"ssl_options.certfile = {tls['cert']}\n"
                f"ssl_options.keyfile = {tls['key']}\n"
                "ssl_options.verify = verify_none\n"
                "ssl_options.fail_if_no_peer_cert = false\n"
            )
        )
        self.env = _environment(base, self.node, self.port, free_port(), extra)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"rabbit://guest:guest@127.0.0.1:{self.port}/"

    @property
    def tls_url(self) -> str:
        return f"rabbit://guest:guest@127.0.0.1:{self.tls_port}/"

    def start(self) -> "Broker":
        # The broker holds its own copy of the descriptor; ours closes here.
        with open(self.base / "server.out", "wb") as out:
            self.proc = subprocess.Popen(
                [str(SERVER)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(self.base),
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers_amqp(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"rabbitmq-server did not start; see "
                    f"{self.base / 'server.out'} and {self.base / 'log'}"
                )
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        subprocess.run(
            [str(CTL), "-n", self.node, "stop"],
            env=self.env,
            capture_output=True,
            timeout=30,
            check=False,
        )
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory):
    if not SERVER.exists() or shutil.which("erl") is None:
        skip_or_fail("Debian's rabbitmq-server is not installed (apt-get install rabbitmq-server)")
    broker = Broker(tmp_path_factory.mktemp("rabbitmq")).start()
    yield broker.url
    broker.stop()
