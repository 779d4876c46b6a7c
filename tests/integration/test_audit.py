"""The allocation audit against the real Placement, with libvirt test-driver
guests (tests/data/libvirt/host.xml) and scheduler-style allocations.

The scheduler here writes at 1.38 so consumers carry their type (INSTANCE,
MIGRATION) as nova's do since Yoga.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

import pytest

from node_agent.cycle.audit import Auditor
from node_agent.cycle.desired import compute_desired
from node_agent.placement.client import PlacementClient
from node_agent.placement.sync import TreeSyncer
from node_agent.policy import audit as A
from node_agent.service.daemon import Agent, Loaded
from node_agent.service.metrics import AgentCollector
from node_agent.state import StateStore
from tests.cli.runner import run_agent
from tests.integration.reshape_driver import PROJECT, USER, Host, agent_cycle
from tests.integration.test_cli_reshape import write_config
from tests.machine_id import isolated_config

pytestmark = pytest.mark.integration
LOG = logging.getLogger(__name__)


class Scheduler(PlacementClient):
    MICROVERSION = "1.38"


def claim(client, consumer, by_rp, consumer_type="INSTANCE"):
    client.put(
        f"/allocations/{consumer}",
        {
            "allocations": {rp: {"resources": res} for rp, res in by_rp.items()},
            "project_id": PROJECT,
            "user_id": USER,
            "consumer_generation": None,
            "consumer_type": consumer_type,
        },
    )


def guest_resources(guest) -> dict:
    return {"VCPU": guest.vcpus, "MEMORY_MB": guest.memory_kb // 1024}


class Scene:
    """One host whose tree the agent created, every guest of host.xml known,
    and the scheduler's claims as each test sets them up."""

    def __init__(self, tmp_path, url, name):
        self.host = Host(tmp_path, url, name)
        agent_cycle(self.host.agent, self.host.settings())
        self.scheduler = Scheduler.for_endpoint(url)
        store = StateStore(Path(self.host.state_dir))
        self.guests = {
            g.name: g
            for g in compute_desired(
                self.host.settings(), state=store.load_or_empty(LOG)
            ).host.guests
        }
        self.other_host = str(uuid.uuid4())
        self.scheduler.post(
            "/resource_providers", {"name": f"{name}-other", "uuid": self.other_host}
        )
        self.scheduler.put(
            f"/resource_providers/{self.other_host}/inventories",
            {
                "resource_provider_generation": 0,
                "inventories": {"VCPU": {"total": 64}, "MEMORY_MB": {"total": 65536}},
            },
        )
        self.consumers: list[str] = []

    def claim(self, consumer, by_rp, consumer_type="INSTANCE"):
        claim(self.scheduler, consumer, by_rp, consumer_type)
        self.consumers.append(consumer)

    def claim_guest(self, name, **override):
        guest = self.guests[name]
        self.claim(guest.uuid, {self.host.root: {**guest_resources(guest), **override}})
        return guest

    def every_allocation(self) -> dict:
        """Every allocation on both hosts' providers, and every consumer's
        record with its generation, read by the scheduler."""
        seen = {}
        for rp in (self.host.root, self.other_host):
            seen[rp] = self.scheduler.get(f"/resource_providers/{rp}/allocations")
        for consumer in self.consumers:
            seen[consumer] = self.scheduler.get(f"/allocations/{consumer}")
        return seen


@pytest.fixture
def scene(tmp_path, placement_server, host_name):
    return Scene(tmp_path, placement_server.url, host_name)


