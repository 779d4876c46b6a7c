"""What a cycle costs after Placement failed one: a verify, not a re-read.

Counted from Placement's own request log (what reached the server,
whoever sent it); the faults come from a proxy in front of it, so an
injected 503 never reaches the log.
"""

import pytest

from node_agent.placement.client import PlacementClient, Unavailable
from node_agent.placement.sync import TreeSyncer
from node_agent.state import StateStore
from tests.integration.test_applier import RequestLog
from tests.integration.test_sync import FakeClock, host_tree, tree_in_placement
from tests.reliability.proxy import FaultProxy

pytestmark = pytest.mark.integration

INTERVAL = 300


@pytest.fixture
def proxy(placement_server):
    proxy = FaultProxy(placement_server.url).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def syncer(proxy, clock, tmp_path, host_name):
    """Registered (root and four NUMA children) through the proxy, no retries."""
    client = PlacementClient.for_endpoint(proxy.url, retries=0)
    syncer = TreeSyncer(
        client, StateStore(tmp_path / "state"), full_verify_interval=INTERVAL, clock=clock
    )
    assert syncer.sync(host_tree(host_name)).ok
    return syncer


def test_cycle_after_a_placement_failure_makes_one_get_when_nothing_moved(
    syncer, proxy, clock, placement_server, host_name
):
    clock.now += INTERVAL  # the verify is due: this cycle talks to Placement
    proxy.fail_next(1)
    with pytest.raises(Unavailable):
        syncer.sync(host_tree(host_name))
    assert proxy.injected == 1

    log = RequestLog(placement_server)
    report = syncer.sync(host_tree(host_name))

    assert report.ok, report.errors
    assert report.full_verify
    requests = log.requests()
    assert len(requests) == 1, requests
    assert requests[0].startswith("GET /resource_providers?in_tree=")
    # ... and the cycle after that is back to the steady floor.
    log.mark()
    assert syncer.sync(host_tree(host_name)).requests == 0
    assert log.requests() == []


def test_write_whose_answer_was_lost_is_verified_by_reading_only_that_provider(
    syncer, proxy, placement_server, host_name
):
    root = syncer.state["root_uuid"]
    numa0 = tree_in_placement(syncer.client, root)[f"{host_name}_NUMA0"]["uuid"]
    put = f"/resource_providers/{numa0}/inventories"
    lost = []
    proxy.drop_answer = lambda method, path: (
        method == "PUT" and path == put and not lost and not lost.append(path)
    )
    with pytest.raises(Unavailable):
        syncer.sync(host_tree(host_name, vcpu=24))
    assert lost, "the proxy never saw the inventory PUT"

    log = RequestLog(placement_server)
    report = syncer.sync(host_tree(host_name, vcpu=24))

    assert report.ok, report.errors
    # The listing, then numa0's inventories and traits (its generation
    # moved); the PUT had landed, so nothing is written again.
    assert sorted(log.requests()) == sorted(
        [
            f"GET /resource_providers?in_tree={root} 200",
            f"GET /resource_providers/{numa0}/inventories 200",
            f"GET /resource_providers/{numa0}/traits 200",
        ]
    )
    assert report.writes == 0


FLEET = 50


def test_fifty_syncers_started_together_spread_their_verifies_over_the_interval(
    placement_server, tmp_path
):
    """Host names are fixed, so the phases (a hash of the name) are too: the
    assertion is deterministic, not statistical luck."""
    clock = FakeClock()
    start = clock.now
    client = PlacementClient.for_endpoint(placement_server.url)
    fleet = [
        TreeSyncer(
            client,
            StateStore(tmp_path / str(n)),
            full_verify_interval=INTERVAL,
            clock=clock,
            spread=True,
        )
        for n in range(FLEET)
    ]
    names = [f"spread-{n:02d}" for n in range(FLEET)]
    for syncer, name in zip(fleet, names):
        assert syncer.sync(host_tree(name, children=0)).ok

    offsets = sorted(s.next_verify_at - start for s in fleet)
    assert all(0 < o <= INTERVAL for o in offsets), offsets
    # Every tenth of the interval holds some first verifies (10 % would be 5).
    tenths = [
        sum(1 for o in offsets if k * INTERVAL / 10 < o <= (k + 1) * INTERVAL / 10)
        for k in range(10)
    ]
    assert min(tenths) >= 2, tenths
    # No 30 s outage catches more than a fifth of the fleet (all of it before).
    assert max(sum(1 for o in offsets if t <= o < t + 30) for t in offsets) <= FLEET // 5

    # Each keeps its phase: after its verify, the next is one interval on.
    first = fleet[0].next_verify_at
    clock.now = first + 7  # the cycle that verifies comes a little late
    report = fleet[0].sync(host_tree(names[0], children=0))
    assert report.full_verify and report.requests == 1
    assert fleet[0].next_verify_at == first + INTERVAL
