"""Capacity cuts below usage are published, as nova publishes them.

Placement takes an inventory whose capacity is below what is allocated
(it logs it and refuses new claims that do not fit); only deleting a class
in use is refused (409 inventory.inuse). So a new configuration's lower
capacity -- a ratio cut, a ``reserved_host_memory_mb`` raise, a smaller
CPU set -- is written whatever the usage, ``--once`` exits 0 and reports
it as a warning with the consumers holding the class, and the scheduler
cannot refill past the new limit. Each scenario runs the real
``node-agent --once`` against the real Placement on the 16-CPU fixture
linux-test4, with allocations written as the scheduler writes them.
"""

from __future__ import annotations

import uuid

import pytest

from node_agent.placement.errors import PlacementError
from tests.integration.reshape_driver import Host, allocate
from tests.integration.test_capacity import assert_within_the_host, placement_tree
from tests.integration.test_cli_reshape import once, write_config

pytestmark = pytest.mark.integration


@pytest.fixture
def host(tmp_path, placement_server, host_name):
    host = Host(tmp_path, placement_server.url, host_name)
    assert once(write_config(host)).code == 0  # VCPU 16 at nova's 4.0
    return host


def twenty_vcpu_in_use(host: Host) -> tuple[str, dict]:
    """A local guest and a consumer that is no guest of this host hold 10
    VCPU each (max_unit is 16): (the guest's uuid, allocations before)."""
    guest = host.unpinned[0]
    host.boot(guest, vcpu=10, memory=1024)
    host.boot(host.not_a_guest, vcpu=10, memory=512)
    return guest, host.allocations()


def claim_refused(host: Host, resources: dict) -> bool:
    """Whether Placement refuses a new claim of ``resources`` on the root."""
    try:
        allocate(host.scheduler, str(uuid.uuid4()), {host.root: resources})
    except PlacementError as exc:
        assert getattr(exc, "status", None) == 409, exc
        return True
    return False


def test_ratio_cut_below_usage_is_published_and_no_new_claim_fits(host):
    """cpu_allocation_ratio 4.0 -> 1.0 with 20 VCPU in use: capacity 16."""
    guest, before = twenty_vcpu_in_use(host)
    config = write_config(host, "cpu_allocation_ratio = 1.0\n")

    plan = once(config, "--dry-run", "--output", "json")
    assert plan.code == 0, plan.stderr
    assert [(c["class"], c["over"]) for c in plan.json()["below_usage"]] == [("VCPU", 4)]
    assert host.inventories()["VCPU"]["allocation_ratio"] == 4.0  # dry run wrote nothing

    result = once(config, "--output", "json")

    assert result.code == 0, result.stderr
    assert "cannot lower" not in result.stderr
    assert host.inventories()["VCPU"]["allocation_ratio"] == 1.0
    [cut] = result.json()["below_usage"]
    assert (cut["class"], cut["provider"], cut["used"], cut["capacity"], cut["over"]) == (
        "VCPU",
        host.name,
        20,
        16,
        4,
    )
    assert sorted((h["consumer"], h["amount"]) for h in cut["holders"]) == sorted(
        [(guest, 10), (host.not_a_guest, 10)]
    )
    assert any(h["guest"] for h in cut["holders"] if h["consumer"] == guest)
    assert "warning: capacity published below usage: VCPU" in result.stderr
    assert any("capacity cut below usage: VCPU" in w for w in result.json()["warnings"])
    # Placement holds the new limit: the scheduler cannot refill past it.
    assert claim_refused(host, {"VCPU": 1})
    assert host.allocations() == before  # no allocation touched
    assert_within_the_host(placement_tree(host))
    again = once(config, "--output", "json")
    assert again.code == 0 and again.json()["changes"] == [], again.stderr


def test_reserved_memory_raise_below_usage_is_published(host):
    """reserved_host_memory_mb raised past what the free memory allows: the
    new reserved is written, and a new memory claim no longer fits."""
    memory = host.inventories()["MEMORY_MB"]
    free = int((memory["total"] - memory["reserved"]) * memory["allocation_ratio"])
    host.boot(host.not_a_guest, vcpu=1, memory=free - 256)
    before = host.allocations()
    reserved = memory["reserved"] + 1024
    config = write_config(host, f"reserved_host_memory_mb = {reserved}\n")

    result = once(config, "--output", "json")

    assert result.code == 0, result.stderr
    assert host.inventories()["MEMORY_MB"]["reserved"] == reserved
    [cut] = result.json()["below_usage"]
    assert (cut["class"], cut["over"]) == ("MEMORY_MB", 768)
    assert [h["consumer"] for h in cut["holders"]] == [host.not_a_guest]
    assert claim_refused(host, {"MEMORY_MB": 1})
    assert host.allocations() == before


def test_cpu_set_cut_below_usage_publishes_fewer_vcpu(host):
    """cpu_shared_set = 0-3 (no dedicated set): VCPU 16 -> 4 CPUs, capacity
    16 at 4.0 under 20 in use. Before, the old 16 CPUs stayed offered and
    the invariant refused the run (exit 1)."""
    guest, before = twenty_vcpu_in_use(host)
    config = write_config(host, "cpu_shared_set = 0-3\n")

    result = once(config, "--output", "json")

    assert result.code == 0, result.stderr
    vcpu = host.inventories()["VCPU"]
    assert (vcpu["total"], vcpu["allocation_ratio"]) == (4, 4.0)
    [cut] = result.json()["below_usage"]
    assert (cut["class"], cut["used"], cut["capacity"], cut["over"]) == ("VCPU", 20, 16, 4)
    assert result.json()["capacity"]["ok"] is True
    assert claim_refused(host, {"VCPU": 1})
    assert host.allocations() == before
    assert_within_the_host(placement_tree(host))
