"""``node-agent-applier``: the central side of ``[agent] upstream = messaging``.

It holds the Placement credentials ([placement] in its own config file) and
applies what agents send (see :mod:`node_agent.remote.wire` for the wire
format) with the direct mode's own cycle:
:func:`node_agent.runner.applier_runner` (maintenance Placement keeps,
reshape first, then the tree sync), one per host and message.

Several processes share one topic ([applier] topic): RabbitMQ hands each
message to one of them. What they must agree on is per host, held by
:mod:`node_agent.remote.coordination` (state files under [applier]
state_path on one machine, Redis across machines):

* the host's record: the syncer's state (root uuid, providers, children it
  created) and the ``applier`` record: the last applied sequence number,
  digest and body, whether it applied cleanly, which process applied it
  last, whether the host signs, and what the direct mode keeps in memory
  between cycles: the syncer's cache of the tree (each provider's
  generation, parent, inventories and traits, and the wall-clock time of
  the last full read) and the digest of the tree's shape last applied
  cleanly (a reshape check is due when it changes);
* the host's tooz lock, held while one message of that host is handled, so
  per-host order holds across processes. A killed process's lock goes with
  it (file driver) or expires after the backend's lock timeout (Redis).

Every message is handled with objects built from that record, so a host
costs Placement the same requests whichever process its message reaches:
as many as the direct mode's agent, whose syncer and reconciler live on
between cycles. The cache is a hint, as it is in the direct mode: a
generation that moved turns into a 409 and a re-read, and the full verify
(``GET /resource_providers?in_tree=<root>``, then a provider's inventories
and traits only where its generation moved) runs every
``full_verify_interval`` seconds. Before anything is written to Placement
the cache and the shape are taken out of the record, and put back once
the apply is done: a process killed (or failing) mid-apply leaves none,
and the next message reads the tree and checks the allocations again.

Per-host order: a message whose ``seq`` is not above the record's is
answered ``stale`` and ignored, unless it is a replay (below).

A host may only change its own subtree: the root must be named as the
sending host, every child must hang under it and be named ``<host>_...``
(one of the names the agent gives its children, never another host's root
name: checked in :func:`node_agent.remote.wire.tree_from_wire`), and a provider
name or uuid that Placement shows under another root is refused and
logged (:meth:`Applier.foreign` says exactly what is looked up).

The sending host is the ``host`` of the message, and the message's
signature proves it (:mod:`node_agent.remote.signing`): before the host's
lock or record is touched, a message that is unsigned, signed with another
host's key or altered is refused, logged and counted (``refused`` by
reason). A replay, a signed message identical to one the host's record
says was applied, is refused as ``replayed`` (see :func:`replay_mark`); an
older message never applied (out of order behind a newer one) is ``stale``.
oslo.messaging does not authenticate senders, and every
hypervisor holds the broker's credentials: the signature is what stops a
hostile hypervisor from sending another host's tree.

Killed mid-apply: the sync writes one provider at a time and the next
message from that host (its next cycle) finds the tree as it is and
finishes it; the reshape is one POST /reshaper, applied or not.

A host from which no message came for ``[applier] dead_after`` seconds is
closed (``COMPUTE_STATUS_DISABLED`` on its root) and reopened at its next
message: :mod:`node_agent.applier.dead_hosts`, called from :meth:`Applier._handle`
under the host's lock, and swept by a thread of :func:`serve`.

Why one module over 400 lines: the per-host record, its lock and the
handler that reads and rewrites them under that lock must be read together
to see that no two processes ever apply one host at once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import uuid as uuidlib
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

from node_agent import logs
from node_agent.applier import dead_hosts
from node_agent.applier import metrics as applier_metrics
from node_agent.applier.dead_hosts import SEEN_KEY, DeadHosts
from node_agent.config.files import load_conf, oslo_args, placement_configured
from node_agent.cycle.reconcile import Shape, shape_of
from node_agent.errors import (
    ConfigError,
    NodeAgentError,
    PlacementError,
    ProviderOwned,
    ReshapeError,
)
from node_agent.placement.client import PlacementClient
from node_agent.placement.errors import NotFound
from node_agent.placement.sync import TreeSyncer
from node_agent.policy import capacity, liveness
from node_agent.policy import maintenance as maint
from node_agent.policy.root_owner import identity_of_tree
from node_agent.remote import keys, messaging, schema, signing, wire
from node_agent.remote.coordination import Busy, Coordination, CoordinationError
from node_agent.runner import DirectRunner, applier_runner
from node_agent.service.loop import systemd_notifier
from node_agent.state import APPLIER, PROVIDERS, ROOT_UUID, Store
from node_agent.version import VersionAction

LOG = logging.getLogger(__name__)

# Seconds between two WARNING lines for refusals from one sender for one cause.
REFUSAL_LOG_INTERVAL = 60.0

RECORD_KEY = APPLIER
# Keys of the record that hold only between completed applies.
CACHE_KEY, SHAPE_KEY = "cache", "shape"
# The marks of the host's last applied messages (replay_mark), newest last.
APPLIED_KEY = "applied_marks"
APPLIED_KEPT = 32
REPLAYED = "replayed"  # refusal reason


def replay_mark(raw) -> Optional[str]:
    """A short name of a signed message (its signature, which covers host,
    seq and digest), kept for the host's last APPLIED_KEPT applied messages.

    An agent never sends one message twice (every send takes a new ``seq``),
    so a signed message whose mark is in the host's record, at or below its
    last sequence number, is a copy: replayed by whoever captured it off the
    bus. One not in the record is ``stale``: an honest message overtaken by
    a newer one (two appliers, a retry after a timeout). A replay of a
    message older than the last APPLIED_KEPT applied ones cannot be told
    from a stale one and is counted as stale: either way nothing is
    applied. Heartbeats answered ``unchanged`` write no record, so they
    leave no mark. None for an unsigned message."""
    signature = raw.get("signature") if isinstance(raw, dict) else None
    if not isinstance(signature, str):
        return None
    return hashlib.sha256(signature.encode("utf-8")).hexdigest()[:24]


@dataclass
class _Local:
    """One message's objects for its host, built from the host's record."""

    client: PlacementClient
    syncer: TreeSyncer
    runner: DirectRunner


def _changes(changes) -> list[dict]:
    return [
        {"method": c.method, "path": c.path, "summary": c.summary, "provider": c.provider}
        for c in changes
    ]


def shape_digest(shape: Shape) -> str:
    """A short, stable name for :func:`node_agent.cycle.reconcile.shape_of`."""
    return hashlib.sha256(wire.canonical(shape).encode("utf-8")).hexdigest()


class Applier:
    """Handles one message at a time per host; safe to call from many threads.

    ``client_factory()`` returns a new PlacementClient (sharing one session):
    each message gets its own, so request counts stay per host.
    """

    def __init__(
        self,
        client_factory: Callable[[], PlacementClient],
        state_path: Path,
        full_verify_interval: float = 300,
        lock_timeout: float = 20,
        clock: Callable[[], float] = time.time,
        token: Optional[str] = None,
        *,
        keyring: signing.Keyring,
        coordination: Optional[Coordination] = None,
        dead_after: float = 0,
    ):
        self.client_factory = client_factory
        self.keyring = keyring
        self.state_path = Path(state_path)
        self.full_verify_interval = full_verify_interval
        self.lock_timeout = lock_timeout
        # The wall clock: the time of a host's last full read travels
        # between processes in its record.
        self.clock = clock
        self.token = token or f"{socket.gethostname()}:{os.getpid()}:{uuidlib.uuid4().hex[:8]}"
        # Per-host locks and records; by default tooz's file driver and
        # state files under state_path (one machine).
        self.coordination = coordination or Coordination(None, self.state_path, self.token)
        # Messages refused since start, by cause: "format" (the wire
        # schema, the version or the digest), "tree" (a rule across
        # fields, or another host's providers), "owner" (a root another
        # machine or nova-compute manages), the signature's
        # (signing.REASONS: unsigned, forged, expired_key) and "replayed"
        # (a copy of a message already applied).
        self.refused: Counter[str] = Counter()
        # (sender, cause) -> (when its WARNING was logged, refusals since):
        # a flood of hostile messages is one WARNING per sender and cause
        # per REFUSAL_LOG_INTERVAL, the rest DEBUG (the counts are metrics).
        self._refusal_logged: dict[tuple[str, str], tuple[float, int]] = {}
        # Every message by the status of its reply (applied, unchanged,
        # stale, refused, busy, error, ...).
        self.outcomes: Counter[str] = Counter()
        self.lock_waits = 0  # messages that found their host locked
        self.placement_requests = 0  # requests sent to Placement, all hosts
        self._counting = threading.Lock()
        # Messages applied closed, by host: a 2.0 agent sends no limits
        # (wire 2.1's body.limits), so the invariant cannot be checked.
        # Logged once per host.
        self.unchecked: Counter[str] = Counter()
        # Messages applied from agents older than 2.4, by host, whose body
        # lacks what a NUMA rule reads (wire.lacking); each lack is logged
        # once per host (said: what was).
        self.lacking: Counter[str] = Counter()
        self._lacks_said: dict[str, set[str]] = {}
        # Hosts that stopped reporting: closed, then reopened (dead_hosts).
        self.dead = DeadHosts(
            self.coordination,
            client_factory,
            dead_after,
            clock=clock,
            token=self.token,
            lock_timeout=min(1.0, lock_timeout),
        )

    def handle(self, raw) -> dict:
        """The reply to one message (a JSON-able dict; never raises)."""
        reply = self._reply(raw)
        with self._counting:
            self.outcomes[reply["status"]] += 1
        return reply

    def _refuse(self, reason: str, sender: str, text: str) -> dict:
        now = self.clock()
        with self._counting:
            self.refused[reason] += 1
            total = sum(self.refused.values())
            logged, since = self._refusal_logged.get((sender, reason), (-math.inf, 0))
            loud = now - logged >= REFUSAL_LOG_INTERVAL
            self._refusal_logged[(sender, reason)] = (now, 0) if loud else (logged, since + 1)
        if loud:
            more = (
                f"; {since} more from {sender} for this cause since the last such line"
                if since
                else ""
            )
            LOG.warning(
                "refused a message from %s (%s; %d refused so far%s): %s",
                sender,
                reason,
                total,
                more,
                text,
            )
        else:
            LOG.debug("refused a message from %s (%s): %s", sender, reason, text)
        return {"status": wire.REFUSED, "error": f"message refused: {text}"}

    def _reply(self, raw) -> dict:
        try:
            version = wire.parse_envelope(raw)
        except wire.Malformed as exc:
            return self._refuse("format", wire.sender_of(raw), str(exc))
        # Before the body, the host's lock and record: a forged or unsigned
        # message costs nothing but the HMAC of its envelope, whatever its
        # size, and changes no sequence number.
        refusal = self.keyring.check(raw, self.clock())
        if refusal is not None:
            return self._refuse(refusal.reason, raw["host"], refusal.text)
        try:
            message = wire.parse_body(raw, version)
        except wire.Malformed as exc:
            return self._refuse("format", raw["host"], str(exc))
        try:
            lock = self.coordination.lock(message.host, self.lock_timeout)
        except Exception as exc:  # noqa: BLE001 - the backend is down: the agent retries
            LOG.error("%s seq %d: %s", message.host, message.seq, exc)
            return {
                "status": wire.ERROR,
                "seq": message.seq,
                "error": f"the appliers' coordination backend cannot be used: {type(exc).__name__}",
            }
        try:
            with lock:
                return self._handle(message, replay_mark(raw))
        except Busy:
            return {
                "status": wire.BUSY,
                "seq": message.seq,
                "error": f"another applier has held {message.host} for {self.lock_timeout:g}s",
            }
        except wire.Malformed as exc:
            with self._counting:
                self.refused["tree"] += 1
            LOG.warning("refused the tree of %s: %s", message.host, exc)
            return {"status": wire.REFUSED, "seq": message.seq, "error": str(exc)}
        except ProviderOwned as exc:
            with self._counting:
                self.refused["owner"] += 1
            LOG.error("refused the tree of %s (seq %d): %s", message.host, message.seq, exc)
            return {"status": wire.REFUSED, "seq": message.seq, "error": str(exc)}
        except (PlacementError, ReshapeError) as exc:
            LOG.error("%s seq %d: %s", message.host, message.seq, exc)
            return {"status": wire.ERROR, "seq": message.seq, "error": str(exc)}
        except Exception as exc:  # one host's bug must not stop the others
            LOG.exception("%s seq %d: unexpected failure", message.host, message.seq)
            return {
                "status": wire.ERROR,
                "seq": message.seq,
                "error": f"applier failure: {type(exc).__name__}: {exc}",
            }
        finally:
            if lock.waited:
                with self._counting:
                    self.lock_waits += 1
                LOG.info(
                    "%s seq %d waited %.1fs for the host's lock (another applier held it)",
                    message.host,
                    message.seq,
                    lock.waited_for,
                )

    # -- one message, under the host's lock

    def _handle(self, message: wire.Message, mark: Optional[str] = None) -> dict:
        store = self.coordination.store(message.host)
        record = store.load_or_empty(LOG).get(RECORD_KEY, {})
        last = record.get("seq", -1)
        marks = record.get(APPLIED_KEY)
        marks = marks if isinstance(marks, list) else []
        if message.seq <= last and mark is not None and mark in marks:
            return self._refuse(
                REPLAYED,
                message.host,
                (
                    f"seq {message.seq} of {message.host} was applied already: this is a "
                    "copy of it (replayed)"
                ),
            )
        if message.seq <= last:
            LOG.warning(
                "%s seq %d ignored: not above %d, the last applied (an "
                "out-of-order message, or a replay of one older than the last %d "
                "applied: stale)",
                message.host,
                message.seq,
                last,
                APPLIED_KEPT,
            )
            return {"status": wire.STALE, "seq": message.seq, "last_seq": last}
        if record.get("signed") and not message.signed:
            # accept_unsigned is for agents not upgraded yet: one that signed
            # has been, and an unsigned message in its name is someone else's.
            return self._refuse(
                signing.UNSIGNED,
                message.host,
                f"{message.host} has sent signed messages: an unsigned one in its name is refused",
            )
        record = self.dead.seen(
            message.host, store, record, lambda: self._maintenance_on(message, record)
        )
        body = message.body
        if body is None:
            if record.get("digest") != message.digest or "body" not in record:
                return {"status": wire.UNKNOWN_DIGEST, "seq": message.seq}
            # Devices guests hold (wire 2.5 guest_held) are reserved by what
            # Placement's allocations say now, which a heartbeat does not
            # show: such a tree is applied again, as the direct mode's
            # every cycle (its cost: one allocations read a held child).
            if (
                record.get("ok")
                and not self._verify_due(record)
                and not wire.has_guest_held(record["body"])
            ):
                LOG.debug("%s seq %d: heartbeat, no change", message.host, message.seq)
                return {"status": wire.UNCHANGED, "seq": message.seq, "requests": 0}
            body = record["body"]  # again: its full verify is due, or it failed
        desired = wire.desired_from_body(body, message.host)
        if desired.limits is None:
            desired = self._unchecked(message.host, desired)
        if desired.lacks:
            self._lacking(message, desired.lacks)
        local = self._local(message.host, record, desired)
        start = local.client.stats.total
        try:
            return self._apply(message, store, record, body, desired, local, mark)
        finally:
            with self._counting:
                self.placement_requests += local.client.stats.total - start

    def _apply(
        self,
        message: wire.Message,
        store: Store,
        record: dict,
        body: dict,
        desired,
        local: _Local,
        mark: Optional[str] = None,
    ) -> dict:
        start = local.client.stats.total
        marks = record.get(APPLIED_KEY)
        marks = marks if isinstance(marks, list) else []
        problems = self.foreign(local, desired.tree)
        if problems:
            with self._counting:
                self.refused["tree"] += 1
            LOG.error(
                "refused the tree of %s (seq %d): %s",
                message.host,
                message.seq,
                "; ".join(problems),
            )
            return {"status": wire.REFUSED, "seq": message.seq, "error": "; ".join(problems)}
        self._take(store, record)
        # The direct mode's cycle: a lost state file on the host cannot end
        # maintenance, the root's disabled trait in Placement keeps it on.
        report = local.runner.run(desired)
        desired = report.desired
        # What the reconciler keeps: the shape once applied cleanly, else
        # the one it started with.
        shape: Optional[str] = shape_digest(shape_of(desired))
        if not (report.ok or record.get(SHAPE_KEY) == shape):
            shape = None
        self._save(
            store,
            {
                "seq": message.seq,
                "digest": message.digest,
                "body": body,
                "ok": report.ok,
                "by": self.token,
                SHAPE_KEY: shape,
                "signed": message.signed or bool(record.get("signed")),
                SEEN_KEY: record.get(SEEN_KEY),
                APPLIED_KEY: (marks + ([mark] if mark else []))[-APPLIED_KEPT:],
                CACHE_KEY: local.syncer.export_cache(),
            },
        )
        requests = local.client.stats.total - start
        log = LOG.warning if not report.ok else LOG.info if report.applied else LOG.debug
        log("%s seq %d: %s", message.host, message.seq, report.summary)
        refused = report.outcome.refused if report.outcome is not None else None
        if refused is not None and not refused.busy:
            # The reconciler leaves a refusal to its caller: said here, per message.
            LOG.error("%s seq %d: %s", message.host, message.seq, refused.reason)
        return {
            "status": wire.APPLIED,
            "seq": message.seq,
            "ok": report.ok,
            "summary": report.summary,
            "errors": report.errors,
            "applied": _changes(report.applied),
            "reshape": report.reshape,
            "requests": requests,
            # What was applied, when the host's own record did not say
            # (a lost state file): the agent's status shows it.
            "maintenance": {
                "on": maint.is_on(desired.maintenance),
                "kept_by_placement": (desired.maintenance or {}).get("source") == "placement",
            },
            "uuids": {p.name: p.uuid for p in report.outcome.report.tree.providers}
            if report.outcome is not None and report.outcome.report.tree
            else {},
        }

    @staticmethod
    def _maintenance_on(message: wire.Message, record: dict) -> bool:
        """Whether the host's own maintenance asks for the disabled trait
        (its message's body, or the last applied one for a heartbeat)."""
        body = message.body if message.body is not None else record.get("body")
        if body is None:
            return False
        try:
            return maint.is_on(wire.desired_from_body(body, message.host).maintenance)
        except wire.Malformed:
            return False

    def _unchecked(self, host: str, desired):
        """A body without the host's limits (a 2.0 agent): the invariant
        cannot be checked, so the tree is applied with every class it checks
        closed (``reserved = total``, :func:`capacity.closed_unchecked`):
        when in doubt, publish less. Nothing new is scheduled on the host
        until it sends 2.1 or later; no allocation is touched."""
        self.unchecked[host] += 1
        if self.unchecked[host] == 1:
            LOG.warning(
                "%s sends wire format 2.0, without the host's limits: the "
                "capacity invariant cannot be checked, so its inventories are "
                "published closed (reserved = total) until it sends 2.1 or later "
                "(upgrade node-agent on it); %d host(s) closed so far",
                host,
                len(self.unchecked),
            )
        return replace(desired, tree=capacity.closed_unchecked(desired.tree))

    def _lacking(self, message: wire.Message, lacks: Sequence[str]) -> None:
        """A body of an agent older than 2.4: applied as such an applier
        applied it; each thing it lacks said once per host."""
        with self._counting:
            self.lacking[message.host] += 1
            said = self._lacks_said.setdefault(message.host, set())
            new = [lack for lack in lacks if lack not in said]
            said.update(new)
        if new:
            LOG.warning(
                "%s sends wire format %s, without %s; applied all the same "
                "(upgrade node-agent on it to wire format %s for the direct "
                "mode's NUMA rules); %d such host(s) so far",
                message.host,
                message.version,
                "; and without ".join(new),
                wire.WIRE_VERSION,
                len(self.lacking),
            )

    def _verify_due(self, record: dict) -> bool:
        """The test the syncer makes, on the record's copy of its cache."""
        try:
            verified_at = float(record[CACHE_KEY]["verified_at"])
        except (KeyError, TypeError, ValueError):
            return True
        return self.clock() - verified_at >= self.full_verify_interval

    def _save(self, store: Store, record: dict) -> None:
        # The syncer owns the other keys of the same file.
        store.put(RECORD_KEY, record)

    def _take(self, store: Store, record: dict) -> None:
        """Drop the cache and the shape from the shared record before
        writing to Placement; :meth:`_handle` puts them back when done."""
        if record.get(CACHE_KEY) is None and record.get(SHAPE_KEY) is None:
            return
        self._save(store, {k: v for k, v in record.items() if k not in (CACHE_KEY, SHAPE_KEY)})

    def _local(self, host: str, record: dict, desired) -> _Local:
        """A syncer and the direct mode's runner holding what the record
        holds, as the agent's previous cycle left them."""

        client = self.client_factory()
        # The agent's machine is the one whose mark it sent: a tree for a
        # root that nova-compute or another machine manages is refused.
        syncer = TreeSyncer(
            client,
            self.coordination.store(host),
            full_verify_interval=self.full_verify_interval,
            clock=self.clock,
            owner=identity_of_tree(desired.tree),
        )
        syncer.import_cache(record.get(CACHE_KEY))
        shape = shape_of(desired)
        # The allocations were checked for this shape when it was applied.
        applied = shape if record.get(SHAPE_KEY) == shape_digest(shape) else None
        return _Local(client, syncer, applier_runner(client, syncer, applied_shape=applied))

    # -- the ownership check

    def foreign(self, local: _Local, tree) -> list[str]:
        """Providers of ``tree`` that Placement shows in another host's tree.

        What is looked up (a host costs these once, not every cycle):

        * the root: its uuid is the state's; without one, the provider named
          like the host (``GET ?name=``), which must be a root: a provider of
          that name with a parent belongs to another host's tree;
        * children whose name the state does not hold, when the root exists:
          ``GET ?in_tree=<root>`` (only when the root was looked up by name,
          i.e. the state was lost: most children are then in it); a name not
          in this host's tree is looked up (``GET ?name=``, one each) and
          refused if Placement has it under another root. The reshape
          resolves such names globally, so they must be checked first. When
          the root does not exist nothing can be reshaped, and the sync's
          ``POST`` of a name that exists anywhere gets a 409 and adopts the
          provider only when it is in this host's tree: no lookup;
        * every uuid the message carries that the state does not hold
          (``GET /resource_providers/{uuid}``): refused if in another tree.
        """
        client = local.client
        state = local.syncer.state
        known = dict(state.get(PROVIDERS, {}))
        problems: list[str] = []
        root = state.get(ROOT_UUID)
        looked_up = root is None
        if looked_up:
            found = self._by_name(client, tree.root.name)
            if found and found.get("parent_provider_uuid"):
                return [
                    f"{tree.root.name}: a provider of that name is a child in "
                    f"another tree (root {found.get('root_provider_uuid')})"
                ]
            root = found["uuid"] if found else None
        ours = set(known.values()) | ({root} if root else set())
        for provider in tree.providers:
            if provider.uuid and provider.uuid not in ours:
                found = self._by_uuid(client, provider.uuid)
                if found and found.get("root_provider_uuid") != root:
                    problems.append(
                        f"{provider.name}: uuid {provider.uuid} is provider "
                        f"{found['name']!r} of another host's tree"
                    )
        unknown = [p.name for p in tree.providers[1:] if p.name not in known]
        if root is None or not unknown:
            return problems
        in_tree = self._tree_names(client, root) if looked_up else set()
        for name in unknown:
            if name in in_tree:
                continue
            found = self._by_name(client, name)
            if found and found.get("root_provider_uuid") != root:
                problems.append(
                    f"{name}: a provider of that name belongs to another "
                    f"tree (root {found.get('root_provider_uuid')})"
                )
        return problems

    @staticmethod
    def _by_name(client, name: str) -> Optional[dict]:
        found = client.providers_named(name)
        return found[0] if found else None

    @staticmethod
    def _tree_names(client, root: str) -> set[str]:
        listed = client.providers_in_tree(root)
        return {rp["name"] for rp in listed}

    @staticmethod
    def _by_uuid(client, uuid: str) -> Optional[dict]:
        try:
            return client.provider(uuid)
        except NotFound:
            return None


class Endpoint:
    """The RPC method agents call."""

    def __init__(self, applier: Applier):
        self.applier = applier
        self.target = messaging.oslo_messaging().Target(version=wire.RPC_VERSION)

    def apply(self, ctxt, message):
        return self.applier.handle(message)


# ---------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="node-agent-applier",
        description="Apply node-agent trees received over oslo.messaging to Placement.",
    )
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument("--config-file", action="append", default=[], metavar="FILE")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR")
    parser.add_argument("--debug", action="store_true", help="log at DEBUG level")
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="check the configuration (transport_url, Placement, the "
        "master key files) and exit: 0 usable, 78 not, 75 when a "
        "service it needs does not answer",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    derive = commands.add_parser(
        "derive-key",
        help="the signing key of HOST, derived from [applier] "
        "master_key_file: what HOST's [agent] upstream_key_file holds",
    )
    derive.add_argument("host", metavar="HOST", help="the host's name, as its agent sends it")
    derive.add_argument(
        "--output", metavar="FILE", help="write the key to FILE (mode 0600) instead of printing it"
    )
    shown = commands.add_parser(
        "status",
        help="the hosts the appliers hold a record of: when each last reported, "
        "and which are closed as dead ([applier] dead_after)",
    )
    shown.add_argument("--output", choices=("text", "json"), default="text")
    forget = commands.add_parser(
        "forget",
        help="remove HOST's record (before moving it back to the direct mode, "
        "or once it is gone): the sweep then never closes it; a "
        "COMPUTE_STATUS_DISABLED the appliers added to its root is removed first",
    )
    forget.add_argument("host", metavar="HOST")
    return parser


