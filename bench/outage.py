"""Section 7: a fleet of real agent services while Placement is down 30 s.

``AGENTS`` real ``node-agent`` service processes (the service loop of
node_agent/service/loop.py, default timing: 60 s cycles with jitter, a
full verify every 300 s, start-up splay, backoff on failure), each with its
own host name and state directory, report the synthetic host (root + 4
SR-IOV children) to a production-like Placement (bench/production.py:
uWSGI on PostgreSQL). All are started together. Once every agent has
registered and the fleet has run ``SETTLE`` seconds, Placement is stopped
for ``OUTAGE`` seconds and started again on the same port and database.

Measured: which agents noticed (their log says Placement could not be
used), when each logged that it was back to normal, Placement's requests
per second after the restart (its request log, one-second buckets), and
the requests each recovering agent sent from the restart until it was back
(attributed by the provider uuids or host name in each request's path).
"""

from __future__ import annotations

import datetime
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from bench import common, production, synthetic_host

AGENTS = 60
SETTLE = 30
OUTAGE = 30
HEAL_LIMIT = 300  # seconds after the restart to wait for every agent
PREFIX = "outage-"

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[.,]\d+)")
_REQUEST = re.compile(r'"(\w+) ([^ "]+)[^"]*" status: (\d+)')
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NAME = re.compile(r"name=([^&]+)")
NOTICED = "Placement cannot be used"
HEALED = "Placement is reachable again"


def _stamp(line: str) -> float | None:
    match = _STAMP.match(line)
    if not match:
        return None
    # Local-time log stamps of this machine; only their differences are used.
    return datetime.datetime.strptime(  # noqa: DTZ007
        match.group(1).replace(",", "."),
        "%Y-%m-%d %H:%M:%S.%f",
    ).timestamp()


def _config(work: Path, root: Path, shape, host: str, url: str, agent_opts: str) -> Path:
    specs = "".join(f"device_spec = {s}\n" for s in synthetic_host.device_specs(shape))
    config = work / f"{host}.conf"
    config.write_text(
        f"[DEFAULT]\nhost = {host}\n[agent]\nstate_path = {work / 'state' / host}\n"
        f"{agent_opts}"
        f"[host]\nsysfs_root = {root}\n[libvirt]\nconnection_uri =\n"
        f"[compute]\ninstances_path = {work}\n[pci]\n{specs}"
        f"[placement]\nauth_type = admin_token\ntoken = admin\n"
        f"endpoint_override = {url}\n"
    )
    return config


