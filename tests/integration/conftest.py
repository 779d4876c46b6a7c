"""Fixtures that run the real Placement (devenv.embedded_placement), and
a private real libvirtd with QEMU guests (tests/integration/libvirtd.py).

``placement_server`` is shared by the whole session: tests keep apart by
naming their providers after the ``host_name`` fixture. Tests that kill or
restart the server, or need an empty database, take
``fresh_placement_server`` instead.
"""

import uuid

import pytest

from devenv.embedded_placement import start_subprocess
from node_agent.placement.client import PlacementClient
from tests.integration.libvirtd import Libvirtd, unavailable_reason
from tests.integration.rabbit import rabbitmq  # noqa: F401 (fixture)
from tests.real_parts import skip_or_fail


@pytest.fixture(scope="session")
def placement_server(tmp_path_factory):
    server = start_subprocess(tmp_path_factory.mktemp("placement"))
    yield server
    server.stop()


@pytest.fixture
def fresh_placement_server(tmp_path):
    server = start_subprocess(tmp_path / "placement")
    yield server
    server.stop()


@pytest.fixture
def placement(placement_server):
    return PlacementClient.for_endpoint(placement_server.url)


@pytest.fixture
def host_name():
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def libvirtd(tmp_path_factory):
    """One private libvirtd per session (the qemu driver's state would collide
    with a second one); skipped, with the reason, where it cannot run. Every
    guest is destroyed and every daemon stopped at session end, also after
    failures."""
    reason = unavailable_reason()
    if reason:
        skip_or_fail(reason)
    daemon = Libvirtd(tmp_path_factory.mktemp("libvirtd"))
    try:
        yield daemon.start()
    finally:
        daemon.stop()
