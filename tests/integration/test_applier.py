"""``[agent] upstream = messaging`` end to end: real ``node-agent-applier``
processes on a real RabbitMQ, writing to the real Placement; agents are
threads using :mod:`node_agent.remote.upstream` with real fixture hosts.

Each test uses its own topic and applier state directory, so queues and
per-host records of other tests never mix in.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from oslo_config import cfg

from node_agent.cycle.desired import compute_desired
from node_agent.cycle.reconcile import Reconciler
from node_agent.model.provider_state import inventories_equal
from node_agent.placement.client import PlacementClient
from node_agent.placement.planner import wanted_inventories
from node_agent.placement.sync import TreeSyncer
from node_agent.remote import messaging, signing, upstream, wire
from node_agent.state import StateStore
from tests import promlint
from tests.hostdata import sysfs_root_for, sysfs_trees
from tests.integration.rabbit import free_port
from tests.integration.reshape_driver import (
    Host,
    allocate,
    boot_legacy_guests,
    cpu_view,
    expected_after_reshape,
)
from tests.integration.test_nested_reshape import GPU1, GPU2, MDEV_TYPE, NestedHost, guest, prefix
from tests.snapshots import settings as make_settings

pytestmark = pytest.mark.integration

APPLIER = Path(sys.executable).with_name("node-agent-applier")
AGENTS = 20
TIMEOUT = 5.0
# oslo.messaging's consumer loops (the appliers' listeners, the senders'
# reply waiters) see a stop only between two polls of the broker, and an
# idle loop's poll grows to 5 s, or threshold / rate / 2 s if that is less:
# 0.25 s here, so each test's teardown does not wait seconds on idle sockets.
# The broker still waits 30 s before it drops a silent connection.
QUICK_STOP = "heartbeat_timeout_threshold = 30\nheartbeat_rate = 60\n"


class ApplierProcess:
    def __init__(self, config: Path, log: Path):
        self.log_path = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(APPLIER), "--config-file", str(config)], stdout=out, stderr=subprocess.STDOUT
            )

    def log(self) -> str:
        return self.log_path.read_text()

    @property
    def server(self) -> str:
        """The name of this process's own queue (node-agent-applier's
        ``server=``): a call prepared with it reaches this process only."""
        return f"{socket.gethostname()}-{self.proc.pid}"

    def wait_listening(self, timeout: float = 30) -> "ApplierProcess":
        deadline = time.monotonic() + timeout
        while "listening on topic" not in self.log():
            assert self.proc.poll() is None, f"applier exited:\n{self.log()}"
            assert time.monotonic() < deadline, f"applier not listening:\n{self.log()}"
            time.sleep(0.1)
        return self

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Bus:
    """One test's topic, applier config and applier processes."""

    def __init__(self, tmp_path: Path, transport_url: str, placement_url: str, rabbit: str = ""):
        """``rabbit``: lines of ``[oslo_messaging_rabbit]`` (TLS) for the
        appliers and the agents alike."""
        self.tmp = tmp_path
        self.url = transport_url
        self.rabbit = QUICK_STOP + rabbit
        self.topic = f"node-agent-applier-{uuid.uuid4().hex[:8]}"
        self.state = tmp_path / "applier-state"
        self.config = tmp_path / "applier.conf"
        self.master_file = tmp_path / "master.key"
        self.master_file.write_text(uuid.uuid4().hex + uuid.uuid4().hex + "\n")
        self.master_file.chmod(0o600)
        self.placement_url = placement_url
        self.write_config()
        self.appliers: list[ApplierProcess] = []
        self.senders: list[upstream.MessagingUpstream] = []

    def write_config(
        self,
        applier: str = "",
        path: Path | None = None,
        state: Path | None = None,
        placement_url: str | None = None,
    ) -> Path:
        """The appliers' config; ``applier``: more lines of ``[applier]``."""
        path = path or self.config
        path.write_text(
            f"[DEFAULT]\ntransport_url = {self.url}\n"
            f"[applier]\ntopic = {self.topic}\nstate_path = {state or self.state}\n"
            + ("" if re.search(r"^lock_timeout *=", applier, re.M) else "lock_timeout = 3\n")
            + f"master_key_file = {self.master_file}\n{applier}"
            "[placement]\nauth_type = admin_token\ntoken = admin\n"
            f"endpoint_override = {placement_url or self.placement_url}\n"
            f"[oslo_messaging_rabbit]\n{self.rabbit}"
        )
        return path

    def start(
        self, count: int, applier: str | None = None, placement_url: str | None = None
    ) -> list[ApplierProcess]:
        """``count`` processes; with ``applier`` (more ``[applier]`` lines)
        or ``placement_url``, each its own config and empty state directory."""
        new = []
        for n in range(len(self.appliers), len(self.appliers) + count):
            config = self.config
            if applier is not None or placement_url is not None:
                config = self.write_config(
                    applier or "",
                    self.tmp / f"applier-{n}.conf",
                    self.tmp / f"applier-state-{n}",
                    placement_url,
                )
            new.append(ApplierProcess(config, self.tmp / f"applier-{n}.log"))
        self.appliers += new
        for process in new:
            process.wait_listening()
        return new

    def key(self, host: str) -> bytes:
        """What ``node-agent-applier derive-key host`` provisions."""
        return signing.host_key(self.master_file.read_text().strip().encode(), host)

    def sender(self, host: str, timeout: float = TIMEOUT) -> upstream.MessagingUpstream:
        sender = upstream.MessagingUpstream(
            self.conf(), host, self.topic, timeout, key=self.key(host)
        )
        self.senders.append(sender)
        return sender

    def conf(self):
        conf = cfg.ConfigOpts()
        agent_conf = self.tmp / "agent-messaging.conf"
        agent_conf.write_text(f"[oslo_messaging_rabbit]\n{self.rabbit}")
        conf(["--config-file", str(agent_conf)])
        messaging.register(conf)
        conf.set_override("transport_url", self.url)
        return conf

    def stop(self) -> None:
        # Every applier and every sender takes a moment to stop polling the
        # broker: all of them at once.
        for process in self.appliers:
            process.terminate()
        closing = [threading.Thread(target=s.close) for s in self.senders]
        for thread in closing:
            thread.start()
        for thread in closing:
            thread.join(30)
        for process in self.appliers:
            process.stop()