def derive_key(conf, host: str, output: Optional[str]) -> int:
    """``derive-key HOST``: the key under the current master."""

    if schema.first_error(host, 2, at="host") is not None:
        raise ConfigError(
            f"derive-key: {host!r} is not a host name (letters, digits, "
            "'.', '_', '-'), so no agent can send it"
        )
    key = signing.host_key(keys.read_master(conf.applier.master_key_file or ""), host)
    if output:
        keys.write_host_key(output, key)
        print(
            f"wrote the key of {host} to {output} (mode 0600): copy it to {host} "
            "as its [agent] upstream_key_file, owned by the agent's user, mode 0600"
        )
    else:
        print(key.hex())
    return 0


def check_config(conf) -> int:
    """``--check-config``: every problem in one run; nothing is started."""

    problems: list[str] = []
    rpc_url, _ = messaging.urls(conf)
    if not rpc_url:
        problems.append(
            "node-agent-applier needs [DEFAULT] transport_url (the bus the agents send to)"
        )
    try:
        _placement_client(conf)
    except ConfigError as exc:
        problems += exc.problems
    try:
        ring = keys.keyring(conf.applier)
    except ConfigError as exc:
        problems += exc.problems
    group = conf.applier
    problem = liveness.dead_after_problem(group.dead_after, group.lock_timeout)
    if problem:
        problems.append(problem)
    try:
        coordination = Coordination(
            group.coordination_url,
            Path(group.state_path),
            f"check-config-{os.getpid()}",
            group.lock_timeout,
        )
    except ConfigError as exc:
        problems += exc.problems
    if problems:
        raise ConfigError(problems)
    coordination.start()  # CoordinationError: exit 75, naming the backend
    coordination.stop()
    print(
        f"configuration is usable: {len(ring.masters)} master key(s)"
        + ("; unsigned messages (wire 2.0, 2.1) accepted" if ring.accept_unsigned else "")
        + f"; coordination backend answers: {coordination.where()}"
        + (
            ""
            if coordination.lock_expiry is None
            else f" (a killed applier's host locks expire after {coordination.lock_expiry}s)"
        )
    )
    return 0


