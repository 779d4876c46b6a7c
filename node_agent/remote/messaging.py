"""The agent on the message bus (oslo.messaging): versioned notifications
out, a small control RPC in.

Notifications (priority INFO unless noted), publisher ``node-agent.<host>``:

* ``node_agent.inventory.update``: the changes a sync applied, and the
  tree's totals after it;
* ``node_agent.reshape.start`` / ``.end`` / ``.error`` (ERROR);
* ``node_agent.sync.error`` (ERROR): Placement refused or was unreachable;
* ``node_agent.audit.update`` (WARN when it holds alarms): the allocation
  audit's findings (:mod:`node_agent.policy.audit`), sent when their set
  changed (a new alarm, one resolved, an in-flight case begun or ended).
* ``node_agent.drift.update`` (WARN when it holds differences), companion
  mode only: the differences between Placement and the host
  (:mod:`node_agent.policy.drift`), sent when their set changed.

Each payload is a versioned envelope, as nova's versioned notifications
are: ``node_agent_object.name`` / ``.version`` / ``.namespace`` /
``.data``. Bump ``PAYLOAD_VERSION``'s minor for an added field, its major
for a removed or changed one.

RPC: topic ``node-agent``, server = the host name; methods ``sync_now``,
``get_status``, ``set_maintenance(on, reason, provider)``; answers are JSON-able
dicts. ``node-agent ctl`` (:mod:`node_agent.cli.ctl`) is its client.

Without ``[DEFAULT] transport_url`` (nor ``[oslo_messaging_notifications]
transport_url``) there is no bus: :func:`from_conf` says so at INFO and
returns None.

Notifications go out from a sender thread, so a cycle never waits for
the broker; when the broker is down they are retried a few times, then
dropped with a warning (they describe state that the next one repeats).
"""

from __future__ import annotations

import importlib
import logging
import queue
import threading
import warnings
from typing import Iterable, Optional

from oslo_config import cfg

from node_agent.config.settings import _masked_url
from node_agent.errors import ConfigError, NodeAgentError

LOG = logging.getLogger(__name__)

TOPIC = "node-agent"
RPC_VERSION = "1.0"
PAYLOAD_VERSION = "1.0"
NAMESPACE = "node_agent"
# Connection retries of one notification when the broker is away; the
# default (-1) would retry forever and stall the sender.
NOTIFY_RETRY = 2
QUEUE_SIZE = 100

EVENT_PAYLOADS = {
    "node_agent.inventory.update": "InventoryUpdatePayload",
    "node_agent.reshape.start": "ReshapePayload",
    "node_agent.reshape.end": "ReshapePayload",
    "node_agent.reshape.error": "ReshapePayload",
    "node_agent.sync.error": "SyncErrorPayload",
    "node_agent.audit.update": "AuditPayload",
    "node_agent.drift.update": "DriftPayload",
}


# oslo.messaging and kombu are imported when a bus is used, here and in
# remote/upstream.py: the CLI imports this module on every run, and a
# dry-run never pays for them (tests/cli/test_start_cost.py).
def oslo_messaging():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # oslo.service's eventlet notice
        import oslo_messaging
    return oslo_messaging


def payload(event_type: str, data: dict) -> dict:
    """The versioned envelope of ``event_type`` around ``data`` (pure)."""
    return {
        "node_agent_object.name": EVENT_PAYLOADS[event_type],
        "node_agent_object.namespace": NAMESPACE,
        "node_agent_object.version": PAYLOAD_VERSION,
        "node_agent_object.data": data,
    }


