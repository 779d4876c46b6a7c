"""How many reads the reshape keeps in flight: raised while latency holds,
eased when it grows, halved when Placement fails."""

from node_agent.placement.read_pace import ReadPace


def test_limit_grows_by_one_per_round_of_answers_whose_latency_holds():
    pace = ReadPace(limit=4)
    for _ in range(4):
        pace.answered(0.010)
    assert pace.limit == 5
    for _ in range(5):
        pace.answered(0.012)  # within 1.5x the best
    assert pace.limit == 6


def test_limit_eases_when_latency_grows_past_the_tolerance():
    pace = ReadPace(limit=6)
    pace.answered(0.010)
    pace.answered(0.020)  # twice the best: the server queues
    assert pace.limit == 5


def test_limit_halves_on_a_5xx_or_timeout_and_never_drops_below_the_floor():
    pace = ReadPace(limit=16)
    pace.overloaded()
    assert pace.limit == 8
    for _ in range(10):
        pace.overloaded()
    assert pace.limit == 1


def test_limit_never_exceeds_the_ceiling():
    pace = ReadPace(limit=3, ceiling=4)
    for _ in range(100):
        pace.answered(0.010)
    assert pace.limit == 4
