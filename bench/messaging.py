"""Section 5: messaging mode (``[agent] upstream = messaging``, issue 9).

A throw-away RabbitMQ (tests/integration/rabbit.py's broker, on free ports),
the embedded Placement and two ``node-agent-applier`` processes on one
topic. N agents are threads, each with its own
:class:`~node_agent.remote.upstream.MessagingUpstream` (own transport and
connections, as a separate process would have), host name and desired tree:
the synthetic host of section 2, root + 4 SR-IOV children. Every phase runs
as one wave, all agents at once. Placement requests are counted from
Placement's request log, as in sections 2 and 4; the appliers' own count
(the ``requests`` of each reply) is shown beside it as a cross-check.

Direct mode is measured in the same section, against the same server, with
the same host and the same phases, so the two columns compare like with like
even when this section is rerun alone.

Bytes: *payload* is the JSON of the agent's message (what it encodes);
*broker* is every octet the broker received and sent on all connections
during the wave (agent -> broker -> applier and the reply back, with
oslo.messaging's envelope and AMQP framing), divided by the agents.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid as uuidlib
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Callable

from bench import common, fleet, synthetic_host
from bench.phases import Scheduler
from devenv.embedded_placement import LOG_FILE, start_subprocess
from node_agent.cycle.desired import desired_from
from node_agent.host.discover import discover
from node_agent.placement.client import PlacementClient, Unavailable
from node_agent.placement.sync import TreeSyncer
from node_agent.remote import messaging, signing, upstream, wire
from node_agent.state import StateStore
from tests.integration.rabbit import CTL, SERVER, Broker

SIZES = (20, 100)
VERIFY_SIZES = (20,)  # per host the same at any size; 100 would add a minute
DIRECT_AGENTS = 20  # requests per host do not depend on the fleet's size
APPLIERS = 2
STEADY_CYCLES = 3
INSTANCES = 10  # per host, before the inventory change
FULL_VERIFY = 300  # the default [applier] full_verify_interval
RPC_TIMEOUT = 60.0  # the default [agent] upstream_timeout
RETRY_FOR = 120.0  # seconds an agent keeps retrying one cycle
APPLIER = Path(sys.executable).with_name("node-agent-applier")
MASTER = b"bench-only master secret, not for use"  # the appliers' [applier] master_key_file
DATABASE = "na_bench_messaging"
RESTART = "first heartbeat after the appliers restart"
VERIFY = "full verify (every 300 s)"
# One per host whose applier process had to build the host's objects anew
# (restarted, or the other process applied it last): the reshape check of
# a fresh Reconciler reads the root's allocations.
FRESH = "GET /resource_providers/{uuid}/allocations 200"


# ---------------------------------------------------------------- servers


class ApplierProcess:
    def __init__(self, config: Path, log: Path):
        self.log_path = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(APPLIER), "--config-file", str(config)], stdout=out, stderr=subprocess.STDOUT
            )

    def wait_listening(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while "listening on topic" not in self.log_path.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"node-agent-applier did not start:\n{self.log_path.read_text()[-2000:]}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Appliers:
    """``count`` applier processes on one topic, sharing one state path; with
    ``coordination`` (more ``[applier]`` lines: a ``coordination_url``), each
    process has its own config and empty state directory instead, as on
    separate machines."""

    def __init__(
        self,
        work: Path,
        transport_url: str,
        placement_url: str,
        topic: str,
        full_verify: int,
        count: int = APPLIERS,
        coordination: str = "",
    ):
        work.mkdir(parents=True, exist_ok=True)
        master = work / "master.key"
        master.write_bytes(MASTER)
        master.chmod(0o600)

        def config(n: int) -> Path:
            own = f"-{n}" if coordination else ""
            path = work / f"applier-{full_verify}{own}.conf"
            path.write_text(
                f"[DEFAULT]\ntransport_url = {transport_url}\n"
                f"[applier]\ntopic = {topic}\nstate_path = {work / ('state' + own)}\n"
                f"full_verify_interval = {full_verify}\nmaster_key_file = {master}\n"
                f"{coordination}"
                "[placement]\nauth_type = admin_token\ntoken = admin\n"
                f"endpoint_override = {placement_url}\n"
            )
            return path

        self.processes = [
            ApplierProcess(config(n), work / f"applier-{full_verify}-{n}.log") for n in range(count)
        ]

    def __enter__(self) -> "Appliers":
        try:
            for process in self.processes:
                process.wait_listening()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for process in self.processes:
            if process.proc.poll() is None:
                process.proc.send_signal(signal.SIGTERM)
        for process in self.processes:
            process.stop()


def broker_octets(broker: Broker) -> int:
    """Octets received plus sent by the broker on all its connections now."""
    done = subprocess.run(
        [
            str(CTL),
            "-n",
            broker.node,
            "list_connections",
            "recv_oct",
            "send_oct",
            "--no-table-headers",
            "-q",
        ],
        env=broker.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return sum(int(n) for line in done.stdout.splitlines() for n in line.split() if n.isdigit())


# ---------------------------------------------------------------- agents


class Host:
    """The synthetic host, discovered once; one desired tree per name."""

    def __init__(self, work: Path):
        self.work = work
        self.shape = synthetic_host.Shape()
        self.root = synthetic_host.build(work / "messaging-host", self.shape)
        self.snapshot = discover(self.settings("probe"))

    def settings(self, name: str, **overrides):
        return common.settings(
            name,
            str(self.root),
            str(self.work),
            str(self.work / "state" / name),
            pci_device_specs=common.device_specs(synthetic_host.device_specs(self.shape)),
            **overrides,
        )

    def desired(self, name: str, **overrides):
        return desired_from(self.settings(name, **overrides), self.snapshot)


def _retrying(attempt: Callable[[], object]) -> dict:
    """What the service does when Placement or the applier cannot be used
    (here without the backoff): the cycle is tried again."""
    deadline = time.monotonic() + RETRY_FOR
    retries, start = 0, time.perf_counter()
    while True:
        try:
            result = attempt()
            return {"seconds": time.perf_counter() - start, "retries": retries, "result": result}
        except Unavailable:  # NoApplier is one too
            if time.monotonic() > deadline:
                raise
            retries += 1
            time.sleep(0.2)


class MessagingAgent:
    def __init__(self, conf, name: str, topic: str, host: Host):
        self.name, self.host = name, host
        self.upstream = upstream.MessagingUpstream(
            conf, name, topic, RPC_TIMEOUT, key=signing.host_key(MASTER, name)
        )
        self.desired = host.desired(name)
        self.root_uuid = None

    def change(self, **overrides) -> None:
        self.desired = self.host.desired(self.name, **overrides)

    def _payloads(self) -> tuple[int, int]:
        """Bytes of this agent's full message and of its heartbeat."""
        body = wire.body_of(self.desired)
        seq = self.upstream.seq
        full = wire.full_message(self.name, seq, body, self.upstream.key)
        beat = wire.heartbeat(self.name, seq, full["digest"], self.upstream.key)
        return len(json.dumps(full)), len(json.dumps(beat))

    def cycle(self) -> dict:
        sent = self.upstream.messages_sent
        # The agent opens with a heartbeat when the applier acknowledged
        # this digest; anything else it sends is the full message.
        opens_with_heartbeat = self.upstream.acked == wire.digest_of(wire.body_of(self.desired))
        done = _retrying(lambda: self.upstream.send(self.desired))
        report = done.pop("result")
        if report.errors:
            raise RuntimeError(f"{self.name}: {report.errors}")
        self.root_uuid = report.uuids.get(self.name, self.root_uuid)
        full, beat = self._payloads()
        messages = self.upstream.messages_sent - sent
        sent_bytes = beat + full * (messages - 1) if opens_with_heartbeat else full * messages
        return {
            **done,
            "messages": messages,
            "status": report.status,
            "applier_requests": report.requests,
            "payload": sent_bytes / messages,
            "full": full,
            "heartbeat": beat,
        }


