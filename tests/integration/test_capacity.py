"""Issue 12: what the agent leaves in Placement never overstates the host.

Each scenario runs the real ``node-agent --once`` against the real
Placement, with libvirt's test-driver guests (tests/data/libvirt/host.xml)
on the 16-CPU fixture linux-test4 (NUMA node 0 = CPUs 0-7, node 1 = 8-15).
After each run the tree is read back from Placement and checked with the
invariant itself (node_agent.policy.capacity), not with the agent's own report.
"""

from __future__ import annotations

import uuid

import pytest

from node_agent.cycle.reconcile import ReshapeRefused
from node_agent.policy.capacity import HostLimits, Published, check, units
from tests.cli.runner import run_agent
from tests.integration.reshape_driver import (
    Host,
    allocate,
    boot_legacy_guests,
    expected_after_reshape,
)
from tests.integration.test_cli_reshape import once, write_config
from tests.integration.test_nested_reshape import NestedHost, guest, prefix
from tests.reliability.proxy import FaultProxy

pytestmark = pytest.mark.integration

CPUS = 16
# NUMA children: a consumer that is no local guest (a migration record)
# keeps VCPU and MEMORY_MB on the root, which Placement refuses to delete
# while they are in use, and the children's beside them would offer the
# same CPUs and memory twice: only the invariant can refuse. (The sets these
# tests used before, VCPU 2 under 12 in use, are a capacity cut, now
# published below usage as nova does: test_capacity_cuts.py.)
REFUSED = "numa_in_placement = true\n"


@pytest.fixture
def host(tmp_path, placement_server, host_name):
    return Host(tmp_path, placement_server.url, host_name)


def placement_tree(host: Host) -> list[Published]:
    """The whole tree as Placement holds it, read with the scheduler's client."""
    listing = host.scheduler.get(f"/resource_providers?in_tree={host.root}")["resource_providers"]
    return [
        Published(
            rp["name"],
            rp["parent_provider_uuid"] is None,
            host.scheduler.get(f"/resource_providers/{rp['uuid']}/inventories")["inventories"],
        )
        for rp in listing
    ]


def placement_units(tree: list[Published], rc: str) -> int:
    return sum(units(rc, p.inventories[rc]) for p in tree if rc in p.inventories)


def assert_within_the_host(tree: list[Published]) -> None:
    # Memory and disk are those of this machine (psutil); bound them loosely
    # but never twice: the level rule catches a doubled tree whatever the sizes.
    limits = HostLimits(cpus=CPUS, memory_mb=10**9, disk_gb=10**9, online_cpus=CPUS)
    verdict = check(tree, limits)
    assert verdict.ok, verdict.lines()


def test_dedicated_set_beside_a_floating_guest_never_publishes_pcpu_beside_vcpu(host):
    """Issue bullet 1: VCPU 16, a floating guest holds 3, cpu_dedicated_set = 0-15."""
    assert once(write_config(host)).code == 0
    guest = host.unpinned[0]  # instance-00000003, not pinned
    host.boot(guest, vcpu=3, memory=1024)
    before = host.allocations()

    result = once(write_config(host, "cpu_dedicated_set = 0-15\n"), "--output", "json")

    assert result.code == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert guest in result.stderr or "instance-00000003" in result.stderr
    tree = placement_tree(host)
    assert placement_units(tree, "PCPU") + placement_units(tree, "VCPU") <= CPUS
    assert_within_the_host(tree)
    assert host.allocations() == before  # no allocation touched


def test_numa_on_with_a_root_allocation_of_no_local_guest_never_doubles_cpus_or_memory(host):
    """Issue bullet 2: a consumer that is no local guest (a migration record)
    holds VCPU and MEMORY_MB on the root; then numa_in_placement = true."""
    assert once(write_config(host)).code == 0
    allocate(host.scheduler, host.not_a_guest, {host.root: {"VCPU": 2, "MEMORY_MB": 512}})
    before = host.allocations()

    result = once(write_config(host, "numa_in_placement = true\n"))

    tree = placement_tree(host)
    assert_within_the_host(tree)
    for rc in ("VCPU", "MEMORY_MB"):
        levels = {p.root for p in tree if rc in p.inventories and units(rc, p.inventories[rc])}
        assert len(levels) <= 1, (rc, tree)
    assert placement_units(tree, "VCPU") <= CPUS
    assert host.allocations() == before
    # Refused: the children cannot get the CPUs and memory the stranger
    # keeps on the root. Exit 1, the consumer named, nothing said to match.
    assert result.code == 1, result.stderr
    assert host.not_a_guest in result.stderr, result.stderr
    assert "Kept as Placement holds them: MEMORY_MB, VCPU" in result.stdout, result.stdout
    assert "already matches" not in result.stdout
    assert "Traceback" not in result.stderr


def test_refused_run_reports_what_was_applied_and_what_was_kept(host):
    """Issue bullet 5: after a refusal, --once never says "already matches".
    The floating consumer is no local guest (a migration record): a local
    floating guest would be refused by name before anything is planned
    (node_agent.policy.guest_fit), and this test is about the invariant's
    refusal (see REFUSED)."""
    assert once(write_config(host)).code == 0
    host.boot(host.not_a_guest, vcpu=12, memory=1024)
    config = write_config(host, REFUSED + "reserved_host_memory_mb = 1024\n")

    text = once(config)
    assert text.code == 1
    assert "already matches" not in text.stdout
    assert "Kept" in text.stdout and "VCPU" in text.stdout
    # The second run has nothing left to apply but is still refused: it says so.
    again = run_agent("--config-file", config, "--once", "--output", "json")
    assert again.code == 1
    body = again.json()
    assert body["changes"] == []
    assert body["capacity"]["ok"] is False
    assert sorted(body["capacity"]["kept"]) == ["MEMORY_MB", "VCPU"]
    assert [b["consumer"] for b in body["capacity"]["blocking"]] == [host.not_a_guest]
    assert body["errors"]


