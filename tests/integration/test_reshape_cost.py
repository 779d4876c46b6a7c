"""What a reshape costs on the path it really takes: a config change, then a
restart (``node-agent --once`` here, a new process each time) or a SIGHUP
(the service's reload builds a new syncer).

Counted from Placement's own request log. ``GET /`` (the microversion
check a new client makes once) is left out: it is not the cycle's. The
floor is the reshape's own reads and write, consumers + 2 (the source's
allocations, each consumer, one POST), plus the listing a new process
verifies its kept cache with; the tree sync after the reshape reads nothing.
A VCPU -> PCPU reshape reads the source's allocations once more after its
POST: VCPU stays on the root and nova's fallback query keeps placing pinned
guests there while the upgrade runs, so one that landed meanwhile is moved
in the same cycle (``RECHECK``).

When the scheduler wrote to the host while the agent was down, the root's
generation moved and the restart's verify reads the root again before the
reshape writes: its traits (whose root this is, before any write) and its
inventories (nova's ratio rule keeps a ratio an operator set in Placement).
Placement has no request that answers both, so that case costs consumers +
6 with the re-check; each of the two reads is proven needed below.
"""

from dataclasses import replace

import os_traits
import pytest

from node_agent.placement.client import PlacementClient
from node_agent.service.daemon import Agent, Loaded
from tests.integration.reshape_driver import (
    Host,
    boot_legacy_guests,
    cpu_view,
    expected_after_reshape,
)
from tests.integration.test_applier import RequestLog
from tests.integration.test_cli_reshape import once, write_config

# The VCPU -> PCPU reshape's read after its POST (see above).
RECHECK = 1

pytestmark = pytest.mark.integration

DEDICATED, SHARED = "2-7,10-15", "0-1,8-9"
PINNED = 2  # the consumers the reshape moves: the two pinned guests of host.xml


def cycle_requests(log: RequestLog) -> list[str]:
    return [r for r in log.requests() if not r.startswith("GET / ")]


def in_order(requests: list[str]) -> list[str]:
    """Method and path of each request; the consumer reads, which go
    concurrently, in uuid order."""
    shapes = [" ".join(r.split()[:2]) for r in requests]
    reads = [i for i, r in enumerate(shapes) if r.startswith("GET /allocations/")]
    if reads:
        shapes[reads[0] : reads[-1] + 1] = sorted(shapes[reads[0] : reads[-1] + 1])
    return shapes


def test_reshape_after_a_restart_costs_consumers_plus_three_and_the_recheck(
    placement_server, host_name, tmp_path
):
    host = Host(tmp_path, placement_server.url, host_name)
    legacy = write_config(host)
    assert once(legacy).code == 0
    boot_legacy_guests(host)
    assert once(legacy).code == 0  # the last cycle before the operator's change
    before = host.allocations()

    pinned = write_config(host, f"cpu_dedicated_set = {DEDICATED}\ncpu_shared_set = {SHARED}\n")
    log = RequestLog(placement_server)
    done = once(pinned, "--output", "json")

    assert done.code == 0, done.stderr
    assert done.json()["reshape"]["request_id"]
    requests = cycle_requests(log)
    assert len(requests) <= PINNED + 3 + RECHECK, requests
    assert sum(r.startswith("POST /reshaper ") for r in requests) == 1
    assert cpu_view(host.inventories()) == {"VCPU": 4, "PCPU": 12}
    assert host.allocations() == expected_after_reshape(before, {host.pinned, host.pinned_2})

    log.mark()  # the run after it reshapes nothing and writes nothing
    again = once(pinned, "--output", "json")
    assert again.code == 0 and again.json()["changes"] == []
    assert again.json()["reshape"] is None
    assert all(r.startswith("GET ") for r in cycle_requests(log))


