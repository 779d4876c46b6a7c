"""``node-agent-applier``: the central side of ``[agent] upstream = messaging``.

It holds the Placement credentials ([placement] in its own config file) and
applies what agents send (see :mod:`node_agent.upstream` for the wire
format) with the same engine as the direct mode:
:class:`~node_agent.reconcile.Reconciler` (reshape first, then the tree
sync), one per host.

Several processes share one topic ([applier] topic): RabbitMQ hands each
message to one of them. What they must agree on lives under the shared
[applier] state_path, one directory per host:

* ``state.json``: the syncer's state (root uuid, providers, children it
  created) and the ``applier`` record: the last applied sequence number,
  digest and body, whether it applied cleanly, when the tree was last read
  in full, and which process applied it last;
* ``lock``: a POSIX lock held while one message of that host is handled,
  so per-host order holds across processes, and a killed process releases
  it at once (the kernel drops its locks).

Per-host order: a message whose ``seq`` is not above the record's is
answered ``stale`` and ignored. A process keeps its syncer's cache of a
host only while the record says it was the last to apply that host;
otherwise it starts a fresh syncer (a full read), so a cache is never
older than Placement.

A host may only change its own subtree: the root must be named as the
sending host, every child must hang under it and be named ``<host>_...``
(checked in :func:`node_agent.upstream.tree_from_wire`), and a provider
name or uuid that Placement shows under another root is refused and
logged (:meth:`Applier.foreign`). The sending host is the ``host`` of the
message: oslo.messaging does not authenticate senders, so this protects
against mistakes and against a confused agent, not against a hostile
hypervisor holding the shared broker credentials.

Killed mid-apply: the sync writes one provider at a time and the next
message from that host (its next cycle) finds the tree as it is and
finishes it; the reshape is one POST /reshaper, applied or not.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence
from urllib.parse import quote

from node_agent import upstream as wire
from node_agent.errors import ConfigError, NodeAgentError, PlacementError, ReshapeError
from node_agent.state import StateStore

LOG = logging.getLogger(__name__)

RECORD_KEY = "applier"
LOCK_FILE = "lock"
LOCK_POLL = 0.05


class Busy(Exception):
    """Another thread or process holds the host's lock."""


class HostLock:
    """``flock`` on ``directory/lock``, waiting up to ``timeout`` seconds."""

    def __init__(self, directory: Path, timeout: float):
        self.path = directory / LOCK_FILE
        self.timeout = timeout
        self._fd: Optional[int] = None

    def __enter__(self) -> "HostLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise Busy() from None
                time.sleep(LOCK_POLL)

    def __exit__(self, *exc) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


@dataclass
class _Local:
    """This process's objects for one host."""

    client: object
    syncer: object
    reconciler: object
    apply_count: Optional[int] = None


def _changes(changes) -> list[dict]:
    return [{"method": c.method, "path": c.path, "summary": c.summary,
             "provider": c.provider} for c in changes]


def _reshape_record(reshape) -> Optional[dict]:
    if reshape is None:
        return None
    if isinstance(reshape, NodeAgentError):
        return {"refused": [str(reshape)], "lines": [f"REFUSED: {reshape}"]}
    if not reshape.reshaped:
        return None
    record = reshape.reshape.as_dict()
    record["request_id"] = reshape.request_id
    return record