def _status_line(topic: str, applier: Applier) -> str:
    """systemd's STATUS=: the topic and the hosts closed as dead."""
    closed = sorted(applier.dead.snapshot()[0])
    if not closed:
        return f"listening on topic {topic}"
    shown = ", ".join(closed[:5]) + (f" and {len(closed) - 5} more" if len(closed) > 5 else "")
    return f"listening on topic {topic}; {len(closed)} host(s) closed as dead: {shown}"


def _check_dead_after(group) -> None:
    problem = liveness.dead_after_problem(group.dead_after, group.lock_timeout)
    if problem:
        raise ConfigError(problem)


def status(conf, output: str) -> int:
    """``status``: every host the appliers hold a record of, when it last
    reported, and whether it is closed as dead (read from the coordination
    backend, so it shows what every applier process did)."""
    group = conf.applier
    coordination = Coordination(
        group.coordination_url, Path(group.state_path), f"status-{os.getpid()}", group.lock_timeout
    ).start()
    try:
        now = time.time()
        rows = []
        for host in coordination.hosts():
            record = coordination.store(host).load_or_empty(LOG).get(RECORD_KEY, {})
            seen = record.get(dead_hosts.SEEN_KEY)
            closed = record.get(dead_hosts.CLOSED_KEY) or None
            rows.append(
                {
                    "host": host,
                    "seen_ago": None if seen is None else round(now - float(seen), 1),
                    "closed": closed is not None,
                    "closed_since": None if closed is None else closed.get("at"),
                    "trait_added_by_applier": None if closed is None else bool(closed.get("added")),
                }
            )
    finally:
        coordination.stop()
    if output == "json":
        print(json.dumps({"dead_after": group.dead_after, "hosts": rows}, indent=1))
        return 0
    closed_rows = [r for r in rows if r["closed"]]
    print(
        f"{len(rows)} host(s), {len(closed_rows)} closed as dead "
        f"([applier] dead_after = {group.dead_after} s"
        + (", off" if not group.dead_after else "")
        + ")"
    )
    for row in rows:
        seen = (
            "never recorded"
            if row["seen_ago"] is None
            else f"last message {row['seen_ago']:.0f} s ago"
        )
        state = ""
        if row["closed"]:
            state = " CLOSED as dead" + (
                "" if row["trait_added_by_applier"] else " (the trait was already there: not ours)"
            )
        print(f"  {row['host']}: {seen}{state}")
    return 0