def _requests(log: Path, since: float) -> list[tuple[float, str, str, int]]:
    found = []
    with open(log, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            at = _stamp(line)
            match = _REQUEST.search(line)
            if at is not None and match and at >= since and "requestlog" in line:
                found.append((at, match.group(1), match.group(2), int(match.group(3))))
    return found


def _owners(server_url: str) -> dict[str, str]:
    """provider uuid -> agent host name, from Placement."""
    from node_agent.placement.client import PlacementClient

    client = PlacementClient.for_endpoint(server_url)
    providers = client.get("/resource_providers")["resource_providers"]
    names = {p["uuid"]: p["name"] for p in providers}
    return {
        p["uuid"]: names[p["root_provider_uuid"]]
        for p in providers
        if names.get(p["root_provider_uuid"], "").startswith(PREFIX)
    }


def _owner(path: str, owners: dict[str, str]) -> str | None:
    for uuid in _UUID.findall(path):
        if uuid in owners:
            return owners[uuid]
    name = _NAME.search(path)
    return name.group(1) if name else None


def _events(log: Path) -> dict[str, list[float]]:
    events: dict[str, list[float]] = {"noticed": [], "healed": []}
    for line in log.read_text(errors="replace").splitlines():
        at = _stamp(line)
        if at is None:
            continue
        if NOTICED in line:
            events["noticed"].append(at)
        elif HEALED in line:
            events["healed"].append(at)
    return events


def _registered(work: Path, hosts: list[str]) -> int:
    return sum(
        1
        for h in hosts
        if any((work / "state" / h).glob("*")) and "root_uuid" in _state_text(work / "state" / h)
    )


def _state_text(directory: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in directory.glob("*") if p.is_file())


def run(
    work: Path,
    agents: int = AGENTS,
    settle: float = SETTLE,
    outage: float = OUTAGE,
    agent_opts: str = "",
) -> dict:
    """``agent_opts``: extra ``[agent]`` lines (a quicker timing to try it)."""
    work.mkdir(parents=True, exist_ok=True)
    shape = synthetic_host.Shape()
    root = synthetic_host.build(work / "host", shape)
    cluster = production.PostgresCluster().start()
    server = None
    procs: list[subprocess.Popen] = []
    hosts = [f"{PREFIX}{i:03d}" for i in range(agents)]
    agent_bin = Path(sys.executable).with_name("node-agent")
    try:
        server = production.UwsgiPlacement(work / "placement", cluster.url).start()
        started = time.time()
        for host in hosts:
            config = _config(work, root, shape, host, server.url, agent_opts)
            with open(work / f"{host}.log", "wb") as out:
                procs.append(
                    subprocess.Popen(
                        [str(agent_bin), "--config-file", str(config)],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                )
        deadline = time.monotonic() + 600
        while _registered(work, hosts) < agents and time.monotonic() < deadline:
            time.sleep(2)
        registered_after = time.time() - started
        registered = _registered(work, hosts)
        time.sleep(settle)
        owners = _owners(server.url)

        down = time.time()
        server.stop()
        time.sleep(outage)
        restarted = time.time()
        server.start()
        up = time.time()

        noticed: dict[str, float] = {}
        healed: dict[str, float] = {}
        limit = time.monotonic() + HEAL_LIMIT
        while time.monotonic() < limit:
            for host in hosts:
                events = _events(work / f"{host}.log")
                after = [t for t in events["noticed"] if t >= down - 1]
                if after:
                    noticed[host] = after[0]
                back = [t for t in events["healed"] if t >= down]
                if back:
                    healed[host] = back[-1]
            if all(h in healed for h in noticed) and time.time() - up > 2 * outage:
                break
            time.sleep(5)
        end = max(healed.values(), default=up)
        requests = _requests(server.log, up)
        window = [r for r in requests if r[0] <= end + 1]
        per_second = Counter(int(r[0] - up) for r in window)
        per_agent: dict[str, int] = defaultdict(int)
        unattributed = 0
        for at, _method, path, _status in window:
            owner = _owner(path, owners)
            if owner in noticed and at <= healed.get(owner, end) + 0.5:
                per_agent[owner] += 1
            elif owner is None:
                unattributed += 1
        recovering = [per_agent.get(h, 0) for h in noticed]
        return {
            "agents": agents,
            "registered": registered,
            "registered_after": registered_after,
            "settle": settle,
            "outage": outage,
            "boot_seconds": up - restarted,
            "agent_opts": agent_opts,
            "noticed": len(noticed),
            "healed": sum(1 for h in noticed if h in healed),
            "heal_seconds": (
                common.summary([healed[h] - up for h in noticed if h in healed]) if healed else None
            ),
            "last_healed_after": end - up,
            "peak_rps": max(per_second.values(), default=0),
            "requests_after_restart": len(window),
            "unattributed": unattributed,
            "per_recovering_agent": common.summary(recovering) if recovering else None,
            "shapes": Counter(
                common.shape((m, p, s)) for _, m, p, s in window if _owner(p, owners) in noticed
            ).most_common(),
            "workers": server.workers,
            "postgres": cluster.version(),
        }
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if server is not None:
            server.stop()
        cluster.stop()
        shutil.rmtree(work / "state", ignore_errors=True)
