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
    tls_broker, tmp_path, placement, placement_server
):
    broker, ca = tls_broker
    bus = Bus(
        tmp_path,
        broker.tls_url,
        placement_server.url,
        rabbit=f"ssl = true\nssl_ca_file = {ca['ca']}\n",
    )
    try:
        (applier,) = bus.start(1)
        agent = make_agents(bus, 1, "tls")[0]
        report = agent.cycle()
        assert report.status == wire.APPLIED and report.ok
        assert converged(placement, agent)
    finally:
        bus.stop()


def test_an_agent_with_the_wrong_ca_gets_a_clear_error_within_seconds(
    tls_broker, tmp_path, placement_server
):
    """A CA that did not sign the broker's certificate: the handshake fails,
    and the agent's cycle ends with an error naming the bus, in seconds
    (oslo.messaging alone would retry the reply queue's connection forever)."""
    import threading
    import time

    from node_agent.remote.upstream import NoApplier

    broker, _ca = tls_broker
    (tmp_path / "stranger-ca").mkdir()
    stranger = make_ca(tmp_path / "stranger-ca")
    bus = Bus(
        tmp_path,
        broker.tls_url,
        placement_server.url,
        rabbit=f"ssl = true\nssl_ca_file = {stranger['ca']}\n",
    )
    outcome: list[BaseException] = []
    try:
        agent = make_agents(bus, 1, "wrongca")[0]

        def cycle() -> None:
            try:
                agent.cycle()
            except BaseException as exc:  # what the service would log
                outcome.append(exc)

        started = time.monotonic()
        caller = threading.Thread(target=cycle, daemon=True)
        caller.start()
        caller.join(90)
        took = time.monotonic() - started
        assert not caller.is_alive(), "the call with the wrong CA never returned"
        assert len(outcome) == 1 and isinstance(outcome[0], NoApplier), outcome
        assert "did not accept a connection" in str(outcome[0])
        assert "CERTIFICATE_VERIFY_FAILED" in str(outcome[0]), outcome[0]
        assert took < 60, took
        print(f"\nwrong CA: {took:.1f}s, {outcome[0]}")
    finally:
        bus.stop()
