"""A dead reporter's capacity (issue 29): with ``[agent] upstream =
messaging``, node-agent-applier closes a host whose agent stopped sending
(COMPUTE_STATUS_DISABLED on its root, nothing else touched) and reopens it
when it reports again. Real RabbitMQ, real Placement, real agent service and
applier processes; the agent is killed with SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from tests import promlint
from tests.integration.postgres_server import postgres_cluster, postgres_url  # noqa: F401
from tests.integration.rabbit import free_port
from tests.integration.redis_server import redis_url  # noqa: F401
from tests.integration.test_applier import (  # noqa: F401 (bus: fixture)
    APPLIER,
    Bus,
    RequestLog,
    bus,
    messaging_service,
    metrics_of,
    root_of,
)

pytestmark = pytest.mark.integration

DISABLED = "COMPUTE_STATUS_DISABLED"
OPERATOR = "CUSTOM_OPERATOR_RACK_7"
DEAD_AFTER = 8  # above 2 x the bus's lock_timeout (3 s); sweeps every 2 s


def traits_of(placement, uuid: str) -> set[str]:
    return set(placement.get(f"/resource_providers/{uuid}/traits")["traits"])


def add_trait(placement, uuid: str, trait: str) -> None:
    if trait.startswith("CUSTOM_"):
        placement.put(f"/traits/{trait}", None)
    now = placement.get(f"/resource_providers/{uuid}/traits")
    placement.put(
        f"/resource_providers/{uuid}/traits",
        {
            "traits": sorted(set(now["traits"]) | {trait}),
            "resource_provider_generation": now["resource_provider_generation"],
        },
    )


def wait_for(predicate, timeout: float, what: str) -> float:
    """Seconds until ``predicate()`` holds."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"not within {timeout} s: {what}"
        time.sleep(0.2)
    return time.monotonic() - start


