"""Where applier processes agree: a lock per host through tooz, and a
record per host in a store every applier can reach. The only code that
talks to the coordination backend.

``[applier] coordination_url`` names the backend, as cinder's or octavia's
``[coordination] backend_url`` does:

* unset: tooz's file driver under ``[applier] state_path/locks`` and the
  records as state files under ``state_path/<host>/`` (one machine:
  today's behaviour and cost; a killed process's locks go with it);
* ``redis://host:port[?lock_timeout=N]``: tooz's Redis driver for the
  locks (a lock expires ``lock_timeout`` seconds after its holder stops
  heartbeating: a process killed while holding a host frees it then; see
  :func:`redis_lock_expiry`) and the records as Redis values under
  ``node-agent-applier/host/<host>``, in the same checksummed envelope as
  the state file. Appliers on several machines then share nothing on
  disk. Redis is the store because it is the backend the locks already
  need: no second service to run, back up or reach.
* ``postgresql://user:password@host:port/database``: tooz's PostgreSQL
  driver (session advisory locks: the server frees a killed holder's locks
  when its connection drops, at once) and the records as rows of one table
  in the same database, through SQLAlchemy (:mod:`.sql_records`), as
  oslo.db-based services keep theirs.

etcd3 would give the locks but no records store (its key-value API is not
tooz's), and MySQL needs PyMySQL, which is not installed nor tested here:
both are refused.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import parse_qs, urlsplit, urlunsplit

import tenacity

from node_agent.errors import ConfigError, NodeAgentError
from node_agent.state import (
    FILE_NAME,
    StateStore,
    Store,
    decode,
    decode_or_empty,
    edited,
    encode,
)

LOG = logging.getLogger(__name__)

RECORD_PREFIX = "node-agent-applier/host/"
LOCK_PREFIX = b"node-agent-applier-host-"
SCHEMES = ("file", "redis", "postgresql")
WHY_NOT = {
    "etcd3": " (tooz gives its locks, but no store for the per-host records)",
    "mysql": " (PyMySQL, which tooz's MySQL driver needs, is not installed, and "
    "this backend is untested)",
}


class Busy(Exception):
    """Another thread or process holds the host's lock."""


class CoordinationError(NodeAgentError):
    """The coordination backend cannot be reached or refused."""

    exit_code = 75


class RedisStore(Store):
    """A host's state as one Redis value (the state file's envelope)."""

    def __init__(self, client, key: str):
        self.client, self.key = client, key
        self.where = f"redis key {key}"

    def load(self) -> dict:
        text = self.client.get(self.key)
        if text is None:
            return {}
        return decode(text.decode("utf-8"), self.where)

    def save(self, data: dict) -> None:
        self.client.set(self.key, encode(data))

    def update(self, change: Callable[[dict], None]) -> dict:
        """As :meth:`node_agent.state.StateStore.update`: read, edit, write
        back only when changed; a Redis transaction (WATCH) instead of a
        file lock, retried when another writer came in between."""
        done: dict = {}

        def attempt(pipe) -> None:
            text = pipe.get(self.key)
            state = decode_or_empty(None if text is None else text.decode("utf-8"), self.where, LOG)
            new = edited(state, change)
            pipe.multi()
            if new != state:
                pipe.set(self.key, encode(new))
            done["state"] = new

        self.client.transaction(attempt, self.key)
        return done["state"]


class HostLock:
    """One host's tooz lock, waiting up to ``timeout`` seconds; raises
    :class:`Busy` when it is not had by then."""

    def __init__(self, lock, timeout: float):
        self._lock = lock
        self.timeout = timeout
        self.waited = False  # another holder was there first
        self.waited_for = 0.0

    def __enter__(self) -> "HostLock":
        if self._lock.acquire(blocking=False):
            return self
        self.waited = True
        started = time.monotonic()
        try:
            if not self._lock.acquire(blocking=max(self.timeout, 0.001)):
                raise Busy()
        except tenacity.RetryError:  # tooz's PostgreSQL driver, at the timeout
            raise Busy() from None
        finally:
            self.waited_for = time.monotonic() - started
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._lock.release()
        except Exception as err:  # noqa: BLE001 - an expired lock: the next holder repairs
            LOG.warning("releasing a host lock failed (it may have expired): %s", err)


