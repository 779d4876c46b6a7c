"""The allocation audit (node_agent.policy.audit), with literal values, no server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node_agent.host.domain import parse_domain
from node_agent.model.cpuset import parse_cpu_spec
from node_agent.model.snapshot import Guest, GuestMdev
from node_agent.placement.audit_read import consumer_type_version
from node_agent.policy import audit as A

ROOT, NUMA0, NUMA1, GPU, OTHER_HOST = "rp-root", "rp-n0", "rp-n1", "rp-gpu", "rp-other"
G1, G2, C9 = "guest-1", "guest-2", "consumer-9"

FLOATING = Guest(G1, "instance-1", vcpus=2, running=True, memory_kb=2048 * 1024)
PINNED = Guest(
    G2,
    "instance-2",
    vcpus=2,
    running=True,
    memory_kb=1024 * 1024,
    vcpupin=((0, parse_cpu_spec("2")), (1, parse_cpu_spec("3"))),
    numa_nodes=frozenset({1}),
)
WITH_GPU = Guest(
    G1, "instance-1", vcpus=2, running=True, memory_kb=2048 * 1024, mdevs=(GuestMdev("m1"),)
)


def on(provider, **consumers):
    """The body of GET /resource_providers/{provider}/allocations."""
    return {
        provider: {
            "resource_provider_generation": 1,
            "allocations": {
                c.replace("_", "-"): {"resources": res, "consumer_generation": 1}
                for c, res in consumers.items()
            },
        }
    }


SEEN = {"guests": {G1: 100.0, G2: 100.0}, "orphans": {C9: 100.0}}


def kinds(result):
    return [(f.kind, f.state, f.consumer) for f in result.findings]


@pytest.mark.parametrize(
    "guests, allocations, history, details, expected",
    [
        # Everything matches: nothing to say.
        ([FLOATING], on(ROOT, guest_1={"VCPU": 2, "MEMORY_MB": 2048}), SEEN, {}, []),
        # An orphan seen by the previous audit is an alarm.
        (
            [],
            on(ROOT, consumer_9={"VCPU": 1, "MEMORY_MB": 512}),
            SEEN,
            {},
            [(A.ORPHAN, A.ALARM, C9)],
        ),
        # Seen for the first time: pending, a boot may be half-way.
        ([], on(ROOT, consumer_9={"VCPU": 1}), {}, {}, [(A.ORPHAN, A.PENDING, C9)]),
        # A migration's consumer is in flight, first time or not.
        (
            [],
            on(ROOT, consumer_9={"VCPU": 1}),
            SEEN,
            {C9: {"allocations": {ROOT: {}}, "consumer_type": "MIGRATION"}},
            [(A.ORPHAN, A.IN_FLIGHT, C9)],
        ),
        # A consumer here and on another host's provider: in flight.
        (
            [],
            on(ROOT, consumer_9={"VCPU": 1}),
            SEEN,
            {
                C9: {
                    "allocations": {ROOT: {}, OTHER_HOST: {"resources": {"VCPU": 1}}},
                    "consumer_type": "INSTANCE",
                }
            },
            [(A.ORPHAN, A.IN_FLIGHT, C9)],
        ),
        # An INSTANCE consumer wholly here with no guest: an alarm.
        (
            [],
            on(ROOT, consumer_9={"VCPU": 1}),
            SEEN,
            {C9: {"allocations": {ROOT: {}}, "consumer_type": "INSTANCE"}},
            [(A.ORPHAN, A.ALARM, C9)],
        ),
        # A guest with nothing here, seen before: alarm.
        ([FLOATING], {ROOT: {"allocations": {}}}, SEEN, {}, [(A.NO_ALLOCATION, A.ALARM, G1)]),
        # ... seen for the first time: pending.
        ([FLOATING], {ROOT: {"allocations": {}}}, {}, {}, [(A.NO_ALLOCATION, A.PENDING, G1)]),
        # ... held on another host only (migration source): in flight.
        (
            [FLOATING],
            {ROOT: {"allocations": {}}},
            SEEN,
            {G1: {"allocations": {OTHER_HOST: {"resources": {"MEMORY_MB": 2048}}}}},
            [(A.NO_ALLOCATION, A.IN_FLIGHT, G1)],
        ),
        # Resize leftover: the old size still allocated.
        (
            [FLOATING],
            on(ROOT, guest_1={"VCPU": 4, "MEMORY_MB": 4096}),
            SEEN,
            {},
            [(A.SIZE_MISMATCH, A.ALARM, G1)],
        ),
        (
            [FLOATING],
            on(ROOT, guest_1={"VCPU": 4, "MEMORY_MB": 4096}),
            {},
            {},
            [(A.SIZE_MISMATCH, A.PENDING, G1)],
        ),
        # VGPU: the guest has an mdev, nothing allocated for it.
        (
            [WITH_GPU],
            on(ROOT, guest_1={"VCPU": 2, "MEMORY_MB": 2048}),
            SEEN,
            {},
            [(A.SIZE_MISMATCH, A.ALARM, G1)],
        ),
        (
            [WITH_GPU],
            {**on(ROOT, guest_1={"VCPU": 2, "MEMORY_MB": 2048}), **on(GPU, guest_1={"VGPU": 1})},
            SEEN,
            {},
            [],
        ),
    ],
)
def test_findings_table(guests, allocations, history, details, expected):
    result = A.audit(
        guests,
        allocations,
        history,
        now=200.0,
        consumer_details=details,
        host_providers=[ROOT, GPU],
    )
    assert kinds(result) == expected


def test_orphan_shows_how_long_by_the_agents_own_observations():
    result = A.audit(
        [],
        on(ROOT, consumer_9={"VCPU": 1}),
        SEEN,
        now=400.0,
        consumer_details={C9: {"allocations": {ROOT: {}}, "consumer_type": "INSTANCE"}},
    )
    (orphan,) = result.findings
    assert (orphan.orphaned_since, orphan.orphaned_for_s, orphan.consumer_type) == (
        100.0,
        300.0,
        "INSTANCE",
    )
    assert result.history["orphans"] == {C9: 100.0}


def test_history_keeps_first_seen_times_and_forgets_what_is_gone():
    result = A.audit(
        [FLOATING],
        on(ROOT, guest_1={"VCPU": 2, "MEMORY_MB": 2048}),
        {"guests": {G1: 50.0, "gone": 10.0}, "orphans": {"gone": 10.0}},
        now=300.0,
    )
    assert result.history == {"guests": {G1: 50.0}, "orphans": {}, "unallocated": {}}


SHARED = "rp-shared-storage"  # a sharing provider: MISC_SHARES_VIA_AGGREGATE


def test_disk_on_shared_storage_does_not_make_an_orphan_look_in_flight():
    """Every instance of the aggregate holds DISK_GB on the sharing
    provider, wherever it runs: that is no other host."""
    details = {
        C9: {
            "consumer_type": "INSTANCE",
            "allocations": {
                ROOT: {"resources": {"VCPU": 1, "MEMORY_MB": 512}},
                SHARED: {"resources": {"DISK_GB": 20}},
            },
        }
    }
    result = A.audit(
        [],
        on(ROOT, consumer_9={"VCPU": 1, "MEMORY_MB": 512}),
        SEEN,
        now=200.0,
        consumer_details=details,
        host_providers=[ROOT],
    )
    assert kinds(result) == [(A.ORPHAN, A.ALARM, C9)]
    assert result.findings[0].elsewhere == ()

    # The same guest with only its disk elsewhere: no allocation here, an alarm.
    details = {G1: {"allocations": {SHARED: {"resources": {"DISK_GB": 20}}}}}
    result = A.audit(
        [FLOATING],
        {ROOT: {"allocations": {}}},
        SEEN,
        now=200.0,
        consumer_details=details,
        host_providers=[ROOT],
    )
    assert kinds(result) == [(A.NO_ALLOCATION, A.ALARM, G1)]


ON_TWO_HOSTS = {
    C9: {
        "consumer_type": "INSTANCE",
        "allocations": {ROOT: {"resources": {"VCPU": 1}}, OTHER_HOST: {"resources": {"VCPU": 1}}},
    }
}
MIGRATING = {C9: {"consumer_type": "MIGRATION", "allocations": {ROOT: {"resources": {"VCPU": 1}}}}}


@pytest.mark.parametrize("details", [ON_TWO_HOSTS, MIGRATING], ids=["two hosts", "migration"])
def test_an_orphan_in_flight_past_the_grace_is_a_failed_operation_alarm(details):
    here = on(ROOT, consumer_9={"VCPU": 1})
    within = A.audit(
        [], here, SEEN, now=100.0 + 3599, consumer_details=details, host_providers=[ROOT]
    )
    assert kinds(within) == [(A.ORPHAN, A.IN_FLIGHT, C9)]
    past = A.audit(
        [], here, within.history, now=100.0 + 3600, consumer_details=details, host_providers=[ROOT]
    )
    assert kinds(past) == [(A.ORPHAN, A.ALARM, C9)]
    assert "longer than audit_in_flight_grace (3600s)" in past.findings[0].detail
    assert past.findings[0].orphaned_since == 100.0
    short = A.audit(
        [],
        here,
        SEEN,
        now=160.0,
        consumer_details=details,
        host_providers=[ROOT],
        in_flight_grace=60,
    )
    assert kinds(short) == [(A.ORPHAN, A.ALARM, C9)]


def test_a_guest_allocated_only_on_another_host_past_the_grace_is_an_alarm():
    details = {G1: {"allocations": {OTHER_HOST: {"resources": {"VCPU": 2}}}}}
    first = A.audit(
        [FLOATING],
        {ROOT: {"allocations": {}}},
        SEEN,
        now=1000.0,
        consumer_details=details,
        host_providers=[ROOT],
        in_flight_grace=600,
    )
    assert kinds(first) == [(A.NO_ALLOCATION, A.IN_FLIGHT, G1)]
    assert first.history["unallocated"] == {G1: 1000.0}
    later = A.audit(
        [FLOATING],
        {ROOT: {"allocations": {}}},
        first.history,
        now=1600.0,
        consumer_details=details,
        host_providers=[ROOT],
        in_flight_grace=600,
    )
    assert kinds(later) == [(A.NO_ALLOCATION, A.ALARM, G1)]
    # Once it holds its allocation here, the sighting is forgotten.
    done = A.audit(
        [FLOATING],
        on(ROOT, guest_1={"VCPU": 2, "MEMORY_MB": 2048}),
        later.history,
        now=1700.0,
        host_providers=[ROOT],
    )
    assert kinds(done) == [] and done.history["unallocated"] == {}


def test_pinned_guest_is_sized_against_pcpu_when_the_host_offers_it():
    allocs = on(ROOT, guest_2={"VCPU": 2, "MEMORY_MB": 1024})
    offered = A.audit([PINNED], allocs, SEEN, 200.0, pcpu_offered=True)
    assert [f.sizes for f in offered.findings] == [(("PCPU", 2, 0), ("VCPU", 0, 2))]
    legacy = A.audit([PINNED], allocs, SEEN, 200.0, pcpu_offered=False)
    assert legacy.findings == ()


def test_numa_placement_is_checked_only_when_numa_reporting_is_on():
    allocs = on(NUMA0, guest_2={"PCPU": 2, "MEMORY_MB": 1024})
    numa = {NUMA0: 0, NUMA1: 1}
    on_ = A.audit([PINNED], allocs, SEEN, 200.0, pcpu_offered=True, numa_nodes=numa)
    assert kinds(on_) == [(A.SIZE_MISMATCH, A.ALARM, G2)]
    assert "NUMA: guest bound to node(s) [1], allocated on [0]" in on_.findings[0].detail
    off = A.audit([PINNED], allocs, SEEN, 200.0, pcpu_offered=True)
    assert off.findings == ()
    right = A.audit(
        [PINNED],
        on(NUMA1, guest_2={"PCPU": 2, "MEMORY_MB": 1024}),
        SEEN,
        200.0,
        pcpu_offered=True,
        numa_nodes=numa,
    )
    assert right.findings == ()


def test_only_unexplained_consumers_are_looked_up():
    allocs = on(ROOT, guest_1={"VCPU": 2}, consumer_9={"VCPU": 1})
    assert A.to_look_up([FLOATING, PINNED], allocs) == [C9, G2]
    assert A.to_look_up([FLOATING], on(ROOT, guest_1={"VCPU": 2})) == []


def test_signature_ignores_pending_and_durations():
    allocs = on(ROOT, consumer_9={"VCPU": 1})
    first = A.audit([], allocs, {}, 100.0)
    later = A.audit([], allocs, SEEN, 900.0)
    again = A.audit([], allocs, SEEN, 1900.0)
    assert first.signature() == ()
    assert later.signature() == again.signature() == ((A.ORPHAN, A.ALARM, C9),)


@pytest.mark.parametrize(
    "server_max, expected", [("1.39", "1.38"), ("1.38", "1.38"), ("1.37", None), (None, None)]
)
def test_consumer_type_is_asked_for_only_where_the_server_has_it(server_max, expected):
    assert consumer_type_version(server_max) == expected


def test_numa_provider_nodes_by_name():
    assert A.numa_provider_nodes(
        [("u0", "h_NUMA_0"), ("u1", "h_NUMA_1"), ("r", "h"), ("x", "other_NUMA_0")], "h"
    ) == {"u0": 0, "u1": 1}


@pytest.mark.parametrize(
    "record, valid",
    [
        ({}, True),
        ({"guests": {"g": 1.5}, "orphans": {"c": 2}, "notified": [["orphan", "alarm", "c"]]}, True),
        ("garbage", False),
        ({"guests": ["g"]}, False),
        ({"guests": {"g": "yesterday"}}, False),
        ({"orphans": {"c": True}}, False),
        ({"notified": "x"}, False),
        ({"unallocated": {"g": 1.0}}, True),
        ({"unallocated": []}, False),
    ],
)
def test_history_from_the_state_file_is_checked_before_use(record, valid):
    from node_agent.cycle.audit import valid_history

    assert valid_history(record) is valid


# ------------------------------------------------ guests as nova 34 writes them

NOVA_GUESTS = Path(__file__).resolve().parents[1] / "data" / "nova_guests"
NOVA_CASES = json.loads((NOVA_GUESTS / "cases.json").read_text())["cases"]


def nova_guest(case: str) -> Guest:
    return parse_domain((NOVA_GUESTS / "xml" / f"{case}.xml").read_text(), running=True)


@pytest.mark.parametrize("case", sorted(NOVA_CASES))
def test_a_guest_allocated_as_nova_claims_it_is_no_finding(case):
    """Every guest of the corpus nova 34's driver wrote, allocated what nova's
    scheduler claims for its flavor (mixed splits, the isolated emulator's
    PCPU, resources: overrides) on a host offering PCPU: no finding."""
    guest = nova_guest(case)
    claimed = {rc: n for rc, n in NOVA_CASES[case]["nova"]["resources"].items() if n}
    result = A.audit(
        [guest],
        on(ROOT, **{guest.uuid.replace("-", "_"): claimed}),
        {"guests": {guest.uuid: 1.0}},
        200.0,
        pcpu_offered=True,
    )
    assert result.findings == ()


def test_a_resized_guests_untyped_migration_record_is_in_flight_not_an_orphan():
    """nova moves a guest's allocation here to the migration's uuid (no
    consumer type) and claims for the guest on the destination; the domain
    stays here until the confirm."""
    guest = nova_guest("one-node--dedicated-emulator-isolate")
    owner = dict(guest.metadata)
    migration = {"PCPU": 3, "MEMORY_MB": 1024}  # 2 vCPUs + the emulator
    details = {
        "migration-1": {
            "allocations": {ROOT: {"resources": migration}},
            "project_id": owner["owner:project"].replace("-", ""),
            "user_id": owner["owner:user"].replace("-", ""),
        },
        guest.uuid: {"allocations": {OTHER_HOST: {"resources": {"PCPU": 3}}}},
    }
    result = A.audit(
        [guest],
        on(ROOT, migration_1=migration),
        {"guests": {guest.uuid: 1.0}, "orphans": {"migration-1": 1.0}},
        200.0,
        consumer_details=details,
        pcpu_offered=True,
    )
    assert kinds(result) == [
        (A.ORPHAN, A.IN_FLIGHT, "migration-1"),
        (A.NO_ALLOCATION, A.IN_FLIGHT, guest.uuid),
    ]
    assert "migration record of guest" in result.findings[0].detail

    # Another project's consumer of the same size is no such record.
    details["migration-1"]["project_id"] = "someone-else"
    result = A.audit(
        [guest],
        on(ROOT, migration_1=migration),
        {"guests": {guest.uuid: 1.0}, "orphans": {"migration-1": 1.0}},
        200.0,
        consumer_details=details,
        pcpu_offered=True,
    )
    assert kinds(result)[0] == (A.ORPHAN, A.ALARM, "migration-1")


def test_a_same_host_resizes_old_flavor_is_in_flight_while_the_guest_holds_its_new_one():
    """nova resizing onto the same host keeps the old flavor on the
    migration's uuid (untyped) and the new one on the guest, both here, until
    the confirm; the domain says only the new size. Seen against nova 34's
    services (tests/integration/test_nova_cloud.py)."""
    guest = nova_guest("one-node--dedicated-emulator-isolate")
    owner = dict(guest.metadata)
    old = {"PCPU": 2, "MEMORY_MB": 512}
    details = {
        "migration-1": {
            "allocations": {ROOT: {"resources": old}},
            "project_id": owner["owner:project"].replace("-", ""),
            "user_id": owner["owner:user"].replace("-", ""),
        },
    }
    history = {"guests": {guest.uuid: 1.0}, "orphans": {"migration-1": 1.0}}
    held = {guest.uuid.replace("-", "_"): {"PCPU": 3, "MEMORY_MB": 1024}, "migration_1": old}
    result = A.audit(
        [guest],
        on(ROOT, **held),
        history,
        200.0,
        consumer_details=details,
        pcpu_offered=True,
    )
    assert kinds(result) == [(A.ORPHAN, A.IN_FLIGHT, "migration-1")]
    assert "resize on this host not yet confirmed" in result.findings[0].detail

    # Past the grace it is an alarm again: the owner alone cannot vouch forever.
    late = A.audit(
        [guest],
        on(ROOT, **held),
        history,
        1.0 + A.IN_FLIGHT_GRACE + 1,
        consumer_details=details,
        pcpu_offered=True,
    )
    assert kinds(late) == [(A.ORPHAN, A.ALARM, "migration-1")]

    # Another project's consumer is an orphan as before.
    details["migration-1"]["project_id"] = "someone-else"
    other = A.audit(
        [guest], on(ROOT, **held), history, 200.0, consumer_details=details, pcpu_offered=True
    )
    assert kinds(other) == [(A.ORPHAN, A.ALARM, "migration-1")]