def applier_status(bus) -> dict:
    done = subprocess.run(
        [str(APPLIER), "--config-file", str(bus.config), "status", "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return {row["host"]: row for row in json.loads(done.stdout)["hosts"]}


def start_agent(bus, tmp_path, host_name):
    agent = messaging_service(bus, tmp_path, host_name)
    agent.start()
    agent.status_after(lambda s: s.startswith("ok") and "via applier" in s, timeout=60)
    return agent


def test_a_killed_agent_is_closed_within_dead_after_and_reopened_when_it_returns_after_an_applier_restart(
    bus, tmp_path, placement, placement_server, host_name
):
    port = free_port()
    # full_verify_interval: the applier's cache of the root catches up
    # with the operator's trait (as it does every 300 s by default).
    bus.write_config(
        f"dead_after = {DEAD_AFTER}\nmetrics_port = {port}\nfull_verify_interval = 2\n"
    )
    bus.start(1)
    agent = start_agent(bus, tmp_path, host_name)
    try:
        root = root_of(placement, host_name)["uuid"]
        add_trait(placement, root, OPERATOR)
        inventories = placement.get(f"/resource_providers/{root}/inventories")["inventories"]
        time.sleep(4)  # reporting every second: never closed while alive
        assert DISABLED not in traits_of(placement, root)

        agent.send(signal.SIGKILL)
        agent.proc.wait(10)
        killed = time.monotonic()
        time.sleep(0.5)  # a message in hand when it died may still be applied
        requests = RequestLog(placement_server)
        text = wait_for_metric(
            port,
            "node_agent_applier_dead_host_closes_total 1.0",
            timeout=DEAD_AFTER + DEAD_AFTER / 4 + 5,
        )
        took = time.monotonic() - killed
        # One write at the generation the applier's cache holds: no read.
        assert requests.requests() == [f"PUT /resource_providers/{root}/traits 200"]
        assert DISABLED in traits_of(placement, root)
        # Not before 3/4 of dead_after (seen_at is written every dead_after/4).
        assert took >= DEAD_AFTER * 3 / 4 - 0.5, took
        assert traits_of(placement, root) >= {DISABLED, OPERATOR}
        assert placement.get(f"/resource_providers/{root}/inventories")["inventories"] == (
            inventories
        )
        assert (
            f'node_agent_applier_dead_host_closed_timestamp_seconds{{host="{host_name}"}}' in text
        )
        assert "node_agent_applier_hosts_closed_dead 1.0" in text
        assert promlint.problems(text) == []
        assert promlint.promtool_problems(text) in (None, [])
        shown = applier_status(bus)[host_name]
        assert shown["closed"] and shown["trait_added_by_applier"]
        assert f"{host_name} closed as dead" in bus.appliers[0].log()

        # The applier is restarted while the host is closed: the record in
        # the coordination backend says the trait is the applier's.
        bus.appliers[0].stop()
        bus.appliers.clear()
        bus.start(1)
        agent.start()
        wait_for(lambda: DISABLED not in traits_of(placement, root), 60, "the host reopened")
        assert OPERATOR in traits_of(placement, root)
        assert f"{host_name} reports again: reopened" in bus.appliers[0].log()
        assert not applier_status(bus)[host_name]["closed"]
        inventories_now = placement.get(f"/resource_providers/{root}/inventories")["inventories"]
        assert all(inv["reserved"] < inv["total"] for inv in inventories_now.values())
    finally:
        agent.stop()
        agent.notify.close()


def wait_for_metric(port: int, needle: str, timeout: float = 20) -> str:
    found = {}

    def has() -> bool:
        found["text"] = metrics_of(port)
        return needle in found["text"]

    wait_for(has, timeout, f"{needle} in the metrics")
    return found["text"]


def test_a_disabled_trait_the_applier_did_not_add_stays_when_the_host_returns(
    bus, tmp_path, placement, host_name
):
    bus.write_config(f"dead_after = {DEAD_AFTER}\n")
    bus.start(1)
    agent = start_agent(bus, tmp_path, host_name)
    try:
        root = root_of(placement, host_name)["uuid"]
        agent.send(signal.SIGKILL)
        agent.proc.wait(10)
        # An operator closes the dead host by hand before the applier does.
        add_trait(placement, root, DISABLED)
        wait_for(
            lambda: applier_status(bus)[host_name]["closed"],
            DEAD_AFTER + 10,
            "the applier noting the host dead",
        )
        assert applier_status(bus)[host_name]["trait_added_by_applier"] is False
        agent.start()
        agent.status_after(lambda s: "via applier" in s, timeout=60)
        wait_for(lambda: not applier_status(bus)[host_name]["closed"], 30, "the host seen again")
        assert DISABLED in traits_of(placement, root)
        assert "the applier did not add it" in bus.appliers[0].log()
    finally:
        agent.stop()
        agent.notify.close()


def test_forget_reopens_a_host_the_applier_closed_and_the_sweep_leaves_it_alone(
    bus, tmp_path, placement, host_name
):
    """Before a host moves back to the direct mode."""
    bus.write_config(f"dead_after = {DEAD_AFTER}\n")
    bus.start(1)
    agent = start_agent(bus, tmp_path, host_name)
    try:
        root = root_of(placement, host_name)["uuid"]
        assert agent.stop() == 0
        wait_for(lambda: DISABLED in traits_of(placement, root), DEAD_AFTER + 10, "closed")

        forget = [str(APPLIER), "--config-file", str(bus.config), "forget", host_name]
        done = subprocess.run(forget, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert f"forgot {host_name}: removed the {DISABLED}" in done.stdout
        assert DISABLED not in traits_of(placement, root)
        assert host_name not in applier_status(bus)
        time.sleep(DEAD_AFTER / 4 + 2)  # a sweep or more
        assert DISABLED not in traits_of(placement, root)
        again = subprocess.run(forget, capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "nothing to forget" in again.stderr
    finally:
        agent.stop()
        agent.notify.close()


def test_a_dead_after_not_above_twice_the_lock_timeout_is_refused_at_start(bus):
    bus.write_config("dead_after = 5\n")  # lock_timeout = 3
    done = subprocess.run(
        [str(APPLIER), "--config-file", str(bus.config), "--check-config"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 78, done.stdout + done.stderr
    assert "[applier] dead_after = 5 is not above twice [applier] lock_timeout" in done.stderr


# ---------------------------------------------------------------- every backend


def hosts_of_a_backend(url, tmp_path) -> list[str]:
    """Records of three hosts written through one Coordination, one
    forgotten and the rest listed by another: what every applier process's
    sweep reads."""
    from node_agent.remote.coordination import Coordination

    writer = Coordination(url, tmp_path / "state", "writer", 10).start()
    reader = Coordination(url, tmp_path / "state", "reader", 10).start()
    try:
        for host in ("compute-b", "compute-a", "compute-c"):
            writer.store(host).put("applier", {"seq": 1, "seen_at": 1.0})
        assert reader.forget("compute-c") and not reader.forget("compute-c")
        return reader.hosts()
    finally:
        writer.stop()
        reader.stop()


def test_the_sweep_lists_the_hosts_not_forgotten_of_state_files(tmp_path):
    assert hosts_of_a_backend(None, tmp_path) == ["compute-a", "compute-b"]


def test_the_sweep_lists_the_hosts_not_forgotten_of_redis(redis_url, tmp_path):
    assert hosts_of_a_backend(redis_url, tmp_path) == ["compute-a", "compute-b"]


def test_the_sweep_lists_the_hosts_not_forgotten_of_postgresql(postgres_url, tmp_path):
    assert hosts_of_a_backend(postgres_url, tmp_path) == ["compute-a", "compute-b"]


@pytest.fixture
def redis_bus(redis_url, tmp_path, rabbitmq, placement_server):
    """``bus`` set up after Redis, so stopped before it (as
    test_applier_coordination's): an applier whose Redis is gone spends
    its stop on tooz's retries."""
    bus = Bus(tmp_path, rabbitmq, placement_server.url)
    yield bus
    bus.stop()


def test_a_host_one_applier_closed_on_redis_is_reopened_by_another(
    redis_bus,
    redis_url,
    tmp_path,
    placement,
    host_name,
):
    bus = redis_bus
    bus.start(2, applier=f"dead_after = {DEAD_AFTER}\ncoordination_url = {redis_url}\n")
    agent = start_agent(bus, tmp_path, host_name)
    try:
        root = root_of(placement, host_name)["uuid"]
        agent.send(signal.SIGKILL)
        agent.proc.wait(10)
        wait_for(lambda: DISABLED in traits_of(placement, root), DEAD_AFTER + 10, "closed")
        wait_for(
            lambda: any(f"{host_name} closed as dead" in a.log() for a in bus.appliers),
            5,
            "the close logged",
        )
        time.sleep(DEAD_AFTER / 4 + 1)  # every process's sweep has seen it closed
        closer = next(a for a in bus.appliers if f"{host_name} closed as dead" in a.log())
        other = next(a for a in bus.appliers if a is not closer)
        assert f"{host_name} closed as dead" not in other.log()  # closed once
        closer.stop()

        agent.start()
        wait_for(lambda: DISABLED not in traits_of(placement, root), 60, "reopened")
        assert f"{host_name} reports again: reopened" in other.log()
    finally:
        agent.stop()
        agent.notify.close()
