"""`make install-service` says what it installs and upgrades nothing
unasked. Run with every privileged command echoed (SUDO="echo would-run:"),
so the machine is not changed; apt-get only simulates."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def install_service(*variables):
    """`make install-service` with every privileged command echoed, not run:
    what it would install, and whether it stops first."""
    if shutil.which("make") is None or shutil.which("dpkg") is None:
        pytest.skip("needs make and dpkg (Debian)")
    return subprocess.run(
        ["make", "-s", "-C", str(ROOT), "install-service", "SUDO=echo would-run:", *variables],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_service_install_builds_the_journal_bindings_only_when_asked():
    """`use_journal = true` needs the `journal` extra (Debian's python3-systemd
    is not seen by a virtualenv), built against libsystemd-dev, whose install
    upgrades systemd: only with JOURNAL=yes."""
    plain = install_service()
    assert plain.returncode == 0, plain.stderr
    assert "libsystemd-dev" not in plain.stdout + plain.stderr
    assert "[journal]" not in plain.stdout
    assert "pip install -q -c requirements.txt" in plain.stdout
    if (ROOT / ".git").exists():  # the installed copy has no .git: the version is written in
        assert re.search(r"^node-agent version: [0-9.]+\+g[0-9a-f]{12}", plain.stdout, re.M)
    asked = install_service("JOURNAL=yes", "ALLOW_UPGRADES=yes")
    assert asked.returncode == 0, asked.stderr
    assert "[journal]" in asked.stdout
    assert "libsystemd-dev" in asked.stdout


def would_upgrade(package):
    """Whether installing ``package`` upgrades installed packages here."""
    simulated = subprocess.run(
        ["apt-get", "-s", "-q", "install", "--no-install-recommends", package],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return re.search(r"^Inst \S+ \[", simulated, re.M) is not None


def test_the_service_install_upgrades_no_installed_package_unasked():
    if shutil.which("apt-get") is None:
        pytest.skip("needs apt-get")
    result = install_service("JOURNAL=yes")
    if "would also upgrade" not in result.stderr and not would_upgrade("libsystemd-dev"):
        pytest.skip("installing libsystemd-dev upgrades nothing on this machine")
    assert result.returncode != 0, result.stdout
    assert "would also upgrade these installed packages" in result.stderr
    assert "libsystemd0 " in result.stderr, result.stderr
    assert "ALLOW_UPGRADES=yes" in result.stderr
    assert "would-run: apt-get install" not in result.stdout
    assert "would-run: useradd" not in result.stdout  # it stops before anything else
