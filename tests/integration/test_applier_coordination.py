"""Appliers on separate machines: two ``node-agent-applier`` processes with
their own empty state directories, coordinated through a real Redis the
test starts (tooz's Redis driver for the per-host locks, the per-host
records in Redis), a real RabbitMQ and the real Placement."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest
import redis

from node_agent.remote import wire
from node_agent.remote.coordination import RECORD_PREFIX
from node_agent.state import decode
from tests.integration.redis_server import redis_url  # noqa: F401 (fixture)
from tests.integration.reshape_driver import allocate
from tests.integration.test_applier import (
    AGENTS,
    Bus,
    allocations,
    converged,
    in_threads,
    make_agents,
    root_of,
    send_to,
)
from tests.reliability.proxy import FaultProxy

pytestmark = pytest.mark.integration
APPLY_MARGIN = 10  # seconds for one apply on a loaded machine, beyond the lock's wait

# The URL sets no expiry: the applier makes it half of its lock_timeout
# (8 s: a killed holder's lock is free after 4 s).
LOCK_TIMEOUT = 8


@pytest.fixture
def bus(redis_url, tmp_path, rabbitmq, placement_server):
    """test_applier's ``bus``, set up after this test's Redis and so stopped
    before it: an applier whose Redis is gone spends its stop on tooz's
    retries until the test kills it (20 s each)."""
    bus = Bus(tmp_path, rabbitmq, placement_server.url)
    yield bus
    bus.stop()


def record(url: str, host: str) -> dict:
    text = redis.Redis.from_url(url).get(RECORD_PREFIX + host)
    return decode(text.decode("utf-8"))["applier"]


def on_redis(url: str, lock_timeout: float = LOCK_TIMEOUT) -> str:
    return f"coordination_url = {url}\nlock_timeout = {lock_timeout}\n"


def nothing_on_disk(bus) -> bool:
    return not any(
        p.is_file()
        for n in range(len(bus.appliers))
        for p in (bus.tmp / f"applier-state-{n}").rglob("*")
    )


def test_twenty_agents_through_two_appliers_sharing_only_redis_converge_then_heartbeat(
    bus, placement, redis_url
):
    first, second = bus.start(2, applier=on_redis(redis_url))
    agents = make_agents(bus, AGENTS, "redis")
    failures: list[str] = []
    deadline = time.monotonic() + 60
    applied = in_threads(agents, lambda a: a.cycle_until_ok(deadline, failures))
    assert all(r.status == wire.APPLIED and r.ok for r in applied.values())
    assert all(converged(placement, a) for a in agents)
    assert " seq " in first.log() and " seq " in second.log()

    # Each heartbeat lands on either process; the record both read is in Redis.
    steady = in_threads(agents, lambda a: a.cycle())
    assert {r.status for r in steady.values()} == {wire.UNCHANGED}
    assert {r.requests for r in steady.values()} == {0}
    assert nothing_on_disk(bus)
    # The records the heartbeats were answered from: written by both processes.
    writers = {record(redis_url, a.name)["by"].split(":")[1] for a in agents}
    assert writers == {str(first.proc.pid), str(second.proc.pid)}
    print(
        f"\nBENCH messaging on redis: first apply requests/host "
        f"{sorted(r.requests for r in applied.values())}; steady: "
        f"{sorted(r.messages for r in steady.values())} messages, 0 requests; "
        f"{len(failures)} cycles retried"
    )


def test_per_host_order_holds_under_a_burst_across_two_appliers(bus, placement, redis_url):
    """Twelve messages of one host, sent at once from six connections: the
    newest one applied is what Placement holds, whatever order they came in."""
    bus.start(2, applier=on_redis(redis_url, lock_timeout=30))
    agent = make_agents(bus, 1, "burst")[0]
    assert agent.cycle().ok
    senders = [bus.sender(agent.name, timeout=60) for _ in range(6)]
    base = agent.upstream._next_seq()
    messages = []
    for n in range(12):
        agent.reserve(256 + 64 * n)
        messages.append(
            wire.full_message(
                agent.name, base + 1 + n, wire.body_of(agent.desired), agent.upstream.key
            )
        )
    order = list(reversed(messages))  # the newest first: the most stale replies
    replies: dict[int, dict] = {}

    def send(k: int) -> None:
        for message in order[k::6]:
            replies[message["seq"]] = senders[k]._client.call({}, "apply", message=message)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    assert len(replies) == 12
    assert {r["status"] for r in replies.values()} <= {wire.APPLIED, wire.STALE}
    newest = max(seq for seq, r in replies.items() if r["status"] == wire.APPLIED)
    assert record(redis_url, agent.name)["seq"] == newest
    wanted = next(m for m in messages if m["seq"] == newest)["body"]["tree"][0]
    root = root_of(placement, agent.name)
    got = placement.get(f"/resource_providers/{root['uuid']}/inventories")["inventories"]
    assert got["MEMORY_MB"]["reserved"] == wanted["inventories"]["MEMORY_MB"]["reserved"]


def kill_the_lock_holder_then_resend(
    bus, placement, placement_server, applier: str, prefix: str, wait: float, expiry: float
):
    """The first applier reaches Placement through a proxy that SIGKILLs it
    on the message's first request, inside the host's lock; the host's next
    message goes to the other applier and must be applied within the lock's
    ``expiry`` (plus a margin for the apply itself). Returns that applier
    and the agent, after checking that the allocation on the host was kept."""
    proxy = FaultProxy(placement_server.url).start()
    try:
        (holder,) = bus.start(1, applier=applier, placement_url=proxy.url)
        (other,) = bus.start(1, applier=applier)
        agent = make_agents(bus, 1, prefix)[0]
        assert send_to(other, agent)["status"] == wire.APPLIED
        consumer = str(uuid.uuid4())
        allocate(placement, consumer, {root_of(placement, agent.name)["uuid"]: {"MEMORY_MB": 256}})
        before = allocations(placement, [consumer])

        proxy.before_forward = lambda n: os.kill(holder.proc.pid, signal.SIGKILL)
        agent.reserve(768)
        lost: list[BaseException] = []

        def never_answered() -> None:
            try:
                send_to(holder, agent)
            except Exception as exc:  # the call times out: its applier is dead
                lost.append(exc)

        caller = threading.Thread(target=never_answered)
        caller.start()
        assert holder.proc.wait(wait) == -signal.SIGKILL

        killed = time.monotonic()
        reply = send_to(other, agent, timeout=2 * wait)
        took = time.monotonic() - killed
        caller.join(2 * wait)
        assert lost, "the killed applier answered"
        assert reply["status"] == wire.APPLIED and reply["ok"], reply
        assert took < expiry + APPLY_MARGIN, (took, expiry)
        assert converged(placement, agent)
        assert allocations(placement, [consumer]) == before
        return other, agent
    finally:
        proxy.stop()


def test_applier_killed_holding_a_hosts_lock_frees_it_at_the_lock_expiry(
    bus, placement, placement_server, redis_url
):
    """With the URL's defaults, the host's next message, on the other
    applier, waits for the Redis lock to expire (half of lock_timeout, not
    tooz's 30 s) and applies; the allocation on the host is kept."""
    other, _agent = kill_the_lock_holder_then_resend(
        bus, placement, placement_server, on_redis(redis_url), "killed", 30, expiry=LOCK_TIMEOUT / 2
    )
    assert "waited" in other.log() and "for the host's lock" in other.log()
    assert f"host locks expire after {LOCK_TIMEOUT // 2}s" in other.log()


def check_config(tmp_path, applier: str, master_mode: int = 0o600):
    import subprocess

    from tests.integration.test_applier import APPLIER

    master = tmp_path / "master.key"
    master.write_text("6d" * 32 + "\n")
    master.chmod(master_mode)
    config = tmp_path / "applier.conf"
    config.write_text(
        "[DEFAULT]\ntransport_url = rabbit://guest:guest@127.0.0.1:5672/\n"
        f"[applier]\nstate_path = {tmp_path / 'state'}\nmaster_key_file = {master}\n"
        f"{applier}[placement]\nauth_type = admin_token\ntoken = admin\n"
        "endpoint_override = http://127.0.0.1:1\n"
    )
    return subprocess.run(
        [str(APPLIER), "--config-file", str(config), "--check-config"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_config_connects_to_the_coordination_backend_and_checks_the_master(
    tmp_path, redis_url
):
    good = check_config(tmp_path, f"coordination_url = {redis_url}\n")
    assert good.returncode == 0, good.stderr
    assert f"coordination backend answers: {redis_url}" in good.stdout

    open_master = check_config(tmp_path, f"coordination_url = {redis_url}\n", 0o644)
    assert open_master.returncode == 78, open_master.stderr
    assert "open to its group or others (mode 0644)" in open_master.stderr
    assert "6d" * 32 not in open_master.stdout + open_master.stderr

    from tests.integration.rabbit import free_port

    closed = f"redis://:S3cret@127.0.0.1:{free_port()}"
    down = check_config(tmp_path, f"coordination_url = {closed}\n")
    assert down.returncode == 75, down.stderr
    assert "the coordination backend at redis://127.0.0.1:" in down.stderr
    assert "S3cret" not in down.stdout + down.stderr
    assert "Traceback" not in down.stderr

    # A Redis lock that outlives the wait: a killed applier's host would be
    # answered busy, never applied.
    late = check_config(tmp_path, f"coordination_url = {redis_url}?lock_timeout=30\n")
    assert late.returncode == 78, late.stderr
    assert "not less than [applier] lock_timeout (20 s)" in late.stderr
    assert "coordination backend answers" in good.stdout
    assert "host locks expire after 10s" in good.stdout

    other = check_config(tmp_path, "coordination_url = etcd3+http://127.0.0.1:2379\n")
    assert other.returncode == 78 and "is not supported" in other.stderr
