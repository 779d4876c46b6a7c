"""The appliers' per-host records in a SQL database, through SQLAlchemy:
one table, one row per host, the row holding the state file's checksummed
envelope. Used with a ``postgresql://`` coordination_url, whose locks are
PostgreSQL advisory locks (tooz), so one database serves both.

Each :meth:`SqlStore.update` is one transaction that reads the row
``FOR UPDATE``: two writers of one host (the applier under the host's lock,
the syncer's cache hints) both keep their change.
"""

from __future__ import annotations

import logging
from typing import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from node_agent.state import Store, decode, decode_or_empty, edited, encode

LOG = logging.getLogger(__name__)

METADATA = sa.MetaData()
RECORDS = sa.Table(
    "node_agent_applier_hosts",
    METADATA,
    sa.Column("host", sa.String(255), primary_key=True),
    sa.Column("record", sa.Text, nullable=False),
)


def engine_for(url: str) -> Engine:
    """An engine for ``url`` (SQLAlchemy's form) that fails fast when the
    server is away and drops connections the server closed."""
    return sa.create_engine(
        url, pool_pre_ping=True, pool_size=2, max_overflow=8, connect_args={"connect_timeout": 10}
    )


def create_table(engine: Engine) -> None:
    """Create the records table when missing. Two appliers starting at once
    may race on it: the loser finds the winner's table."""
    try:
        METADATA.create_all(engine, checkfirst=True)
    except sa.exc.DBAPIError:
        if not sa.inspect(engine).has_table(RECORDS.name):
            raise


class SqlStore(Store):
    """A host's state as one row (the state file's envelope)."""

    def __init__(self, engine: Engine, host: str):
        self.engine, self.host = engine, host
        self.where = f"table {RECORDS.name}, host {host}"

    def _read(self, conn: Connection, for_update: bool = False) -> str | None:
        query = sa.select(RECORDS.c.record).where(RECORDS.c.host == self.host)
        if for_update:
            query = query.with_for_update()
        return conn.execute(query).scalar_one_or_none()

    def load(self) -> dict:
        with self.engine.connect() as conn:
            text = self._read(conn)
        return {} if text is None else decode(text, self.where)

    def save(self, data: dict) -> None:
        text = encode(data)
        with self.engine.begin() as conn:
            self._write(conn, text, exists=self._read(conn, for_update=True) is not None)

    def _write(self, conn: Connection, text: str, exists: bool) -> None:
        if exists:
            conn.execute(sa.update(RECORDS).where(RECORDS.c.host == self.host).values(record=text))
        else:
            conn.execute(sa.insert(RECORDS).values(host=self.host, record=text))

    def update(self, change: Callable[[dict], None]) -> dict:
        """As :meth:`node_agent.state.StateStore.update`: read, edit, write
        back only when changed, in one transaction holding the row. A first
        insert that loses to another writer's is retried on its row."""
        for attempt in range(3):
            try:
                return self._update_once(change)
            except sa.exc.IntegrityError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _update_once(self, change: Callable[[dict], None]) -> dict:
        with self.engine.begin() as conn:
            text = self._read(conn, for_update=True)
            state = decode_or_empty(text, self.where, LOG)
            new = edited(state, change)
            if new != state:
                self._write(conn, encode(new), exists=text is not None)
            return new


def hosts(engine: Engine) -> list[str]:
    """The hosts that have a row, sorted."""
    with engine.connect() as conn:
        return sorted(row[0] for row in conn.execute(sa.select(RECORDS.c.host)))


def forget(engine: Engine, host: str) -> bool:
    """Delete the host's row; False when it had none."""
    with engine.begin() as conn:
        return conn.execute(sa.delete(RECORDS).where(RECORDS.c.host == host)).rowcount > 0
