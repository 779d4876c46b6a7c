"""The real ``node-agent`` service process against the real Placement:
sd_notify datagrams, signals, and Placement going away and coming back."""

import signal
import socket
import time

import pytest

from node_agent.placement.client import PlacementClient
from node_agent.service.loop import DEFAULT_STOP_TIMEOUT
from tests.integration.agent_process import OTHER_HOST, AgentProcess, mount_host

pytestmark = pytest.mark.integration


@pytest.fixture
def agent(tmp_path, placement_server, host_name):
    process = AgentProcess(tmp_path, placement_server.url, host_name)
    yield process
    process.stop()
    process.notify.close()


def root_inventory(placement_url, host):
    client = PlacementClient.for_endpoint(placement_url)
    found = client.get(f"/resource_providers?name={host}")["resource_providers"]
    if not found:
        return {}
    return client.get(f"/resource_providers/{found[0]['uuid']}/inventories")["inventories"]


def wait_until(predicate, timeout=20):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def test_systemd_hears_ready_then_a_status_line_per_cycle_and_watchdog(agent):
    agent.start()

    first = agent.notify.wait_for(lambda d: d in ("READY=1",) or d.startswith("STATUS=ok"))
    assert first == "READY=1"
    status = agent.status_after(lambda s: s.startswith("ok:"))
    assert "create provider" in status or "no change" in status
    assert agent.status_after(lambda s: "no change (0 requests)" in s)
    assert "WATCHDOG=1" in agent.notify.received
    assert all("\n" not in d for d in agent.notify.received if d.startswith("STATUS="))


def test_sigterm_exits_zero_within_a_few_seconds(agent):
    agent.start()
    agent.status_after(lambda s: s.startswith("ok:"))

    agent.send(signal.SIGTERM)
    # What the loop promises: a running cycle gets stop_timeout seconds (a
    # fixed 5 s failed on a loaded machine while a cycle was running).
    code = agent.proc.wait(DEFAULT_STOP_TIMEOUT + 30)

    assert code == 0
    assert "STOPPING=1" in agent.notify.wait_for(lambda d: d == "STOPPING=1")


def test_sighup_with_an_invalid_config_keeps_the_old_one_running(agent, placement_server):
    agent.start()
    agent.status_after(lambda s: s.startswith("ok:"))

    agent.write_config(
        agent.config_text(reserved_memory_mb=-4).replace(
            "[compute]\n", "[compute]\ncpu_dedicated_set = 2-x\n"
        )
    )
    agent.send(signal.SIGHUP)

    agent.notify.wait_for(lambda d: d == "RELOADING=1")
    assert agent.new_status(lambda s: s.startswith("ok:"))
    log = agent.log()
    assert "reload refused, the running configuration stays: 2 problem(s)" in log
    assert "[compute] cpu_dedicated_set = '2-x' is not a CPU spec" in log
    assert "[compute] reserved_host_memory_mb has an invalid value" in log
    assert agent.proc.poll() is None
    assert root_inventory(placement_server.url, agent.host)["MEMORY_MB"]["reserved"] == 512


def test_sighup_with_a_valid_config_applies_it_on_the_next_cycle(agent, placement_server):
    agent.start()
    agent.status_after(lambda s: s.startswith("ok:"))

    # metrics_textfile is read at start only: the reload must say it waits.
    textfile = agent.dir / "node-agent.prom"
    agent.write_config(
        agent.config_text(reserved_memory_mb=2048) + f"[agent]\nmetrics_textfile = {textfile}\n"
    )
    agent.send(signal.SIGHUP)

    wait_until(
        lambda: root_inventory(placement_server.url, agent.host)["MEMORY_MB"]["reserved"] == 2048
    )
    log = agent.log()
    assert "configuration reloaded" in log
    assert "except [agent] metrics_textfile: read at start only" in log, log
    assert "`systemctl restart node-agent`" in log


def test_placement_killed_and_restarted_the_agent_survives_and_heals_in_a_cycle(
    tmp_path, fresh_placement_server, host_name
):
    agent = AgentProcess(tmp_path / "agent", fresh_placement_server.url, host_name)
    try:
        agent.start()
        agent.status_after(lambda s: s.startswith("ok:"))
        before = root_inventory(fresh_placement_server.url, host_name)["VCPU"]["total"]

        fresh_placement_server.kill()
        # Unchanged cycles send no request; a host change makes one.
        mount_host(OTHER_HOST, agent.sysroot)
        agent.new_status(lambda s: s.startswith("Placement cannot be used"))
        agent.status_after(lambda s: "(3 failed cycles)" in s)
        fresh_placement_server.start()
        healed_by = time.monotonic() + 2 + 8  # retry_max_interval + a cycle on a loaded machine
        agent.new_status(lambda s: s.startswith("ok:"))

        assert time.monotonic() < healed_by
        after = root_inventory(fresh_placement_server.url, host_name)["VCPU"]["total"]
        assert after != before
        assert agent.proc.poll() is None
        log = agent.log()
        assert log.count("Placement cannot be used") == 1
        assert log.count("Placement is reachable again") == 1
    finally:
        agent.stop()
        agent.notify.close()


def fill(notify_path) -> int:
    """Send to ``notify_path`` until its datagram queue is full (the
    receiver's ``max_dgram_qlen`` or its buffer): from then on, every
    sd_notify of the service finds it full, as with a stalled systemd."""
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.setblocking(False)
    sent = 0
    try:
        while True:
            sender.sendto(b"STATUS=filler", str(notify_path))
            sent += 1
    except BlockingIOError:
        return sent
    finally:
        sender.close()


def test_a_notify_socket_nobody_reads_never_wedges_the_service(agent, placement_server):
    """systemd reads its notify socket; a stalled reader (a full datagram
    queue) must not block the service's sd_notify, so cycles go on and
    SIGTERM still ends it. The queue is filled here, whatever its length,
    and a host change shows that a cycle ran after it was full."""
    agent.start()
    agent.status_after(lambda s: s.startswith("ok:"))
    before = root_inventory(placement_server.url, agent.host)["VCPU"]["total"]
    assert fill(agent.notify.path) > 0

    mount_host(OTHER_HOST, agent.sysroot)
    wait_until(
        lambda: root_inventory(placement_server.url, agent.host)["VCPU"]["total"] != before,
        timeout=120,  # a cycle a second (report_interval = 1) on a quiet machine
    )
    agent.send(signal.SIGTERM)
    # The loop gives a running cycle stop_timeout seconds, then exits 0.
    assert agent.proc.wait(DEFAULT_STOP_TIMEOUT + 30) == 0
