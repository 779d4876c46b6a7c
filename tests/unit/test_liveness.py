"""When node-agent-applier closes a host that stopped reporting, and what it
does to the root's traits (node_agent.policy.liveness)."""

import pytest

from node_agent.policy import liveness

D = "COMPUTE_STATUS_DISABLED"


@pytest.mark.parametrize(
    "now, seen_at, since, dead_after, dead",
    [
        (1000, 399, 0, 600, True),  # silent 601 s
        (1000, 400, 0, 600, True),  # exactly dead_after
        (1000, 401, 0, 600, False),
        (1000, None, 0, 600, True),  # never recorded: counted from the start
        (1000, None, 500, 600, False),
        (1000, 0, 500, 600, False),  # the applier was down: the host gets dead_after
        (1000, 0, 0, 0, False),  # 0: off
    ],
)
def test_a_host_is_dead_after_dead_after_seconds_from_its_last_message_or_our_start(
    now, seen_at, since, dead_after, dead
):
    assert liveness.is_dead(now, seen_at, since, dead_after) is dead


@pytest.mark.parametrize(
    "now, seen_at, dead_after, due",
    [
        (100, None, 600, True),
        (100, 99, 600, False),
        (250, 100, 600, True),  # a quarter of dead_after
        (249, 100, 600, False),
        (50, 100, 600, True),  # a clock that went back
        (1000, 1, 0, False),  # off: written once, never refreshed
        (1000, None, 0, True),
    ],
)
def test_seen_at_is_written_at_most_four_times_per_dead_after(now, seen_at, dead_after, due):
    assert liveness.seen_due(now, seen_at, dead_after) is due


def test_closing_keeps_every_other_trait_and_adds_nothing_when_already_closed():
    assert liveness.closing(["CUSTOM_RACK_7", "HW_CPU_X86_AVX2"]) == [
        D,
        "CUSTOM_RACK_7",
        "HW_CPU_X86_AVX2",
    ]
    assert liveness.closing([D, "CUSTOM_RACK_7"]) is None


def test_reopening_removes_only_the_disabled_trait():
    assert liveness.reopening([D, "CUSTOM_RACK_7"]) == ["CUSTOM_RACK_7"]
    assert liveness.reopening(["CUSTOM_RACK_7"]) is None


@pytest.mark.parametrize(
    "dead_after, lock_timeout, ok",
    [(0, 20, True), (600, 20, True), (41, 20, True), (40, 20, False), (10, 20, False)],
)
def test_dead_after_must_be_above_twice_the_lock_timeout_or_zero(dead_after, lock_timeout, ok):
    problem = liveness.dead_after_problem(dead_after, lock_timeout)
    assert (problem is None) is ok
    if not ok:
        assert "[applier] dead_after" in problem and "lock_timeout" in problem
