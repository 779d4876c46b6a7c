"""Maintenance through the real ``node-agent`` command against the real
Placement, on a host whose pinned (PCPU) and floating (VCPU) guests hold
allocations written as the scheduler writes them."""

import json
import uuid
from pathlib import Path

import pytest

from node_agent.cycle.desired import compute_desired
from node_agent.policy import maintenance as maint
from node_agent.policy.maintenance import TRAIT
from node_agent.state import FILE_NAME, MAINTENANCE, StateStore
from tests.cli.runner import run_agent
from tests.integration.reshape_driver import Host, allocate, boot_legacy_guests
from tests.integration.test_applier import bus  # noqa: F401 (fixture)
from tests.integration.test_cli_reshape import write_config
from tests.integration.test_messaging import agent, ctl  # noqa: F401 (fixture)
from tests.integration.test_nested_reshape import NestedHost
from tests.integration.test_service_process import root_inventory

pytestmark = pytest.mark.integration

PINNED = "cpu_dedicated_set = 2-7,10-15\ncpu_shared_set = 0-1,8-9\n"


def once(config, *args):
    return run_agent("--config-file", config, "--once", *args)


def maintenance(config, *args):
    return run_agent("maintenance", *args, "--config-file", config)


def root_traits(host):
    return set(host.scheduler.get(f"/resource_providers/{host.root}/traits")["traits"])


def usages(host):
    return host.scheduler.get(f"/resource_providers/{host.root}/usages")["usages"]


def assert_closed(host):
    inventories = host.inventories()
    assert {rc: (inv["reserved"], inv["total"]) for rc, inv in inventories.items()} == {
        rc: (inv["total"], inv["total"]) for rc, inv in inventories.items()
    }
    assert TRAIT in root_traits(host)


@pytest.fixture
def busy(placement_server, host_name, tmp_path):
    """A host with pinned guests on PCPU and floating guests on VCPU."""
    host = Host(tmp_path, placement_server.url, host_name)
    assert once(write_config(host)).code == 0
    boot_legacy_guests(host)
    config = write_config(host, PINNED)
    assert once(config).code == 0  # the reshape moves pinned guests to PCPU
    used = usages(host)
    assert used["PCPU"] and used["VCPU"] and used["MEMORY_MB"]
    host.config = config
    return host


@pytest.fixture
def closed(busy):
    assert maintenance(busy.config, "on", "--reason", "disk swap").code == 0
    busy.before = busy.allocations()
    result = once(busy.config, "--output", "json")
    assert result.code == 0, result.stderr
    return busy


def test_maintenance_on_reserves_every_class_in_use_and_sets_the_disabled_trait(busy):
    configured = busy.inventories()
    before = busy.allocations()
    assert maintenance(busy.config, "on", "--reason", "disk swap").code == 0

    result = once(busy.config, "--output", "json")

    assert result.code == 0, result.stderr
    assert "cannot lower" not in result.stderr
    assert_closed(busy)
    assert set(busy.inventories()) == set(configured)  # nothing removed
    assert busy.allocations() == before  # no allocation touched
    assert any("maintenance is on (disk swap)" in w for w in result.json()["warnings"])
    again = once(busy.config, "--output", "json")
    assert again.code == 0 and again.json()["changes"] == []


def test_maintenance_with_a_ratio_cut_below_usage_publishes_the_cut_closed(
    placement_server, host_name, tmp_path
):
    """20 VCPU in use (16 x 4.0 = 64), then maintenance on and
    cpu_allocation_ratio = 1.0 (capacity 16 < 20 in use) in one cycle: the
    ratio is written, as nova writes it (Placement takes a capacity below
    usage), and the record is closed all the same. Before, the ratio
    change was held back and the run exited 1."""
    host = Host(tmp_path, placement_server.url, host_name)
    assert once(write_config(host)).code == 0
    host.boot(host.not_a_guest, vcpu=10, memory=1024)
    other = str(uuid.uuid4())  # max_unit is 16: two consumers
    allocate(host.scheduler, other, {host.root: {"VCPU": 10}})
    before = host.allocations()
    config = write_config(host, "cpu_allocation_ratio = 1.0\n")
    assert maintenance(config, "on", "--reason", "disk swap").code == 0

    first = once(config, "--output", "json")

    assert first.code == 0, first.stderr
    assert "cannot lower" not in first.stderr
    inventories = host.inventories()
    assert inventories["VCPU"] == {
        **inventories["VCPU"],
        "total": 16,
        "reserved": 16,
        "allocation_ratio": 1.0,
    }
    assert_closed(host)
    # Closed on purpose: maintenance, not a cut below usage to report.
    assert first.json()["below_usage"] == []
    second = once(config, "--output", "json")
    assert second.code == 0, second.stderr
    assert second.json()["changes"] == []
    assert_closed(host)
    assert host.allocations() == before


