"""node-agent-applier closes the hosts that stopped reporting, and reopens
them when they report again (the rules: :mod:`node_agent.policy.liveness`).

What holds it, so that it survives an applier's restart and works across
several applier processes:

* the host's shared record (:mod:`node_agent.remote.coordination`, the
  ``applier`` key every process reads) gets ``seen_at``, the wall-clock time
  of the host's last message, written at most
  :data:`~node_agent.policy.liveness.SEEN_WRITES_PER_PERIOD` times per
  ``dead_after`` (a heartbeat answered "unchanged" writes nothing else), and
  ``closed_dead`` while the host is closed: when, which root, and whether
  this applier added the trait (``added``: only then is it removed);
* Placement holds the close itself: ``COMPUTE_STATUS_DISABLED`` on the root.

Memory holds nothing that matters: a restarted applier reads the records
(:meth:`Coordination.hosts`), closes what is dead (counting from its own
start, see the policy) and reopens, at the host's next message, what the
record says it closed, whichever process closed it.

Every process sweeps every ``dead_after / 4`` seconds (at most 30 s);
closing is done under the host's lock, after reading the record again, so
two processes never both close a host, and a host whose message is being
applied is never closed. Requests: one ``PUT .../traits`` at the cached
generation when the record holds the syncer's cache of the root, else (or
on a 409) one ``GET`` first; the cache is updated to the new generation so
the host's next apply is not a 409.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

from node_agent.placement.client import PlacementClient
from node_agent.placement.errors import GenerationConflict, NotFound
from node_agent.policy import liveness
from node_agent.policy import maintenance as maint
from node_agent.remote.coordination import Busy, Coordination
from node_agent.state import APPLIER as RECORD_KEY
from node_agent.state import ROOT_UUID, Store

LOG = logging.getLogger(__name__)

SEEN_KEY = "seen_at"
CLOSED_KEY = "closed_dead"
CACHE_KEY = "cache"  # the syncer's cache in the record (applier.CACHE_KEY)
SWEEP_MAX = 30.0  # seconds between two sweeps, at most


class DeadHosts:
    """The close/reopen of one applier process; thread-safe."""

    def __init__(
        self,
        coordination: Coordination,
        client_factory: Callable[[], PlacementClient],
        dead_after: float,
        clock: Callable[[], float] = time.time,
        token: str = "",
        lock_timeout: float = 1.0,
    ):
        self.coordination = coordination
        self.client_factory = client_factory
        self.dead_after = dead_after
        self.clock = clock
        self.token = token
        self.lock_timeout = lock_timeout
        self.since = clock()  # the watch's start: see policy.liveness
        self._lock = threading.Lock()
        # As the last sweep saw the records: host -> closed since (wall clock).
        self.closed: dict[str, float] = {}
        self.closes = 0  # hosts this process closed
        self.reopens = 0  # hosts this process reopened
        self.placement_requests = 0

    def snapshot(self) -> tuple[dict[str, float], int, int, int]:
        """(closed hosts -> since, closes, reopens, Placement requests), for
        the metrics and systemd's STATUS=."""
        with self._lock:
            return dict(self.closed), self.closes, self.reopens, self.placement_requests

    @property
    def enabled(self) -> bool:
        return self.dead_after > 0

    @property
    def sweep_interval(self) -> float:
        return min(SWEEP_MAX, max(0.5, self.dead_after / liveness.SEEN_WRITES_PER_PERIOD))

    # -- at each message, under the host's lock (Applier._handle)

    def seen(
        self, host: str, store: Store, record: dict, maintenance_on: Callable[[], bool]
    ) -> dict:
        """The host sent a message: reopen it when the record says the
        applier closed it, refresh ``seen_at`` when due. Returns the record
        as saved. ``maintenance_on``: the host's own maintenance asks for
        the trait, so a reopen leaves it (the cycle keeps it)."""
        now = self.clock()
        closed = record.get(CLOSED_KEY)
        if not closed and not liveness.seen_due(now, _seen_at(record), self.dead_after):
            return record
        new = dict(record)
        new[SEEN_KEY] = now
        if closed:
            self._reopen(host, new, closed, maintenance_on())
            new.pop(CLOSED_KEY, None)
        store.put(RECORD_KEY, new)
        if closed:
            with self._lock:
                self.closed.pop(host, None)
        return new

    def _reopen(self, host: str, record: dict, closed: dict, maintenance_on: bool) -> None:
        root = closed.get("root")
        if not closed.get("added") or maintenance_on or not root:
            LOG.warning(
                "%s reports again after %.0f s closed as dead; COMPUTE_STATUS_DISABLED "
                "is left on its root (%s)",
                host,
                self.clock() - float(closed.get("at", 0)),
                "the host's maintenance is on"
                if maintenance_on and closed.get("added")
                else "the applier did not add it",
            )
            return
        done = self._write_traits(record, root, liveness.reopening)
        with self._lock:
            self.reopens += 1
        LOG.warning(
            "%s reports again: reopened after %.0f s closed as dead (%s)",
            host,
            self.clock() - float(closed.get("at", 0)),
            f"{maint.TRAIT} removed from its root"
            if done
            else f"{maint.TRAIT} was already gone from its root",
        )

    def forget(self, host: str) -> tuple[bool, bool]:
        """``node-agent-applier forget HOST``, under the host's lock: remove
        the trait when the record says the applier added it, then the
        record. Returns (had a record, trait removed). For a host leaving
        the messaging mode: otherwise the sweep closes it as dead."""
        with self.coordination.lock(host, self.lock_timeout):
            store = self.coordination.store(host)
            record = dict(store.load_or_empty(LOG).get(RECORD_KEY, {}))
            closed = record.get(CLOSED_KEY) or {}
            removed = False
            if closed.get("added") and closed.get("root"):
                try:
                    removed = self._write_traits(record, closed["root"], liveness.reopening)
                except NotFound:
                    removed = False
            return self.coordination.forget(host), removed

    # -- the sweep

    def run(self, stop: threading.Event) -> None:
        """Sweep until ``stop`` is set (the serve loop's thread)."""
        while not stop.wait(self.sweep_interval):
            try:
                self.sweep()
            except Exception:  # one failed sweep must not end the watch
                LOG.exception("the dead-host sweep failed; retrying in %.0f s", self.sweep_interval)

    def sweep(self) -> list[str]:
        """Close every dead host not closed yet; returns the hosts closed now."""
        if not self.enabled:
            return []
        done, closed_now = [], {}
        for host in self.coordination.hosts():
            record = self.coordination.store(host).load_or_empty(LOG).get(RECORD_KEY, {})
            if record.get(CLOSED_KEY):
                closed_now[host] = float(record[CLOSED_KEY].get("at", 0))
                continue
            if not liveness.is_dead(self.clock(), _seen_at(record), self.since, self.dead_after):
                continue
            at = self._close_locked(host)
            if at is not None:
                closed_now[host] = at
                done.append(host)
        with self._lock:
            self.closed = closed_now
        return done

    def _close_locked(self, host: str) -> Optional[float]:
        try:
            with self.coordination.lock(host, self.lock_timeout):
                return self._close(host, self.coordination.store(host))
        except Busy:
            return None  # a message of the host is being applied: it is alive

    def _close(self, host: str, store: Store) -> Optional[float]:
        state = store.load_or_empty(LOG)
        record = dict(state.get(RECORD_KEY, {}))
        now = self.clock()
        if record.get(CLOSED_KEY):
            return float(record[CLOSED_KEY].get("at", now))
        seen_at = _seen_at(record)
        if not liveness.is_dead(now, seen_at, self.since, self.dead_after):
            return None
        root = state.get(ROOT_UUID)
        if not root:
            return None  # never registered: nothing of it is open in Placement
        try:
            added = self._write_traits(record, root, liveness.closing)
        except NotFound:
            # Deleted (decommissioned): nothing is open; noted so that the
            # next sweeps do not ask again.
            LOG.warning("%s: its root %s is gone from Placement; nothing to close", host, root)
            added = False
        record[CLOSED_KEY] = {"at": now, "root": root, "added": added, "by": self.token}
        store.put(RECORD_KEY, record)
        with self._lock:
            self.closes += 1
        silent = now - (seen_at if seen_at is not None else self.since)
        LOG.warning(
            "%s closed as dead: no message for %.0f s ([applier] dead_after = %g): %s",
            host,
            silent,
            self.dead_after,
            f"{maint.TRAIT} added to its root {root}; it is removed when the host reports again"
            if added
            else f"{maint.TRAIT} was already on its root {root} (not ours: it stays)",
        )
        return now

    # -- Placement

    def _write_traits(self, record: dict, root: str, change) -> bool:
        """Apply ``change`` (traits -> new traits or None) to the root's
        traits with its generation; True when something was written.
        Updates the record's cache of the root (``record`` in place)."""
        client = self.client_factory()
        start = client.stats.total
        try:
            cached = _cached_root(record, root)
            for attempt in range(3):
                if cached is None or attempt:
                    read = client.traits(root)
                    cached = (read["resource_provider_generation"], read["traits"])
                generation, traits = cached
                wanted = change(traits)
                if wanted is None:
                    return False
                try:
                    written = client.put_traits(
                        root, {"traits": wanted, "resource_provider_generation": generation}
                    )
                except GenerationConflict:
                    continue
                _note_root(record, root, written["resource_provider_generation"], written["traits"])
                return True
            raise GenerationConflict(
                f"the traits of root {root} kept changing while the applier wrote them"
            )
        finally:
            with self._lock:
                self.placement_requests += client.stats.total - start


def _seen_at(record: dict) -> Optional[float]:
    try:
        return float(record[SEEN_KEY])
    except (KeyError, TypeError, ValueError):
        return None


def _cached_root(record: dict, root: str) -> Optional[tuple[int, list[str]]]:
    """(generation, traits) of the root in the record's syncer cache."""
    cache = record.get(CACHE_KEY)
    try:
        for provider in cache["providers"]:  # type: ignore[index]
            if provider["uuid"] == root and int(provider["generation"]) >= 0:
                return int(provider["generation"]), list(provider["traits"])
    except (KeyError, TypeError, ValueError):
        return None
    return None


def _note_root(record: dict, root: str, generation: int, traits) -> None:
    """The root's new generation and traits into the record's cache: the
    host's next apply starts from what is in Placement, not a 409."""
    cache = record.get(CACHE_KEY)
    if not isinstance(cache, dict) or not isinstance(cache.get("providers"), list):
        return
    providers = []
    for provider in cache["providers"]:
        if isinstance(provider, dict) and provider.get("uuid") == root:
            provider = {**provider, "generation": generation, "traits": sorted(traits)}
        providers.append(provider)
    record[CACHE_KEY] = {**cache, "providers": providers}
