"""What the control RPC and ``node-agent maintenance`` act on: a cycle now,
the status, the maintenance flag. Kept apart from oslo.messaging
(:mod:`node_agent.remote.messaging` calls :class:`Control`) and from the
cycle (:class:`node_agent.service.daemon.Agent`)."""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from node_agent.errors import NodeAgentError
from node_agent.policy import device_maintenance as devmaint
from node_agent.policy import maintenance as maint
from node_agent.state import DEVICE_MAINTENANCE, MAINTENANCE, StateStore

if TYPE_CHECKING:
    from node_agent.cycle.desired import Desired
    from node_agent.service.daemon import Agent
    from node_agent.service.loop import Service

LOG = logging.getLogger(__name__)


def utc_now() -> str:
    """Now, as the status and the state file show it."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class Maintenance:
    """The operator's maintenance flag: the ``maintenance`` key of the state
    file, as ``node-agent maintenance`` writes it. :mod:`node_agent.cycle.desired`
    turns it into a fully reserved tree on the next cycle."""

    def __init__(self, state_path: str):
        self._store = StateStore(Path(state_path))

    def get(self, last: Optional[Desired] = None) -> dict:
        """The state file's say; ``last`` (the last cycle's desired) adds
        maintenance kept on by Placement's disabled trait alone."""
        saved = self._store.load_or_empty(LOG).get(MAINTENANCE)
        if not saved and last is not None and maint.is_on(last.maintenance):
            return {
                "on": True,
                "reason": maint.UNKNOWN_REASON,
                "since": None,
                "source": "placement",
            }
        if saved is None or not maint.is_on(saved):
            return {
                "on": False,
                "reason": None,
                "since": None,
                "off_pending": maint.requested(saved) is False,
            }
        return {
            "on": True,
            "reason": saved.get("reason") or None,
            "since": saved.get("since"),
            "source": "state file",
        }

    def devices(self, last: Optional[Desired] = None) -> dict:
        """Provider name -> its device maintenance (the last cycle's tree
        and the state file's records): :func:`devmaint.status`."""
        records = self._store.load_or_empty(LOG).get(DEVICE_MAINTENANCE)
        return devmaint.status(last.tree if last is not None else None, records)

    def set_device(self, provider: str, on: bool, reason: Optional[str] = None) -> dict:
        record = maint.record(on, reason, utc_now())

        def put(state: dict) -> None:
            state[DEVICE_MAINTENANCE] = {**(state.get(DEVICE_MAINTENANCE) or {}), provider: record}

        self._store.update(put)
        LOG.info(
            "maintenance %s for %s%s",
            "on" if on else "off",
            provider,
            f": {reason}" if reason else "",
        )
        return {"provider": provider, **record}

    def set(self, on: bool, reason: Optional[str] = None) -> dict:
        # The syncer owns the other keys of the file.
        self._store.put(MAINTENANCE, maint.record(on, reason, utc_now()))
        LOG.info("maintenance %s%s", "on" if on else "off", f": {reason}" if reason else "")
        return self.get()


class Control:
    """What the RPC endpoints act on (kept apart from oslo.messaging)."""

    SYNC_WAIT = 120.0

    def __init__(self, agent: Agent, service: Service):
        self.agent = agent
        self.service = service

    def sync_now(self) -> dict:
        number = self.service.trigger(wait=self.SYNC_WAIT)
        status = self.status()
        status["triggered_cycle"] = number
        return status

    def status(self) -> dict:
        return self.agent.status(self.service)

    def set_maintenance(
        self, on: bool, reason: Optional[str] = None, provider: Optional[str] = None
    ) -> dict:
        """The maintenance status after the switch, or, when the state file
        cannot be written (read-only, full, permission), a refusal:
        ``{"error": message, "exit_code": code}``, which the caller prints
        and exits with; nothing is applied. After the switch, a cycle
        reserves (or releases) it now: ``applied_in_cycle`` is that cycle's
        number, or None when it had not ended within SYNC_WAIT (a loaded
        host, a slow Placement); the flag is recorded either way and the
        cycle still applies it.

        ``provider``: one child of the tree only
        (:mod:`node_agent.policy.device_maintenance`); a name that is not
        one of the last cycle's children is refused, naming them."""
        try:
            switch = Maintenance(self.service.config.settings.state_path)
            if provider is not None:
                desired = self.agent.last_desired
                if desired is None:
                    raise NodeAgentError(
                        f"maintenance --provider {provider}: the service has not built "
                        "this host's tree yet; try again after its first cycle"
                    )
                devmaint.check_name(desired.tree, provider)
                result = switch.set_device(provider, on, reason)
            else:
                result = switch.set(on, reason)
        except NodeAgentError as exc:
            LOG.error("maintenance %s refused: %s", "on" if on else "off", exc)
            return refusal(exc)
        result["applied_in_cycle"] = self.service.trigger(wait=self.SYNC_WAIT)
        return result


def refusal(exc: NodeAgentError) -> dict:
    """A control RPC's answer for an error the agent raised on purpose: the
    caller gets the message and the exit code, not a remote traceback."""
    return {"error": str(exc), "exit_code": exc.exit_code}