def changed_while_the_agent_was_down(placement_server, host_name, tmp_path):
    """Registered with the legacy config, then guests booted by the scheduler
    (the root's generation moves) with no agent cycle after them; the
    operator's new CPU sets are written. (host, config, allocations before)."""
    host = Host(tmp_path, placement_server.url, host_name)
    assert once(write_config(host)).code == 0
    boot_legacy_guests(host)
    pinned = write_config(host, f"cpu_dedicated_set = {DEDICATED}\ncpu_shared_set = {SHARED}\n")
    return host, pinned, host.allocations()


def test_reshape_after_a_restart_reads_again_only_the_root_that_moved(
    placement_server, host_name, tmp_path
):
    host, pinned, before = changed_while_the_agent_was_down(placement_server, host_name, tmp_path)
    log = RequestLog(placement_server)
    done = once(pinned, "--output", "json")

    assert done.code == 0, done.stderr
    root = host.root
    assert in_order(cycle_requests(log)) == [
        f"GET /resource_providers?in_tree={root}",
        f"GET /resource_providers/{root}/inventories",
        f"GET /resource_providers/{root}/traits",
        f"GET /resource_providers/{root}/allocations",
        *sorted(f"GET /allocations/{c}" for c in (host.pinned, host.pinned_2)),
        "POST /reshaper",
        f"GET /resource_providers/{root}/allocations",
    ]
    assert host.allocations() == expected_after_reshape(before, {host.pinned, host.pinned_2})


def test_reshape_after_a_restart_keeps_a_ratio_the_operator_set_while_the_agent_was_down(
    placement_server, host_name, tmp_path
):
    """Why the moved root's inventories are read: the config leaves
    ``ram_allocation_ratio`` unset, so nova keeps the ratio Placement holds."""
    host, pinned, _ = changed_while_the_agent_was_down(placement_server, host_name, tmp_path)
    set_memory_ratio(1.25)(host)

    done = once(pinned, "--output", "json")

    assert done.code == 0, done.stderr
    assert cpu_view(host.inventories()) == {"VCPU": 4, "PCPU": 12}
    assert host.inventories()["MEMORY_MB"]["allocation_ratio"] == 1.25


def test_reshape_after_a_restart_writes_nothing_to_a_root_nova_compute_took_meanwhile(
    placement_server, host_name, tmp_path
):
    """Why the moved root's traits are read: whose root it is is decided
    before any write, and the reshape is a write."""
    host, pinned, before = changed_while_the_agent_was_down(placement_server, host_name, tmp_path)
    traits = host.scheduler.get(f"/resource_providers/{host.root}/traits")
    host.scheduler.put(
        f"/resource_providers/{host.root}/traits",
        {
            "resource_provider_generation": traits["resource_provider_generation"],
            "traits": [*traits["traits"], os_traits.OWNER_NOVA],
        },
    )
    inventories = host.inventories()

    done = once(pinned, "--output", "json")

    assert done.code != 0
    assert "nova-compute" in done.stderr, done.stderr
    assert host.allocations() == before
    assert host.inventories() == inventories


def reload_after_guests_booted(placement_server, host_name, tmp_path, operator=None, **settings):
    """A service registered with the legacy config; the scheduler boots
    guests (the root's generation moves) and the service's next cycle reads
    nothing (within its verify period); ``operator`` acts; then SIGHUP with
    the new CPU sets. (host, requests of the reload's cycle, allocations
    before, agent's reshape count)."""
    host = Host(tmp_path, placement_server.url, host_name)
    client = PlacementClient.for_endpoint(host.url)
    agent = Agent()
    try:
        legacy = Loaded(None, replace(host.settings(), **settings), client)
        assert agent(legacy).ok
        boot_legacy_guests(host)
        assert agent(legacy).ok
        before = host.allocations()
        if operator is not None:
            operator(host)

        # SIGHUP: the loop loads the files again; a new Loaded means a new syncer.
        reloaded = Loaded(
            None, replace(host.settings(dedicated=DEDICATED, shared=SHARED), **settings), client
        )
        log = RequestLog(placement_server)
        assert agent(reloaded).ok
        return host, cycle_requests(log), before, agent.reshapes
    finally:
        agent.close()


