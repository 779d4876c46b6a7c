"""TLS to RabbitMQ with a private CA: agents and appliers use
oslo.messaging's own options (``[oslo_messaging_rabbit] ssl``,
``ssl_ca_file``) against a real broker whose TLS listener presents a
certificate signed by a CA the test makes with openssl."""

from __future__ import annotations

import pytest

from node_agent.remote import wire
from tests.integration.rabbit import SERVER, Broker, make_ca
from tests.integration.test_applier import Bus, converged, make_agents
from tests.real_parts import skip_or_fail

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    import shutil

    if not SERVER.exists() or shutil.which("erl") is None:
        skip_or_fail("Debian's rabbitmq-server is not installed")
    base = tmp_path_factory.mktemp("rabbitmq-tls")
    ca = make_ca(base)
    broker = Broker(base, tls=ca).start()
    yield broker, ca
    broker.stop()


def test_agent_and_applier_speak_tls_to_rabbitmq_with_a_private_ca(
        tls_broker, tmp_path, placement, placement_server):
    broker, ca = tls_broker
    bus = Bus(tmp_path, broker.tls_url, placement_server.url,
              rabbit=f"ssl = true\nssl_ca_file = {ca['ca']}\n")
    try:
        applier, = bus.start(1)
        agent = make_agents(bus, 1, "tls")[0]
        report = agent.cycle()
        assert report.status == wire.APPLIED and report.ok
        assert converged(placement, agent)
    finally:
        bus.stop()

