"""The benchmark's bookkeeping (bench/): repetitions kept, single runs shown
as such, ratios taken per interleaved repetition."""

import subprocess
from pathlib import Path

import pytest

from bench import common
from bench.phases import Phases

_LINE = (
    "2026-11-23 18:00:00.000 1 INFO placement.requestlog [-] 127.0.0.1 "
    '"{method} {path}" status: {status} len: 0 microversion: 1.37\n'
)


class _Placement:
    """Appends request-log lines the way placement's request log writes them."""

    def __init__(self, path: Path):
        self.path = path
        path.write_text("")

    def serve(self, *requests: tuple[str, str, int]) -> None:
        with open(self.path, "a") as log:
            for method, path, status in requests:
                log.write(_LINE.format(method=method, path=path, status=status))


class _Clock:
    """Time moves only when a side's work says how long it took."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


def _phases(tmp_path: Path, clock=None) -> tuple[Phases, _Placement]:
    placement = _Placement(tmp_path / "placement.log")
    log = common.RequestLog(placement.path)
    return (Phases(log, clock) if clock else Phases(log)), placement


def test_every_repetition_of_a_phase_is_kept_not_only_the_last(tmp_path):
    phases, placement = _phases(tmp_path)
    rp = "/resource_providers/11111111-2222-3333-4444-555555555555/inventories"
    phases.measure(
        "inventory change",
        "node-agent",
        lambda: placement.serve(("GET", rp, 200), ("PUT", rp, 409), ("PUT", rp, 200)),
    )
    phases.measure(
        "inventory change",
        "node-agent",
        lambda: placement.serve(("PUT", rp, 200), ("PUT", rp, 200)),
    )

    row = phases.rows["inventory change"]["node-agent"]

    assert row["requests"]["n"] == 2
    assert (row["requests"]["min"], row["requests"]["max"]) == (2, 3)


def test_time_ratio_is_taken_per_interleaved_repetition_in_alternating_order(tmp_path):
    clock = _Clock()
    phases, _ = _phases(tmp_path, clock)
    # A slow machine in the second repetition slows both sides: per
    # repetition nova takes 2x, which a ratio of medians would not show.
    costs = {"node-agent": [0.01, 0.04, 0.02], "nova": [0.02, 0.08, 0.04]}
    order = []

    def side(name):
        def work():
            order.append(name)
            clock.spend(costs[name].pop(0))

        return work

    phases.repeat([(None, ("cycle", {s: side(s) for s in costs}))], repetitions=3)

    ratio = phases.result()["cycle"]["ratio"]["seconds"]
    assert order == ["node-agent", "nova", "nova", "node-agent", "node-agent", "nova"]
    assert ratio["n"] == 3
    assert (ratio["min"], ratio["max"]) == (pytest.approx(2.0), pytest.approx(2.0))


def test_a_single_run_is_not_shown_as_a_range():
    single = common.summary([371.0])

    assert common.fmt_stat(single, str) == "371.0 (1 run)"
    assert common.fmt_stat(common.summary([1.0, 3.0, 2.0]), str) == "2.0 (1.0–3.0)"


def test_a_rerun_replaces_its_section_and_adds_a_missing_one_before_how_to_rerun():
    from bench import report

    existing = "\n".join(
        [
            "# Benchmarks",
            "",
            "## 6. Production-like Placement: uWSGI on PostgreSQL",
            "old figures",
            "",
            "## How to rerun",
            "",
            "This run took 1 minute.",
            "",
        ]
    )
    results = {
        "machine": {"date": "today", "commit": "abc"},
        "production": {"failed": "boom"},
        "audit": {"failed": "bang"},
        "durations": {"production": 1.0, "audit": 2.0},
    }

    merged = report.merge(existing, results, ["production", "audit"])

    headings = [line for line in merged.splitlines() if line.startswith("## ")]
    assert headings == [
        "## 6. Production-like Placement: uWSGI on PostgreSQL",
        "## 8. Allocation audit",
        "## How to rerun",
    ]
    assert "old figures" not in merged and "boom" in merged and "bang" in merged
    assert "This run took 1 minute." in merged


def test_the_machine_line_says_when_its_commit_is_not_in_the_history():
    from bench import report

    head = subprocess.run(
        ["git", "-C", str(report.REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    gone = "- measured 2026-11-23 19:00 UTC at commit `0123abc`"
    kept = f"- measured 2026-11-23 19:00 UTC at commit `{head}`"

    assert "not in this branch's history" in report._unknown_commit(gone)
    assert report._unknown_commit(kept) == kept


def _reshape_row(total: int, reshaper: int, audit: int, moved: int = 1) -> dict:
    paths = (
        ["GET /resource_providers 200"]
        + [
            "GET /resource_providers/{uuid}/inventories 200",
            "GET /resource_providers/{uuid}/traits 200",
        ]
        * moved
        + ["GET /allocations/{uuid} 200"] * 100
    )
    return {
        "rows": {
            "reshape, 100 consumers (VCPU → PCPU), after a restart": {
                "node-agent": {
                    "first": {
                        "total": total,
                        "paths": paths,
                        "reply": {"reshaper_requests": reshaper, "audit_requests": audit},
                    }
                }
            }
        }
    }


def test_the_reshape_row_is_split_and_judged_with_its_verify_but_not_the_audit():
    from bench import report

    moved = " ".join(report._reshape_breakdown(_reshape_row(110, 102, 5)))
    still = " ".join(report._reshape_breakdown(_reshape_row(108, 102, 5, moved=0)))
    over = " ".join(report._reshape_breakdown(_reshape_row(112, 102, 5)))

    assert "the reshape itself 102" in moved and "the allocation audit 5" in moved
    assert "the restart's verify before any write 3 (the listing 1, then 2 for the 1" in moved
    assert "it is 105 here: the cycle without the audit costs 105, **met**" in moved
    assert "plus the 2 reads of the moved root" in moved
    assert "is 103 here: the cycle without the audit costs 103, **met** (within" in still
    assert "2 other; " in over and "costs 107, **missed**" in over


def test_a_regression_needs_after_slower_in_enough_pairs_for_a_sign_test():
    from bench.before_after import sign_test_threshold

    # P(X >= 5 of 5) = 1/32 <= 5 %; P(X >= 4) = 6/32 > 5 %.
    assert sign_test_threshold(5) == 5
    # 41 pairs: P(X >= 27) is about 3.0 %, P(X >= 26) about 5.9 %.
    assert sign_test_threshold(41) == 27


def test_how_to_rerun_says_what_a_full_run_takes_now_from_each_sections_latest_time():
    from bench import report

    existing = "\n".join(
        [
            "# Benchmarks",
            "",
            "## 8. Allocation audit",
            "",
            "*This section was rerun alone (`--only audit`) on today at commit `abc`, in 60 s, "
            "load; the machine ...*",
            "",
            "## How to rerun",
            "",
            "This run took 2.0 minutes (phases 100 s, memory 20 s).",
            "",
        ]
    )
    results = {
        "machine": {"date": "today", "commit": "abc"},
        "memory": {"failed": "boom"},
        "durations": {"memory": 40.0},
    }

    once = report.merge(existing, results, ["memory"])
    twice = report.merge(once, results, ["memory"])

    line = next(line for line in twice.splitlines() if line.startswith("This run took"))
    assert line.count("A full run now") == 1
    assert "about 3 minutes" in line  # phases 100 + memory 40 (alone) + audit 60
    assert "phases 100 s, memory 40 s, audit 60 s" in line