def test_reshape_after_a_reload_with_explicit_ratios_costs_consumers_plus_two_and_the_recheck(
    placement_server, host_name, tmp_path
):
    """Every ratio set in the config: the tree gives each record of the
    body, so nothing but the reshape's own reads is needed."""
    host, requests, before, reshapes = reload_after_guests_booted(
        placement_server, host_name, tmp_path
    )
    root = host.root
    assert in_order(requests) == [
        f"GET /resource_providers/{root}/allocations",
        *sorted(f"GET /allocations/{c}" for c in (host.pinned, host.pinned_2)),
        "POST /reshaper",
        f"GET /resource_providers/{root}/allocations",
    ]
    assert reshapes == 1
    assert host.allocations() == expected_after_reshape(before, {host.pinned, host.pinned_2})


def test_reshape_after_a_reload_keeping_placements_ratios_costs_consumers_plus_three_and_the_recheck(
    placement_server, host_name, tmp_path
):
    """No ratio in the config (nova's default): the body keeps the ratios
    Placement holds, and the root moved since the cache read it (the
    guests), so its inventories are read once."""
    host, requests, before, reshapes = reload_after_guests_booted(
        placement_server, host_name, tmp_path, explicit_ratios=frozenset()
    )
    root = host.root
    assert in_order(requests) == [
        f"GET /resource_providers/{root}/allocations",
        *sorted(f"GET /allocations/{c}" for c in (host.pinned, host.pinned_2)),
        f"GET /resource_providers/{root}/inventories",
        "POST /reshaper",
        f"GET /resource_providers/{root}/allocations",
    ]
    assert reshapes == 1
    assert host.allocations() == expected_after_reshape(before, {host.pinned, host.pinned_2})


def set_memory_ratio(ratio):
    def operator(host):
        body = host.scheduler.get(f"/resource_providers/{host.root}/inventories")
        body["inventories"]["MEMORY_MB"]["allocation_ratio"] = ratio
        host.scheduler.put(f"/resource_providers/{host.root}/inventories", body)

    return operator


def test_reshape_after_a_reload_keeps_a_ratio_the_operator_set_since_the_last_read(
    placement_server, host_name, tmp_path
):
    """No ratio in the config (nova keeps Placement's); the service's cache
    still holds MEMORY_MB at 1.0 (within its verify period): the reshape's
    body must not put that back."""
    host, _, _, reshapes = reload_after_guests_booted(
        placement_server, host_name, tmp_path, set_memory_ratio(1.25), explicit_ratios=frozenset()
    )
    assert reshapes == 1
    assert cpu_view(host.inventories()) == {"VCPU": 4, "PCPU": 12}
    assert host.inventories()["MEMORY_MB"]["allocation_ratio"] == 1.25


def test_registering_a_new_host_costs_one_lookup_then_its_writes(
    placement_server, host_name, tmp_path
):
    """A new host's first ``--once``: the owner check, the reshape check and
    the sync share one name lookup and one lookup of the roots carrying this
    machine's mark (a second root is refused); then the owner trait, the
    provider, its mark first (written at the generation just read, then read
    back: the creation race), its inventories and its traits."""
    host = Host(tmp_path, placement_server.url, host_name)
    log = RequestLog(placement_server)

    assert once(write_config(host)).code == 0

    requests = [" ".join(r.split()[:2]) for r in cycle_requests(log)]
    assert requests[0] == f"GET /resource_providers?name={host_name}", requests
    assert requests.count(f"GET /resource_providers?name={host_name}") == 1, requests
    marked = [r for r in requests if r.startswith("GET /resource_providers?required=")]
    assert len(marked) == 1, requests
    assert [r.split()[0] for r in requests] == [
        "GET",
        "GET",
        "PUT",
        "POST",
        "GET",
        "PUT",
        "GET",
        "PUT",
        "PUT",
    ], requests