def url_of(url: Optional[str], state_path: Path) -> str:
    return url or f"file://{Path(state_path).resolve() / 'locks'}"


def check_url(url: str) -> None:
    """Refuse a backend the records cannot live in; raises ConfigError."""
    scheme = urlsplit(url).scheme
    if scheme not in SCHEMES:
        why = next((reason for prefix, reason in WHY_NOT.items() if scheme.startswith(prefix)), "")
        raise ConfigError(
            f"[applier] coordination_url: {scheme or url!r} is not supported{why}; use "
            "redis://HOST:PORT or postgresql://USER:PASSWORD@HOST:PORT/DATABASE "
            "(several machines) or leave it unset (one machine: files under "
            "[applier] state_path)"
        )


def redis_lock_expiry(url: str, lock_timeout: float) -> tuple[int, bool]:
    """Seconds after which tooz's Redis driver frees the lock of a killed
    holder, and whether the URL sets it (else the applier passes it).

    A message waits ``[applier] lock_timeout`` for its host's lock, then is
    answered busy. For the next message after a kill -9 to apply, the lock
    must expire sooner than that: tooz's own default (30 s, its ``timeout``)
    is above the default lock_timeout (20 s). Unset in the URL, the expiry is
    half of lock_timeout (whole seconds, tooz's unit; at least 1); set, it
    must be below lock_timeout. Raises ConfigError otherwise."""
    query = {k: v[-1] for k, v in parse_qs(urlsplit(url).query).items()}
    given = query.get("lock_timeout", query.get("timeout"))
    if given is None:
        expiry = max(1, int(lock_timeout // 2))
        if expiry >= lock_timeout:
            raise ConfigError(
                f"[applier] lock_timeout = {lock_timeout:g} is too short with Redis: a "
                "killed applier's lock expires after 1 s at the least, and a message "
                "must be able to wait longer than that; set it to 2 or more"
            )
        return expiry, False
    try:
        expiry = int(given)
    except ValueError:
        raise ConfigError(
            f"[applier] coordination_url: lock_timeout={given!r} is not a whole number of seconds"
        ) from None
    if expiry >= lock_timeout:
        raise ConfigError(
            f"[applier] coordination_url: the Redis lock expires after {expiry} s "
            f"(lock_timeout= or timeout= in the URL), not less than [applier] "
            f"lock_timeout ({lock_timeout:g} s): after an applier is killed holding a "
            "host, that host's next message would be answered busy instead of "
            "applied. Leave lock_timeout out of the URL (it is then half of [applier] "
            "lock_timeout) or make it smaller"
        )
    return expiry, True


def sqlalchemy_url(url: str) -> str:
    """tooz's ``postgresql://`` URL as SQLAlchemy's, with psycopg2 (the
    driver tooz uses) and without tooz's query options."""
    parts = urlsplit(url)
    return urlunsplit(("postgresql+psycopg2", parts.netloc, parts.path, "", ""))


class Coordination:
    """The tooz coordinator of this process and the per-host records."""

    def __init__(
        self,
        url: Optional[str],
        state_path: Path,
        member: str,
        lock_timeout: Optional[float] = None,
    ):
        """``lock_timeout``: the applier's (how long a message waits for its
        host's lock); with Redis it sets or checks the locks' expiry."""
        # Each backend's library is imported when it is the configured one:
        # tooz here, redis-py and SQLAlchemy (sql_records) below.
        from tooz import coordination as tooz

        self.url = url_of(url, state_path)
        check_url(self.url)
        self.state_path = Path(state_path)
        options: dict[str, str] = {}
        # Seconds a killed holder keeps a host locked (None: until its
        # connection or process is gone).
        self.lock_expiry: Optional[int] = None
        if urlsplit(self.url).scheme == "redis" and lock_timeout is not None:
            self.lock_expiry, in_url = redis_lock_expiry(self.url, lock_timeout)
            if not in_url:
                options["lock_timeout"] = str(self.lock_expiry)
        self._coordinator = tooz.get_coordinator(self.url, member.encode("utf-8"), None, **options)
        self._redis = None
        if urlsplit(self.url).scheme == "redis":
            import redis

            parts = urlsplit(self.url)
            # The query holds tooz's options (lock_timeout...), not redis-py's.
            self._redis = redis.Redis.from_url(
                urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")),
                socket_timeout=10,
                socket_connect_timeout=10,
            )
        self._sql = None
        if urlsplit(self.url).scheme == "postgresql":
            from node_agent.remote import sql_records

            self._sql = sql_records.engine_for(sqlalchemy_url(self.url))
        self._started = False

    def start(self) -> "Coordination":
        """Connect (and, for Redis, start heartbeating held locks); raises
        :class:`CoordinationError` naming the backend, not its password."""
        if self._started:
            return self
        try:
            if self._redis is not None:
                # First: tooz's Redis driver retries a refused connection
                # for about a minute before it says so.
                self._redis.ping()
            self._coordinator.start(start_heart=True)
            if self._sql is not None:
                from node_agent.remote import sql_records

                sql_records.create_table(self._sql)
        except Exception as exc:  # noqa: BLE001 - any failure means "cannot be used"
            raise CoordinationError(
                f"the coordination backend at {self.where()} cannot be used: "
                f"{type(exc).__name__}: {exc}".replace(self.url, self.where())
            ) from None
        self._started = True
        return self

    def where(self) -> str:
        """The backend's URL without credentials, for messages."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    def lock(self, host: str, timeout: float) -> HostLock:
        self.start()
        return HostLock(self._coordinator.get_lock(LOCK_PREFIX + host.encode("utf-8")), timeout)

    def store(self, host: str) -> Store:
        if self._sql is not None:
            from node_agent.remote import sql_records

            return sql_records.SqlStore(self._sql, host)
        if self._redis is None:
            return StateStore(self.state_path / host)
        return RedisStore(self._redis, RECORD_PREFIX + host)

    def hosts(self) -> list[str]:
        """Every host that has a record (sorted): what the dead-host watch
        looks at, whichever applier process last handled each host."""
        if self._sql is not None:
            from node_agent.remote import sql_records

            return sql_records.hosts(self._sql)
        if self._redis is not None:
            prefix = RECORD_PREFIX.encode("utf-8")
            return sorted(
                key[len(prefix) :].decode("utf-8")
                for key in self._redis.scan_iter(match=prefix + b"*", count=500)
            )
        if not self.state_path.is_dir():
            return []
        return sorted(
            d.name for d in self.state_path.iterdir() if d.is_dir() and (d / FILE_NAME).exists()
        )

    def forget(self, host: str) -> bool:
        """Remove the host's record (hold its lock); False when it had none."""
        if self._sql is not None:
            from node_agent.remote import sql_records

            return sql_records.forget(self._sql, host)
        if self._redis is not None:
            return bool(self._redis.delete(RECORD_PREFIX + host))
        directory = self.state_path / host
        if not (directory / FILE_NAME).exists():
            return False
        shutil.rmtree(directory)
        return True

    def stop(self) -> None:
        if self._started:
            try:
                self._coordinator.stop()
            except Exception as exc:  # noqa: BLE001 - shutting down: nothing left to protect
                LOG.debug("stopping the coordinator: %s", exc)
            if self._sql is not None:
                self._sql.dispose()
            self._started = False
