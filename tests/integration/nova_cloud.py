"""nova 34's own services beside the agent, for tests/integration/test_nova_cloud.py.

Everything nova runs is nova's, unchanged, from ``.venv-nova``: ``nova-manage``
builds its databases (the API database, cell0 and cell1, in the suite's
throw-away PostgreSQL),
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
PROJECT = "8f6c1a2e00004000800000000000000a"
USER = "5d1e7b3c00004000800000000000000b"
MICROVERSION = "2.96"


def unavailable_reason() -> Optional[str]:
    """Why nova's services cannot run here, or None."""
    missing = [
        n for n in ("nova-compute", "nova-conductor", "nova-manage") if not (NOVA_BIN / n).exists()
    ]
    if missing:
        return f"{NOVA_VENV} has no {', '.join(missing)}: `make nova-venv` builds nova 34 there"
    import shutil

    if shutil.which("qemu-img") is None:
        return "qemu-img not installed (qemu-utils): nova's image backend runs it"
    probe = subprocess.run(
        [str(NOVA_BIN / "python"), "-c", "import libvirt"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return (
            f"{NOVA_VENV} lacks libvirt-python, which nova's libvirt driver imports: "
            "`make nova-venv` installs it (bench/requirements-nova.txt)"
        )
    return None


def nova_env(shims: Optional[Path] = None) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # nothing of ours on nova's path
    env["PATH"] = ":".join(
        [str(p) for p in (shims, NOVA_BIN) if p is not None] + [env.get("PATH", "")]
    )
    return env


class NovaCloud:
    """nova's databases, services and API under ``base``."""

    def __init__(
        self,
        base: Path,
        *,
        placement_url: str,
        transport_url: str,
        libvirt_uri: str,
        glance_url: str = "",
        database_url: str = "",
        compute: str = "",
    ):
        self.base = Path(base)
        self.placement_url = placement_url
        self.transport_url = transport_url
        self.libvirt_uri = libvirt_uri
        self.glance_url = glance_url
        # postgresql://user@host:port/ (databases nova_api, nova, nova_cell0
        # must exist): SQLite, nova's default for tests, fails builds with
        # "database is locked" once the API, conductor and scheduler write at once.
        self.database_url = database_url
        self.api_url = ""
        self.host = socket.gethostname()
        self.conf = self.base / "nova.conf"
        self.logs = self.base / "log"
        self.base.mkdir(parents=True, exist_ok=True)
        # nova starts oslo.privsep's helper as `sudo nova-rootwrap
        # /etc/nova/rootwrap.conf privsep-helper ...`; the services run as
        # root already (libvirtd's guests are root's), the machine may have
        # no sudo and has no /etc/nova: the shim runs the helper itself.
        self.shims = self.base / "bin"
        self.shims.mkdir(exist_ok=True)
        (self.shims / "sudo").write_text(
            '#!/bin/sh\n[ "$1" = nova-rootwrap ] && shift 2\nexec "$@"\n'
        )
        (self.shims / "sudo").chmod(0o755)
        (self.base / "api-paste.ini").write_text(API_PASTE)
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
            f"connection = {self.database_url}nova_api\n"
            "[database]\n"
            f"connection = {self.database_url}nova\n"
            "[oslo_concurrency]\n"
            f"lock_path = {db / 'locks'}\n"
            f"[compute]\n{compute}"
            "[libvirt]\n"
            "virt_type = qemu\n"
            f"connection_uri = {self.libvirt_uri}\n"
            "[vnc]\nenabled = False\n"
            f"[wsgi]\napi_paste_config = {db / 'api-paste.ini'}\n"
            f"[glance]\napi_servers = {self.glance_url}\n"
            "[neutron]\nauth_type = admin_token\ntoken = admin\n"
            f"endpoint_override = {self.glance_url}\n"
            "[scheduler]\ndiscover_hosts_in_cells_interval = -1\nworkers = 1\n"
            "[filter_scheduler]\nenabled_filters = ComputeFilter, ImagePropertiesFilter, "
            "NUMATopologyFilter\n"
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
            env=nova_env(self.shims),
            timeout=300,
        )
        if run.returncode != 0:
            raise RuntimeError(
                f"nova-manage {' '.join(args)} exited {run.returncode}:\n"
                f"{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
            )
        return run.stdout

    def discover_hosts(self) -> None:
        self.manage("cell_v2", "discover_hosts", "--verbose")

    def create_databases(self) -> None:
        self.manage("api_db", "sync")
        self.manage(
            "cell_v2",
            "map_cell0",
            "--database_connection",
            f"{self.database_url}nova_cell0",
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
                env=nova_env(self.shims),
            )
        self.procs[name] = proc
        return proc

    def start_api(self) -> str:
        """nova-api (compute API) on a free loopback port; returns its URL."""
        port_file = self.base / "api.port"
        port_file.unlink(missing_ok=True)
        env = nova_env(self.shims)
        env.update(
            OS_NOVA_CONFIG_DIR=str(self.base), OS_NOVA_CONFIG_FILES="api-paste.ini;nova.conf"
        )
        with open(self.logs / "nova-api.out", "ab") as out:
            self.procs["nova-api"] = subprocess.Popen(
                [str(NOVA_BIN / "python"), "-c", API_SERVER, str(port_file)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        port = self.wait_for(
            lambda: port_file.exists() and port_file.read_text(), "nova-api", "nova-api"
        )
        self.api_url = f"http://127.0.0.1:{port}/v2.1"
        return self.api_url

    def api(self, method: str, path: str, body: Optional[dict] = None) -> dict:
        """One compute API call as an admin of PROJECT, at microversion 2.latest
        (the identity headers keystonemiddleware would set)."""
        import json
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            self.api_url + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={
                "Content-Type": "application/json",
                "X-Auth-Token": "admin",
                # keystonemiddleware always sets the names too; without them
                # nova writes an empty <nova:owner/> into the domain.
                "X-User-Id": USER,
                "X-User-Name": "demo",
                "X-Project-Id": PROJECT,
                "X-Project-Name": "demo",
                "X-Roles": "admin,member,reader",
                "X-Identity-Status": "Confirmed",
                "OpenStack-API-Version": f"compute {MICROVERSION}",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"{method} {path}: {error.code} {error.read()[:2000]!r}") from None
        return json.loads(text) if text else {}

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


# -- nova-api: nova's own WSGI application (nova.wsgi.osapi_compute) under
# wsgiref, in .venv-nova. Its paste pipeline is nova's api-paste.ini less
# keystonemiddleware's authtoken: the caller sends the identity headers that
# authtoken would set (nova 34 has no noauth2 any more).
API_PASTE = """\
[composite:osapi_compute]
use = call:nova.api.openstack.urlmap:urlmap_factory
/v2.1: openstack_compute_api_v21

[composite:openstack_compute_api_v21]
use = call:nova.api.auth:pipeline_factory_v21
keystone = compute_req_id faultwrap request_log sizelimit keystonecontext osapi_compute_app_v21

[filter:request_log]
paste.filter_factory = nova.api.openstack.requestlog:RequestLog.factory

[filter:compute_req_id]
paste.filter_factory = nova.api.compute_req_id:ComputeReqIdMiddleware.factory

[filter:faultwrap]
paste.filter_factory = nova.api.openstack:FaultWrapper.factory

[filter:sizelimit]
paste.filter_factory = oslo_middleware:RequestBodySizeLimiter.factory

[filter:keystonecontext]
paste.filter_factory = nova.api.auth:NovaKeystoneContext.factory

[app:osapi_compute_app_v21]
paste.app_factory = nova.api.openstack.compute:APIRouterV21.factory
"""

API_SERVER = """\
import os, socketserver, sys
port_file = sys.argv.pop()  # nova's config parser reads sys.argv
from wsgiref import simple_server

class Server(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    daemon_threads = True

class Quiet(simple_server.WSGIRequestHandler):
    def log_message(self, *args):
        pass

from nova.wsgi.osapi_compute import application
server = simple_server.make_server("127.0.0.1", 0, application, Server, Quiet)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_port))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
"""


class ImageService:
    """The lightest glance nova's glance client accepts: one raw image of
    1 MiB of zeros (a guest with nothing to boot idles in its BIOS), served
    over HTTP from this process: GET /v2/images/<id>, its /file and the image
    schema glanceclient asks for. Also the lightest neutron: every list is
    empty (the guests have ``networks: none``; nova still asks neutron for
    their ports and security groups when it shows a server). Neither glance
    nor neutron is one of the parts under test."""

    IMAGE_ID = "a1b2c3d4-0000-4000-8000-00000000000c"
    DATA = b"\0" * (1024 * 1024)

    def __init__(self):
        import http.server
        import json
        import threading

        image = {
            "id": self.IMAGE_ID,
            "name": "zeros",
            "status": "active",
            "visibility": "public",
            "disk_format": "raw",
            "container_format": "bare",
            "size": len(self.DATA),
            "min_disk": 0,
            "min_ram": 0,
            "protected": False,
            "tags": [],
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
            "owner": PROJECT,
        }
        # nova keeps the schema's properties as the image's own attributes,
        # anything else as the image's properties.
        schema = {
            "name": "image",
            "properties": {name: {} for name in image},
            "additionalProperties": {"type": "string"},
        }
        data = self.DATA
        versions = {"versions": []}

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                path = self.path.split("?")[0].rstrip("/")
                if path == f"/v2/images/{image['id']}":
                    self._send(json.dumps(image).encode(), "application/json")
                elif path == f"/v2/images/{image['id']}/file":
                    self._send(data, "application/octet-stream")
                elif path == "/v2/schemas/image":
                    self._send(json.dumps(schema).encode(), "application/json")
                elif path == "":
                    self._send(json.dumps(versions).encode(), "application/json")
                elif path.startswith("/v2.0/"):
                    # neutron: nothing of any kind (networks: none).
                    kind = path.rsplit("/", 1)[1].replace("-", "_")
                    self._send(json.dumps({kind: []}).encode(), "application/json")
                else:
                    self._send(b'{"error": "not found"}', "application/json", 404)

            def _send(self, body: bytes, kind: str, code: int = 200):
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        versions["versions"].append(
            {
                "id": "v2.0",
                "status": "CURRENT",
                "links": [{"rel": "self", "href": self.url + "/v2.0/"}],
            }
        )
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
