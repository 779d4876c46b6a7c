"""Fixtures that run the real Placement (node_agent.embedded_placement).

``placement_server`` is shared by the whole session: tests keep apart by
naming their providers after the ``host_name`` fixture. Tests that kill or
restart the server, or need an empty database, take
``fresh_placement_server`` instead.
"""

import uuid

import pytest

from node_agent.embedded_placement import start_subprocess
from node_agent.placement import PlacementClient
from tests.integration.rabbit import rabbitmq  # noqa: F401 (fixture)


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
