"""NODE_AGENT_REQUIRE_REAL=1 turns "nova's venv is missing" from a skip into
a failure, in the test run and in `make`; a skip says NOT RUN in the summary.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conformance.bridge import REPO
from tests.real_parts import REQUIRE_REAL, skip_or_fail


def _env(tmp_path, strict: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_REAL}
    env["NODE_AGENT_NOVA_VENV"] = str(tmp_path / "no-nova-venv")
    if strict:
        env[REQUIRE_REAL] = "1"
    return env


def _run_conformance_test(tmp_path, strict: bool) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore::UserWarning",
            "tests/conformance/test_disk_conformance.py",
        ],
        cwd=REPO,
        env=_env(tmp_path, strict),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_novas_venv_the_suite_skips_and_says_not_run(tmp_path):
    run = _run_conformance_test(tmp_path, strict=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 skipped" in run.stdout
    assert "nova conformance: NOT RUN (nova's virtualenv" in run.stdout


def test_without_novas_venv_the_strict_mode_fails(tmp_path):
    run = _run_conformance_test(tmp_path, strict=True)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 error" in run.stdout and "NODE_AGENT_REQUIRE_REAL=1" in run.stdout
    assert "nova conformance: NOT RUN (nova's virtualenv" in run.stdout


@pytest.mark.parametrize(
    "strict, outcome", [(False, pytest.skip.Exception), (True, pytest.fail.Exception)]
)
def test_skip_or_fail_follows_the_variable(monkeypatch, strict, outcome):
    monkeypatch.delenv(REQUIRE_REAL, raising=False)
    if strict:
        monkeypatch.setenv(REQUIRE_REAL, "1")
    with pytest.raises(outcome, match="no libvirtd here"):
        skip_or_fail("no libvirtd here")


@pytest.mark.parametrize("strict, code", [(False, 0), (True, 2)])
def test_make_fails_when_novas_venv_cannot_be_built_in_the_strict_mode(tmp_path, strict, code):
    # PYTHON=false: building the venv fails at once, nothing is installed.
    run = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "nova-venv",
            f"NOVA_VENV={tmp_path / 'venv'}",
            "PYTHON=false",
        ],
        cwd=REPO,
        env=_env(tmp_path, strict),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == code, run.stdout + run.stderr
    said = run.stdout + run.stderr
    assert ("ERROR" if strict else "WARNING") in said and "could not be built" in said
