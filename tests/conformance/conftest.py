"""The nova bridge for the whole session, and the per-run summary."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from tests.conformance.bridge import NOVA_VENV, NovaBridge, nova_python
from tests.conformance.differences import RESULTS, listed, unchecked_areas, whole_suite
from tests.real_parts import skip_or_fail

HERE = Path(__file__).parent
# Why the suite did not run, or which listed areas no test reported.
_RUN: dict[str, object] = {
    "not_run": None,
    "nova_ran": False,
    "deselected": 0,
    "whole": False,
    "unchecked": [],
}


@pytest.fixture(scope="session")
def nova():
    python = nova_python()
    if python is None:
        reason = (
            f"nova's virtualenv {NOVA_VENV} is not built (make "
            ".venv-nova/.installed failed or was not run)"
        )
        _RUN["not_run"] = reason
        warnings.warn(f"NOVA CONFORMANCE NOT RUN: {reason}", stacklevel=1)
        skip_or_fail(f"NOVA CONFORMANCE NOT RUN: {reason}")
    bridge = NovaBridge(python)
    _RUN["nova_ran"] = True
    yield bridge
    bridge.close()


def _in_here(item) -> bool:
    return Path(str(item.fspath)).parent == HERE


def pytest_deselected(items):
    _RUN["deselected"] = int(_RUN["deselected"]) + sum(1 for i in items if _in_here(i))


def pytest_collection_finish(session):
    selected = {Path(str(i.fspath)).name for i in session.items if _in_here(i)}
    every_file = {p.name for p in HERE.glob("test_*.py")}
    _RUN["whole"] = whole_suite(selected, every_file, int(_RUN["deselected"]))


def pytest_sessionfinish(session, exitstatus):
    # A listed area no test reported was never checked: with the whole suite
    # run against nova, that fails the run.
    if _RUN["whole"] and _RUN["nova_ran"]:
        _RUN["unchecked"] = unchecked_areas(RESULTS, listed())
        if _RUN["unchecked"] and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _RUN["not_run"]:
        terminalreporter.write_line(
            f"nova conformance: NOT RUN ({_RUN['not_run']})", red=True, bold=True
        )
    if not RESULTS and not _RUN["unchecked"]:
        return
    table = listed()
    terminalreporter.section("nova conformance")
    for area, observed in sorted(RESULTS.items()):
        in_table = sum(1 for a in table.values() if a == area)
        terminalreporter.write_line(
            f"{area:16s} {observed.cases:6d} cases, {len(observed.differences)} "
            f"differences observed, {in_table} listed in nova-differences.yaml"
        )
    for area in _RUN["unchecked"]:
        terminalreporter.write_line(
            f"FAILED: area {area} has rows in docs/design/nova-differences.yaml but no "
            "test reported it: its rows were never checked",
            red=True,
            bold=True,
        )