class DirectAgent:
    """Direct mode (the TreeSyncer) with a simulated clock, as in section 2."""

    def __init__(self, url: str, name: str, host: Host, state: Path):
        self.name, self.host = name, host
        self.client = PlacementClient.for_endpoint(url)
        self.now = 0.0
        self.syncer = TreeSyncer(
            self.client, StateStore(state), full_verify_interval=FULL_VERIFY, clock=lambda: self.now
        )
        self.desired = host.desired(name)
        self.root_uuid = None

    def change(self, **overrides) -> None:
        self.desired = self.host.desired(self.name, **overrides)

    def _sync(self) -> None:
        report = self.syncer.sync(self.desired.tree)
        if report.errors:
            raise Unavailable("; ".join(report.errors))  # retried like an outage

    def cycle(self, advance: float = 60) -> dict:
        self.now += advance
        done = _retrying(self._sync)
        done.pop("result")
        self.root_uuid = self.syncer.store.load().get("root_uuid")
        return done

    def full_verify(self) -> dict:
        return self.cycle(FULL_VERIFY)


# ---------------------------------------------------------------- waves


class Waves:
    def __init__(self, log: common.RequestLog, broker: Broker):
        self.log = log
        self.broker = broker
        self.rows: dict[str, dict] = {}

    def run(
        self, phase: str, agents: list, work: Callable[[object], dict], messaging_side: bool
    ) -> dict:
        octets = broker_octets(self.broker) if messaging_side else 0
        mark = self.log.mark()
        start = time.perf_counter()
        with ThreadPoolExecutor(len(agents)) as pool:
            results = list(pool.map(work, agents))
        wall = time.perf_counter() - start
        requests = self.log.since(mark)
        n = len(agents)
        row = {
            "agents": n,
            "wall": wall,
            "requests_per_host": len(requests) / n,
            "counted": common.count(requests),
            "paths": [common.shape(r) for r in requests],
            "fresh": sum(1 for r in requests if common.shape(r) == FRESH),
            "retries": sum(r["retries"] for r in results),
            "messages_total": sum(r.get("messages", 1) for r in results),
            "p50": common.percentile([r["seconds"] for r in results], 50),
            "p99": common.percentile([r["seconds"] for r in results], 99),
        }
        if messaging_side:
            # The log has settled (mark/since); so has the broker by then.
            row.update(
                {
                    "broker_bytes_per_agent": (broker_octets(self.broker) - octets) / n,
                    "messages": common.summary([r["messages"] for r in results]),
                    "payload": common.summary([r["payload"] for r in results]),
                    "statuses": sorted({r["status"] for r in results}),
                    "applier_requests_per_host": sum(r["applier_requests"] for r in results) / n,
                    "full_bytes": results[0]["full"],
                    "heartbeat_bytes": results[0]["heartbeat"],
                }
            )
        self.rows.setdefault(phase, []).append(row)
        return row


