"""Companion mode on a nova host, against the real Placement: the test plays
nova-compute (it creates the compute node provider with OWNER_NOVA and the
scheduler's allocations), the agent reads a nova.conf-shaped file, and
Placement's own request log shows it sent nothing but GETs.

Guests are libvirt test-driver guests (tests/data/libvirt/host.xml).
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from node_agent.config.files import load_conf
from node_agent.config.settings import load_settings
from node_agent.cycle.desired import compute_desired
from node_agent.placement.client import PlacementClient
from node_agent.service.daemon import Agent, Loaded
from node_agent.service.metrics import AgentCollector
from tests.cli.runner import run_agent
from tests.integration.reshape_driver import PROJECT, USER, Host
from tests.integration.test_applier import RequestLog
from tests.machine_id import isolated_config

pytestmark = pytest.mark.integration
LOG = logging.getLogger(__name__)

LEGACY = ""  # no CPU sets: every CPU is VCPU, as on a host before the change
DEDICATED = "cpu_dedicated_set = 2-7,10-15\ncpu_shared_set = 0-1,8-9\n"
# Pinned guest instance-00000001 runs on CPUs 2-3,10-11: shared below.
STRANDING = "cpu_dedicated_set = 4-7,12-15\ncpu_shared_set = 0-3,8-11\n"
# The same CPUs in the legacy option (a [DEFAULT] one), without cpu_dedicated_set.
LEGACY_STRANDING = "[DEFAULT]\nvcpu_pin_set = 4-7,12-15\n[compute]\n"


class NovaHost:
    """A host where nova-compute owns the compute node provider."""

    def __init__(self, tmp_path, url, name):
        self.host = Host(tmp_path, url, name)
        self.tmp, self.url, self.name = tmp_path, url, name
        # instance-00000006 has an mdev, and this nova.conf enables no mdev
        # type: nova would not run it here. The audit's own tests cover it.
        xml = tmp_path / "host.xml"
        text = xml.read_text()
        start = text.rindex("<domain", 0, text.index("<name>instance-00000006</name>"))
        end = text.index("</domain>", start) + len("</domain>")
        xml.write_text(text[:start] + text[end:])
        self.nova = PlacementClient.for_endpoint(url)
        self.root = str(uuid.uuid4())
        self.consumers: list[str] = []
        self.textfile = tmp_path / "node-agent.prom"

    def config(self, compute: str = LEGACY) -> list[str]:
        """nova.conf as a compute node has it (nova's own sections included),
        and the agent's few lines of its own."""
        nova = self.tmp / "nova.conf"
        nova.write_text(
            f"[DEFAULT]\nhost = {self.name}\nmy_ip = 10.0.0.7\nstate_path = /var/lib/nova\n"
            f"instances_path = {self.tmp}\nreserved_host_memory_mb = 2048\n"
            "ram_allocation_ratio = 1.5\ncompute_driver = libvirt.LibvirtDriver\n"
            "[api_database]\nconnection = mysql+pymysql://nova:secret@db/nova_api\n"
            f"[compute]\n{compute}resource_provider_association_refresh = 300\n"
            f"[libvirt]\nvirt_type = kvm\nconnection_uri = {self.host.uri}\n"
            f"[placement]\nauth_type = admin_token\ntoken = admin\n"
            f"endpoint_override = {self.url}\n"
        )
        agent = self.tmp / "node-agent.conf"
        agent.write_text(
            isolated_config(self.tmp)
            + f"[agent]\nmode = companion\nstate_path = {self.host.state_dir}\n"
            f"metrics_textfile = {self.textfile}\n"
            f"[host]\nsysfs_root = {self.host.sysfs}\n"
        )
        return ["--config-file", str(nova), "--config-file", str(agent)]

    def settings(self, compute: str = LEGACY):
        return load_settings(load_conf(self.config(compute)))

    def desired(self, compute: str = LEGACY):
        return compute_desired(self.settings(compute))

    def nova_starts(self, memory_reserved=512, memory_ratio=1.0):
        """nova-compute creates its compute node the way it does: the provider,
        its inventories (VCPU ratio 16.0 set by an operator through the API),
        its traits with OWNER_NOVA and some of nova's own."""
        root = self.desired().tree.root
        inventories = {rc: inv.as_placement() for rc, inv in root.inventories.items()}
        inventories["VCPU"]["allocation_ratio"] = 16.0
        inventories["MEMORY_MB"].update(reserved=memory_reserved, allocation_ratio=memory_ratio)
        self.nova.post("/resource_providers", {"name": self.name, "uuid": self.root})
        self.nova.put(
            f"/resource_providers/{self.root}/inventories",
            {"resource_provider_generation": 0, "inventories": inventories},
        )
        self.nova.put(
            f"/resource_providers/{self.root}/traits",
            {
                "resource_provider_generation": 1,
                "traits": sorted(
                    root.wanted_traits | {"OWNER_NOVA", "COMPUTE_NET_VIF_MODEL_VIRTIO"}
                ),
            },
        )

    def schedule_every_guest(self):
        """The scheduler's claims, one per guest, in VCPU (a legacy host)."""
        for guest in self.desired().host.guests:
            self.nova.put(
                f"/allocations/{guest.uuid}",
                {
                    "allocations": {
                        self.root: {
                            "resources": {"VCPU": guest.vcpus, "MEMORY_MB": guest.memory_kb // 1024}
                        }
                    },
                    "project_id": PROJECT,
                    "user_id": USER,
                    "consumer_generation": None,
                },
            )
            self.consumers.append(guest.uuid)

    def placement_record(self) -> dict:
        """Everything the agent could have changed, read by nova's client."""
        base = f"/resource_providers/{self.root}"
        return {
            "provider": self.nova.get(base),
            "inventories": self.nova.get(f"{base}/inventories"),
            "traits": self.nova.get(f"{base}/traits"),
            "allocations": self.nova.get(f"{base}/allocations"),
            "consumers": {c: self.nova.get(f"/allocations/{c}") for c in self.consumers},
            "named": self.nova.get(f"/resource_providers?name={self.name}"),
        }


@pytest.fixture
def nova_host(tmp_path, placement_server, host_name):
    return NovaHost(tmp_path, placement_server.url, host_name)


def only_reads(requests: list[str]) -> bool:
    return bool(requests) and all(r.startswith("GET ") for r in requests)


def test_once_reports_drift_with_novas_options_and_sends_only_reads(nova_host, placement_server):
    nova_host.nova_starts()
    nova_host.schedule_every_guest()
    before = nova_host.placement_record()
    log = RequestLog(placement_server)

    run = run_agent(*nova_host.config(), "--once", "--output", "json")
    assert run.code == 3, run.stderr
    companion = run.json()["companion"]
    assert (companion["root_uuid"], companion["owner"]) == (nova_host.root, "nova-compute")
    drift = {d["subject"]: d for d in companion["drift"]}
    # VCPU's 16.0 stays (cpu_allocation_ratio unset: nova keeps Placement's);
    # nova's own traits (OWNER_NOVA, COMPUTE_NET_*) are no drift.
    assert set(drift) == {"MEMORY_MB reserved", "MEMORY_MB allocation_ratio"}
    assert (
        drift["MEMORY_MB reserved"]["placement"],
        drift["MEMORY_MB reserved"]["host"],
        drift["MEMORY_MB reserved"]["explained_by"],
    ) == ("512", "2048", "[DEFAULT] reserved_host_memory_mb = 2048")
    assert drift["MEMORY_MB allocation_ratio"]["explained_by"].startswith(
        "[DEFAULT] ram_allocation_ratio = 1.5"
    )
    assert run.json()["changes"] == []
    assert run.json()["audit"]["alarms"] == 0
    # node_exporter's textfile collector sees it from --once too.
    gauges = nova_host.textfile.read_text()
    assert 'node_agent_drift_differences{kind="inventory"} 2.0' in gauges
    assert 'node_agent_drift_differences{kind="trait"} 0.0' in gauges

    text = run_agent(*nova_host.config(), "--once")
    assert text.code == 3, text.stderr
    assert f"provider {nova_host.name} [{nova_host.root}], owned by nova-compute" in text.stdout
    assert (
        "MEMORY_MB reserved: Placement 512, this host 2048 -- "
        "[DEFAULT] reserved_host_memory_mb = 2048"
    ) in text.stdout

    audit = run_agent(*nova_host.config(), "audit", "--output", "json")
    assert audit.code == 0, audit.stderr
    assert audit.json()["audit"]["consumers"] == len(nova_host.consumers)

    requests = log.requests()
    assert only_reads(requests), [r for r in requests if not r.startswith("GET ")]
    assert nova_host.placement_record() == before

    # nova-compute restarted with this nova.conf: Placement now matches.
    inventories = before["inventories"]
    inventories["inventories"]["MEMORY_MB"].update(reserved=2048, allocation_ratio=1.5)
    nova_host.nova.put(f"/resource_providers/{nova_host.root}/inventories", inventories)
    again = run_agent(*nova_host.config(), "--once", "--output", "json")
    assert again.code == 0, (again.stderr, again.json()["companion"]["drift"])
    assert again.json()["companion"]["drift"] == []


def test_companion_never_creates_a_provider_the_name_does_not_find(nova_host, placement_server):
    log = RequestLog(placement_server)
    run = run_agent(*nova_host.config(), "--once", "--output", "json")
    assert run.code == 1
    assert f"has no resource provider named {nova_host.name}" in run.stderr
    assert "Companion mode never creates one" in run.stderr
    assert run.json()["companion"]["found"] is False
    assert only_reads(log.requests()), log.requests()
    assert (
        nova_host.nova.get(f"/resource_providers?name={nova_host.name}")["resource_providers"] == []
    )


def test_dry_run_previews_novas_reshape_at_next_restart_and_stale_pins_block_it(
    nova_host, placement_server
):
    nova_host.nova_starts()
    nova_host.schedule_every_guest()
    before = nova_host.placement_record()
    log = RequestLog(placement_server)
    guests = {g.name: g.uuid for g in nova_host.desired().host.guests}

    plan = run_agent(*nova_host.config(DEDICATED), "--once", "--dry-run", "--output", "json")
    assert plan.code == 0, plan.stderr
    restart = plan.json()["companion"]["next_restart"]
    assert restart["blocking"] == []
    moved = {c["consumer"]: c["moves"] for c in restart["reshape"]["consumers"]}
    assert set(moved) == {guests["instance-00000001"], guests["instance-00000002"]}
    assert [
        (m["from_class"], m["to_class"], m["amount"]) for m in moved[guests["instance-00000001"]]
    ] == [("VCPU", "PCPU", 4)]
    drift = {d["subject"]: d for d in plan.json()["companion"]["drift"]}
    assert drift["PCPU"]["explained_by"] == "[compute] cpu_dedicated_set = '2-7,10-15'"

    # A pinned guest of nova's outside the new dedicated set: nova-compute
    # only warns at start (_validate_pinning_configuration), but its resource
    # tracker then pins the guest on the dedicated CPUs again and fails
    # (CPUPinningUnknown) at every update, so it never reshapes (seen with
    # nova-compute itself, test_nova_cloud.py): the preview says it is blocked.
    stale = run_agent(*nova_host.config(STRANDING), "--once", "--dry-run", "--output", "json")
    assert stale.code == 0, stale.stderr
    restart = stale.json()["companion"]["next_restart"]
    assert restart["reshape"] is None
    blocked = [b for b in restart["blocking"] if "instance-00000001" in b]
    assert len(blocked) == 1 and "CPUPinningUnknown" in blocked[0], restart
    assert "CPUs 2-3,10-11 are outside cpu_dedicated_set = '4-7,12-15'" in blocked[0]
    assert restart["lines"][0].startswith("BLOCKED: ")
    assert any(
        "instance-00000001" in w and "outside cpu_dedicated_set" in w
        for w in stale.json()["warnings"]
    )

    # The legacy vcpu_pin_set: nova pins on its CPUs when cpu_dedicated_set is unset.
    legacy = run_agent(
        *nova_host.config(LEGACY_STRANDING), "--once", "--dry-run", "--output", "json"
    )
    assert legacy.code == 0, legacy.stderr
    restart = legacy.json()["companion"]["next_restart"]
    blocked = [b for b in restart["blocking"] if "instance-00000001" in b]
    assert len(blocked) == 1, restart
    assert "CPUs 2-3,10-11 are outside vcpu_pin_set = '4-7,12-15'" in blocked[0]

    assert only_reads(log.requests()), log.requests()
    assert nova_host.placement_record() == before
    assert not Path(nova_host.host.state_dir, "state.json").exists()  # nothing anywhere


def test_service_cycles_read_only_on_the_verify_schedule_and_count_the_drift(nova_host):
    nova_host.nova_starts()
    nova_host.schedule_every_guest()
    client = PlacementClient.for_endpoint(nova_host.url)
    loaded = Loaded(None, nova_host.settings(), client)
    agent = Agent()
    try:
        agent(loaded)  # first cycle: reads the tree, audits, previews
        first = client.stats.total
        # GET /, ?name, ?in_tree, inventories, traits, the root's allocations
        # (read once for the audit and the restart preview).
        assert first == 6, [p for _m, p, _s in client.stats.log]
        client.stats.reset()
        agent(loaded)  # steady: nothing due
        assert client.stats.total == 0
        gauges = {s.labels["kind"]: s.value for s in AgentCollector(agent, None)._drift().samples}
        assert gauges == {"inventory": 2, "trait": 0, "provider": 0}

        agent._companion.full_verify_interval = 0  # the next verify is due
        agent(loaded)
        # ?name, ?in_tree, the allocations: the root's generation did not move.
        assert client.stats.total == 3, [p for _m, p, _s in client.stats.log]
        assert client.stats.writes == 0
        assert agent.last_audit["alarms"] == 0
    finally:
        agent.close()


def test_companion_with_messaging_upstream_is_refused_as_bad_configuration(nova_host):
    args = nova_host.config()
    agent_conf = Path(args[-1])
    agent_conf.write_text(
        agent_conf.read_text().replace(
            "mode = companion\n", "mode = companion\nupstream = messaging\n"
        )
    )
    run = run_agent(*args, "--check-config")
    assert run.code == 78
    assert "mode = companion reads Placement itself" in run.stderr


def test_a_change_in_the_drift_is_notified_once_over_the_real_bus(nova_host, rabbitmq, tmp_path):
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
    messenger = messaging.from_conf(conf, nova_host.name)
    nova_host.nova_starts()
    nova_host.schedule_every_guest()
    client = PlacementClient.for_endpoint(nova_host.url)
    loaded = Loaded(None, nova_host.settings(), client)
    agent = Agent(messenger=messenger)

    def drift_heard(publisher, event_type, payload):
        return (
            event_type == "node_agent.drift.update"
            and payload["node_agent_object.data"]["host"] == nova_host.name
        )

    try:
        agent(loaded)
        first = heard.wait_for(drift_heard)[2]
        assert first["node_agent_object.name"] == "DriftPayload"
        assert {d["subject"] for d in first["node_agent_object.data"]["drift"]} == {
            "MEMORY_MB reserved",
            "MEMORY_MB allocation_ratio",
        }
        agent._companion.full_verify_interval = 0
        agent(loaded)  # the same differences: nothing sent
        messenger.flush()
        with pytest.raises(AssertionError, match="no matching notification"):
            heard.wait_for(drift_heard, timeout=3)
        # An operator fixes the ratio by hand: one difference left, announced.
        inventories = nova_host.nova.get(f"/resource_providers/{nova_host.root}/inventories")
        inventories["inventories"]["MEMORY_MB"]["allocation_ratio"] = 1.5
        nova_host.nova.put(f"/resource_providers/{nova_host.root}/inventories", inventories)
        agent(loaded)
        third = heard.wait_for(drift_heard)[2]["node_agent_object.data"]
        assert [d["subject"] for d in third["drift"]] == ["MEMORY_MB reserved"]
        assert client.stats.writes == 0
    finally:
        agent.close()
        messenger.stop()
        server.stop()
        server.wait()
        transport.cleanup()


def test_maintenance_switch_is_refused_in_companion_mode_and_nothing_is_recorded(nova_host):
    run = run_agent(*nova_host.config(), "maintenance", "on", "--reason", "disk swap")
    assert run.code == 78
    assert "companion never writes this host's provider" in run.stderr
    assert "openstack compute service set --disable" in run.stderr
    assert not Path(nova_host.host.state_dir, "state.json").exists()
