"""``node-agent maintenance on|off --provider NAME`` through the real command
and the running service, against the real Placement: one NUMA child closed,
its sibling still taking claims, across state loss."""

import re
import uuid
from pathlib import Path

import pytest

from node_agent.placement.client import PlacementClient
from node_agent.placement.errors import PlacementError
from node_agent.policy.maintenance import TRAIT
from node_agent.state import DEVICE_MAINTENANCE, FILE_NAME, StateStore
from tests.cli.runner import run_agent
from tests.integration.rabbit import free_port
from tests.integration.reshape_driver import Host, allocate
from tests.integration.test_applier import bus  # noqa: F401 (fixture)
from tests.integration.test_cli_reshape import write_config
from tests.integration.test_metrics import samples, scrape

pytestmark = pytest.mark.integration

NUMA = "numa_in_placement = true\n"


def once(config, *args):
    return run_agent("--config-file", config, "--once", *args)


def maintenance(config, *args):
    return run_agent("maintenance", *args, "--config-file", config)


def tree(host) -> dict:
    listing = host.scheduler.get(f"/resource_providers?in_tree={host.root}")
    return {rp["name"]: rp["uuid"] for rp in listing["resource_providers"]}


def inventories(host, rp):
    return host.scheduler.get(f"/resource_providers/{rp}/inventories")["inventories"]


def traits(host, rp):
    return set(host.scheduler.get(f"/resource_providers/{rp}/traits")["traits"])


def closed(host, rp) -> bool:
    held = inventories(host, rp)
    return bool(held) and all(inv["reserved"] == inv["total"] for inv in held.values())


def open_(host, rp) -> bool:
    return not any(inv["reserved"] == inv["total"] for inv in inventories(host, rp).values())


def candidates(host, resources: str) -> set:
    """The providers the candidates take ``resources`` from."""
    got = host.scheduler.get(f"/allocation_candidates?resources={resources}")
    return {rp for request in got["allocation_requests"] for rp in request["allocations"]}


@pytest.fixture
def numa_host(placement_server, host_name, tmp_path):
    host = Host(tmp_path, placement_server.url, host_name)
    host.config = write_config(host, NUMA)
    assert once(host.config).code == 0
    host.node0, host.node1 = f"{host_name}_NUMA_0", f"{host_name}_NUMA_1"
    assert {host.node0, host.node1} <= set(tree(host))
    return host


@pytest.fixture
def node0_closed(numa_host):
    host = numa_host
    result = maintenance(host.config, "on", "--provider", host.node0, "--reason", "DIMM swap")
    assert result.code == 0, result.stderr
    assert once(host.config).code == 0
    return host


def test_a_child_in_maintenance_takes_no_claim_while_its_sibling_does(node0_closed):
    host = node0_closed
    rps = tree(host)
    node0, node1 = rps[host.node0], rps[host.node1]

    assert closed(host, node0) and TRAIT in traits(host, node0)
    assert open_(host, node1) and TRAIT not in traits(host, node1)
    assert open_(host, host.root) and TRAIT not in traits(host, host.root)
    offered = candidates(host, "VCPU:1")
    assert node1 in offered and node0 not in offered
    with pytest.raises(PlacementError):
        allocate(host.scheduler, str(uuid.uuid4()), {node0: {"VCPU": 1}})
    allocate(host.scheduler, str(uuid.uuid4()), {node1: {"VCPU": 1}})
    steady = once(host.config, "--output", "json")
    assert steady.code == 0 and steady.json()["changes"] == []


def test_a_child_holding_allocations_is_closed_and_they_stay(numa_host):
    host = numa_host
    node0 = tree(host)[host.node0]
    guest = str(uuid.uuid4())
    allocate(host.scheduler, guest, {node0: {"VCPU": 2}})
    assert maintenance(host.config, "on", "--provider", host.node0).code == 0

    result = once(host.config, "--output", "json")

    assert result.code == 0, result.stderr
    assert closed(host, node0)
    assert result.json()["below_usage"] == []  # closed on purpose, not a cut
    held = host.scheduler.get(f"/allocations/{guest}")["allocations"]
    assert held[node0]["resources"] == {"VCPU": 2}


def test_a_lost_state_file_does_not_reopen_the_child(node0_closed):
    host = node0_closed
    node0 = tree(host)[host.node0]
    (Path(host.state_dir) / FILE_NAME).unlink()

    again = once(host.config, "--output", "json")

    assert again.code == 0, again.stderr
    assert again.json()["changes"] == []
    assert any(
        f"device maintenance is on for {host.node0} (unknown" in w for w in again.json()["warnings"]
    )
    assert closed(host, node0) and TRAIT in traits(host, node0)
    assert node0 not in candidates(host, "VCPU:1")

    off = maintenance(host.config, "off", "--provider", host.node0)
    assert off.code == 0, off.stderr
    assert once(host.config).code == 0
    assert open_(host, node0) and TRAIT not in traits(host, node0)
    assert node0 in candidates(host, "VCPU:1")
    # The off is done: the record goes, and the next cycle changes nothing.
    assert DEVICE_MAINTENANCE not in StateStore(Path(host.state_dir)).load()
    assert once(host.config, "--output", "json").json()["changes"] == []


def test_an_unknown_provider_is_refused_naming_the_children(numa_host):
    host = numa_host

    result = maintenance(host.config, "on", "--provider", "gpu-0")

    assert result.code == 2, result.stderr
    assert "maintenance --provider gpu-0: not a provider of this host" in result.stderr
    assert host.node0 in result.stderr and host.node1 in result.stderr
    assert DEVICE_MAINTENANCE not in StateStore(Path(host.state_dir)).load()


