"""``[agent] upstream = messaging``: the agent's side of node-agent-applier.

The agent holds no Placement credentials. Each cycle it sends one RPC call
(topic ``[agent] upstream_topic``, no server: the applier processes on that
topic are competing consumers) and learns the result from the reply:

* when the tree or the reshape inputs changed since the last acknowledged
  apply (their digest differs), or on the first cycle of the process: the
  full message, ``{version, host, seq, digest, signature, body}``;
* otherwise a heartbeat, ``{version, host, seq, digest, signature}`` (about 220
  bytes). The applier answers ``unchanged`` without touching Placement,
  re-applies the tree it keeps when its periodic full verify is due, or
  answers ``unknown_digest``, and the agent sends the full message at once.

``body`` and its checks are the wire format, :mod:`node_agent.remote.wire`.

``seq`` grows on every message (microseconds of the wall clock, never
below the last one sent), so the applier can ignore a message older than
one it already applied (``stale``).

No answer within ``[agent] upstream_timeout`` raises :class:`NoApplier`, a
:class:`~node_agent.placement.client.Unavailable`: the service backs off as for a
Placement outage. Nothing is lost; the next cycle sends the state of then.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional

from node_agent.config.settings import _masked_url
from node_agent.errors import ConfigError
from node_agent.placement.errors import Unavailable
from node_agent.policy.guest_fit import guests_refused
from node_agent.remote import messaging
from node_agent.remote.wire import (
    BUSY,
    DEFAULT_TOPIC,
    ERROR,
    METHOD,
    REFUSED,
    RPC_VERSION,
    STALE,
    STATUSES,
    UNCHANGED,
    UNKNOWN_DIGEST,
    WIRE_VERSION,
    Malformed,
    body_of,
    check_outgoing,
    digest_of,
    full_message,
    heartbeat,
)
from node_agent.state import APPLIED, FILE_INVENTORIES, PROVIDERS

LOG = logging.getLogger(__name__)


# Connection retries of one call when the broker is away (oslo.messaging's
# default retries forever); the next cycle sends again.
RPC_RETRY = 2


class NoApplier(Unavailable):
    """No node-agent-applier answered in time (or it could not use Placement)."""


class Refused(ConfigError):
    """The applier refused the tree (another host's providers, bad format)."""


# ---------------------------------------------------------------- the reply


@dataclass(frozen=True)
class RemoteChange:
    """A request the applier sent, as the notifications describe it."""

    method: str
    path: str
    summary: str
    provider: Optional[str] = None


@dataclass
class UpstreamReport:
    """The applier's answer, shaped like a SyncReport for the service."""

    status: str
    applied: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    requests: int = 0
    messages: int = 1
    reshape: Optional[dict] = None
    uuids: dict = field(default_factory=dict)
    text: str = ""
    # The maintenance the applier applied ({"on", "kept_by_placement"}); None
    # from a heartbeat or an older applier.
    maintenance: Optional[dict] = None
    # Refused on this host: guests the CPU sets leave without CPUs.
    guests_refused: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        sent = f"{self.messages} message{'s' if self.messages != 1 else ''}"
        if self.status == UNCHANGED:
            return f"no change (heartbeat; {sent})"
        return f"{self.text or 'applied'} (via applier; {sent})"


def report_from_reply(reply: Mapping, messages: int) -> UpstreamReport:
    return UpstreamReport(
        status=reply.get("status", ERROR),
        applied=[
            RemoteChange(
                c.get("method", ""), c.get("path", ""), c.get("summary", ""), c.get("provider")
            )
            for c in reply.get("applied", [])
        ],
        errors=list(reply.get("errors", [])),
        requests=int(reply.get("requests", 0)),
        messages=messages,
        reshape=reply.get("reshape"),
        uuids=dict(reply.get("uuids") or {}),
        text=reply.get("summary", ""),
        maintenance=reply.get("maintenance")
        if isinstance(reply.get("maintenance"), dict)
        else None,
    )


def remember(store, report: UpstreamReport, desired) -> None:
    """Keep in the agent's state file what the direct mode's syncer keeps
    for the cycle: the operator-file traits applied (once applied cleanly),
    the operator-file inventories and the providers' uuids, so provider files may name them by uuid.
    Written only when something changed."""

    def note(state: dict) -> None:
        if report.ok:
            state[APPLIED] = {k: list(v) for k, v in desired.applied.items()}
        if desired.applied_inventories or state.get(FILE_INVENTORIES):
            state[FILE_INVENTORIES] = dict(desired.applied_inventories)
        if report.uuids:
            state[PROVIDERS] = dict(report.uuids)

    store.update(note)


def _guests_refused_here(desired) -> Optional[UpstreamReport]:
    """Guests that do not fit the CPU sets are refused on the host, where the
    whole partition is known (the applier gets only the dedicated set):
    nothing is sent, the report carries the refusal."""

    refused = guests_refused(desired)
    if refused is None:
        return None
    LOG.debug("%s", refused)  # the service reports it, once while it stays the same
    return UpstreamReport(
        status=REFUSED,
        guests_refused=True,
        errors=[str(refused)],
        messages=0,
        reshape={
            "refused": list(refused.reasons),
            "lines": [f"REFUSED: {r}" for r in refused.reasons],
        },
        text="refused on this host: nothing sent",
    )


# ---------------------------------------------------------------- the shell


class MessagingUpstream:
    """The agent's RPC client of node-agent-applier. One per process: it
    remembers the last sequence number and the last acknowledged digest."""

    def __init__(
        self,
        conf,
        host: str,
        topic: str = DEFAULT_TOPIC,
        timeout: float = 60.0,
        clock=time.time,
        *,
        key: bytes,
    ):

        rpc_url, _ = messaging.urls(conf)
        if not rpc_url:
            raise ConfigError(
                "[agent] upstream = messaging needs [DEFAULT] transport_url "
                "(the bus node-agent-applier listens on)"
            )
        self._om = messaging.oslo_messaging()
        self._transport = self._om.get_rpc_transport(conf, url=rpc_url)
        target = self._om.Target(topic=topic, version=RPC_VERSION)
        self._client = self._om.get_rpc_client(self._transport, target, timeout=timeout)
        self.host, self.topic, self.timeout = host, topic, timeout
        self.key = key  # this host's own key: it can sign for no other host
        self.clock = clock
        self.seq = 0
        self.acked: Optional[str] = None
        self.messages_sent = 0
        self._rpc_url = rpc_url
        self._bus_answered = False

    def _next_seq(self) -> int:
        self.seq = max(self.seq + 1, int(self.clock() * 1_000_000))
        return self.seq

    def _check_bus(self) -> None:
        """Connect once, with bounded retries, before the first call.

        oslo.messaging opens the reply queue's connection with unbounded
        retries, so a first call to a broker that is down (or that refuses
        the TLS handshake) would never return, whatever the call's timeout.
        A send connection from the same pool, with the same TLS options,
        fails in a few seconds instead, and is reused by the call."""
        from oslo_messaging._drivers import common as rpc_common

        get_connection = getattr(getattr(self._transport, "_driver", None), "_get_connection", None)
        if get_connection is None:  # a driver without a pool: nothing to check
            return
        try:
            with get_connection(rpc_common.PURPOSE_SEND, retry=RPC_RETRY):
                pass
        except Exception as exc:  # noqa: BLE001 - kombu and amqp raise many types; all mean "no"
            raise NoApplier(
                f"the message bus at {_masked_url(self._rpc_url)} did not "
                f"accept a connection: {_masked_url(str(exc)) or type(exc).__name__}"
                "; the next cycle tries again"
            ) from None

    def _call(self, message: dict, timeout: float) -> dict:
        check_outgoing(message)  # raises Malformed: nothing is sent
        if not self._bus_answered:
            self._check_bus()
        self.messages_sent += 1
        try:
            reply = self._client.prepare(timeout=timeout, retry=RPC_RETRY).call(
                {}, METHOD, message=message
            )
            self._bus_answered = True
        except self._om.MessagingTimeout:
            self._bus_answered = True  # the reply queue exists: later calls are bounded
            raise NoApplier(
                f"no node-agent-applier answered on topic {self.topic} "
                f"within {timeout:g}s; the next cycle sends the tree "
                "again"
            ) from None
        except self._om.MessagingException as exc:
            raise NoApplier(
                f"the message bus refused the call to node-agent-applier: {exc}"
            ) from exc
        if not isinstance(reply, dict) or reply.get("status") not in STATUSES:
            raise NoApplier(f"node-agent-applier answered {reply!r}, not a reply")
        return reply

    def send(self, desired, timeout: Optional[float] = None) -> UpstreamReport:
        """Send this cycle's state; returns what the applier did.

        Raises :class:`NoApplier` (no answer, or the applier could not use
        Placement) and :class:`Refused` (the applier will not apply this tree).
        """
        refused = _guests_refused_here(desired)
        if refused is not None:
            return refused
        before = self.messages_sent
        try:
            return self._send(desired, timeout or self.timeout)
        except Malformed as exc:
            LOG.error(
                "not sent to node-agent-applier: this agent built a message that "
                "breaks wire format %s (a bug in node-agent): %s",
                WIRE_VERSION,
                exc,
            )
            return UpstreamReport(
                status=REFUSED,
                messages=self.messages_sent - before,
                errors=[f"wire format {WIRE_VERSION}: {exc}"],
                text="refused on this host (a node-agent bug): nothing sent",
            )

    def _send(self, desired, timeout: float) -> UpstreamReport:
        body = body_of(desired)
        digest = digest_of(body)
        sent = 1
        if digest == self.acked:
            reply = self._call(heartbeat(self.host, self._next_seq(), digest, self.key), timeout)
            if reply["status"] == UNKNOWN_DIGEST:
                reply, sent = (
                    self._call(full_message(self.host, self._next_seq(), body, self.key), timeout),
                    2,
                )
        else:
            reply = self._call(full_message(self.host, self._next_seq(), body, self.key), timeout)
        if reply["status"] == STALE:
            LOG.warning(
                "node-agent-applier already applied sequence %s for %s, newer "
                "than ours (%s): the clock went back, or another agent uses "
                "this host name; sending again after it",
                reply.get("last_seq"),
                self.host,
                self.seq,
            )
            self.seq = max(self.seq, int(reply.get("last_seq") or 0))
            reply = self._call(full_message(self.host, self._next_seq(), body, self.key), timeout)
            sent += 1
        return self._outcome(reply, digest, sent)

    def _outcome(self, reply: dict, digest: str, sent: int) -> UpstreamReport:
        status = reply["status"]
        if status == REFUSED:
            raise Refused(
                f"node-agent-applier refused the tree of {self.host}: {reply.get('error')}"
            )
        if status in (ERROR, BUSY, STALE, UNKNOWN_DIGEST):
            raise NoApplier(
                f"node-agent-applier could not apply the tree of "
                f"{self.host} ({status}): {reply.get('error', '')}".rstrip(": ")
            )
        self.acked = digest
        return report_from_reply(reply, sent)

    def close(self) -> None:
        self._transport.cleanup()