class Applier:
    """Handles one message at a time per host; safe to call from many threads.

    ``client_factory()`` returns a new PlacementClient (sharing one session):
    each host gets its own, so request counts stay per host.
    """

    def __init__(self, client_factory: Callable[[], object], state_path: Path,
                 full_verify_interval: float = 300, lock_timeout: float = 20,
                 clock: Callable[[], float] = time.time, token: Optional[str] = None):
        self.client_factory = client_factory
        self.state_path = Path(state_path)
        self.full_verify_interval = full_verify_interval
        self.lock_timeout = lock_timeout
        self.clock = clock
        self.token = token or f"{socket.gethostname()}:{os.getpid()}:{uuidlib.uuid4().hex[:8]}"
        self._hosts: dict[str, _Local] = {}
        self._hosts_lock = threading.Lock()

    def handle(self, raw) -> dict:
        """The reply to one message (a JSON-able dict; never raises)."""
        try:
            message = wire.parse_message(raw)
        except wire.Malformed as exc:
            host = raw.get("host") if isinstance(raw, dict) else None
            LOG.warning("refused a message from %s: %s", host, exc)
            return {"status": wire.REFUSED, "error": f"message refused: {exc}"}
        try:
            with HostLock(self.state_path / message.host, self.lock_timeout):
                return self._handle(message)
        except Busy:
            return {"status": wire.BUSY, "seq": message.seq,
                    "error": f"another applier has held {message.host} for "
                             f"{self.lock_timeout:g}s"}
        except wire.Malformed as exc:
            LOG.warning("refused the tree of %s: %s", message.host, exc)
            return {"status": wire.REFUSED, "seq": message.seq, "error": str(exc)}
        except (PlacementError, ReshapeError) as exc:
            LOG.error("%s seq %d: %s", message.host, message.seq, exc)
            self._forget(message.host)
            return {"status": wire.ERROR, "seq": message.seq, "error": str(exc)}
        except Exception as exc:  # one host's bug must not stop the others
            LOG.exception("%s seq %d: unexpected failure", message.host, message.seq)
            self._forget(message.host)
            return {"status": wire.ERROR, "seq": message.seq,
                    "error": f"applier failure: {type(exc).__name__}: {exc}"}

    # -- one message, under the host's lock

    def _handle(self, message: wire.Message) -> dict:
        store = StateStore(self.state_path / message.host)
        record = store.load_or_empty(LOG).get(RECORD_KEY, {})
        last = record.get("seq", -1)
        if message.seq <= last:
            LOG.info("%s seq %d ignored: %d was applied already (stale)",
                     message.host, message.seq, last)
            return {"status": wire.STALE, "seq": message.seq, "last_seq": last}
        verify = False
        body = message.body
        if body is None:
            if record.get("digest") != message.digest or "body" not in record:
                return {"status": wire.UNKNOWN_DIGEST, "seq": message.seq}
            if record.get("ok") and not self._verify_due(record):
                LOG.debug("%s seq %d: heartbeat, no change", message.host, message.seq)
                return {"status": wire.UNCHANGED, "seq": message.seq, "requests": 0}
            body, verify = record["body"], True
        desired = wire.desired_from_body(body, message.host)
        local = self._local(message.host, record)
        if verify:
            local.syncer.invalidate()
        start = local.client.stats.total
        problems = self.foreign(local, desired.tree)
        if problems:
            LOG.error("refused the tree of %s (seq %d): %s", message.host, message.seq,
                      "; ".join(problems))
            return {"status": wire.REFUSED, "seq": message.seq,
                    "error": "; ".join(problems)}
        outcome = local.reconciler.apply(desired)
        report = outcome.report
        local.apply_count = record.get("apply_count", 0) + 1
        now = self.clock()
        self._save(store, {
            "seq": message.seq, "digest": message.digest, "body": body,
            "ok": outcome.ok, "by": self.token, "apply_count": local.apply_count,
            "verified_at": now if (report.full_verify or verify)
            else record.get("verified_at", now)})
        requests = local.client.stats.total - start
        log = LOG.warning if not outcome.ok else LOG.info
        log("%s seq %d: %s", message.host, message.seq, report.summary())
        return {"status": wire.APPLIED, "seq": message.seq, "ok": outcome.ok,
                "summary": report.summary(), "errors": outcome.errors,
                "applied": _changes(report.applied),
                "reshape": _reshape_record(outcome.reshape), "requests": requests,
                "uuids": {p.name: p.uuid for p in report.tree.providers}
                if report.tree else {}}

    def _verify_due(self, record: dict) -> bool:
        return self.clock() - record.get("verified_at", 0) >= self.full_verify_interval

    def _save(self, store: StateStore, record: dict) -> None:
        # The syncer owns the other keys of the same file.
        store.save({**store.load_or_empty(LOG), RECORD_KEY: record})

    def _local(self, host: str, record: dict) -> _Local:
        from node_agent.reconcile import Reconciler
        from node_agent.sync import TreeSyncer

        local = self._hosts.get(host)
        if (local is None or record.get("by") != self.token
                or record.get("apply_count") != local.apply_count):
            client = self.client_factory()
            syncer = TreeSyncer(client, StateStore(self.state_path / host),
                                full_verify_interval=self.full_verify_interval)
            local = _Local(client, syncer, Reconciler(client, syncer))
            with self._hosts_lock:
                self._hosts[host] = local
        return local

    def _forget(self, host: str) -> None:
        with self._hosts_lock:
            self._hosts.pop(host, None)

    # -- the ownership check

    def foreign(self, local: _Local, tree) -> list[str]:
        """Providers of ``tree`` that Placement shows in another host's tree.

        Only names and uuids new to this host's state are looked up (one GET
        each), so a host costs these reads once, not every cycle.
        """
        client = local.client
        state = local.syncer.state
        known = dict(state.get("providers", {}))
        root = state.get("root_uuid") or self._uuid_by_name(client, tree.root.name)
        ours = set(known.values()) | ({root} if root else set())
        problems = []
        for provider in tree.providers:
            if provider.uuid and provider.uuid not in ours:
                found = self._by_uuid(client, provider.uuid)
                if found and found.get("root_provider_uuid") != root:
                    problems.append(f"{provider.name}: uuid {provider.uuid} is provider "
                                    f"{found['name']!r} of another host's tree")
            if provider.parent is not None and provider.name not in known:
                found = self._by_name(client, provider.name)
                if found and found.get("root_provider_uuid") != root:
                    problems.append(f"{provider.name}: a provider of that name belongs "
                                    f"to another tree (root "
                                    f"{found.get('root_provider_uuid')})")
        return problems

    @staticmethod
    def _by_name(client, name: str) -> Optional[dict]:
        found = client.get(f"/resource_providers?name={quote(name)}")["resource_providers"]
        return found[0] if found else None

    def _uuid_by_name(self, client, name: str) -> Optional[str]:
        found = self._by_name(client, name)
        return found["uuid"] if found else None

    @staticmethod
    def _by_uuid(client, uuid: str) -> Optional[dict]:
        from node_agent.placement import NotFound

        try:
            return client.get(f"/resource_providers/{uuid}")
        except NotFound:
            return None