def register(conf) -> None:
    """Register oslo.messaging's options on ``conf`` (safe to repeat)."""
    oslo_messaging()
    from oslo_messaging import opts as om_opts

    for group, opts in om_opts.list_opts():
        if group in (None, "oslo_messaging_notifications"):
            conf.register_opts(opts, group=group)
    # oslo.messaging 18 registers its metrics and tracing options on the
    # global CONF only, then reads them from the conf it is given.
    for group in ("oslo_messaging_metrics", "oslo_messaging_tracing"):
        module = f"oslo_messaging._{group.rsplit('_', 1)[1]}.client"
        try:
            opts = getattr(importlib.import_module(module), group)
        except (ImportError, AttributeError):
            continue  # a release without it
        conf.register_opts(opts, group=group)


def urls(conf) -> tuple[Optional[str], Optional[str]]:
    """(RPC url, notification url); either may be None."""
    register(conf)
    rpc = _configured(conf, "transport_url", None)
    notify = _configured(conf, "transport_url", "oslo_messaging_notifications") or rpc
    return rpc, notify


def check_broker(conf, timeout: float = 10.0) -> str:
    """Connect to every broker of ``[DEFAULT] transport_url`` once (AMQP
    handshake and login, no retry); returns where, or raises
    MessagingUnavailable naming the broker (``--check-config --connect``)."""
    import kombu

    rpc_url, _ = urls(conf)
    parsed = oslo_messaging().TransportURL.parse(conf, rpc_url)
    checked = []
    for host in parsed.hosts:
        where = f"{host.hostname}:{host.port or 5672}"
        connection = kombu.Connection(
            hostname=host.hostname,
            port=host.port or 5672,
            userid=host.username,
            password=host.password,
            virtual_host=parsed.virtual_host or "/",
            connect_timeout=timeout,
        )
        try:
            connection.ensure_connection(max_retries=1, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - kombu/amqp raise many types; all mean "no"
            raise MessagingUnavailable(
                f"the broker at {where} ([DEFAULT] transport_url = "
                f"{_masked_url(rpc_url) if rpc_url else '(not set)'}) did not accept "
                f"a connection: "
                f"{_masked_url(str(exc)) or type(exc).__name__}"
            ) from None
        finally:
            connection.release()
        checked.append(where)
    return ", ".join(checked)


class MessagingUnavailable(NodeAgentError):
    """The broker does not answer or refuses the credentials."""

    exit_code = 75  # EX_TEMPFAIL


def _configured(conf, name: str, group: Optional[str]) -> Optional[str]:
    """The option's value if someone set it; oslo.messaging's own default
    (``rabbit://``, a broker on localhost) does not count as a choice."""

    where = conf.get_location(name, group)
    if where is None or where.location == cfg.Locations.opt_default:
        return None
    value = conf[group][name] if group else conf[name]
    return value or None


class Messenger:
    """Notifier (and, once started, RPC server) of one host."""

    def __init__(self, conf, host: str):
        om = oslo_messaging()
        self.conf = conf
        self.host = host
        rpc_url, notify_url = urls(conf)
        self._rpc_url = rpc_url
        self._rpc_server = None
        self._notifier = None
        if notify_url:
            transport = om.get_notification_transport(conf, url=notify_url)
            # A bus without a driver would send nothing; messagingv2 is
            # what consumers of versioned notifications read.
            driver = None if conf.oslo_messaging_notifications.driver else "messagingv2"
            self._notifier = om.Notifier(
                transport, publisher_id=f"node-agent.{host}", driver=driver, retry=NOTIFY_RETRY
            )
        self._queue: "queue.Queue" = queue.Queue(QUEUE_SIZE)
        self._sender = threading.Thread(
            target=self._send_loop, name="node-agent-notify", daemon=True
        )
        self._sender.start()

    # -- notifications

    def notify(self, event_type: str, data: dict, priority: str = "info") -> None:
        if self._notifier is None:
            return
        try:
            self._queue.put_nowait((event_type, payload(event_type, data), priority))
        except queue.Full:
            LOG.warning(
                "notification %s dropped: %d are waiting for the broker", event_type, QUEUE_SIZE
            )

    def _send_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            event_type, body, priority = item
            if priority is None:  # a flush marker
                body.set()
                continue
            try:
                getattr(self._notifier, priority)({}, event_type, body)
            except Exception as exc:  # noqa: BLE001 - the bus must never take the agent down
                LOG.warning("notification %s not sent: %s", event_type, exc)

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until queued notifications were handed to the broker."""
        done = threading.Event()
        self._queue.put(("__flush__", done, None))
        done.wait(timeout)

    def inventory_update(self, host: str, changes: Iterable, tree: list[dict]) -> None:
        self.notify(
            "node_agent.inventory.update",
            {
                "host": host,
                "changes": [
                    {
                        "method": c.method,
                        "path": c.path,
                        "summary": c.summary,
                        "provider": c.provider,
                    }
                    for c in changes
                ],
                "providers": tree,
            },
        )

    def sync_error(self, host: str, errors: Iterable[str]) -> None:
        self.notify(
            "node_agent.sync.error", {"host": host, "errors": list(errors)}, priority="error"
        )

    def audit(self, host: str, record: dict) -> None:
        """``record`` is :meth:`node_agent.policy.audit.AuditResult.as_dict`."""
        self.notify(
            "node_agent.audit.update",
            {"host": host, **record},
            priority="warn" if record.get("alarms") else "info",
        )

    def drift(self, host: str, record: dict) -> None:
        """``record`` is :meth:`node_agent.cycle.companion.CompanionReport.as_dict`."""
        self.notify(
            "node_agent.drift.update",
            {**record, "host": host},
            priority="warn" if record.get("drift") else "info",
        )

    def reshape(self, phase: str, host: str, record: dict) -> None:
        """``phase`` is start, end or error; ``record`` describes the reshape."""
        self.notify(
            f"node_agent.reshape.{phase}",
            {"host": host, **record},
            priority="error" if phase == "error" else "info",
        )

    # -- RPC

    def start_rpc(self, control) -> bool:
        if not self._rpc_url:
            LOG.info("[DEFAULT] transport_url is not set: the control RPC is disabled")
            return False
        om = oslo_messaging()
        transport = om.get_rpc_transport(self.conf, url=self._rpc_url)
        target = om.Target(topic=TOPIC, server=self.host)
        server = om.get_rpc_server(transport, target, [Endpoint(control)])
        self._rpc_server = server
        server.start()
        LOG.info("control RPC listening: topic %s, server %s", TOPIC, self.host)
        return True

    def stop(self) -> None:
        if self._rpc_server is not None:
            self._rpc_server.stop()
            self._rpc_server.wait()
            self._rpc_server = None
        self._queue.put(None)
        self._sender.join(5)


class Endpoint:
    """The RPC methods; each answers a JSON-able dict."""

    def __init__(self, control):
        self.control = control
        self.target = oslo_messaging().Target(version=RPC_VERSION)

    def sync_now(self, ctxt):
        return self.control.sync_now()

    def get_status(self, ctxt):
        return self.control.status()

    def set_maintenance(self, ctxt, on, reason=None, provider=None):
        return self.control.set_maintenance(bool(on), reason, provider)


def from_conf(conf, host: str) -> Optional[Messenger]:
    rpc_url, notify_url = urls(conf)
    if not rpc_url and not notify_url:
        LOG.info(
            "[DEFAULT] transport_url is not set: notifications are off and "
            "the control RPC is disabled"
        )
        return None
    return Messenger(conf, host)


def client(conf, host: str, timeout: float = 30):
    """An RPC client for the agent on ``host``."""
    rpc_url, _ = urls(conf)
    if not rpc_url:
        raise ConfigError(
            "[DEFAULT] transport_url is not set; the agent's control "
            "RPC needs it (or pass --transport-url)"
        )
    om = oslo_messaging()
    transport = om.get_rpc_transport(conf, url=rpc_url)
    target = om.Target(topic=TOPIC, server=host, version=RPC_VERSION)
    return om.get_rpc_client(transport, target, timeout=timeout)