def test_lost_state_file_does_not_end_maintenance(closed):
    (Path(closed.state_dir) / FILE_NAME).unlink()

    plan = once(closed.config, "--dry-run", "--output", "json")
    assert plan.code == 0, plan.stderr
    assert plan.json()["changes"] == []
    assert any("maintenance is on (unknown" in w for w in plan.json()["warnings"])

    result = once(closed.config, "--output", "json")
    assert result.code == 0, result.stderr
    assert result.json()["changes"] == []
    assert_closed(closed)
    assert closed.allocations() == closed.before


def test_corrupt_state_file_does_not_end_maintenance(closed):
    path = Path(closed.state_dir) / FILE_NAME
    path.write_text(path.read_text()[:40])

    result = once(closed.config, "--output", "json")

    assert result.code == 0, result.stderr
    assert_closed(closed)
    status = maintenance(closed.config, "status", "--output", "json")
    assert status.code == 0, status.stderr
    report = status.json()
    assert report["maintenance"] == "on" and "unknown" in report["reason"]
    assert report["state_file"]["maintenance"] == "none"  # rebuilt by the cycle
    assert report["agree"] is True


def test_maintenance_off_restores_configured_reservations_and_removes_the_trait(closed):
    assert maintenance(closed.config, "off").code == 0
    assert TRAIT in root_traits(closed)  # applied by the next cycle, as `on` is

    result = once(closed.config, "--output", "json")

    assert result.code == 0, result.stderr
    inventories = closed.inventories()
    assert {rc: inv["reserved"] for rc, inv in inventories.items()} == {
        "VCPU": 0,
        "PCPU": 0,
        "MEMORY_MB": 512,
        "DISK_GB": 0,
    }
    assert TRAIT not in root_traits(closed)
    assert closed.allocations() == closed.before
    state = json.loads((Path(closed.state_dir) / FILE_NAME).read_text())["payload"]
    assert "maintenance" not in state  # done: the trait alone decides again
    assert once(closed.config, "--output", "json").json()["changes"] == []


def test_maintenance_off_after_the_state_file_was_lost_still_ends_it(closed):
    (Path(closed.state_dir) / FILE_NAME).unlink()
    assert maintenance(closed.config, "off").code == 0
    assert once(closed.config).code == 0
    assert TRAIT not in root_traits(closed)
    assert closed.inventories()["PCPU"]["reserved"] == 0


def test_status_shows_the_state_file_and_placement_and_whether_they_agree(busy):
    assert maintenance(busy.config, "on", "--reason", "disk swap").code == 0
    pending = maintenance(busy.config, "status", "--output", "json").json()
    assert pending["maintenance"] == "on" and pending["reason"] == "disk swap"
    assert pending["state_file"]["maintenance"] == "on"
    assert pending["placement"]["trait"] is False and pending["agree"] is False

    assert once(busy.config).code == 0
    text = maintenance(busy.config, "status")
    assert text.code == 0, text.stderr
    assert "maintenance is ON" in text.stdout and "disk swap" in text.stdout
    assert f"{TRAIT} set" in text.stdout and "open: none" in text.stdout
    assert "agree: yes" in text.stdout
    report = maintenance(busy.config, "status", "--output", "json").json()
    assert report["placement"]["root_uuid"] == busy.root
    assert sorted(report["placement"]["fully_reserved"]) == sorted(busy.inventories())
    assert report["agree"] is True