@pytest.fixture
def bus(tmp_path, rabbitmq, placement_server):
    bus = Bus(tmp_path, rabbitmq, placement_server.url)
    yield bus
    bus.stop()


class FixtureAgent:
    """An agent in messaging mode on one fixture host (a thread's worth)."""

    def __init__(self, bus: Bus, name: str, system_dir: Path, base: Path, reserved=512):
        base.mkdir(parents=True)
        self.name = name
        self.settings = make_settings(
            host=name,
            sysfs_root=str(sysfs_root_for(system_dir, base)),
            instances_path=str(base),
            state_path=str(base / "state"),
            reserved_host_memory_mb=reserved,
        )
        self.upstream = bus.sender(name)
        self.desired = compute_desired(self.settings)

    def reserve(self, reserved: int) -> None:
        from dataclasses import replace

        self.settings = replace(self.settings, reserved_host_memory_mb=reserved)
        self.desired = compute_desired(self.settings)

    def cycle(self) -> upstream.UpstreamReport:
        return self.upstream.send(self.desired)

    def cycle_until_ok(self, deadline: float, failures: list) -> upstream.UpstreamReport:
        """What the service does: an outage is retried (here without backoff)."""
        while True:
            try:
                return self.cycle()
            except upstream.NoApplier as exc:
                failures.append(str(exc))
                assert time.monotonic() < deadline, f"{self.name}: {exc}"
                time.sleep(0.2)


def fixture_hosts(count: int):
    trees = sysfs_trees()
    return [trees[n % len(trees)] for n in range(count)]


def make_agents(bus: Bus, count: int, tag: str) -> list[FixtureAgent]:
    return [
        FixtureAgent(bus, f"{tag}-{uuid.uuid4().hex[:6]}-{n}", tree, bus.tmp / "agents" / f"{n}")
        for n, tree in enumerate(fixture_hosts(count))
    ]


