"""``make run``: the agent against an embedded Placement, on this machine's real sysfs.

1. starts (or reuses) a local Placement: SQLite, loopback, noauth2;
2. writes ``run/node-agent.conf`` pointing at it, with ``qemu:///system``
   when a local libvirtd answers there (read-only), otherwise sysfs alone,
   and says which (``NODE_AGENT_LIBVIRT_URI`` asks another URI instead);
3. runs ``node-agent --once`` and shows what it reported;
4. reads the tree back with osc-placement (``openstack resource provider ...``);
5. says how to stop the server.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from devenv.embedded_placement import start_subprocess

RUN = Path("run").resolve()
PLACEMENT_DIR = RUN / "placement"
PID_FILE = PLACEMENT_DIR / "server.pid"
URL_FILE = PLACEMENT_DIR / "url"
LIBVIRT_URI = os.environ.get("NODE_AGENT_LIBVIRT_URI", "qemu:///system")


def _answering(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/", timeout=2):
            return True
    except OSError:
        return False


def ensure_placement() -> str:
    if URL_FILE.exists() and _answering(URL_FILE.read_text().strip()):
        url = URL_FILE.read_text().strip()
        print(f"Reusing the embedded Placement at {url}")
        return url
    server = start_subprocess(PLACEMENT_DIR, detach=True)
    PID_FILE.write_text(f"{server.proc.pid}\n")
    URL_FILE.write_text(server.url + "\n")
    print(
        f"Started an embedded Placement at {server.url} (pid {server.proc.pid}, "
        f"SQLite in {PLACEMENT_DIR})"
    )
    return server.url


def libvirt_uri(uri: str = LIBVIRT_URI) -> tuple[str, str]:
    """``(uri, what was found)``: ``uri`` when a libvirtd answers there
    read-only (as the agent will connect), else "" (sysfs alone) and why."""
    from node_agent.errors import DiscoveryError
    from node_agent.host.hypervisor import Hypervisor

    try:
        with Hypervisor(uri) as hypervisor:
            hypervisor.capabilities_xml()
    except DiscoveryError as exc:
        reason = " ".join(str(exc).split())  # one line: it also goes into a comment
        return "", f"no libvirtd answers ({reason}); using sysfs alone: no guests, no CPU model"
    return uri, f"a local libvirtd answers at {uri}; using it (read-only)"


def write_config(url: str) -> Path:
    instances = RUN / "instances"
    instances.mkdir(parents=True, exist_ok=True)
    uri, found = libvirt_uri()
    print(f"libvirt: {found}")
    config = RUN / "node-agent.conf"
    config.write_text(
        "# Written by `make run`: the agent against the embedded Placement.\n"
        f"[DEFAULT]\nhost = {socket.gethostname()}\n[agent]\nstate_path = {RUN / 'state'}\n"
        "[host]\nsysfs_root = /sys\n"
        f"[libvirt]\n# {found}\nconnection_uri = {uri}\n"
        f"[compute]\ninstances_path = {instances}\n"
        "[placement]\nauth_type = admin_token\ntoken = admin\n"
        f"endpoint_override = {url}\n"
    )
    return config


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def show_placement(url: str, host: str) -> None:
    osc = [
        _bin("openstack"),
        "--os-auth-type",
        "admin_token",
        "--os-token",
        "admin",
        "--os-endpoint",
        url,
        "--os-placement-api-version",
        "1.37",
    ]
    if not shutil.which(osc[0]):
        print("(osc-placement is not installed; skipping the read-back)")
        return
    listing = subprocess.run(
        osc + ["resource", "provider", "list", "--name", host, "-f", "json"],
        capture_output=True,
        text=True,
    )
    providers = json.loads(listing.stdout or "[]")
    if not providers:
        print(listing.stderr)
        return
    uuid = providers[0]["uuid"]
    print(f"\nWhat Placement now holds (osc-placement), provider {host} {uuid}:")
    for args in (
        ["resource", "provider", "inventory", "list", uuid],
        ["resource", "provider", "trait", "list", uuid],
    ):
        subprocess.run(osc + args, check=False)


def main() -> int:
    url = ensure_placement()
    config = write_config(url)
    print(f"Config: {config}\n\n$ node-agent --config-file {config} --once")
    code = subprocess.call([_bin("node-agent"), "--config-file", str(config), "--once"])
    if code != 0:
        print(f"node-agent exited with {code}")
        return code
    show_placement(url, socket.gethostname())
    print(
        f"\nThe embedded Placement keeps running at {url}. Stop it with:\n"
        f"    make stop        (or: kill $(cat {PID_FILE}))\n"
        f"Run the agent again: .venv/bin/node-agent --config-file {config} --once"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
