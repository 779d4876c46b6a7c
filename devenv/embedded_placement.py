"""A real OpenStack Placement on loopback, for tests and ``make run``.

It runs the installed ``openstack-placement`` package unchanged: SQLite
database, ``noauth2`` (the token ``admin`` gets the admin role) and a policy
file that lets that admin use ``POST /reshaper``, whose default rule asks for
the ``service`` role. Nothing here is fit for production.

Usage::

    python -m devenv.embedded_placement --workdir DIR [--port N] [--port-file F]

Files in the work directory: ``placement.conf``, ``policy.yaml``,
``placement.sqlite``, ``placement.log`` (one INFO line per request, written by
placement's request log) and ``server.out`` (the subprocess's own output).
"""

from __future__ import annotations

import argparse
import os
import signal
import socketserver
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from wsgiref import simple_server

CONFIG_FILE = "placement.conf"  # the name placement.wsgi looks for
POLICY_FILE = "policy.yaml"
LOG_FILE = "placement.log"
PORT_FILE = "port"

# placement's default for this rule is role:service; the embedded server
# authenticates everyone as admin, so the reshaper would otherwise be closed.
POLICY = '"placement:reshaper:reshape": "role:admin or role:service"\n'


def _config_text(
    workdir: Path, database_url: str | None = None, placement_options: dict | None = None
) -> str:
    connection = database_url or f"sqlite:///{workdir / 'placement.sqlite'}"
    # [placement] options of placement itself (max_allocation_candidates...),
    # for the allocation-candidates benchmark.
    extra = "".join(f"{k} = {v}\n" for k, v in (placement_options or {}).items())
    return (
        "[DEFAULT]\n"
        f"log_dir = {workdir}\n"
        f"log_file = {LOG_FILE}\n"
        "debug = False\n"
        "\n[api]\n"
        "auth_strategy = noauth2\n"
        "\n[placement_database]\n"
        f"connection = {connection}\n"
        "\n[oslo_policy]\n"
        f"policy_file = {workdir / POLICY_FILE}\n" + (f"\n[placement]\n{extra}" if extra else "")
    )