def in_threads(agents, work) -> dict:
    results, errors = {}, []

    def run(agent):
        try:
            results[agent.name] = work(agent)
        except BaseException as exc:  # reported below, with the host's name
            errors.append(f"{agent.name}: {exc!r}")

    threads = [threading.Thread(target=run, args=(a,)) for a in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, "\n".join(errors)
    return results


def root_of(client, name: str) -> dict:
    found = client.get(f"/resource_providers?name={name}")["resource_providers"]
    assert found, f"{name} is not in Placement"
    return found[0]


def allocations(client, consumers) -> dict:
    """consumer -> provider -> resources (generations left out: they move
    with every inventory write)."""
    return {
        c: {rp: a["resources"] for rp, a in client.get(f"/allocations/{c}")["allocations"].items()}
        for c in consumers
    }


def converged(client, agent: FixtureAgent) -> bool:
    root = root_of(client, agent.name)
    got = client.get(f"/resource_providers/{root['uuid']}/inventories")["inventories"]
    return inventories_equal(got, wanted_inventories(agent.desired.tree.root))


def test_twenty_agents_through_two_appliers_converge_then_heartbeat(bus, placement):
    first, second = bus.start(2)
    agents = make_agents(bus, AGENTS, "many")
    # 20 hosts writing at once can meet the test Placement's SQLite lock (a
    # 500): the agent retries as the service would.
    failures: list[str] = []
    deadline = time.monotonic() + 60
    applied = in_threads(agents, lambda a: a.cycle_until_ok(deadline, failures))
    assert all(r.status == wire.APPLIED and r.ok for r in applied.values())
    assert all(converged(placement, a) for a in agents)
    # Competing consumers: both processes took a share of the burst.
    assert " seq " in first.log() and " seq " in second.log()

    steady = in_threads(agents, lambda a: a.cycle())
    assert {r.status for r in steady.values()} == {wire.UNCHANGED}
    assert {r.messages for r in steady.values()} == {1}
    assert {r.requests for r in steady.values()} == {0}

    for agent in agents[:5]:
        agent.reserve(1024)
    changed = in_threads(agents[:5], lambda a: a.cycle_until_ok(deadline, failures))
    assert all(r.status == wire.APPLIED and r.ok for r in changed.values())
    assert all(converged(placement, a) for a in agents)
    print(
        f"\nBENCH messaging: first apply requests/host "
        f"{sorted(r.requests for r in applied.values())}; steady: 1 message, 0 requests; "
        f"one inventory change: {sorted(r.requests for r in changed.values())} requests; "
        f"{len(failures)} cycles retried"
    )


def test_applier_killed_during_a_burst_loses_no_allocation(bus, placement):
    first, second = bus.start(2)
    agents = make_agents(bus, AGENTS, "kill")
    failures: list[str] = []
    deadline = time.monotonic() + 60
    in_threads(agents, lambda a: a.cycle_until_ok(deadline, failures))
    consumers = {}
    for agent in agents:
        consumer = str(uuid.uuid4())
        allocate(placement, consumer, {root_of(placement, agent.name)["uuid"]: {"MEMORY_MB": 256}})
        consumers[consumer] = agent.name
    before = allocations(placement, consumers)

    for agent in agents:
        agent.reserve(768)
    killer = threading.Timer(0.05, lambda: os.kill(first.proc.pid, signal.SIGKILL))
    killer.start()
    results = in_threads(agents, lambda a: a.cycle_until_ok(deadline, failures))
    killer.join()
    assert first.proc.wait(5) == -signal.SIGKILL
    assert all(r.ok for r in results.values())
    assert all(converged(placement, a) for a in agents)
    assert allocations(placement, consumers) == before
    print(f"\nkilled applier: {len(failures)} agent cycles failed and were retried")


def test_stale_message_is_ignored(bus, placement):
    bus.start(1)
    agent = make_agents(bus, 1, "stale")[0]
    client = agent.upstream._client
    newer = wire.body_of(agent.desired)
    reply = client.call(
        {}, "apply", message=wire.full_message(agent.name, 200, newer, agent.upstream.key)
    )
    assert reply["status"] == wire.APPLIED

    agent.reserve(2048)
    older = wire.body_of(agent.desired)
    reply = client.call(
        {}, "apply", message=wire.full_message(agent.name, 100, older, agent.upstream.key)
    )
    assert reply == {"status": wire.STALE, "seq": 100, "last_seq": 200}
    root = root_of(placement, agent.name)
    got = placement.get(f"/resource_providers/{root['uuid']}/inventories")["inventories"]
    assert got["MEMORY_MB"]["reserved"] == newer["tree"][0]["inventories"]["MEMORY_MB"]["reserved"]
    assert got["MEMORY_MB"]["reserved"] != 2048


def test_message_naming_another_hosts_provider_is_refused(bus, placement):
    (applier,) = bus.start(1)
    victim, intruder = make_agents(bus, 2, "own")
    assert victim.cycle().ok
    victim_root = root_of(placement, victim.name)
    before = placement.get(f"/resource_providers/{victim_root['uuid']}/inventories")
    client = intruder.upstream._client

    body = wire.body_of(intruder.desired)
    by_name = dict(body["tree"][0], name=f"{victim.name}_NUMA_0", parent=intruder.name, uuid=None)
    reply = client.call(
        {},
        "apply",
        message=wire.full_message(
            intruder.name, 1, {**body, "tree": body["tree"] + [by_name]}, intruder.upstream.key
        ),
    )
    assert reply["status"] == wire.REFUSED and "not this host's" in reply["error"]

    by_uuid = dict(
        body["tree"][0],
        name=f"{intruder.name}_0000:3b:00.1",
        parent=intruder.name,
        uuid=victim_root["uuid"],
    )
    reply = client.call(
        {},
        "apply",
        message=wire.full_message(
            intruder.name, 2, {**body, "tree": body["tree"] + [by_uuid]}, intruder.upstream.key
        ),
    )
    assert reply["status"] == wire.REFUSED
    assert "of another host's tree" in reply["error"]

    assert placement.get(f"/resource_providers?name={intruder.name}")["resource_providers"] == []
    assert placement.get(f"/resource_providers/{victim_root['uuid']}/inventories") == before
    assert applier.log().count("refused") >= 2

    # A host whose name is a child's in the victim's tree gets no root there.
    child = f"{victim.name}_{uuid.uuid4().hex[:4]}"
    placement.post(
        "/resource_providers", {"name": child, "parent_provider_uuid": victim_root["uuid"]}
    )
    namesake = FixtureAgent(bus, child, sysfs_trees()[0], bus.tmp / "agents" / "namesake")
    with pytest.raises(upstream.Refused, match="is a child in another tree"):
        namesake.cycle()
    found = root_of(placement, child)
    assert found["parent_provider_uuid"] == victim_root["uuid"]
    assert placement.get(f"/resource_providers/{found['uuid']}/inventories")["inventories"] == {}


class MessagingHost(Host):
    """reshape_driver's host, whose root is found by name (the agent in
    messaging mode keeps no root uuid of its own)."""

    @property
    def root(self) -> str:
        return root_of(self.scheduler, self.name)["uuid"]


def test_reshape_through_the_applier_moves_pinned_guests_in_one_post(
    bus, tmp_path, placement_server, host_name
):
    bus.start(1)
    host = MessagingHost(tmp_path, placement_server.url, host_name)
    sender = bus.sender(host_name, timeout=30)
    assert sender.send(compute_desired(host.settings())).ok
    boot_legacy_guests(host)
    before = host.allocations()

    report = sender.send(
        compute_desired(host.settings(dedicated="2-5,10-13", shared="0-1,6-9,14-15"))
    )
    assert report.ok and report.reshape is not None
    assert report.reshape["totals"]["consumers"] == 2
    assert report.reshape["request_id"]
    assert cpu_view(host.inventories()) == {"VCPU": 8, "PCPU": 8}
    assert host.allocations() == expected_after_reshape(before, [host.pinned, host.pinned_2])


def messaging_service(bus, tmp_path, host_name):
    """An agent service with ``upstream = messaging`` and no Placement
    credentials, provisioned with the applier's own ``derive-key``; not
    started."""
    from tests.integration.agent_process import AgentProcess

    agent = AgentProcess(tmp_path / "agent", "unused", host_name)
    text = agent.config_text()
    text = text[: text.index("[placement]")]  # the hypervisor holds no credentials
    text = text.replace("[DEFAULT]\n", f"[DEFAULT]\ntransport_url = {bus.url}\n")
    key_file = tmp_path / "upstream.key"
    subprocess.run(
        [
            str(APPLIER),
            "--config-file",
            str(bus.config),
            "derive-key",
            host_name,
            "--output",
            str(key_file),
        ],
        check=True,
        capture_output=True,
    )
    text = text.replace(
        "[agent]\n",
        f"[agent]\nupstream = messaging\nupstream_timeout = 2\n"
        f"upstream_topic = {bus.topic}\n"
        f"upstream_key_file = {key_file}\n",
    )
    agent.write_config(text)
    return agent


def test_reshape_through_the_applier_keeps_a_ratio_the_operator_set_in_placement(
    bus, tmp_path, placement_server, host_name
):
    """No ratio in the host's config (nova keeps Placement's): the applier's
    reshape body must not put back the initial ratio over the operator's."""
    from dataclasses import replace

    from tests.integration.test_reshape_cost import set_memory_ratio

    bus.start(1)
    host = MessagingHost(tmp_path, placement_server.url, host_name)
    sender = bus.sender(host_name, timeout=30)
    nova_default = {"explicit_ratios": frozenset()}
    assert sender.send(compute_desired(replace(host.settings(), **nova_default))).ok
    boot_legacy_guests(host)
    set_memory_ratio(1.25)(host)

    report = sender.send(
        compute_desired(
            replace(host.settings(dedicated="2-5,10-13", shared="0-1,6-9,14-15"), **nova_default)
        )
    )

    assert report.ok and report.reshape is not None, report.errors
    assert cpu_view(host.inventories()) == {"VCPU": 8, "PCPU": 8}
    assert host.inventories()["MEMORY_MB"]["allocation_ratio"] == 1.25


def test_service_in_messaging_mode_backs_off_without_applier_then_converges(
    bus, tmp_path, placement, host_name
):
    agent = messaging_service(bus, tmp_path, host_name)
    agent.start()
    try:
        agent.status_after(
            lambda s: "Placement cannot be used" in s and "no node-agent-applier answered" in s,
            timeout=30,
        )
        assert placement.get(f"/resource_providers?name={host_name}")["resource_providers"] == []
        bus.start(1)
        agent.status_after(lambda s: s.startswith("ok") and "via applier" in s, timeout=30)
        agent.new_status(lambda s: s.startswith("ok: no change (heartbeat"), timeout=30)
        assert root_of(placement, host_name)
        assert "Placement is reachable again" in agent.log()
    finally:
        assert agent.stop() == 0
        agent.notify.close()


def test_status_in_messaging_mode_after_a_lost_state_file_says_the_applier_keeps_it_closed(
    bus, tmp_path, placement, host_name
):
    """The applier keeps the host closed from the root's disabled trait when
    the host's state file is lost; the host's own status must not say off."""
    from node_agent.state import FILE_NAME
    from tests.cli.runner import run_agent
    from tests.integration.test_messaging import ctl

    bus.start(1)
    agent = messaging_service(bus, tmp_path, host_name)
    agent.start()
    try:
        agent.status_after(lambda s: s.startswith("ok") and "via applier" in s, timeout=30)
        on = run_agent(
            "--config-file", str(agent.config), "maintenance", "on", "--reason", "disk swap"
        )
        assert on.code == 0 and "the running service recorded it" in on.stdout, on.stderr
        assert agent.stop() == 0
        (agent.dir / "state" / FILE_NAME).unlink()
        agent.start()
        agent.new_status(lambda s: s.startswith("ok") and "via applier" in s, timeout=30)

        inventories = placement.get(
            f"/resource_providers/{root_of(placement, host_name)['uuid']}/inventories"
        )["inventories"]
        assert all(inv["reserved"] == inv["total"] for inv in inventories.values())
        status = ctl(bus.url, host_name, "status")["maintenance"]
        assert (status["on"], status["source"]) == (True, "placement")
        shown = run_agent(
            "--config-file", str(agent.config), "maintenance", "status", "--output", "json"
        )
        assert shown.code == 0, shown.stderr
        assert shown.json()["maintenance"] == "on"
        assert shown.json()["state_file"]["maintenance"] == "none"
        text = run_agent("--config-file", str(agent.config), "maintenance", "status").stdout
        assert text.startswith(f"maintenance is ON for {host_name}"), text
        assert "the applier kept the host closed" in text
    finally:
        assert agent.stop() == 0
        agent.notify.close()


# ---------------------------------------------------------------- nested reshapes

REQUEST_LINE = re.compile(r'placement\.requestlog .*"(\w+) ([^ "]+)[^"]*" status: (\d+)')


class RequestLog:
    """Placement's own request log (one line per request, with its request
    id): counts what reached the server, whoever sent it. The session's
    Placement is shared, but tests run one at a time."""

    def __init__(self, server):
        self.path = Path(server.workdir) / "placement.log"
        self.mark()

    def mark(self) -> None:
        self.offset = self.path.stat().st_size

    def lines(self, request: str) -> list[str]:
        with open(self.path, encoding="utf-8", errors="replace") as log:
            log.seek(self.offset)
            return [line for line in log if f'"{request}"' in line]

    def requests(self) -> list[str]:
        """``METHOD path status`` of every request since the mark, once the
        log has stopped growing (a line may land just after the reply)."""
        size, deadline = -1, time.monotonic() + 2
        while self.path.stat().st_size != size and time.monotonic() < deadline:
            size = self.path.stat().st_size
            time.sleep(0.1)
        with open(self.path, encoding="utf-8", errors="replace") as log:
            log.seek(self.offset)
            return [" ".join(m.groups()) for m in map(REQUEST_LINE.search, log) if m]


def consumer_totals(allocs: dict) -> dict:
    """consumer -> class -> amount, wherever it is held."""
    totals = {}
    for consumer, by_rp in allocs.items():
        sums = totals.setdefault(consumer, {})
        for resources in by_rp.values():
            for rc, amount in resources.items():
                sums[rc] = sums.get(rc, 0) + amount
    return totals


def sent_once(requests: RequestLog, report: upstream.UpstreamReport) -> None:
    posts = requests.lines("POST /reshaper")
    assert len(posts) == 1, posts
    assert report.reshape["request_id"] in posts[0] and "status: 204" in posts[0]


def test_vgpu_then_numa_reshape_through_the_applier_keep_every_allocation(
    bus, tmp_path, placement_server, host_name
):
    bus.start(1)
    p, mdevs = prefix(), [str(uuid.uuid4()) for _ in range(3)]
    guests = [
        guest(1, p, pins=(2, 3), nodes="0", mdevs=mdevs[:1]),  # node 0, GPU1
        guest(2, p, pins=(10, 11), nodes="1", mdevs=mdevs[1:], memory=2048),
        guest(3, p, nodes="1"),
    ]  # floating
    host = NestedHost(
        tmp_path, placement_server.url, host_name, guests, gpus={GPU1: mdevs[:2], GPU2: mdevs[2:]}
    )
    a, b, c = (g["uuid"] for g in guests)
    sender = bus.sender(host_name, timeout=30)
    requests = RequestLog(placement_server)
    assert sender.send(compute_desired(host.settings())).ok
    root = host.root
    host.add_root_vgpu(6)  # VGPU on the root, as nova had it before nested GPUs
    allocate(host.scheduler, a, {root: {"PCPU": 2, "MEMORY_MB": 1024, "VGPU": 1, "DISK_GB": 5}})
    allocate(host.scheduler, b, {root: {"PCPU": 2, "MEMORY_MB": 2048, "VGPU": 2}})
    allocate(host.scheduler, c, {root: {"VCPU": 2, "MEMORY_MB": 1024}})
    before = host.allocations()

    # 1. enabled_mdev_types: VGPU follows each mdev to its parent GPU's child.
    requests.mark()
    report = sender.send(compute_desired(host.settings(enabled_mdev_types=(MDEV_TYPE,))))
    assert report.status == wire.APPLIED and report.ok, report.errors
    assert report.reshape["totals"] == {"consumers": 2, "moved": {"VGPU -> VGPU": 3}}
    sent_once(requests, report)
    gpu1 = host.uuid_of(f"{host_name}_pci_0000_81_00_0")
    gpu2 = host.uuid_of(f"{host_name}_pci_0000_82_00_0")
    assert host.allocations() == {
        a: {root: {"PCPU": 2, "MEMORY_MB": 1024, "DISK_GB": 5}, gpu1: {"VGPU": 1}},
        b: {root: {"PCPU": 2, "MEMORY_MB": 2048}, gpu1: {"VGPU": 1}, gpu2: {"VGPU": 1}},
        c: before[c],
    }
    assert host.inventories(gpu1) == {"VGPU": 4} and host.inventories(gpu2) == {"VGPU": 3}
    assert "VGPU" not in host.inventories(root)

    # 2. numa_in_placement: CPU and memory go to the node each guest lives on.
    requests.mark()
    numa = compute_desired(host.settings(enabled_mdev_types=(MDEV_TYPE,), numa_in_placement=True))
    report = sender.send(numa)
    assert report.status == wire.APPLIED and report.ok, report.errors
    sent_once(requests, report)
    node0, node1 = (host.uuid_of(f"{host_name}_NUMA_{n}") for n in (0, 1))
    after = host.allocations()
    assert after == {
        a: {root: {"DISK_GB": 5}, node0: {"PCPU": 2, "MEMORY_MB": 1024}, gpu1: {"VGPU": 1}},
        b: {node1: {"PCPU": 2, "MEMORY_MB": 2048}, gpu1: {"VGPU": 1}, gpu2: {"VGPU": 1}},
        c: {node1: {"VCPU": 2, "MEMORY_MB": 1024}},
    }
    assert consumer_totals(after) == consumer_totals(before)
    assert set(host.inventories(root)) == {"DISK_GB"} and len(host.tree()) == 5

    # 3. Steady state: a heartbeat, no Placement request, no reshape.
    requests.mark()
    steady = sender.send(numa)
    assert (steady.status, steady.messages, steady.requests) == (wire.UNCHANGED, 1, 0)
    assert requests.lines("POST /reshaper") == [] and host.allocations() == after


def test_numa_refusal_through_the_applier_is_an_error_in_the_reply(
    bus, tmp_path, placement_server, host_name
):
    (applier,) = bus.start(1)
    p = prefix()
    guests = [
        guest(1, p, pins=(2, 3), nodes="0"),
        guest(2, p, pins=(4, 12), nodes="0-1"),
    ]  # one vCPU on each node
    host = NestedHost(tmp_path, placement_server.url, host_name, guests)
    sender = bus.sender(host_name, timeout=30)
    requests = RequestLog(placement_server)
    assert sender.send(compute_desired(host.settings())).ok
    root = host.root
    for g in guests:
        allocate(host.scheduler, g["uuid"], {root: {"PCPU": 2, "MEMORY_MB": 1024}})
    before, inventories = host.allocations(), host.inventories(root)

    requests.mark()
    numa = compute_desired(host.settings(numa_in_placement=True))
    # The refusal stands on the next cycle too: its heartbeat re-applies.
    for messages in (1, 1):
        report = sender.send(numa)
        assert report.status == wire.APPLIED and not report.ok
        assert report.messages == messages
        (refusal,) = report.errors
        assert f"guest instance-00000002 ({guests[1]['uuid']}) spans NUMA nodes 0-1" in refusal
        assert "instance-00000001" not in refusal
        assert report.reshape["refused"] == [refusal]

    assert requests.lines("POST /reshaper") == []
    assert host.allocations() == before
    assert host.inventories(root) == inventories
    # Children may exist, but offer none of what the root still offers.
    for name, (rp, _parent) in host.tree().items():
        if "_NUMA_" in name:
            assert not {"VCPU", "PCPU", "MEMORY_MB"} & set(host.inventories(rp))
    assert "spans NUMA nodes 0-1" in applier.log()


def test_message_of_another_wire_version_is_refused_with_the_side_to_upgrade(bus):
    bus.start(1)
    agent = make_agents(bus, 1, "version")[0]
    body = wire.body_of(agent.desired)
    old = {**wire.full_message(agent.name, 1, body, agent.upstream.key), "version": "1.0"}
    reply = agent.upstream._client.call({}, "apply", message=old)
    assert reply["status"] == wire.REFUSED
    assert "upgrade node-agent on this host" in reply["error"]
    assert agent.cycle().ok  # the current version is applied


# ---------------------------------------------------------------- cost per host


class DirectHost:
    """The direct mode on the same fixture host: what its service keeps
    between cycles (a Reconciler over a TreeSyncer), with a clock moved by
    hand."""

    def __init__(self, placement_url: str, name: str, system_dir: Path, base: Path):
        base.mkdir(parents=True)
        self.now = 0.0
        self.settings = make_settings(
            host=name,
            sysfs_root=str(sysfs_root_for(system_dir, base)),
            instances_path=str(base),
            state_path=str(base / "state"),
            reserved_host_memory_mb=512,
        )
        client = PlacementClient.for_endpoint(placement_url)
        self.syncer = TreeSyncer(
            client, StateStore(base / "state"), full_verify_interval=300, clock=lambda: self.now
        )
        self.reconciler = Reconciler(client, self.syncer)

    def reserve(self, reserved: int) -> None:
        from dataclasses import replace

        self.settings = replace(self.settings, reserved_host_memory_mb=reserved)

    def cycle(self, advance: float = 60) -> None:
        self.now += advance
        assert self.reconciler.apply(compute_desired(self.settings)).ok


def send_to(
    applier: ApplierProcess, agent: FixtureAgent, beat: bool = False, timeout: float = TIMEOUT
) -> dict:
    """The agent's message (or heartbeat), delivered to that process only."""
    body = wire.body_of(agent.desired)
    seq = agent.upstream._next_seq()
    key = agent.upstream.key
    message = (
        wire.heartbeat(agent.name, seq, wire.digest_of(body), key)
        if beat
        else wire.full_message(agent.name, seq, body, key)
    )
    client = agent.upstream._client.prepare(server=applier.server, timeout=timeout)
    return client.call({}, "apply", message=message)


def applied_by(bus: Bus, host: str) -> str:
    return StateStore(bus.state / host).load()["applier"]["by"]


def test_host_hopping_between_applier_processes_costs_placement_what_direct_mode_costs(
    bus, placement, placement_server, tmp_path
):
    """Per host, counted in Placement's log: each message goes to the
    process that did not apply the host last, and costs the requests the
    direct mode's agent pays for the same step."""
    a, b = bus.start(2)
    tag = uuid.uuid4().hex[:6]
    system_dir = sysfs_trees()[0]
    agent = FixtureAgent(bus, f"hop-{tag}", system_dir, tmp_path / "messaging")
    direct = DirectHost(placement_server.url, f"direct-{tag}", system_dir, tmp_path / "direct")
    log = RequestLog(placement_server)

    def cost(step) -> list[str]:
        log.mark()
        step()
        return log.requests()

    def hop(applier: ApplierProcess, beat: bool = False, status=wire.APPLIED):
        def step():
            reply = send_to(applier, agent, beat)
            assert reply["status"] == status and reply.get("ok", True), reply
            assert (
                f":{applier.proc.pid}:" in applied_by(bus, agent.name) or status == wire.UNCHANGED
            )

        return step

    def scheduler_activity():
        for name in (agent.name, direct.settings.host):
            allocate(
                placement, str(uuid.uuid4()), {root_of(placement, name)["uuid"]: {"MEMORY_MB": 256}}
            )

    first = {"messaging": cost(hop(a)), "direct": cost(direct.cycle)}
    # The one request more: the ownership check looks the new root up by name.
    assert len(first["messaging"]) == len(first["direct"]) + 1, first

    assert cost(hop(b, beat=True, status=wire.UNCHANGED)) == []
    assert cost(direct.cycle) == []

    steps = {}
    for what, reserved, applier in (("shrink", 1024, b), ("grow", 256, a)):
        scheduler_activity()
        agent.reserve(reserved)
        direct.reserve(reserved)
        steps[what] = {"messaging": cost(hop(applier)), "direct": cost(direct.cycle)}
        assert converged(placement, agent)
    # Raising `reserved` lowers capacity: the usages are read first (to
    # report a cut below usage; it is published all the same), and that read
    # gives the fresh generation, so the PUT costs no 409. A grow reads
    # nothing: the cache's old generation costs a 409 and one GET before the PUT.
    assert len(steps["shrink"]["messaging"]) == len(steps["shrink"]["direct"]) == 2, steps
    assert not any(" 409" in r for r in steps["shrink"]["messaging"])
    assert len(steps["grow"]["messaging"]) == len(steps["grow"]["direct"]) == 3, steps
    assert any(" 409" in r for r in steps["grow"]["messaging"])  # the cache's old generation

    # Five minutes later (the record's clock moved, as the direct mode's):
    # the heartbeat on the other process is the full verify.
    store = StateStore(bus.state / agent.name)

    def five_minutes_later(applier):
        state = store.load()
        state["applier"]["cache"]["verified_at"] -= 300
        store.save(state)
        return {
            "messaging": cost(hop(applier, beat=True)),
            "direct": cost(lambda: direct.cycle(300)),
        }

    # The root's generation moved under the shrink and the grow (the
    # scheduler's allocations), and its traits were not read since: the first
    # verify reads that provider whole; the next one only the tree.
    verify = five_minutes_later(b)
    assert len(verify["messaging"]) == len(verify["direct"]) == 3, verify
    verify = five_minutes_later(a)
    assert len(verify["messaging"]) == len(verify["direct"]) == 1, verify
    assert verify["messaging"][0].startswith("GET /resource_providers?in_tree=")
    print(
        f"\nBENCH applier hop, requests per host (messaging/direct): "
        f"first apply {len(first['messaging'])}/{len(first['direct'])}, steady 0/0, "
        f"shrink {len(steps['shrink']['messaging'])}/{len(steps['shrink']['direct'])}, "
        f"grow {len(steps['grow']['messaging'])}/{len(steps['grow']['direct'])}, "
        f"full verify {len(verify['messaging'])}/{len(verify['direct'])}"
    )


# ---------------------------------------------------------------- the capacity invariant


def test_dedicated_set_beside_a_stranger_on_vcpu_never_publishes_pcpu_beside_vcpu_via_applier(
    bus, tmp_path, placement_server, host_name
):
    """Issue 12's first bullet through the applier: VCPU 16 (legacy), a
    consumer that is no local guest (a migration record, written as the
    scheduler writes it) holds 3 VCPU, then cpu_dedicated_set = 0-15. The
    applier checks the agent's limits (wire 2.1) as the direct mode does:
    it keeps VCPU as Placement holds it, publishes no PCPU beside it, and
    says so in the reply."""
    from node_agent.policy.capacity import HostLimits, Published, check

    (applier,) = bus.start(1)
    host = NestedHost(tmp_path, placement_server.url, host_name, [])
    sender = bus.sender(host_name, timeout=30)
    assert sender.send(compute_desired(host.settings(dedicated=None, shared=None))).ok
    root = host.root
    assert host.inventories(root)["VCPU"] == 16
    migration = str(uuid.uuid4())
    allocate(host.scheduler, migration, {root: {"VCPU": 3, "MEMORY_MB": 512}})
    before = allocations(host.scheduler, [migration])

    # The refusal stands on the next cycle too (its heartbeat re-applies).
    for _ in range(2):
        report = sender.send(compute_desired(host.settings(dedicated="0-15", shared=None)))
        assert report.status == wire.APPLIED and not report.ok
        assert any(migration in e for e in report.errors), report.errors

    listed = host.scheduler.get(f"/resource_providers?in_tree={root}")["resource_providers"]
    tree = [
        Published(
            rp["name"],
            rp["parent_provider_uuid"] is None,
            host.scheduler.get(f"/resource_providers/{rp['uuid']}/inventories")["inventories"],
        )
        for rp in listed
    ]
    verdict = check(tree, HostLimits(cpus=16, memory_mb=10**9, disk_gb=10**9, online_cpus=16))
    assert verdict.ok, verdict.lines()
    assert allocations(host.scheduler, [migration]) == before
    assert "not checked" not in applier.log()


def test_a_2_0_agent_is_applied_closed_and_the_applier_says_so_once_per_host(bus, placement):
    """A 2.0 message carries no limits: the applier cannot check the
    invariant, so it publishes the tree with every class it checks closed
    (reserved = total) and logs that once for the host. When in doubt,
    publish less. A 2.0 agent does not sign either: applied during an
    upgrade only (``accept_unsigned``)."""
    bus.write_config("accept_unsigned = true\n")
    (applier,) = bus.start(1)
    agent = make_agents(bus, 1, "old-agent")[0]
    body = wire.body_of(agent.desired)
    del body["limits"]
    for seq in (1, 2):
        old = {**wire.full_message(agent.name, seq, body, agent.upstream.key), "version": "2.0"}
        del old["signature"]
        reply = agent.upstream._client.call({}, "apply", message=old)
        assert reply["status"] == wire.APPLIED and reply["ok"], reply
        root = root_of(placement, agent.name)
        got = placement.get(f"/resource_providers/{root['uuid']}/inventories")["inventories"]
        assert {rc: inv["reserved"] for rc, inv in got.items()} == {
            rc: inv["total"] for rc, inv in got.items()
        }
        assert set(got) == set(agent.desired.tree.root.inventories)
    warned = re.findall(
        rf"{re.escape(agent.name)} sends wire format 2\.0.*published "
        r"closed \(reserved = total\)",
        applier.log(),
    )
    assert len(warned) == 1, applier.log()
    assert agent.cycle().ok  # a current message from the same host: checked and open again
    assert converged(placement, agent)


def test_a_child_named_like_another_hosts_root_is_refused_and_that_host_registers(bus, placement):
    """Host ``hv`` with its own valid key sends a child ``hv_2``: refused,
    so the real host ``hv_2`` still gets its root."""
    bus.start(1)
    name = f"hv-{uuid.uuid4().hex[:6]}"
    hv = FixtureAgent(bus, name, sysfs_trees()[0], bus.tmp / "agents" / "hv")
    body = wire.body_of(hv.desired)
    shadow = dict(body["tree"][0], name=f"{name}_2", parent=name, uuid=None)

    reply = hv.upstream._client.call(
        {},
        "apply",
        message=wire.full_message(
            name, 1, {**body, "tree": body["tree"] + [shadow]}, hv.upstream.key
        ),
    )

    assert reply["status"] == wire.REFUSED and "could be another host's root" in reply["error"]
    assert placement.get(f"/resource_providers?name={name}_2")["resource_providers"] == []
    assert hv.cycle().ok  # its own children's names pass
    real = FixtureAgent(bus, f"{name}_2", sysfs_trees()[1], bus.tmp / "agents" / "hv_2")
    assert real.cycle().ok
    assert root_of(placement, f"{name}_2")["parent_provider_uuid"] is None


def test_tree_for_a_root_another_machine_marked_is_refused_by_the_applier(bus, placement):
    from dataclasses import replace

    from node_agent.policy.root_owner import Identity, mark_for, marked

    (applier,) = bus.start(1)
    name = f"clone-{uuid.uuid4().hex[:6]}"
    first = FixtureAgent(bus, name, sysfs_trees()[0], bus.tmp / "agents" / "first")
    clone = FixtureAgent(bus, name, sysfs_trees()[1], bus.tmp / "agents" / "clone")
    mine, other = mark_for("a" * 32), mark_for("b" * 32)
    first.desired = replace(first.desired, tree=marked(first.desired.tree, Identity(mine)))
    clone.desired = replace(clone.desired, tree=marked(clone.desired.tree, Identity(other)))
    assert first.cycle().ok
    root = root_of(placement, name)
    before = placement.get(f"/resource_providers/{root['uuid']}")

    with pytest.raises(upstream.Refused, match="managed by node-agent on another machine"):
        clone.cycle()

    assert placement.get(f"/resource_providers/{root['uuid']}") == before
    assert mine in placement.get(f"/resource_providers/{root['uuid']}/traits")["traits"]
    assert "another machine" in applier.log()


# ---------------------------------------------------------------- signed messages


def test_forged_tampered_unsigned_and_replayed_messages_change_nothing_in_placement(
    bus, placement, placement_server
):
    """A hostile hypervisor holds the broker's credentials and its own key:
    whatever it sends in another host's name, or replays of that host's old
    messages, reach no Placement request (its request log stays empty) and
    leave the victim's inventory as it was. The applier's metrics count
    each refusal by reason; a replay (refused) is told from an honest
    message overtaken by a newer one (stale)."""
    port = free_port()
    (applier,) = bus.start(1, applier=f"metrics_port = {port}\n")
    victim, intruder = make_agents(bus, 2, "signed")
    client = intruder.upstream._client  # any connection to the broker will do
    key = victim.upstream.key

    victim.reserve(1024)
    overtaken = wire.full_message(
        victim.name, victim.upstream._next_seq(), wire.body_of(victim.desired), key
    )  # never delivered
    old = wire.full_message(
        victim.name, victim.upstream._next_seq(), wire.body_of(victim.desired), key
    )
    assert client.call({}, "apply", message=old)["status"] == wire.APPLIED
    victim.reserve(512)
    assert victim.cycle().ok
    inventories = f"/resource_providers/{root_of(placement, victim.name)['uuid']}/inventories"
    before = placement.get(inventories)

    # The victim's tree with all its memory reserved: no guest could land there.
    hostile = wire.body_of(victim.desired)
    memory = hostile["tree"][0]["inventories"]["MEMORY_MB"]
    memory["reserved"] = memory["total"]
    seq = victim.upstream._next_seq() + 10**9
    forged = wire.full_message(victim.name, seq, hostile, intruder.upstream.key)
    tampered = {
        **wire.full_message(victim.name, seq, wire.body_of(victim.desired), key),
        "body": hostile,
        "digest": wire.digest_of(hostile),
    }
    older = {
        **hostile,
        "limits": {k: v for k, v in hostile["limits"].items() if k != "mem_encryption"},
    }  # 2.3's
    unsigned = {**wire.full_message(victim.name, seq, older, key), "version": "2.1"}
    del unsigned["signature"]
    attempts = {
        "forged host": (forged, wire.REFUSED, "does not verify"),
        "bad signature": (tampered, wire.REFUSED, "does not verify"),
        "unsigned": (unsigned, wire.REFUSED, "carries no signature"),
        "replayed": (old, wire.REFUSED, "was applied already"),
        "out of order": (overtaken, wire.STALE, None),
    }

    log = RequestLog(placement_server)
    for what, (message, status, words) in attempts.items():
        log.mark()
        reply = client.call({}, "apply", message=message)
        assert reply["status"] == status, (what, reply)
        assert words is None or words in reply["error"], (what, reply)
        assert log.requests() == [], what
        assert placement.get(inventories) == before, what
        secrets = (bus.master_file.read_text().strip(), key.hex(), intruder.upstream.key.hex())
        assert not any(s in json.dumps(reply) for s in secrets), what

    text = applier.log()
    # The tampered copy is the second "forged" from this sender within a
    # minute: DEBUG, not a second WARNING (a flood is one line a minute).
    assert f"refused a message from {victim.name} (forged; 1 refused so far)" in text
    assert f"refused a message from {victim.name} (forged; 2 refused so far" not in text
    assert f"refused a message from {victim.name} (unsigned; 3 refused so far)" in text
    assert f"refused a message from {victim.name} (replayed; 4 refused so far)" in text
    assert re.search(
        rf"{re.escape(victim.name)} seq {overtaken['seq']} ignored: not above "
        r"\d+, the last applied \(an out-of-order message",
        text,
    )
    assert not any(s in text for s in secrets)
    assert victim.cycle().ok  # the victim's own next message is applied

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    for line in (
        'node_agent_applier_refused_total{reason="forged"} 2.0',
        'node_agent_applier_refused_total{reason="unsigned"} 1.0',
        'node_agent_applier_refused_total{reason="expired_key"} 0.0',
        'node_agent_applier_refused_total{reason="replayed"} 1.0',
        'node_agent_applier_messages_total{status="stale"} 1.0',
        'node_agent_applier_messages_total{status="refused"} 4.0',
    ):
        assert line in metrics, metrics
    requests = re.search(r"^node_agent_applier_placement_requests_total (\S+)$", metrics, re.M)
    assert requests and float(requests[1]) > 0, metrics


def metrics_of(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.read().decode()


def test_master_rotation_in_the_config_accepts_old_keys_until_the_overlap_ends(bus, placement):
    """The new master in master_key_file, the old one in
    previous_master_key_file: a host still holding its key under the old
    master is applied while the overlap lasts, refused (expired_key) after;
    a host with its new key is applied by both."""
    old_master = bus.master_file
    new_master = bus.tmp / "new-master.key"
    new_master.write_text(uuid.uuid4().hex + uuid.uuid4().hex + "\n")
    new_master.chmod(0o600)
    bus.master_file = new_master  # what the appliers' master_key_file names
    rotation = f"previous_master_key_file = {old_master}\nprevious_master_key_until = {{}}\n"
    port = free_port()
    (during,) = bus.start(1, applier=rotation.format("2099-01-01T00:00:00Z"))
    (after,) = bus.start(
        1, applier=rotation.format("2020-01-01T00:00:00Z") + f"metrics_port = {port}\n"
    )
    late, moved = make_agents(bus, 2, "rotate")  # keys under the new master
    late.upstream.key = signing.host_key(old_master.read_text().strip().encode(), late.name)
    assert late.upstream.key != bus.key(late.name)

    assert send_to(during, late)["status"] == wire.APPLIED
    assert send_to(during, moved)["status"] == wire.APPLIED
    refused = send_to(after, late)
    assert refused["status"] == wire.REFUSED and "previous master" in refused["error"], refused
    assert send_to(after, moved)["status"] == wire.APPLIED
    assert f"refused a message from {late.name} (expired_key;" in after.log()
    assert 'node_agent_applier_refused_total{reason="expired_key"} 1.0' in metrics_of(port)
    assert converged(placement, late) and converged(placement, moved)


def test_a_message_that_waits_for_its_hosts_lock_is_counted_as_a_lock_wait(
    bus, placement, tmp_path
):
    """Another holder of the host's lock (here the test, through the same
    file locks): the message waits, applies once it is released, and the
    wait shows in the log and in node_agent_applier_lock_waits_total."""
    from node_agent.remote.coordination import Coordination

    port = free_port()
    (applier,) = bus.start(1, applier=f"metrics_port = {port}\nlock_timeout = 30\n")
    agent = make_agents(bus, 1, "waits")[0]
    assert "node_agent_applier_lock_waits_total 0.0" in metrics_of(port)
    holder = Coordination(None, bus.tmp / "applier-state-0", "the-test")
    replies: list[dict] = []
    try:
        with holder.lock(agent.name, 5):
            sender = threading.Thread(
                target=lambda: replies.append(send_to(applier, agent, timeout=60))
            )
            sender.start()
            time.sleep(2)
            assert not replies, replies  # still waiting for the lock
        sender.join(60)
    finally:
        holder.stop()
    assert replies and replies[0]["status"] == wire.APPLIED, replies
    assert re.search(
        rf"{re.escape(agent.name)} seq \d+ waited [\d.]+s for the host's lock", applier.log()
    )
    metrics = metrics_of(port)
    assert "node_agent_applier_lock_waits_total 1.0" in metrics, metrics
    assert converged(placement, agent)
    # Issue 28: build and process metrics, names promtool accepts.
    assert re.search(
        r'^node_agent_build_info\{python="3[^"]*",version="[^"]+"\} 1\.0$', metrics, re.M
    )
    assert re.search(r"^process_resident_memory_bytes [1-9]", metrics, re.M), metrics
    assert promlint.problems(metrics) == [] and promlint.promtool_problems(metrics) in (None, [])


def test_a_broker_that_is_down_is_a_clear_error_within_seconds_not_a_hung_call(tmp_path):
    """oslo.messaging retries a reply queue's connection forever; the
    agent's first call must still end, naming the bus."""
    port = free_port()  # nothing listens there
    conf = cfg.ConfigOpts()
    messaging.register(conf)
    conf([])
    conf.set_override("transport_url", f"rabbit://guest:secret@127.0.0.1:{port}/")
    sender = upstream.MessagingUpstream(conf, "down-host", timeout=5, key=b"k" * 32)
    message = wire.heartbeat("down-host", 1, "0" * 64, sender.key)
    outcome: dict = {}

    def call():
        try:
            sender._call(message, 5)
        except upstream.NoApplier as exc:
            outcome["error"] = str(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(60)  # generous: bounded retries take a few seconds
    assert not thread.is_alive(), "the call to a dead broker never returned"
    assert f"127.0.0.1:{port}" in outcome["error"]
    assert "did not accept a connection" in outcome["error"]
    assert "secret" not in outcome["error"]