def set_up_every_case(scene: Scene) -> dict:
    """Each kind of finding, and each in-flight case, on one host."""
    s = scene
    for name in ("instance-00000001", "instance-00000002", "instance-00000005"):
        s.claim_guest(name)
    cases = {
        "resized": s.claim_guest("instance-00000003", VCPU=4).uuid,  # old size kept
        "unclaimed": s.guests["instance-00000006"].uuid,  # no allocation
        "orphan": str(uuid.uuid4()),  # deleted while down
        "migration": str(uuid.uuid4()),  # MIGRATION consumer
        "spanning": str(uuid.uuid4()),  # here and elsewhere
        "migrating_out": s.guests["instance-00000004"].uuid,  # held on the other host
    }
    s.claim(cases["orphan"], {s.host.root: {"VCPU": 1, "MEMORY_MB": 512}})
    s.claim(cases["migration"], {s.host.root: {"VCPU": 2, "MEMORY_MB": 1024}}, "MIGRATION")
    s.claim(
        cases["spanning"],
        {s.host.root: {"VCPU": 1, "MEMORY_MB": 256}, s.other_host: {"VCPU": 1, "MEMORY_MB": 256}},
    )
    s.claim(cases["migrating_out"], {s.other_host: {"VCPU": 1, "MEMORY_MB": 1024}})
    return cases


def by_consumer(audit: dict) -> dict:
    return {f["consumer"]: (f["kind"], f["state"]) for f in audit["findings"]}


def test_audit_command_reports_each_kind_once_seen_twice_and_never_alarms_in_flight(scene):
    cases = set_up_every_case(scene)
    config = write_config(scene.host)
    before = scene.every_allocation()

    first = run_agent("--config-file", config, "audit", "--output", "json")
    assert first.code == 0, first.stderr  # all new: pending, or in flight
    found = by_consumer(first.json()["audit"])
    first_since = {f["consumer"]: f["orphaned_since"] for f in first.json()["audit"]["findings"]}
    assert found[cases["orphan"]] == (A.ORPHAN, A.PENDING)
    assert found[cases["unclaimed"]] == (A.NO_ALLOCATION, A.PENDING)
    assert found[cases["resized"]] == (A.SIZE_MISMATCH, A.PENDING)

    # Global options after the subcommand work too.
    second = run_agent("audit", "--output", "json", "--config-file", config)
    assert second.code == 1, second.stderr  # alarms
    audit = second.json()["audit"]
    assert by_consumer(audit) == {
        cases["orphan"]: (A.ORPHAN, A.ALARM),
        cases["unclaimed"]: (A.NO_ALLOCATION, A.ALARM),
        cases["resized"]: (A.SIZE_MISMATCH, A.ALARM),
        cases["migration"]: (A.ORPHAN, A.IN_FLIGHT),
        cases["spanning"]: (A.ORPHAN, A.IN_FLIGHT),
        cases["migrating_out"]: (A.NO_ALLOCATION, A.IN_FLIGHT),
    }
    types = {f["consumer"]: f["consumer_type"] for f in audit["findings"]}
    assert types[cases["orphan"]] == "INSTANCE"
    assert types[cases["migration"]] == "MIGRATION"
    resized = next(f for f in audit["findings"] if f["consumer"] == cases["resized"])
    assert resized["sizes"] == [{"resource": "VCPU", "guest": 2, "allocated": 4}]
    # How long: from the first run's sighting, kept by the state file
    # between the two processes.
    orphan = next(f for f in audit["findings"] if f["consumer"] == cases["orphan"])
    assert orphan["orphaned_since"] == first_since[cases["orphan"]] is not None
    assert orphan["orphaned_for_s"] > 0
    assert audit["alarms"] == 3

    text = run_agent("--config-file", config, "audit")
    assert text.code == 1
    assert f"ALARM: orphan consumer {cases['orphan']}" in text.stdout
    assert "in flight (not an alarm): orphan consumer" in text.stdout

    # The audit never changes an allocation.
    assert scene.every_allocation() == before


