"""Notifications and the control RPC over a real RabbitMQ (started by the
suite), with the real agent process and the real Placement."""

import json
import queue
import subprocess
import sys
from pathlib import Path

import pytest
from oslo_config import cfg

from node_agent.remote import messaging
from tests.integration.agent_process import OTHER_HOST, AgentProcess, mount_host
from tests.integration.test_service_process import root_inventory

pytestmark = pytest.mark.integration

NODE_AGENT = Path(sys.executable).with_name("node-agent")


class Collector:
    """Notification endpoint: every (event_type, payload) heard."""

    def __init__(self):
        self.heard = queue.Queue()

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        self.heard.put((publisher_id, event_type, payload))

    error = info

    def wait_for(self, predicate, timeout=20):
        import time

        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "no matching notification"
            try:
                item = self.heard.get(timeout=left)
            except queue.Empty:
                continue
            if predicate(*item):
                return item


@pytest.fixture
def listener(rabbitmq):
    om = messaging.oslo_messaging()
    conf = cfg.ConfigOpts()
    conf([])
    transport = om.get_notification_transport(conf, url=rabbitmq)
    collector = Collector()
    server = om.get_notification_listener(
        transport, [om.Target(topic="notifications")], [collector]
    )
    server.start()
    yield collector
    server.stop()
    server.wait()
    transport.cleanup()


@pytest.fixture
def agent(tmp_path, placement_server, host_name, rabbitmq):
    process = AgentProcess(
        tmp_path,
        placement_server.url,
        host_name,
        agent_options="report_interval = 3600\n",
        extra=f"transport_url = {rabbitmq}\n",
    )
    yield process.start()
    process.stop()
    process.notify.close()


def ctl(rabbitmq, host, *command):
    result = subprocess.run(
        [
            str(NODE_AGENT),
            "ctl",
            "--host",
            host,
            "--transport-url",
            rabbitmq,
            "--timeout",
            "60",
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def totals(payload, provider):
    data = payload["node_agent_object.data"]
    return next(p["inventories"] for p in data["providers"] if p["name"] == provider)


def test_status_is_returned_over_rpc(agent, rabbitmq):
    agent.status_after(lambda s: s.startswith("ok:"))

    status = ctl(rabbitmq, agent.host, "status")

    assert status["host"] == agent.host
    assert status["last_sync"]["ok"] is True
    assert status["problem"] is None
    root = status["tree"][0]
    assert root["name"] == agent.host and root["inventories"]["VCPU"] == 16
    assert status["maintenance"]["on"] is False


def test_rpc_sync_now_runs_a_cycle_and_answers_after_it(agent, rabbitmq):
    agent.status_after(lambda s: s.startswith("ok:"))
    before = ctl(rabbitmq, agent.host, "status")["cycles"]

    answer = ctl(rabbitmq, agent.host, "sync-now")

    assert answer["triggered_cycle"] == before + 1
    assert answer["cycles"] == before + 1
    assert "next in 3" in agent.status_after(lambda s: "no change" in s)


def test_a_host_change_sends_an_inventory_update_with_the_new_totals(agent, rabbitmq, listener):
    agent.status_after(lambda s: s.startswith("ok:"))

    mount_host(OTHER_HOST, agent.sysroot)
    ctl(rabbitmq, agent.host, "sync-now")

    publisher, event, payload = listener.wait_for(
        lambda pub, ev, body: (
            ev == "node_agent.inventory.update"
            and body["node_agent_object.data"]["host"] == agent.host
            and totals(body, agent.host).get("VCPU") == 2
        )
    )
    assert publisher == f"node-agent.{agent.host}"
    assert payload["node_agent_object.version"] == messaging.PAYLOAD_VERSION
    assert payload["node_agent_object.name"] == "InventoryUpdatePayload"
    summaries = [c["summary"] for c in payload["node_agent_object.data"]["changes"]]
    assert any("set VCPU total 16→2" in s for s in summaries)


def test_maintenance_is_set_over_rpc_shown_in_status_and_applied_at_once(
    agent, rabbitmq, placement_server
):
    agent.status_after(lambda s: s.startswith("ok:"))

    ctl(rabbitmq, agent.host, "maintenance", "on", "--reason", "disk swap")
    status = ctl(rabbitmq, agent.host, "status")
    assert status["maintenance"]["on"] is True
    assert status["maintenance"]["reason"] == "disk swap"
    vcpu = root_inventory(placement_server.url, agent.host)["VCPU"]
    assert vcpu["reserved"] == vcpu["total"]  # applied without waiting an interval

    ctl(rabbitmq, agent.host, "maintenance", "off")
    assert ctl(rabbitmq, agent.host, "status")["maintenance"]["on"] is False


def test_without_transport_url_messaging_is_off_and_says_so(tmp_path, placement_server, host_name):
    process = AgentProcess(tmp_path, placement_server.url, host_name).start()
    try:
        process.status_after(lambda s: s.startswith("ok:"))
        assert (
            "transport_url is not set: notifications are off and the control RPC is disabled"
        ) in process.log()
    finally:
        process.stop()
        process.notify.close()