def test_service_restarted_without_its_state_file_keeps_maintenance_and_says_why(
    agent, rabbitmq, placement_server
):
    agent.status_after(lambda s: s.startswith("ok:"))
    ctl(rabbitmq, agent.host, "maintenance", "on", "--reason", "disk swap")
    assert agent.stop() == 0
    (agent.dir / "state" / FILE_NAME).unlink()

    agent.start()
    agent.new_status(lambda s: s.startswith("ok:"))

    status = ctl(rabbitmq, agent.host, "status")
    assert status["maintenance"]["on"] is True
    assert status["maintenance"]["source"] == "placement"
    assert "unknown" in status["maintenance"]["reason"]
    inventories = root_inventory(placement_server.url, agent.host)
    assert all(inv["reserved"] == inv["total"] for inv in inventories.values())


def test_maintenance_command_asks_the_running_service_which_applies_it_at_once(
    agent, rabbitmq, placement_server
):
    agent.status_after(lambda s: s.startswith("ok:"))  # report_interval is an hour

    result = maintenance(str(agent.config), "on", "--reason", "disk swap")

    assert result.code == 0, result.stderr
    assert "the running service recorded it" in result.stdout
    inventories = root_inventory(placement_server.url, agent.host)
    assert all(inv["reserved"] == inv["total"] for inv in inventories.values())
    status = ctl(rabbitmq, agent.host, "status")
    assert status["maintenance"]["on"] is True and status["maintenance"]["reason"] == "disk swap"

    assert maintenance(str(agent.config), "off").code == 0
    inventories = root_inventory(placement_server.url, agent.host)
    assert not any(inv["reserved"] == inv["total"] for inv in inventories.values())


def test_maintenance_command_writes_the_file_when_no_service_answers(
    tmp_path, rabbitmq, placement_server, host_name
):
    from tests.integration.agent_process import AgentProcess

    idle = AgentProcess(
        tmp_path, placement_server.url, host_name, extra=f"transport_url = {rabbitmq}\n"
    )  # never started

    result = maintenance(str(idle.config), "on")

    assert result.code == 0, result.stderr
    assert "at the next cycle" in result.stdout
    from node_agent.policy.maintenance import is_on
    from node_agent.state import MAINTENANCE as MAINTENANCE_KEY
    from node_agent.state import StateStore

    assert is_on(StateStore(tmp_path / "state").load()[MAINTENANCE_KEY])
    idle.notify.close()


def test_lost_state_file_does_not_end_maintenance_through_the_applier(
    bus, tmp_path, placement_server, host_name
):
    """``[agent] upstream = messaging``: the agent's state file is lost, so its
    tree carries no maintenance; the applier keeps it on from the root's
    disabled trait in Placement, as the direct mode does."""
    bus.start(1)
    host = NestedHost(tmp_path, placement_server.url, host_name, [])
    sender = bus.sender(host_name, timeout=30)
    settings = host.settings()
    on = {MAINTENANCE: maint.record(True, "disk swap", "2026-01-01T00:00:00+00:00")}
    assert sender.send(compute_desired(settings, state=on)).ok

    def closed() -> dict:
        found = host.scheduler.get(f"/resource_providers/{host.root}/inventories")
        return {rc: inv["reserved"] == inv["total"] for rc, inv in found["inventories"].items()}

    assert all(closed().values()) and TRAIT in host.root_traits()

    report = sender.send(compute_desired(settings, state={}))  # the file is gone

    assert report.ok, report.errors
    assert all(closed().values()), closed()
    assert TRAIT in host.root_traits()
    # `maintenance off` (an off record) still ends it through the applier.
    off = {MAINTENANCE: maint.record(False, None, "2026-01-02T00:00:00+00:00")}
    assert sender.send(compute_desired(settings, state=off)).ok
    assert not any(closed().values()) and TRAIT not in host.root_traits()


