"""The nova bridge for the whole session, and the per-run summary."""

from __future__ import annotations

import warnings

import pytest

from tests.conformance.bridge import NOVA_VENV, NovaBridge, nova_python
from tests.conformance.differences import RESULTS, listed


@pytest.fixture(scope="session")
def nova():
    python = nova_python()
    if python is None:
        reason = (f"NOVA CONFORMANCE NOT RUN: nova's virtualenv {NOVA_VENV} is not "
                  "built (make .venv-nova/.installed failed or was not run)")
        warnings.warn(reason)
        pytest.skip(reason)
    bridge = NovaBridge(python)
    yield bridge
    bridge.close()


def pytest_terminal_summary(terminalreporter):
    if not RESULTS:
        return
    table = listed()
    terminalreporter.section("nova conformance")
    for area, observed in sorted(RESULTS.items()):
        in_table = sum(1 for a in table.values() if a == area)
        terminalreporter.write_line(
            f"{area:16s} {observed.cases:6d} cases, {len(observed.differences)} "
            f"differences observed, {in_table} listed in the README")