def test_in_flight_past_the_grace_and_disk_on_shared_storage_are_alarms(scene):
    """A migration that never finished leaves allocations on two hosts: in
    flight at first, an alarm once [agent] audit_in_flight_grace has passed
    since the agent first saw it. A consumer whose only allocation outside
    this host is DISK_GB on shared storage is no migration: an orphan."""
    s = scene
    shared = str(uuid.uuid4())
    s.scheduler.post("/resource_providers", {"name": f"{s.host.name}-nfs", "uuid": shared})
    s.scheduler.put(
        f"/resource_providers/{shared}/inventories",
        {"resource_provider_generation": 0, "inventories": {"DISK_GB": {"total": 1000}}},
    )
    s.scheduler.put(
        f"/resource_providers/{shared}/traits",
        {"resource_provider_generation": 1, "traits": ["MISC_SHARES_VIA_AGGREGATE"]},
    )
    cases = {
        "spanning": str(uuid.uuid4()),
        "migration": str(uuid.uuid4()),
        "shared_disk": str(uuid.uuid4()),
    }
    s.claim(
        cases["spanning"],
        {s.host.root: {"VCPU": 1, "MEMORY_MB": 256}, s.other_host: {"VCPU": 1, "MEMORY_MB": 256}},
    )
    s.claim(cases["migration"], {s.host.root: {"VCPU": 2, "MEMORY_MB": 1024}}, "MIGRATION")
    s.claim(
        cases["shared_disk"], {s.host.root: {"VCPU": 1, "MEMORY_MB": 512}, shared: {"DISK_GB": 20}}
    )
    before = s.every_allocation()

    config = write_config(s.host)  # the default grace: an hour
    runs = [run_agent("--config-file", config, "audit", "--output", "json") for _ in range(2)]
    assert runs[0].code == 0 and runs[1].code == 1, runs[1].stderr
    assert {
        c: f for c, f in by_consumer(runs[1].json()["audit"]).items() if c in cases.values()
    } == {
        cases["spanning"]: (A.ORPHAN, A.IN_FLIGHT),
        cases["migration"]: (A.ORPHAN, A.IN_FLIGHT),
        cases["shared_disk"]: (A.ORPHAN, A.ALARM),
    }

    time.sleep(1.1)
    late = run_agent(
        "--config-file",
        write_config(s.host, "[agent]\naudit_in_flight_grace = 1\n"),
        "audit",
        "--output",
        "json",
    )
    assert late.code == 1, late.stderr
    audit = late.json()["audit"]
    assert {c: by_consumer(audit)[c] for c in cases.values()} == {
        c: (A.ORPHAN, A.ALARM) for c in cases.values()
    }
    spanning = next(f for f in audit["findings"] if f["consumer"] == cases["spanning"])
    assert "longer than audit_in_flight_grace (1s)" in spanning["detail"]
    first_seen = {f["consumer"]: f["orphaned_since"] for f in runs[0].json()["audit"]["findings"]}
    assert spanning["orphaned_since"] == first_seen[cases["spanning"]]
    assert s.every_allocation() == before


def test_dry_run_shows_the_audit_section_and_writes_nothing(scene):
    cases = set_up_every_case(scene)
    config = write_config(scene.host)
    before = scene.every_allocation()
    state_before = (
        Path(scene.host.state_dir, "state.json").read_bytes()
        if Path(scene.host.state_dir, "state.json").exists()
        else None
    )
    for _ in range(2):
        plan = run_agent("--config-file", config, "--once", "--dry-run", "--output", "json")
        assert plan.code == 0, plan.stderr
        # --dry-run keeps no observation: everything new stays pending.
        assert by_consumer(plan.json()["audit"])[cases["orphan"]] == (A.ORPHAN, A.PENDING)
    text = run_agent("--config-file", config, "--once", "--dry-run")
    assert "Allocation audit (" in text.stdout
    assert "pending: orphan consumer" in text.stdout
    assert scene.every_allocation() == before
    if state_before is not None:
        assert Path(scene.host.state_dir, "state.json").read_bytes() == state_before


