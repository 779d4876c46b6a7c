"""nova 34's scheduler places guests on agent hosts, against the real Placement.

nova's own code builds the requests (with the fallback VCPU query for
pinned flavors), claims, moves a resize's allocations, fits the guest's
CPUs on the host and writes its domain; the hosts are real agent cycles on
the 16-CPU fixture virhostcpudata/linux-test4 (node 0 = CPUs 0-7, node 1 =
8-15) with libvirt's test driver. See tests/integration/nova_scheduler.py
for who does what. After every step the host is checked against what it
physically has (``check_host``) and every other consumer's allocations
against what they were (``moved_whole``).

These tests assert nova's behaviour and the capacity invariant, not what
the agent does today: several fail on the code they were written against
(each test's docstring says which assertion and why).
"""

from __future__ import annotations

import uuid

import pytest

from node_agent.cycle.reconcile import ReshapeRefused
from node_agent.policy.guest_cpu import classify
from tests.conformance.bridge import NOVA_VENV, nova_python
from tests.integration.nova_scheduler import (
    AgentHost,
    Cloud,
    check_host,
    flavor,
    moved_whole,
    nova_side,
    pinned,
    pinned_not_on_pcpu,
)
from tests.real_parts import skip_or_fail

pytestmark = pytest.mark.integration

DEDICATED, SHARED = "2-7,10-15", "0-1,8-9"  # PCPU 12; VCPU 4 x 4.0 = 16
PIN2 = pinned("pin.2", 2)
PIN4 = pinned("pin.4", 4)
FLOAT2 = flavor("float.2", 2)
# vCPU 0 floats on the shared set, 1-2 are dedicated: VCPU 1 + PCPU 2.
MIXED3 = flavor("mixed.3", 3, hw__cpu_policy="mixed", hw__cpu_dedicated_mask="^0")
# One more PCPU for the emulator threads: PCPU 3 (the fallback asks VCPU 2).
ISOLATE2 = pinned("pin.2.isolate", 2, hw__emulator_threads_policy="isolate")


@pytest.fixture(scope="module")
def nova_venv_python():
    python = nova_python()
    if python is None:
        skip_or_fail(
            f"nova's virtualenv {NOVA_VENV} is not built: nova's scheduler "
            "cannot run (make .venv-nova/.installed)"
        )
    return python


@pytest.fixture(scope="module")
def nova_processes():
    """The module's nova process (a new one after one died)."""
    running: list = []
    yield running
    for process in running:
        process.close()


@pytest.fixture
def cloud(nova_venv_python, nova_processes, placement_server):
    nova = nova_side(nova_venv_python, nova_processes[-1] if nova_processes else None)
    if not nova_processes or nova is not nova_processes[-1]:
        nova_processes.append(nova)
    return Cloud(nova, placement_server.url)


def new_host(cloud, tmp_path, host_name, suffix="", **config) -> AgentHost:
    host = cloud.add_host(AgentHost(tmp_path / f"host{suffix}", cloud.url, f"{host_name}{suffix}"))
    if config:
        cloud.configure(host, **config)
    outcome, report, _ = host.cycle()
    assert report.ok and not isinstance(outcome, ReshapeRefused), (outcome, report.errors)
    return host


def ok(outcome, report) -> bool:
    """The cycle reported success."""
    return report.ok and not isinstance(outcome, (ReshapeRefused, Exception))


def boot_checked(cloud, fl, on=None):
    """Boot through nova; the host and every other consumer checked after."""
    before = cloud.allocations()
    guest = cloud.boot(fl, on=on)
    skip = {guest.uuid} if guest else set()
    assert moved_whole(before, cloud.allocations(), skip) == []
    for host in cloud.hosts.values():
        assert check_host(cloud, host) == []
    return guest


def first_query_candidates(cloud, fl, host) -> int:
    """How many of Placement's answers to nova's first query (PCPU for a
    pinned flavor) are on ``host``."""
    cloud.select(str(uuid.uuid4()), fl, lambda h: h is host)
    return sum(1 for name, first in cloud.last_candidates if name == host.name and first)