def test_the_root_is_refused_as_a_device(numa_host):
    result = maintenance(numa_host.config, "on", "--provider", numa_host.name)

    assert result.code == 2
    assert "without --provider for the whole host" in result.stderr


def test_host_wide_maintenance_off_leaves_a_device_in_maintenance(node0_closed):
    host = node0_closed
    node0 = tree(host)[host.node0]
    assert maintenance(host.config, "on").code == 0
    assert once(host.config).code == 0
    assert maintenance(host.config, "off").code == 0

    assert once(host.config).code == 0

    assert TRAIT not in traits(host, host.root) and open_(host, host.root)
    assert closed(host, node0) and TRAIT in traits(host, node0)


def test_status_shows_the_device_in_maintenance(node0_closed):
    host = node0_closed

    report = maintenance(host.config, "status", "--output", "json").json()

    assert report["devices"][host.node0]["on"] is True
    assert report["devices"][host.node0]["reason"] == "DIMM swap"
    assert report["devices"][host.node0]["closed_in_placement"] is True
    assert host.node1 not in report["devices"]
    text = maintenance(host.config, "status").stdout
    assert f"device {host.node0}: maintenance ON (reason: DIMM swap)" in text


# --- the running service


@pytest.fixture
def numa_agent(tmp_path, placement_server, host_name, rabbitmq):
    from tests.integration.agent_process import AgentProcess

    process = AgentProcess(
        tmp_path,
        placement_server.url,
        host_name,
        agent_options=f"report_interval = 3600\nmetrics_port = {free_port()}\n[compute]\n{NUMA}",
        extra=f"transport_url = {rabbitmq}\n",
    )
    yield process.start()
    process.stop()
    process.notify.close()


def test_the_running_service_applies_device_maintenance_and_shows_it(
    numa_agent, rabbitmq, placement_server
):
    from tests.integration.test_messaging import ctl

    agent = numa_agent
    agent.status_after(lambda s: s.startswith("ok:"))
    client = PlacementClient.for_endpoint(placement_server.url)
    root = client.providers_named(agent.host)[0]["uuid"]
    children = {
        rp["name"]: rp["uuid"] for rp in client.providers_in_tree(root) if rp["uuid"] != root
    }
    name = sorted(children)[0]

    refused = maintenance(str(agent.config), "on", "--provider", "nope")
    assert refused.code == 2, refused.stderr
    assert name in refused.stderr

    result = maintenance(str(agent.config), "on", "--provider", name, "--reason", "reseat")
    assert result.code == 0, result.stderr
    assert "the running service recorded it and applied it" in result.stdout
    held = client.inventories(children[name])["inventories"]
    assert all(inv["reserved"] == inv["total"] for inv in held.values())

    status = ctl(rabbitmq, agent.host, "status")
    assert status["device_maintenance"][name]["on"] is True
    assert status["device_maintenance"][name]["reason"] == "reseat"
    assert status["maintenance"]["on"] is False
    port = int(re.search(r"metrics_port = (\d+)", agent.config.read_text()).group(1))
    scraped = samples(scrape(port))
    assert scraped[("node_agent_device_maintenance", (("provider", name),))] == 1
    assert ("node_agent_device_maintenance", (("provider", sorted(children)[-1]),)) not in scraped

    answer = ctl(rabbitmq, agent.host, "maintenance", "off", "--provider", name)
    assert answer["applied_in_cycle"] is not None, answer
    held = client.inventories(children[name])["inventories"]
    assert not any(inv["reserved"] == inv["total"] for inv in held.values())
    assert TRAIT not in client.traits(children[name])["traits"]


# --- through node-agent-applier (upstream = messaging)


def test_a_lost_state_file_does_not_reopen_the_child_through_the_applier(
    bus, tmp_path, placement_server, host_name
):
    """The agent's state file is lost, so its tree has no opinion on the
    child's trait; the applier keeps the child closed from Placement, and an
    ``off`` record still reopens it."""
    from node_agent.cycle.desired import compute_desired
    from node_agent.policy import maintenance as maint
    from tests.integration.test_nested_reshape import NestedHost

    bus.start(1)
    host = NestedHost(tmp_path, placement_server.url, host_name, [])
    sender = bus.sender(host_name, timeout=30)
    settings = host.settings(numa_in_placement=True)
    node = f"{host_name}_NUMA_0"
    on = {DEVICE_MAINTENANCE: {node: maint.record(True, "reseat", "2026-01-01T00:00:00+00:00")}}
    assert sender.send(compute_desired(settings, state=on)).ok
    child = host.uuid_of(node)

    def state() -> tuple[bool, bool]:
        held = host.scheduler.get(f"/resource_providers/{child}/inventories")["inventories"]
        marked = TRAIT in host.scheduler.get(f"/resource_providers/{child}/traits")["traits"]
        return all(inv["reserved"] == inv["total"] for inv in held.values()), marked

    assert state() == (True, True)
    assert sender.send(compute_desired(settings, state={})).ok  # the file is gone
    assert state() == (True, True)

    off = {DEVICE_MAINTENANCE: {node: maint.record(False, None, "2026-01-02T00:00:00+00:00")}}
    assert sender.send(compute_desired(settings, state=off)).ok
    assert state() == (False, False)