def prepare(
    workdir: Path, database_url: str | None = None, placement_options: dict | None = None
) -> Path:
    """Write the config and policy files and create or upgrade the database.

    ``database_url`` (an SQLAlchemy URL, e.g. PostgreSQL for ``make bench``)
    replaces the SQLite file. Idempotent: a second call keeps the database.
    Returns the config path.
    """
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / POLICY_FILE).write_text(POLICY)
    config = workdir / CONFIG_FILE
    config.write_text(_config_text(workdir, database_url, placement_options))
    manage = Path(sys.executable).parent / "placement-manage"
    result = subprocess.run(
        [str(manage), "--config-file", str(config), "db", "sync"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"placement-manage db sync failed ({result.returncode}):\n{result.stderr.strip()}"
        )
    return config


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    daemon_threads = True

    def server_bind(self):
        # WSGIServer's version resolves the host's FQDN, which can stall for
        # seconds on a machine without DNS; loopback needs no name.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = host
        self.server_port = port
        self.setup_environ()


class _QuietHandler(simple_server.WSGIRequestHandler):
    def log_message(self, format, *args):
        """Placement's request log already records every request."""


def make_server(workdir: Path, host: str = "127.0.0.1", port: int = 0) -> simple_server.WSGIServer:
    """Load placement's WSGI app from ``workdir`` (after :func:`prepare`) and
    bind a threaded server; ``port=0`` picks a free port (``server_port``)."""
    workdir = Path(workdir).resolve()
    os.environ["OS_PLACEMENT_CONFIG_DIR"] = str(workdir)
    # oslo.config would otherwise read our own command line as placement's.
    sys.argv = sys.argv[:1]
    from placement import wsgi  # imported late: heavy, and reads env

    app = wsgi.init_application()
    server = _ThreadingWSGIServer((host, port), _QuietHandler)
    server.set_app(app)
    return server


def serve(workdir: Path, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve placement from ``workdir`` in this process until interrupted."""
    server = make_server(workdir, host, port)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devenv.embedded_placement",
        description="Run a throw-away Placement (SQLite, noauth2) on loopback.",
    )
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path, help="write the chosen port here once listening")
    parser.add_argument("--database-url", help="SQLAlchemy URL instead of the SQLite file")
    parser.add_argument(
        "--placement-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of placement's own [placement] section (repeatable)",
    )
    args = parser.parse_args(argv)

    options = dict(o.split("=", 1) for o in args.placement_option)
    prepare(args.workdir, args.database_url, options)
    server = make_server(args.workdir, args.host, args.port)
    url = f"http://{args.host}:{server.server_port}"
    if args.port_file:
        _write_atomically(args.port_file, f"{server.server_port}\n")
    print(f"placement listening on {url} (token: admin)", flush=True)
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


class EmbeddedPlacement:
    """A placement subprocess; ``restart`` keeps its port and database."""

    def __init__(
        self,
        workdir: Path,
        port: int = 0,
        host: str = "127.0.0.1",
        timeout: float = 90,
        detach: bool = False,
        database_url: str | None = None,
        placement_options: dict | None = None,
    ):
        # detach: own session, so the server outlives the command that started it.
        self.detach = detach
        self.database_url = database_url
        self.placement_options = dict(placement_options or {})
        self.workdir = Path(workdir).resolve()
        self.host = host
        self.port = port
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "EmbeddedPlacement":
        self.workdir.mkdir(parents=True, exist_ok=True)
        port_file = self.workdir / PORT_FILE
        port_file.unlink(missing_ok=True)
        command = [
            sys.executable,
            "-m",
            "devenv.embedded_placement",
            "--workdir",
            str(self.workdir),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--port-file",
            str(port_file),
        ]
        if self.database_url:
            command += ["--database-url", self.database_url]
        for key, value in self.placement_options.items():
            command += ["--placement-option", f"{key}={value}"]
        with open(self.workdir / "server.out", "ab") as out:
            self.proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=self.detach,
            )
        self.port = self._wait_for_port(port_file)
        self._wait_until_answering()
        return self

    def _deadline_check(self, deadline: float, what: str) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"embedded placement exited with {self.proc.returncode} "
                f"while {what}; see {self.workdir / 'server.out'}"
            )
        if time.monotonic() > deadline:
            self.kill()
            raise RuntimeError(
                f"embedded placement not ready after {self.timeout}s while "
                f"{what}; see {self.workdir / 'server.out'}"
            )

    def _wait_for_port(self, port_file: Path) -> int:
        deadline = time.monotonic() + self.timeout
        while not port_file.exists():
            self._deadline_check(deadline, "starting")
            time.sleep(0.05)
        return int(port_file.read_text())

    def _wait_until_answering(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + "/", timeout=2):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                self._deadline_check(deadline, f"waiting for GET {self.url}/")
                time.sleep(0.05)

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM, then SIGKILL if it does not exit within ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: a crash, as far as clients can tell."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> "EmbeddedPlacement":
        self.stop()
        return self.start()


def start_subprocess(
    workdir: Path,
    timeout: float = 90,
    port: int = 0,
    host: str = "127.0.0.1",
    detach: bool = False,
    database_url: str | None = None,
    placement_options: dict | None = None,
) -> EmbeddedPlacement:
    """Start placement in a child process and wait until ``GET /`` answers.
    ``database_url`` (SQLAlchemy URL) replaces the SQLite file;
    ``placement_options`` go to placement's own ``[placement]`` section."""
    return EmbeddedPlacement(
        workdir,
        port=port,
        host=host,
        timeout=timeout,
        detach=detach,
        database_url=database_url,
        placement_options=placement_options,
    ).start()


if __name__ == "__main__":
    sys.exit(main())