def test_dry_run_shows_the_verdict_and_the_consumers_that_would_block(host):
    """The blocking consumer is no local guest (see above): the invariant,
    not the guest-fit check, is what refuses."""
    assert once(write_config(host)).code == 0
    host.boot(host.not_a_guest, vcpu=12, memory=1024)
    before = host.inventories()
    config = write_config(host, REFUSED)

    plan = run_agent("--config-file", config, "--once", "--dry-run", "--output", "json")
    assert plan.code == 0, plan.stderr
    verdict = plan.json()["capacity"]
    assert verdict["ok"] is False
    assert verdict["blocking"][0]["consumer"] == host.not_a_guest
    text = run_agent("--config-file", config, "--once", "--dry-run")
    assert "Capacity:" in text.stdout and host.not_a_guest in text.stdout
    assert host.inventories() == before


def test_reshape_committed_but_answer_lost_is_still_reported_as_the_reshape(
    tmp_path, placement_server, host_name
):
    """Issue bullet 5: the POST /reshaper went through, its answer was lost,
    the client's retry got a 409 and the re-plan found nothing left to move."""
    proxy = FaultProxy(placement_server.url).start()
    try:
        host = Host(tmp_path, proxy.url, host_name)
        assert once(write_config(host)).code == 0
        boot_legacy_guests(host)
        before = host.allocations()
        lost = []
        proxy.drop_answer = lambda method, path: (
            method == "POST" and path.endswith("/reshaper") and not lost and not lost.append(path)
        )
        result = once(
            write_config(host, "cpu_dedicated_set = 2-7,10-15\ncpu_shared_set = 0-1,8-9\n"),
            "--output",
            "json",
        )
    finally:
        proxy.stop()
    assert lost, "the proxy never saw the POST /reshaper"
    assert result.code == 0, result.stderr
    reshape = result.json()["reshape"]
    assert reshape is not None and reshape["response_lost"] is True
    assert {c["consumer"] for c in reshape["consumers"]} == {host.pinned, host.pinned_2}
    assert host.allocations() == expected_after_reshape(before, {host.pinned, host.pinned_2})


def test_numa_reshape_that_would_keep_memory_on_the_root_for_a_stranger_is_not_sent(
    tmp_path, placement_server, host_name
):
    """Issue bullet 2 with a guest the NUMA reshape can move: the body would
    keep VCPU and MEMORY_MB on the root for the consumer that is no local
    guest while the children get theirs, in one atomic POST."""
    p = prefix()
    guests = [guest(1, p, pins=(2, 3), nodes="0")]
    host = NestedHost(tmp_path, placement_server.url, host_name, guests)
    host.cycle()
    root = host.root
    allocate(host.scheduler, guests[0]["uuid"], {root: {"PCPU": 2, "MEMORY_MB": 1024}})
    stranger = str(uuid.uuid4())
    allocate(host.scheduler, stranger, {root: {"VCPU": 2, "MEMORY_MB": 512}})
    before = host.allocations()

    outcome, report, _ = host.cycle(numa_in_placement=True)

    listing = host.scheduler.get(f"/resource_providers?in_tree={root}")["resource_providers"]
    tree = [
        Published(
            rp["name"],
            rp["parent_provider_uuid"] is None,
            host.scheduler.get(f"/resource_providers/{rp['uuid']}/inventories")["inventories"],
        )
        for rp in listing
    ]
    assert_within_the_host(tree)
    # Refused whole: the guest's memory cannot go to its node while the
    # stranger's stays on the root. Nothing moved, exit 1 for --once.
    assert isinstance(outcome, ReshapeRefused) and "overstates the host" in str(outcome)
    assert host.allocations() == before
    assert host.scheduler.get(f"/allocations/{stranger}")["allocations"][root]["resources"] == {
        "VCPU": 2,
        "MEMORY_MB": 512,
    }


def test_huge_pages_and_memory_together_never_exceed_the_hosts_memory(host, tmp_path):
    """linux-resctrl: node 1 holds 4 pages of 1 GiB, published as
    CUSTOM_MEMORY_PAGE_1048576; its nodes' memory is unknown, so the root
    keeps MEMORY_MB. The pool's 4096 MiB must not also be schedulable as
    MEMORY_MB: a 4K guest would take memory the pool holds."""
    import psutil

    from tests.hostdata import HOSTDATA, sysfs_root_for

    resctrl = tmp_path / "resctrl"
    resctrl.mkdir()
    host.sysfs = str(
        sysfs_root_for(HOSTDATA / "vircaps2xmldata" / "linux-resctrl" / "system", resctrl)
    )
    result = once(write_config(host, "numa_in_placement = true\n"))
    assert result.code == 0, result.stderr

    tree = placement_tree(host)
    page_mb = placement_units(tree, "CUSTOM_MEMORY_PAGE_1048576") * 1024
    assert page_mb == 4096
    memory_mb = psutil.virtual_memory().total // (1024 * 1024)
    assert placement_units(tree, "MEMORY_MB") + page_mb <= memory_mb
    limits = HostLimits(
        cpus=CPUS,
        memory_mb=memory_mb,
        disk_gb=10**9,
        online_cpus=CPUS,
        hugepages={"CUSTOM_MEMORY_PAGE_1048576": 4},
    )
    assert check(tree, limits).ok, check(tree, limits).lines()