def test_audit_without_placement_is_a_config_error(tmp_path):
    config = tmp_path / "node-agent.conf"
    # No hypervisor: with libvirt's default URI and no [DEFAULT] host the
    # host's name is libvirt's, and an unreachable libvirt is exit 69 first.
    config.write_text(
        isolated_config(tmp_path)
        + f"[agent]\nstate_path = {tmp_path}\n[libvirt]\nconnection_uri =\n"
    )
    result = run_agent("--config-file", str(config), "audit")
    assert result.code == 78
    assert "node-agent audit reads Placement" in result.stderr


def test_steady_cycle_sends_no_request_and_the_audit_runs_with_each_full_verify(scene):
    set_up_every_case(scene)
    client = PlacementClient.for_endpoint(scene.host.url)
    agent = Agent()
    loaded = Loaded(None, scene.host.settings(), client)
    try:
        agent(loaded)  # first cycle: full verify, then the audit
        providers = 1  # this host's tree: the root only
        # Consumers the allocations alone cannot explain: the orphan, the
        # MIGRATION and spanning consumers, the two guests with nothing here.
        looked_up = 5
        assert agent._auditor.requests == providers + looked_up
        assert agent.last_audit["counts"][A.ORPHAN][A.PENDING] == 1

        client.stats.reset()
        agent(loaded)  # steady: nothing changed, nothing due
        assert client.stats.total == 0

        agent._syncer.full_verify_interval = 0  # the next full verify is due
        agent(loaded)
        assert any(p.endswith("/allocations") for _m, p, _s in client.stats.log)
        assert agent.last_audit["counts"][A.ORPHAN][A.ALARM] == 1
        assert client.stats.writes == 0
        gauges = {
            tuple(s.labels.values()): s.value for s in AgentCollector(agent, None)._audit().samples
        }
        assert gauges[(A.ORPHAN, A.ALARM)] == 1
        assert gauges[(A.ORPHAN, A.IN_FLIGHT)] == 2
        assert gauges[(A.NO_ALLOCATION, A.IN_FLIGHT)] == 1
        assert gauges[(A.SIZE_MISMATCH, A.ALARM)] == 1
    finally:
        agent.close()


def test_findings_change_is_noticed_once(scene):
    cases = set_up_every_case(scene)
    client = PlacementClient.for_endpoint(scene.host.url)
    store = StateStore(Path(scene.host.state_dir))
    syncer = TreeSyncer(client, store)
    desired = compute_desired(scene.host.settings(), state=store.load_or_empty(LOG))
    syncer.plan(desired.tree)
    auditor = Auditor(syncer)
    auditor.run(desired, scene.host.name, numa=False)
    assert auditor.changed()  # the in-flight cases are news
    auditor.run(desired, scene.host.name, numa=False)
    assert auditor.changed()  # pending ones became alarms
    auditor.run(desired, scene.host.name, numa=False)
    assert not auditor.changed()  # the same set: no second notification
    scene.scheduler.delete(f"/allocations/{cases['orphan']}")
    auditor.run(desired, scene.host.name, numa=False)
    assert auditor.changed()  # an orphan cleared by the operator


def test_audit_of_a_host_not_yet_in_placement_says_so(tmp_path, placement_server, host_name):
    host = Host(tmp_path, placement_server.url, host_name)
    result = run_agent("--config-file", write_config(host), "audit")
    assert result.code == 1
    assert f"{host_name} has no provider in Placement" in result.stderr
    assert "node-agent --once" in result.stderr