def fill(cloud, host, flavors, cycle_every=3, limit=40):
    """Boot ``flavors`` in turn on ``host`` until nova finds no room for any."""
    full, booted, step = set(), [], 0
    while len(full) < len(flavors) and step < limit:
        fl = flavors[step % len(flavors)]
        step += 1
        if fl["name"] in full:
            continue
        guest = boot_checked(cloud, fl, on=[host])
        if guest is None:
            full.add(fl["name"])
            continue
        booted.append(guest)
        if len(booted) % cycle_every == 0:
            before = cloud.allocations()
            outcome, report, _ = host.cycle()
            assert ok(outcome, report), (outcome, report.errors)
            assert moved_whole(before, cloud.allocations()) == []
            assert check_host(cloud, host) == []
    assert step < limit, "the host never filled"
    return booted


def sets_around(guests, host) -> tuple[str, str]:
    """cpu_dedicated_set / cpu_shared_set an operator would choose for a
    legacy host: the pinned guests' CPUs stay dedicated, the two lowest
    unpinned CPUs of each node become the shared set."""
    pinned_cpus = {
        cpu for g in guests for cpus in g.pins.values() if len(cpus) == 1 for cpu in cpus
    }
    shared = []
    for cpus in host.topology.nodes.values():
        shared += [c for c in cpus if c not in pinned_cpus][:2]
    dedicated = sorted(host.topology.online - set(shared))
    return ",".join(map(str, dedicated)), ",".join(map(str, sorted(shared)))


# ---------------------------------------------------------------- scenario 1


@pytest.mark.parametrize("numa_in_placement", [False, True], ids=["flat", "numa"])
def test_filling_a_host_until_nova_finds_no_candidate_overcommits_nothing(
    cloud, tmp_path, host_name, numa_in_placement
):
    """Pinned, floating and mixed guests until nova's queries (with the
    NUMA filter's fit) find no room: nothing over-committed at any step (on
    the host, and on each NUMA child when they are on), and at the end
    Placement itself offers neither PCPU for a pinned guest nor anything for
    a floating one. nova 34 does not ask for NUMA affinity in Placement: its
    single request group may take a guest's CPUs from one child and its
    memory from the other, which is nova's behaviour, not checked here."""
    host = new_host(
        cloud,
        tmp_path,
        host_name,
        dedicated=DEDICATED,
        shared=SHARED,
        numa_in_placement=numa_in_placement,
    )
    if numa_in_placement:
        assert len(cloud.tree_of(host)) == 1 + len(host.topology.nodes)
    booted = fill(cloud, host, [PIN2, FLOAT2, MIXED3, ISOLATE2])
    assert booted
    # nova asked Placement for PCPU first, then the fallback VCPU query.
    pinned_queries = [q for q in cloud.queries if len(q) == 2]
    assert pinned_queries and all("PCPU" in q[0] and "PCPU" not in q[1] for q in pinned_queries)
    outcome, report, desired = host.cycle()
    assert ok(outcome, report)
    assert check_host(cloud, host) == []
    assert pinned_not_on_pcpu(cloud, host) == []
    # The agent reads every domain nova defined and counts it as nova claimed it.
    seen = {g.uuid: classify(g) for g in desired.host.guests}
    allocations = cloud.allocations()
    for guest in booted:
        held = cloud.pcpu_held(host, guest.uuid, allocations)
        cpu = seen[guest.uuid]
        assert (cpu.vcpu, cpu.pcpu) == (held.get("VCPU", 0), held.get("PCPU", 0)), (
            guest.name,
            guest.flavor,
            cpu.describe(),
            held,
        )
    truth, usage = host.truth(), cloud.usage(host)["total"]
    assert usage["PCPU"][0] <= truth.capacity["PCPU"]
    assert usage["VCPU"][0] <= truth.capacity["VCPU"]
    assert first_query_candidates(cloud, PIN2, host) == 0
    assert first_query_candidates(cloud, FLOAT2, host) == 0


# ---------------------------------------------------------------- scenario 2


def _cut(cloud, host, fill_with, probe, **cut):
    """Fill ``host`` partly, cut its config below usage, run the agent: no
    new claim may succeed past the new limit, nothing allocated moves."""
    for fl in fill_with:
        assert boot_checked(cloud, fl, on=[host]) is not None
    outcome, report, _ = host.cycle()
    assert ok(outcome, report)
    used_before = {rc: used for rc, (used, _c) in cloud.usage(host)["total"].items()}
    before = cloud.allocations()
    cloud.configure(host, **cut)
    outcome, report, _ = host.cycle()
    assert cloud.allocations() == before
    # Existing guests keep what they hold; nothing new fits past the limit.
    assert check_host(cloud, host, over=used_before) == []
    guest = cloud.boot(probe, on=[host])
    assert guest is None, (
        f"nova claimed {probe['name']} on {host.name} after the cut {cut}: Placement "
        f"still offers the old capacity {cloud.usage(host)['total']} "
        f"(ground truth {host.truth().capacity})"
    )
    assert check_host(cloud, host, over=used_before) == []


