"""Appliers on separate machines coordinated through PostgreSQL: two
``node-agent-applier`` processes with their own empty state directories,
a throw-away PostgreSQL cluster the test makes (tooz's advisory locks per
host, the per-host records as rows of one table), a real RabbitMQ and the
real Placement."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from node_agent.remote import wire
from node_agent.remote.coordination import sqlalchemy_url
from node_agent.remote.sql_records import RECORDS
from node_agent.state import decode
from tests.integration.postgres_server import postgres_cluster, postgres_url  # noqa: F401
from tests.integration.test_applier import (  # noqa: F401
    AGENTS,
    allocations,
    bus,
    converged,
    in_threads,
    make_agents,
    root_of,
    send_to,
)
from tests.integration.test_applier_coordination import (
    check_config,
    kill_the_lock_holder_then_resend,
    nothing_on_disk,
)

pytestmark = pytest.mark.integration


def records(url: str) -> dict[str, dict]:
    engine = sa.create_engine(sqlalchemy_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(RECORDS.c.host, RECORDS.c.record)).all()
    finally:
        engine.dispose()
    return {host: decode(text)["applier"] for host, text in rows}


def on_postgres(url: str, lock_timeout: float = 3) -> str:
    return f"coordination_url = {url}\nlock_timeout = {lock_timeout}\n"


def test_twenty_agents_through_two_appliers_sharing_only_postgres_converge_then_heartbeat(
    bus, placement, postgres_url
):
    first, second = bus.start(2, applier=on_postgres(postgres_url))
    agents = make_agents(bus, AGENTS, "pg")
    failures: list[str] = []
    deadline = time.monotonic() + 120
    applied = in_threads(agents, lambda a: a.cycle_until_ok(deadline, failures))
    assert all(r.status == wire.APPLIED and r.ok for r in applied.values())
    assert all(converged(placement, a) for a in agents)
    assert " seq " in first.log() and " seq " in second.log()

    # Each heartbeat lands on either process; the record both read is a row.
    steady = in_threads(agents, lambda a: a.cycle())
    assert {r.status for r in steady.values()} == {wire.UNCHANGED}
    assert {r.requests for r in steady.values()} == {0}
    assert nothing_on_disk(bus)
    rows = records(postgres_url)
    assert set(rows) == {a.name for a in agents}
    writers = {rows[a.name]["by"].split(":")[1] for a in agents}
    assert writers == {str(first.proc.pid), str(second.proc.pid)}


def test_per_host_order_holds_under_a_burst_across_two_appliers_on_postgres(
    bus, placement, postgres_url
):
    """Twelve messages of one host, sent at once from six connections, newest
    first: the newest one applied is what Placement and the row hold."""
    bus.start(2, applier=on_postgres(postgres_url, lock_timeout=60))
    agent = make_agents(bus, 1, "pgburst")[0]
    assert agent.cycle().ok
    senders = [bus.sender(agent.name, timeout=120) for _ in range(6)]
    base = agent.upstream._next_seq()
    messages = []
    for n in range(12):
        agent.reserve(256 + 64 * n)
        messages.append(
            wire.full_message(
                agent.name, base + 1 + n, wire.body_of(agent.desired), agent.upstream.key
            )
        )
    order = list(reversed(messages))
    replies: dict[int, dict] = {}

    def send(k: int) -> None:
        for message in order[k::6]:
            replies[message["seq"]] = senders[k]._client.call({}, "apply", message=message)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)

    assert len(replies) == 12
    assert {r["status"] for r in replies.values()} <= {wire.APPLIED, wire.STALE}
    newest = max(seq for seq, r in replies.items() if r["status"] == wire.APPLIED)
    assert records(postgres_url)[agent.name]["seq"] == newest
    wanted = next(m for m in messages if m["seq"] == newest)["body"]["tree"][0]
    root = root_of(placement, agent.name)
    got = placement.get(f"/resource_providers/{root['uuid']}/inventories")["inventories"]
    assert got["MEMORY_MB"]["reserved"] == wanted["inventories"]["MEMORY_MB"]["reserved"]


def test_applier_killed_holding_a_hosts_advisory_lock_frees_it_with_its_session(
    bus, placement, placement_server, postgres_url
):
    """PostgreSQL ends the killed applier's session and its advisory locks
    with it: the host's next message, on the other applier, applies; the
    allocation is kept."""
    other, agent = kill_the_lock_holder_then_resend(
        bus,
        placement,
        placement_server,
        on_postgres(postgres_url, lock_timeout=60),
        "pgkilled",
        60,
        expiry=0,
    )
    assert records(postgres_url)[agent.name]["by"].split(":")[1] == str(other.proc.pid)


def test_check_config_connects_to_postgres_and_names_it_without_its_password(
    tmp_path, postgres_url
):
    good = check_config(tmp_path, f"coordination_url = {postgres_url}\n")
    assert good.returncode == 0, good.stderr
    assert "coordination backend answers: postgresql://127.0.0.1:" in good.stdout

    from tests.integration.rabbit import free_port

    closed = f"postgresql://admin:S3cret@127.0.0.1:{free_port()}/coordination"
    down = check_config(tmp_path, f"coordination_url = {closed}\n")
    assert down.returncode == 75, down.stderr
    assert "the coordination backend at postgresql://127.0.0.1:" in down.stderr
    assert "S3cret" not in down.stdout + down.stderr
    assert "Traceback" not in down.stderr

    mysql = check_config(tmp_path, "coordination_url = mysql://u:p@127.0.0.1/db\n")
    assert mysql.returncode == 78 and "is not supported" in mysql.stderr
    etcd = check_config(tmp_path, "coordination_url = etcd3+http://127.0.0.1:2379\n")
    assert etcd.returncode == 78 and "no store for the per-host records" in etcd.stderr


def test_a_host_held_past_lock_timeout_on_postgres_is_answered_busy_then_applies(
    bus, placement, postgres_url, tmp_path
):
    """tooz's PostgreSQL lock gives up by raising (tenacity's RetryError),
    not by returning False: the applier still answers 'busy'."""
    from node_agent.remote.coordination import Coordination

    (applier,) = bus.start(1, applier=on_postgres(postgres_url, lock_timeout=1))
    agent = make_agents(bus, 1, "pgbusy")[0]
    other = Coordination(postgres_url, tmp_path, "the-test").start()
    try:
        with other.lock(agent.name, 5):
            reply = send_to(applier, agent, timeout=60)
        assert reply["status"] == wire.BUSY, reply
        assert agent.name not in records(postgres_url)
        assert send_to(applier, agent, timeout=60)["status"] == wire.APPLIED
        assert converged(placement, agent)
    finally:
        other.stop()
