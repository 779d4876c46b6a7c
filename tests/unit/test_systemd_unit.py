"""The shipped systemd unit: systemd's own checker, and the settings the
agent relies on (Type=notify with a watchdog, reload by SIGHUP)."""

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "node-agent.service"


def unit_section(name):
    parser = configparser.RawConfigParser(strict=False)
    parser.optionxform = str
    parser.read(UNIT)
    return parser[name]


def test_unit_is_a_notify_service_with_watchdog_reload_and_sandbox():
    service = unit_section("Service")
    assert service["Type"] == "notify"
    assert int(service["WatchdogSec"]) > 5  # the agent pings every 5 s or sooner
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["Restart"] == "on-failure"
    assert service["User"] == "node-agent"
    assert service["StateDirectory"] == "node-agent"
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "ReadOnlyPaths": "/sys",
        "SupplementaryGroups": "libvirt",
        "LogsDirectory": "node-agent",
        "RestartPreventExitStatus": "78",
    }.items():
        assert service[key] == value, key


def test_unit_grants_the_documented_write_paths():
    # state_path's default, log_dir = /var/log/node-agent (LogsDirectory),
    # and Debian node_exporter's textfile directory when it exists.
    writable = unit_section("Service")["ReadWritePaths"].split()
    assert "/var/lib/node-agent" in writable
    assert "-/var/lib/prometheus/node-exporter" in writable


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    # verify checks that ExecStart exists: point it at this venv's script.
    agent = Path(sys.executable).with_name("node-agent")
    unit = tmp_path / "node-agent.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/node-agent", str(agent)))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "node-agent.service" not in result.stderr, result.stderr


def test_the_config_directory_mode_is_the_one_make_install_service_gives_it():
    """systemd logs "ConfigurationDirectory 'node-agent' already exists but
    the mode is different" at every start and reload when the unit's mode
    (0755 by default) is not the one the install made (seen under systemd)."""
    import re

    makefile = (UNIT.parents[1] / "Makefile").read_text()
    made = re.search(r"install -d -m (\d+) -o root -g node-agent /etc/node-agent", makefile)
    assert made is not None
    for unit in (UNIT, UNIT.with_name("node-agent-applier.service")):
        parser = configparser.RawConfigParser(strict=False)
        parser.optionxform = str
        parser.read(unit)
        service = parser["Service"]
        assert service["ConfigurationDirectory"] == "node-agent"
        assert service.get("ConfigurationDirectoryMode") == made.group(1), unit.name