def test_status_reads_the_numa_children_and_names_a_reopened_one(
    placement_server, host_name, tmp_path
):
    """The root alone would say "closed" while a NUMA child, reopened by
    hand, still offers its CPUs and memory."""
    host = Host(tmp_path, placement_server.url, host_name)
    config = write_config(host, "numa_in_placement = true\n")
    assert maintenance(config, "on", "--reason", "disk swap").code == 0
    assert once(config).code == 0
    closed = maintenance(config, "status", "--output", "json").json()
    children = closed["placement"]["children"]
    assert {c["name"] for c in children} == {f"{host_name}_NUMA_0", f"{host_name}_NUMA_1"}
    assert all(c["agent"] and c["fully_reserved"] and not c["open"] for c in children)
    assert closed["agree"] is True

    child = next(c for c in children if c["name"].endswith("_NUMA_1"))
    held = host.scheduler.get(f"/resource_providers/{child['uuid']}/inventories")
    host.scheduler.put(
        f"/resource_providers/{child['uuid']}/inventories",
        {
            "resource_provider_generation": held["resource_provider_generation"],
            "inventories": {rc: {**inv, "reserved": 0} for rc, inv in held["inventories"].items()},
        },
    )

    report = maintenance(config, "status", "--output", "json").json()
    assert report["agree"] is False
    assert report["placement"]["open_by_provider"] == {child["name"]: sorted(held["inventories"])}
    text = maintenance(config, "status").stdout
    assert f"child {child['name']}: fully reserved: none; open: " in text
    assert "agree: NO" in text
    assert once(config).code == 0  # the next cycle closes it again
    assert maintenance(config, "status", "--output", "json").json()["agree"] is True


def test_numa_off_during_maintenance_is_refused_naming_maintenance(
    tmp_path, placement_server, host_name
):
    """The reshape back to the root cannot move allocations onto a closed
    root; the refusal says maintenance is why, not "give the host more"."""
    from node_agent.cycle.reconcile import ReshapeRefused
    from tests.integration.test_reverse_reshape import numa_host_with_guests

    host = numa_host_with_guests(tmp_path, placement_server.url, host_name)
    StateStore(Path(host.state_dir)).put(
        MAINTENANCE, maint.record(True, "disk swap", "2026-01-01T00:00:00+00:00")
    )
    _outcome, report, _ = host.cycle(numa_in_placement=True)  # closes the NUMA tree
    assert report.ok, report.errors
    before = host.allocations()

    outcome, _report, _ = host.cycle()  # NUMA off

    assert isinstance(outcome, ReshapeRefused)
    text = str(outcome)
    assert "Give the host more" not in text
    for rc in ("MEMORY_MB", "PCPU", "VCPU"):
        assert f"{rc} on {host_name} is fully reserved (reserved = total" in text, text
    assert "`node-agent maintenance off`" in text
    assert host.allocations() == before


def test_maintenance_holds_when_guests_refuse_the_new_configuration(
    placement_server, host_name, tmp_path
):
    """The new CPU sets are refused by name (a floating guest has no shared
    set left), so VCPU and PCPU keep what Placement holds; maintenance
    closes them all the same."""
    host = Host(tmp_path, placement_server.url, host_name)
    assert once(write_config(host)).code == 0
    host.boot(host.unpinned[0], vcpu=2, memory=1024)  # instance-00000003, floating
    before = host.allocations()
    config = write_config(host, "cpu_dedicated_set = 0-15\n")
    assert maintenance(config, "on", "--reason", "disk swap").code == 0

    result = once(config, "--output", "json")

    assert result.code == 1
    assert "instance-00000003" in result.stderr and "cpu_shared_set" in result.stderr
    assert_closed(host)
    assert set(host.inventories()) == {"VCPU", "MEMORY_MB", "DISK_GB"}  # the old layout
    assert host.allocations() == before


def test_maintenance_and_numa_on_in_one_cycle_leave_nothing_open(
    placement_server, host_name, tmp_path
):
    """Maintenance on and numa_in_placement = true reach the same cycle. The
    reshape cannot move the guests onto closed children and is refused; the
    classes it keeps on the root as Placement holds them are closed too."""
    host = Host(tmp_path, placement_server.url, host_name)
    assert once(write_config(host)).code == 0
    boot_legacy_guests(host)
    before = host.allocations()
    config = write_config(host, "numa_in_placement = true\n")
    assert maintenance(config, "on", "--reason", "disk swap").code == 0

    result = once(config, "--output", "json")

    assert result.code == 1, result.stderr
    assert "fully reserved (reserved = total" in result.stderr
    listing = host.scheduler.get(f"/resource_providers?in_tree={host.root}")["resource_providers"]
    for rp in listing:
        held = host.scheduler.get(f"/resource_providers/{rp['uuid']}/inventories")
        assert all(inv["reserved"] == inv["total"] for inv in held["inventories"].values()), (
            rp["name"],
            held["inventories"],
        )
    assert TRAIT in root_traits(host)
    assert host.allocations() == before