def test_a_change_in_the_findings_is_notified_once_over_the_real_bus(scene, rabbitmq, tmp_path):
    from oslo_config import cfg

    from node_agent.remote import messaging
    from tests.integration.test_messaging import Collector

    class Heard(Collector):
        warn = Collector.info

    om = messaging.oslo_messaging()
    listen_conf = cfg.ConfigOpts()
    listen_conf([])
    transport = om.get_notification_transport(listen_conf, url=rabbitmq)
    heard = Heard()
    server = om.get_notification_listener(transport, [om.Target(topic="notifications")], [heard])
    server.start()
    conf_file = tmp_path / "bus.conf"
    conf_file.write_text(f"[DEFAULT]\ntransport_url = {rabbitmq}\n")
    conf = cfg.ConfigOpts()
    messaging.register(conf)
    conf(["--config-file", str(conf_file)])
    messenger = messaging.from_conf(conf, scene.host.name)
    cases = set_up_every_case(scene)
    agent = Agent(messenger=messenger)
    loaded = Loaded(None, scene.host.settings(), PlacementClient.for_endpoint(scene.host.url))
    audits = []

    def audit_heard(publisher, event_type, payload):
        if (
            event_type == "node_agent.audit.update"
            and payload["node_agent_object.data"]["host"] == scene.host.name
        ):
            audits.append(payload)
            return True
        return False

    try:
        agent(loaded)  # in-flight cases are news; the rest is pending
        first = heard.wait_for(audit_heard)[2]
        assert first["node_agent_object.name"] == "AuditPayload"
        assert first["node_agent_object.version"] == messaging.PAYLOAD_VERSION
        assert first["node_agent_object.data"]["alarms"] == 0
        agent._syncer.full_verify_interval = 0
        agent(loaded)  # seen twice: alarms
        second = heard.wait_for(audit_heard)[2]["node_agent_object.data"]
        assert {f["consumer"] for f in second["findings"] if f["state"] == A.ALARM} == {
            cases["orphan"],
            cases["unclaimed"],
            cases["resized"],
        }
        agent(loaded)  # the same set: nothing sent
        messenger.flush()
        with pytest.raises(AssertionError, match="no matching notification"):
            heard.wait_for(audit_heard, timeout=3)
        assert len(audits) == 2
    finally:
        agent.close()
        messenger.stop()
        server.stop()
        server.wait()
        transport.cleanup()


def audited_twice(config: str) -> dict:
    """``node-agent audit`` run twice (a finding is an alarm once seen twice):
    the second run's findings by consumer."""
    assert run_agent("--config-file", config, "audit", "--output", "json").code in (0, 1)
    second = run_agent("--config-file", config, "audit", "--output", "json")
    assert second.code in (0, 1), second.stderr
    return {f["consumer"]: f for f in second.json()["audit"]["findings"]}


def test_pinned_guest_allocated_vcpu_on_a_host_offering_pcpu_is_a_size_alarm(
    tmp_path, placement_server, host_name
):
    host = Host(tmp_path, placement_server.url, host_name)
    config = write_config(host, "cpu_dedicated_set = 2-7,10-15\ncpu_shared_set = 0-1,8-9\n")
    assert run_agent("--config-file", config, "--once").code == 0
    scheduler = Scheduler.for_endpoint(placement_server.url)
    claim(scheduler, host.pinned, {host.root: {"PCPU": 4, "MEMORY_MB": 4096}})  # right
    claim(scheduler, host.pinned_2, {host.root: {"VCPU": 2, "MEMORY_MB": 2048}})  # wrong

    found = audited_twice(config)

    assert host.pinned not in found
    wrong = found[host.pinned_2]
    assert (wrong["kind"], wrong["state"]) == (A.SIZE_MISMATCH, A.ALARM)
    assert wrong["sizes"] == [
        {"resource": "PCPU", "guest": 2, "allocated": 0},
        {"resource": "VCPU", "guest": 0, "allocated": 2},
    ]


