"""The reliability suite reuses the integration suite's real-Placement fixtures."""

from tests.integration.conftest import (  # noqa: F401 (fixtures)
    fresh_placement_server,
    host_name,
    placement,
    placement_server,
)
