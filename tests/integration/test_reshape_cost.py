"""What a reshape costs on the path it really takes: a config change, then a
restart (``node-agent --once`` here, a new process each time) or a SIGHUP
(the service's reload builds a new syncer).

Counted from Placement's own request log. ``GET /`` (the microversion
check a new client makes once) is left out: it is not the cycle's. The
floor is the reshape's own reads and write, consumers + 2 (the source's
allocations, each consumer, one POST), plus the listing a new process
verifies its kept cache with; the tree sync after the reshape reads nothing.
"""

import pytest

from node_agent.placement.client import PlacementClient
from node_agent.service.daemon import Agent, Loaded
from tests.integration.reshape_driver import (Host, boot_legacy_guests, cpu_view,
                                              expected_after_reshape)
from tests.integration.test_applier import RequestLog
from tests.integration.test_cli_reshape import once, write_config

pytestmark = pytest.mark.integration

DEDICATED, SHARED = "2-7,10-15", "0-1,8-9"
PINNED = 2  # the consumers the reshape moves: the two pinned guests of host.xml


def cycle_requests(log: RequestLog) -> list[str]:
    return [r for r in log.requests() if not r.startswith("GET / ")]


def test_reshape_after_a_restart_costs_consumers_plus_three(placement_server, host_name,
                                                            tmp_path):
    host = Host(tmp_path, placement_server.url, host_name)
    legacy = write_config(host)
    assert once(legacy).code == 0
    boot_legacy_guests(host)
    assert once(legacy).code == 0   # the last cycle before the operator's change
    before = host.allocations()

    pinned = write_config(host, f"cpu_dedicated_set = {DEDICATED}\n"
                                f"cpu_shared_set = {SHARED}\n")
    log = RequestLog(placement_server)
    done = once(pinned, "--output", "json")

    assert done.code == 0, done.stderr
    assert done.json()["reshape"]["request_id"]
    requests = cycle_requests(log)
    assert len(requests) <= PINNED + 3, requests
    assert sum(r.startswith("POST /reshaper ") for r in requests) == 1
    assert cpu_view(host.inventories()) == {"VCPU": 4, "PCPU": 12}
    assert host.allocations() == expected_after_reshape(before, {host.pinned, host.pinned_2})

    log.mark()   # the run after it reshapes nothing and writes nothing
    again = once(pinned, "--output", "json")
    assert again.code == 0 and again.json()["changes"] == []
    assert again.json()["reshape"] is None
    assert all(r.startswith("GET ") for r in cycle_requests(log))


def test_reshape_after_a_reload_costs_consumers_plus_two(placement_server, host_name,
                                                         tmp_path):
    host = Host(tmp_path, placement_server.url, host_name)
    client = PlacementClient.for_endpoint(host.url)
    agent = Agent()
    try:
        legacy = Loaded(None, host.settings(), client)
        assert agent(legacy).ok
        boot_legacy_guests(host)
        assert agent(legacy).ok
        before = host.allocations()

        # SIGHUP: the loop loads the files again; a new Loaded means a new syncer.
        reloaded = Loaded(None, host.settings(dedicated=DEDICATED, shared=SHARED), client)
        log = RequestLog(placement_server)
        assert agent(reloaded).ok

        requests = cycle_requests(log)
        assert len(requests) <= PINNED + 2, requests
        assert agent.reshapes == 1
        assert host.allocations() == expected_after_reshape(before,
                                                            {host.pinned, host.pinned_2})
    finally:
        agent.close()


def test_registering_a_new_host_costs_one_lookup_then_its_writes(placement_server, host_name,
                                                                 tmp_path):
    """A new host's first ``--once``: the owner check, the reshape check and
    the sync share one name lookup; then the owner trait, the provider, its
    inventories and its traits."""
    host = Host(tmp_path, placement_server.url, host_name)
    log = RequestLog(placement_server)

    assert once(write_config(host)).code == 0

    requests = [" ".join(r.split()[:2]) for r in cycle_requests(log)]
    assert requests[0] == f"GET /resource_providers?name={host_name}", requests
    assert requests.count(f"GET /resource_providers?name={host_name}") == 1, requests
    assert [r.split()[0] for r in requests] == ["GET", "PUT", "POST", "PUT", "PUT"], requests