def forget_host(conf, host: str) -> int:
    """``forget HOST``: 0 done, 1 when there was no record."""
    group = conf.applier
    coordination = Coordination(
        group.coordination_url, Path(group.state_path), f"forget-{os.getpid()}", group.lock_timeout
    ).start()
    try:
        base = _placement_client(conf)
        watch = DeadHosts(
            coordination, lambda: PlacementClient(base.adapter), 0, lock_timeout=group.lock_timeout
        )
        try:
            had, removed = watch.forget(host)
        except Busy:
            raise CoordinationError(
                f"forget {host}: its record is held by an applier applying one of its "
                f"messages for more than {group.lock_timeout:g} s; stop its agent first"
            ) from None
    finally:
        coordination.stop()
    if not had:
        print(f"no record of {host}: nothing to forget", file=sys.stderr)
        return 1
    print(
        f"forgot {host}"
        + (f": removed the {maint.TRAIT} the appliers had added to its root" if removed else "")
        + "; a message from it makes a new record"
    )
    return 0


def _placement_client(conf):
    if not placement_configured(conf):
        raise ConfigError(
            "node-agent-applier needs Placement: set [placement] auth_type "
            "(and its credentials) or endpoint_override"
        )
    return PlacementClient.from_conf(conf)


def serve(conf) -> int:
    """Listen until SIGTERM/SIGINT; returns the exit code."""

    rpc_url, _ = messaging.urls(conf)
    if not rpc_url:
        raise ConfigError(
            "node-agent-applier needs [DEFAULT] transport_url (the bus the agents send to)"
        )

    group = conf.applier
    _check_dead_after(group)
    keyring = keys.keyring(group)
    base = _placement_client(conf)
    base.check_version()
    token = f"{socket.gethostname()}:{os.getpid()}:{uuidlib.uuid4().hex[:8]}"
    coordination = Coordination(
        group.coordination_url, Path(group.state_path), token, group.lock_timeout
    ).start()
    applier = Applier(
        lambda: PlacementClient(base.adapter),
        Path(group.state_path),
        full_verify_interval=group.full_verify_interval,
        lock_timeout=group.lock_timeout,
        token=token,
        keyring=keyring,
        coordination=coordination,
        dead_after=group.dead_after,
    )
    if keyring.accept_unsigned:
        LOG.warning(
            "[applier] accept_unsigned is on: messages of wire format 2.0 and "
            "2.1 carry no signature and can name any host; turn it off once "
            "every agent signs"
        )

    metrics = applier_metrics.serve(applier, group.metrics_port, group.metrics_host)
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
    watch = None
    if applier.dead.enabled:
        watch = threading.Thread(
            target=applier.dead.run, args=(stop,), name="dead-hosts", daemon=True
        )
        watch.start()
    notifier = systemd_notifier()
    notifier.notify("READY=1")
    notifier.notify(f"STATUS=listening on topic {group.topic}")
    LOG.info(
        "node-agent-applier listening on topic %s (coordination: %s%s)",
        group.topic,
        coordination.where(),
        ""
        if coordination.lock_expiry is None
        else f"; a killed applier's host locks expire after {coordination.lock_expiry}s",
    )
    shown = None
    while not stop.wait(5):
        notifier.notify("WATCHDOG=1")
        status = _status_line(group.topic, applier)
        if status != shown:
            notifier.notify(f"STATUS={status}")
            shown = status
    notifier.notify("STOPPING=1")
    if watch is not None:
        watch.join(30)
    server.stop()
    server.wait()
    transport.cleanup()
    coordination.stop()
    if metrics is not None:
        metrics.shutdown()
    LOG.info("node-agent-applier stopped")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        conf = load_conf(oslo_args(args))
        logs.setup(conf, args.debug)  # the same format as node-agent
        messaging.register(conf)
        if args.command == "derive-key":
            return derive_key(conf, args.host, args.output)
        if args.command == "status":
            return status(conf, args.output)
        if args.command == "forget":
            return forget_host(conf, args.host)
        if args.check_config:
            return check_config(conf)
        return serve(conf)
    except NodeAgentError as exc:
        print(f"node-agent-applier: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