def test_guest_bound_to_one_numa_node_allocated_on_the_other_is_an_alarm(
    tmp_path, placement_server, host_name
):
    """instance-00000005's memory is bound (strict) to node 1; with NUMA
    nodes in Placement, its allocation on node 0 is an alarm."""
    host = Host(tmp_path, placement_server.url, host_name)
    config = write_config(host, "numa_in_placement = true\n")
    assert run_agent("--config-file", config, "--once").code == 0
    listed = host.scheduler.get(f"/resource_providers?in_tree={host.root}")
    nodes = {
        rp["name"].rsplit("_", 1)[1]: rp["uuid"]
        for rp in listed["resource_providers"]
        if "_NUMA_" in rp["name"]
    }
    scheduler = Scheduler.for_endpoint(placement_server.url)
    bound = host.unpinned[2][:-2] + "05"
    claim(scheduler, bound, {nodes["0"]: {"VCPU": 2, "MEMORY_MB": 2048}})

    found = audited_twice(config)

    wrong = found[bound]
    assert (wrong["kind"], wrong["state"]) == (A.SIZE_MISMATCH, A.ALARM)
    assert "NUMA: guest bound to node(s) [1], allocated on [0]" in wrong["detail"]

    held = scheduler.get(f"/allocations/{bound}")
    scheduler.put(
        f"/allocations/{bound}",
        {
            "allocations": {nodes["1"]: {"resources": {"VCPU": 2, "MEMORY_MB": 2048}}},
            "project_id": PROJECT,
            "user_id": USER,
            "consumer_type": "INSTANCE",
            "consumer_generation": held["consumer_generation"],
        },
    )
    assert bound not in audited_twice(config)


def test_guest_with_an_mdev_allocated_no_vgpu_is_a_size_alarm(
    tmp_path, placement_server, host_name
):
    """The GPU is a child provider (``enabled_mdev_types``); the guest's
    mdev must be matched by one VGPU somewhere in the host's tree."""
    from tests.integration.test_nested_reshape import GPU1, MDEV_TYPE, NestedHost, guest, prefix

    mdev = str(uuid.uuid4())
    p = prefix()
    with_mdev, without = guest(1, p, mdevs=[mdev]), guest(2, p)
    host = NestedHost(
        tmp_path, placement_server.url, host_name, [with_mdev, without], gpus={GPU1: (mdev,)}
    )
    host.cycle(dedicated=None, shared=None, enabled_mdev_types=(MDEV_TYPE,))
    gpu = host.uuid_of(f"{host_name}_pci_0000_81_00_0")
    scheduler = Scheduler.for_endpoint(placement_server.url)
    claim(scheduler, with_mdev["uuid"], {host.root: {"VCPU": 2, "MEMORY_MB": 1024}})
    claim(scheduler, without["uuid"], {host.root: {"VCPU": 2, "MEMORY_MB": 1024}})

    store = StateStore(Path(host.state_dir))
    syncer = TreeSyncer(PlacementClient.for_endpoint(placement_server.url), store)
    desired = compute_desired(
        host.settings(dedicated=None, shared=None, enabled_mdev_types=(MDEV_TYPE,)),
        state=store.load_or_empty(LOG),
    )
    syncer.plan(desired.tree)
    auditor = Auditor(syncer)
    auditor.run(desired, host_name, numa=False)
    found = {f.consumer: f for f in auditor.run(desired, host_name, numa=False).findings}

    assert set(found) == {with_mdev["uuid"]}
    finding = found[with_mdev["uuid"]]
    assert (finding.kind, finding.state) == (A.SIZE_MISMATCH, A.ALARM)
    assert finding.sizes == (("VGPU", 1, 0),)

    held = scheduler.get(f"/allocations/{with_mdev['uuid']}")
    scheduler.put(
        f"/allocations/{with_mdev['uuid']}",
        {
            "allocations": {
                host.root: {"resources": {"VCPU": 2, "MEMORY_MB": 1024}},
                gpu: {"resources": {"VGPU": 1}},
            },
            "project_id": PROJECT,
            "user_id": USER,
            "consumer_type": "INSTANCE",
            "consumer_generation": held["consumer_generation"],
        },
    )
    assert auditor.run(desired, host_name, numa=False).findings == ()