def _scheduler_activity(scheduler: Scheduler, agents: list) -> None:
    """INSTANCES allocations on each root, then one resized: the roots'
    generations moved since the agents (or the appliers) last wrote."""
    for agent in agents:
        consumers = [str(uuidlib.uuid4()) for _ in range(INSTANCES)]
        scheduler.place(agent.root_uuid, consumers)
        scheduler.resize(agent.root_uuid, consumers[0])


def _phases(waves: Waves, agents: list, scheduler: Scheduler, messaging_side: bool) -> None:
    """First apply, steady cycles, an inventory change: the same for both modes."""

    def cycle(agent):
        return agent.cycle()

    waves.run("first apply", agents, cycle, messaging_side)
    for _ in range(STEADY_CYCLES):
        waves.run("steady cycle", agents, cycle, messaging_side)
    _scheduler_activity(scheduler, agents)
    for agent in agents:
        agent.change(reserved_host_memory_mb=4096)
    waves.run("inventory change after scheduler activity", agents, cycle, messaging_side)


def _close(agents: list[MessagingAgent]) -> None:
    # Each transport takes a moment to stop polling the broker: all at once.
    closing = [threading.Thread(target=a.upstream.close) for a in agents]
    for thread in closing:
        thread.start()
    for thread in closing:
        thread.join(30)