def test_cpu_allocation_ratio_cut_below_usage_stops_new_claims(cloud, tmp_path, host_name):
    """VCPU 4 x 4.0 = 16 with 12 in use; the ratio cut to 2.0 leaves 8."""
    host = new_host(cloud, tmp_path, host_name, dedicated=DEDICATED, shared=SHARED)
    _cut(cloud, host, [FLOAT2] * 6, FLOAT2, cpu_allocation_ratio=2.0)


def test_reserved_host_memory_raised_above_free_memory_stops_new_claims(cloud, tmp_path, host_name):
    """Guests hold most of the host's memory; reserved_host_memory_mb is
    raised so the memory left for guests is 1 GiB below what they hold."""
    host = new_host(cloud, tmp_path, host_name, dedicated=DEDICATED, shared=SHARED)
    capacity = host.truth().capacity["MEMORY_MB"]
    big = flavor("mem.big", 1, memory_mb=capacity // 4)
    used = 3 * (capacity // 4)
    reserved = host.config.reserved_host_memory_mb + (capacity - used) + 1024
    _cut(
        cloud,
        host,
        [big] * 3,
        flavor("mem.small", 1, memory_mb=512),
        reserved_host_memory_mb=reserved,
    )


def test_cpu_shared_set_cut_below_usage_stops_new_claims(cloud, tmp_path, host_name):
    """cpu_shared_set 0-1,8-9 (VCPU 16) with 12 in use is cut to 0,8 (8)."""
    host = new_host(cloud, tmp_path, host_name, dedicated=DEDICATED, shared=SHARED)
    _cut(cloud, host, [FLOAT2] * 6, FLOAT2, shared="0,8")


# ---------------------------------------------------------------- scenario 3


def test_pinned_guest_booted_during_the_pcpu_reshape_ends_on_pcpu(cloud, tmp_path, host_name):
    """A legacy host (no CPU sets): nova's fallback query puts pinned
    guests on VCPU. The operator sets cpu_dedicated_set/cpu_shared_set and
    the agent reshapes; between the agent's reads and its POST nova boots
    one more pinned guest through the fallback query (the host still offers
    VCPU only). After that same cycle every pinned guest holds PCPU, or the
    cycle does not report success (and the next one moves it)."""
    host = new_host(cloud, tmp_path, host_name)
    legacy = [boot_checked(cloud, fl, on=[host]) for fl in (PIN2, PIN2, FLOAT2)]
    for guest in legacy[:2]:
        assert cloud.pcpu_held(host, guest.uuid).get("VCPU") == 2  # the fallback's
    dedicated, shared = sets_around(legacy, host)
    cloud.configure(host, dedicated=dedicated, shared=shared)
    before = cloud.allocations()

    during = []

    def nova_boots_a_pinned_guest(_body):
        if not during:
            during.append(cloud.boot(PIN2, on=[host]))

    outcome, report, _ = host.cycle(before_post=nova_boots_a_pinned_guest)
    assert during and during[0] is not None, "nova found no room during the reshape"
    late = during[0]
    assert cloud.last_candidates and not any(first for _h, first in cloud.last_candidates), (
        "the late guest was not placed by nova's fallback VCPU query"
    )
    assert moved_whole(before, cloud.allocations(), skip={late.uuid}) == []
    if ok(outcome, report):
        assert pinned_not_on_pcpu(cloud, host) == [], (
            "the cycle reported success with a pinned guest left on VCPU"
        )
    else:
        outcome, report, _ = host.cycle()
        assert ok(outcome, report), (outcome, report.errors)
        assert pinned_not_on_pcpu(cloud, host) == []
    assert check_host(cloud, host) == []
    assert cloud.pcpu_held(host, late.uuid) == {"PCPU": 2, "MEMORY_MB": 512, "DISK_GB": 1}


# ---------------------------------------------------------------- scenario 4


def _resize_in_flight_during_reshape(cloud, tmp_path, host_name):
    """Two legacy hosts; a pinned guest on the source is resized to the
    other host (allocations moved to the migration uuid on the source, the
    new ones claimed on the destination, the guest defined on both); then
    both hosts get CPU sets and the agent reshapes them."""
    source = new_host(cloud, tmp_path, host_name, "-src")
    dest = new_host(cloud, tmp_path, host_name, "-dst")
    guest = boot_checked(cloud, PIN2, on=[source])
    assert cloud.resize(guest, PIN4) is dest
    assert guest.migration and cloud.pcpu_held(source, guest.migration).get("VCPU") == 2
    for host in (source, dest):
        dedicated, shared = sets_around([g for g, _p in cloud.domains_on(host)], host)
        cloud.configure(host, dedicated=dedicated, shared=shared)
        before = cloud.allocations()
        outcome, report, _ = host.cycle()
        assert moved_whole(before, cloud.allocations()) == []
        assert ok(outcome, report), (host.name, outcome, report.errors)
        assert check_host(cloud, host) == []
    # The source's guest is pinned and defined there: whoever holds its
    # resources there (the migration) must hold them as PCPU, or the
    # scheduler may claim its CPUs for another guest.
    assert pinned_not_on_pcpu(cloud, source) == []
    assert pinned_not_on_pcpu(cloud, dest) == []
    return source, dest, guest


def test_resize_in_flight_during_the_reshape_then_confirm_never_double_books_pcpu(
    cloud, tmp_path, host_name
):
    source, dest, guest = _resize_in_flight_during_reshape(cloud, tmp_path, host_name)
    cloud.confirm(guest)
    for host in (source, dest):
        assert check_host(cloud, host) == []
    fill(cloud, source, [PIN2])
    assert check_host(cloud, source) == []
    assert first_query_candidates(cloud, PIN2, source) == 0, (
        "Placement still offers PCPU the source's pinned guests hold"
    )


def test_resize_in_flight_during_the_reshape_then_revert_succeeds_without_double_booking(
    cloud, tmp_path, host_name
):
    source, dest, guest = _resize_in_flight_during_reshape(cloud, tmp_path, host_name)
    assert cloud.revert(guest) is True, "move_allocations back to the instance failed"
    assert guest.host == source.name
    held = cloud.pcpu_held(source, guest.uuid)
    assert held.get("PCPU") == 2 and "VCPU" not in held, held
    assert cloud.pcpu_held(dest, guest.uuid) == {}
    for host in (source, dest):
        assert check_host(cloud, host) == []
        assert pinned_not_on_pcpu(cloud, host) == []
    fill(cloud, source, [PIN2])
    assert check_host(cloud, source) == []
    assert first_query_candidates(cloud, PIN2, source) == 0, (
        "Placement still offers PCPU the source's pinned guests hold"
    )


def test_resize_started_between_the_reshapes_reads_and_its_post_leaves_no_pinned_vcpu(
    cloud, tmp_path, host_name
):
    """The source's reshape reads a pinned guest holding VCPU; before its
    POST nova's conductor moves those allocations to a migration uuid and
    claims the new flavor on another host. After that cycle (or the next,
    when this one did not report success) the migration holds PCPU on the
    source, as nova's own reshape moves an outgoing migration's."""
    source = new_host(cloud, tmp_path, host_name, "-src")
    new_host(cloud, tmp_path, host_name, "-dst")
    guest = boot_checked(cloud, PIN2, on=[source])
    dedicated, shared = sets_around([guest], source)
    cloud.configure(source, dedicated=dedicated, shared=shared)
    before = cloud.allocations()
    started = []

    def nova_starts_a_resize(_body):
        if not started:
            started.append(cloud.resize(guest, PIN4))

    outcome, report, _ = source.cycle(before_post=nova_starts_a_resize)
    assert started and started[0] is not None
    assert moved_whole({guest.migration: before[guest.uuid]}, cloud.allocations()) == []
    if not ok(outcome, report):
        outcome, report, _ = source.cycle()
        assert ok(outcome, report), (outcome, report.errors)
    assert pinned_not_on_pcpu(cloud, source) == [], (
        "the source's migration record kept VCPU for a pinned guest"
    )
    assert check_host(cloud, source) == []
    cloud.confirm(guest)
    assert check_host(cloud, source) == []