class Endpoint:
    """The RPC method agents call."""

    def __init__(self, applier: Applier):
        from node_agent import messaging

        self.applier = applier
        self.target = messaging.oslo_messaging().Target(version=wire.RPC_VERSION)

    def apply(self, ctxt, message):
        return self.applier.handle(message)


# ---------------------------------------------------------------- main

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="node-agent-applier",
        description="Apply node-agent trees received over oslo.messaging to Placement.")
    parser.add_argument("--config-file", action="append", default=[], metavar="FILE")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR")
    parser.add_argument("--debug", action="store_true", help="log at DEBUG level")
    return parser


def _placement_client(conf):
    from node_agent.placement import PlacementClient

    group = conf.placement
    if not (group.auth_type or group.endpoint_override):
        raise ConfigError("node-agent-applier needs Placement: set [placement] auth_type "
                          "(and its credentials) or endpoint_override")
    return PlacementClient.from_conf(conf)


def serve(conf) -> int:
    """Listen until SIGTERM/SIGINT; returns the exit code."""
    from node_agent import messaging
    from node_agent.placement import PlacementClient
    from node_agent.service import systemd_notifier

    rpc_url, _ = messaging.urls(conf)
    if not rpc_url:
        raise ConfigError("node-agent-applier needs [DEFAULT] transport_url (the bus the "
                          "agents send to)")
    base = _placement_client(conf)
    base.check_version()
    group = conf.applier
    applier = Applier(lambda: PlacementClient(base.adapter), Path(group.state_path),
                      full_verify_interval=group.full_verify_interval,
                      lock_timeout=group.lock_timeout)
    om = messaging.oslo_messaging()
    transport = om.get_rpc_transport(conf, url=rpc_url)
    # server= only names this process's own queue; agents call the topic
    # without a server, so every process consumes from one shared queue.
    target = om.Target(topic=group.topic, server=f"{socket.gethostname()}-{os.getpid()}")
    server = om.get_rpc_server(transport, target, [Endpoint(applier)], executor="threading")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    notifier = systemd_notifier()
    notifier.notify("READY=1")
    notifier.notify(f"STATUS=listening on topic {group.topic}")
    LOG.info("node-agent-applier listening on topic %s (state in %s)", group.topic,
             group.state_path)
    while not stop.wait(5):
        notifier.notify("WATCHDOG=1")
    notifier.notify("STOPPING=1")
    server.stop()
    server.wait()
    transport.cleanup()
    LOG.info("node-agent-applier stopped")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    from node_agent import messaging
    from node_agent.configfile import load_conf

    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO,
                        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    conf_args = []
    for path in args.config_file:
        conf_args += ["--config-file", path]
    for path in args.config_dir:
        conf_args += ["--config-dir", path]
    try:
        conf = load_conf(conf_args)
        messaging.register(conf)
        return serve(conf)
    except NodeAgentError as exc:
        print(f"node-agent-applier: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