def _messaging_size(
    size: int, work: Path, broker: Broker, url: str, host: Host, log: common.RequestLog
) -> dict:
    topic = f"bench-applier-{size}-{uuidlib.uuid4().hex[:6]}"
    base = work / f"appliers-{size}"
    conf = messaging_conf(broker.url)
    agents = [MessagingAgent(conf, f"bench-msg{size}-{n:03d}", topic, host) for n in range(size)]
    waves = Waves(log, broker)
    try:
        with Appliers(base, broker.url, url, topic, full_verify=FULL_VERIFY):
            _phases(waves, agents, Scheduler(url), True)
        if size not in VERIFY_SIZES:
            return {"size": size, "rows": waves.rows}
        # An applier re-reads a host's tree when a heartbeat arrives and the
        # full verify is due; restarted with full_verify_interval = 0 it is
        # due at once instead of in 300 s. The first wave meets processes
        # that hold no host in memory; the second is the periodic verify as
        # a running pair of appliers does it.
        with Appliers(base, broker.url, url, topic, full_verify=0):
            waves.run(RESTART, agents, lambda a: a.cycle(), True)
            waves.run(VERIFY, agents, lambda a: a.cycle(), True)
    finally:
        _close(agents)
    return {"size": size, "rows": waves.rows}


def _direct(work: Path, url: str, host: Host, broker: Broker, log: common.RequestLog) -> dict:
    agents = [
        DirectAgent(url, f"bench-direct-{n:03d}", host, work / "direct" / str(n))
        for n in range(DIRECT_AGENTS)
    ]
    waves = Waves(log, broker)
    _phases(waves, agents, Scheduler(url), False)
    waves.run(VERIFY, agents, lambda a: a.full_verify(), False)
    return {"size": DIRECT_AGENTS, "rows": waves.rows}


def messaging_conf(transport_url: str):
    from oslo_config import cfg

    conf = cfg.ConfigOpts()
    conf([])
    messaging.register(conf)
    conf.set_override("transport_url", transport_url)
    return conf


def rabbitmq_version() -> str:
    done = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"], capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def available() -> str | None:
    """Why this section cannot run here, or None."""
    if not SERVER.exists():
        return f"{SERVER} is missing (apt-get install rabbitmq-server)"
    if not APPLIER.exists():
        return f"{APPLIER} is missing (pip install -e .)"
    return None


def _database(name: str = DATABASE) -> tuple[str | None, str]:
    """(SQLAlchemy URL, description): PostgreSQL on 127.0.0.1 as in section 4
    when it answers; SQLite otherwise, whose single writer turns a burst of
    registrations into 500s and retries."""
    try:
        fleet.admin(f"DROP DATABASE IF EXISTS {name}")
        fleet.admin(f"CREATE DATABASE {name}")
        return (
            f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}",
            f"PostgreSQL {fleet.postgres_version()}",
        )
    except Exception:  # noqa: BLE001 - no server, no driver: fall back
        return None, "SQLite (no PostgreSQL on 127.0.0.1:5432)"


def run(work: Path) -> dict:
    missing = available()
    if missing:
        raise RuntimeError(missing)
    work.mkdir(parents=True, exist_ok=True)
    host = Host(work)
    (work / "rabbitmq").mkdir()
    broker = Broker(work / "rabbitmq").start()
    server = None
    database_url, database = _database()
    try:
        server = start_subprocess(
            work / "placement-messaging", timeout=120, database_url=database_url
        )
        log = common.RequestLog(server.workdir / LOG_FILE)
        direct = _direct(work, server.url, host, broker, log)
        sizes = [_messaging_size(size, work, broker, server.url, host, log) for size in SIZES]
    finally:
        if server is not None:
            server.stop()
        broker.stop()
        if database_url:
            fleet.admin(f"DROP DATABASE IF EXISTS {DATABASE}")
    return {
        "direct": direct,
        "sizes": sizes,
        "appliers": APPLIERS,
        "instances": INSTANCES,
        "steady_cycles": STEADY_CYCLES,
        "full_verify": FULL_VERIFY,
        "database": database,
        "rpc_timeout": RPC_TIMEOUT,
        "rabbitmq": rabbitmq_version(),
        "oslo_messaging": metadata.version("oslo.messaging"),
        "providers": len(host.desired("probe").tree.providers),
    }


if __name__ == "__main__":  # a quick look without the report
    import logging
    import tempfile

    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="node-agent-bench-") as tmp:
        print(json.dumps(run(Path(tmp)), indent=1, default=str))
    os._exit(0)