def test_maintenance_closes_a_class_the_new_sets_remove_but_usage_keeps(
    placement_server, host_name, tmp_path
):
    """No local guest; a migration record holds 3 VCPU. Maintenance on and
    cpu_dedicated_set = 0-15 (no VCPU any more) in one cycle: VCPU cannot be
    removed while in use, and the record it keeps is closed."""
    host = NestedHost(tmp_path, placement_server.url, host_name, [])
    _outcome, report, _ = host.cycle(dedicated=None, shared=None)
    assert report.ok, report.errors
    stranger = str(uuid.uuid4())
    allocate(host.scheduler, stranger, {host.root: {"VCPU": 3, "MEMORY_MB": 512}})
    StateStore(Path(host.state_dir)).put(
        MAINTENANCE, maint.record(True, "disk swap", "2026-01-01T00:00:00+00:00")
    )

    _outcome, report, _ = host.cycle(dedicated="0-15", shared=None)

    assert not report.ok and "cannot lower VCPU" in report.errors[0]
    held = host.scheduler.get(f"/resource_providers/{host.root}/inventories")["inventories"]
    assert {rc: inv["reserved"] for rc, inv in held.items()} == {
        rc: inv["total"] for rc, inv in held.items()
    }
    assert set(held) == {"VCPU", "PCPU", "MEMORY_MB", "DISK_GB"}
    assert host.scheduler.get(f"/allocations/{stranger}")["allocations"][host.root][
        "resources"
    ] == {"VCPU": 3, "MEMORY_MB": 512}


def test_a_running_service_follows_maintenance_ended_by_the_command_and_once(
    tmp_path, placement_server, host_name
):
    """The operator ends maintenance with ``node-agent maintenance off`` and
    ``node-agent --once`` (what the command advises) between two cycles of
    the running service, which has no control RPC to be told. The service's
    next cycle knows the root is open. It used to go on from its cache of
    Placement, where the root was still disabled, until its next full
    verify (300 s): maintenance on in its metrics and status, and a reshape
    due meanwhile refused as one onto a closed inventory (seen under
    systemd). The cycles are 30 s apart so the two commands fit between
    them; were the machine too slow for that, the service would end the
    maintenance itself and the test would pass on either code."""
    from node_agent.placement.client import PlacementClient
    from tests.integration.agent_process import AgentProcess
    from tests.integration.rabbit import free_port
    from tests.integration.test_metrics import samples, scrape

    client = PlacementClient.for_endpoint(placement_server.url)

    def traits() -> set:
        found = client.get(f"/resource_providers?name={host_name}")["resource_providers"]
        return set(client.get(f"/resource_providers/{found[0]['uuid']}/traits")["traits"])

    port = free_port()
    agent = AgentProcess(
        tmp_path,
        placement_server.url,
        host_name,
        agent_options=f"report_interval = 30\nmetrics_port = {port}\n",
    )
    config = str(agent.config)
    assert maintenance(config, "on", "--reason", "bios").code == 0
    assert once(config).code == 0
    assert TRAIT in traits()
    agent.start()
    try:
        agent.status_after(lambda s: s.startswith("ok:"), 60)  # its cache: closed
        assert samples(scrape(port))[("node_agent_maintenance", ())] == 1

        assert maintenance(config, "off").code == 0
        result = once(config)
        assert result.code == 0, result.stderr
        assert TRAIT not in traits()
        agent.new_status(lambda s: True, 90)  # the service's next cycle

        assert samples(scrape(port))[("node_agent_maintenance", ())] == 0
        assert TRAIT not in traits()
    finally:
        agent.stop()
        agent.notify.close()
