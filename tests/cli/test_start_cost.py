"""What ``node-agent --once --dry-run`` loads: only what the run uses.

A dry-run without a ``[placement]`` section talks to no server, so it must
not pay for keystoneauth, requests or oslo.messaging (their imports and
keystoneauth's plugin scan were most of its start-up). The imports are read
from the interpreter's own ``-X importtime`` report of the real entry point.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.memory import DRY_RUN_LIBRARIES
from node_agent.deferred_imports import DEFERRED
from tests.cli.runner import write_config
from tests.hostdata import HOSTDATA

TEST6 = HOSTDATA / "virhostcpudata" / "linux-test6"
UNUSED_BY_A_DRY_RUN = ("keystoneauth1", "requests", "urllib3", "oslo_messaging")
# node-agent's own engine, which a dry-run without Placement never runs, and
# the owner mark's HMAC (OpenSSL): together about 0.08 s CPU and 3 MiB; and
# oslo.log's logging machinery (about 3 MiB), for a run that logs to stderr only
# (node_agent/logs.py; with a log file it is loaded: test_operator_lifecycle).
ENGINE_UNUSED_BY_A_DRY_RUN = (
    "node_agent.placement.sync",
    "node_agent.placement.reshaper",
    "node_agent.cycle.reconcile",
    "node_agent.cycle.audit",
    "node_agent.service.daemon",
    "node_agent.remote.messaging",
    "node_agent.cli.ctl",
    "node_agent.cli.decommission",
    "hmac",
    "oslo_log.log",
)
# What only libvirt or an option holding a uuid needs (issue 28): libvirt's XML
# parsers with xml.etree, and uuid (it loads platform); together about 10 ms
# CPU and 1 MiB a run, 0.4x `python -c pass` (BENCHMARKS.md, start-up).
UNUSED_WITHOUT_LIBVIRT = (
    "xml.etree.ElementTree",
    "node_agent.host.libvirt_facts",
    "node_agent.host.capabilities",
    "node_agent.host.domain",
    "node_agent.host.domain_capabilities",
    "node_agent.host.hypervisor_info",
    "node_agent.host.libvirt_xml",
    "node_agent.policy.shared_storage",
    "uuid",
    "platform",
)


def imported_by(config: Path, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    return _importtime("-m", "node_agent.cli.main", "--config-file", str(config), *args)


def _importtime(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return proc, modules


def test_dry_run_without_placement_imports_no_http_auth_or_messaging_library(tmp_path):
    proc, modules = imported_by(write_config(tmp_path, TEST6), "--once", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "node_agent.host.discover" in modules  # the report is read
    assert not {m for m in modules if m.split(".")[0] in UNUSED_BY_A_DRY_RUN}
    assert not modules & set(ENGINE_UNUSED_BY_A_DRY_RUN)


def test_dry_run_without_libvirt_loads_no_xml_parser_nor_uuid(tmp_path):
    proc, modules = imported_by(write_config(tmp_path, TEST6), "--once", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "connection_uri is empty" in proc.stdout  # libvirt was not read
    loaded = modules & set(UNUSED_WITHOUT_LIBVIRT)
    assert not loaded


def test_dry_run_loads_none_of_oslo_configs_deferred_libraries(tmp_path):
    """netaddr, rfc3986 and stevedore were half of oslo.config's import cost
    (BENCHMARKS.md, start-up). The top-level placeholder is not an import in
    ``-X importtime``'s report, so what is checked is that none of their
    modules ran."""
    proc, modules = imported_by(write_config(tmp_path, TEST6), "--once", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "oslo_config.cfg" in modules
    assert not {m for m in modules if m.split(".")[0] in DEFERRED}


def test_the_benchmarks_library_floor_holds_every_library_the_dry_run_loads(tmp_path):
    """BENCHMARKS.md (start-up) calls DRY_RUN_LIBRARIES every third-party
    module a dry run loads: the floor under its ratio."""
    proc, modules = imported_by(write_config(tmp_path, TEST6), "--once", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    floor, libraries = _importtime("-c", DRY_RUN_LIBRARIES)
    assert floor.returncode == 0, floor.stderr[-2000:]
    outside = {
        m
        for m in modules - libraries
        if m.split(".")[0] not in sys.stdlib_module_names and not m.startswith("node_agent")
    }
    assert not outside


def test_a_placement_section_is_checked_with_keystoneauth(tmp_path):
    config = write_config(
        tmp_path,
        TEST6,
        extra="[placement]\nauth_type = none\nendpoint_override = http://127.0.0.1:9\nregion = x\n",
    )
    proc, modules = imported_by(config, "--once", "--dry-run")
    assert proc.returncode == 78
    assert "unknown option [placement] region" in proc.stderr
    assert "keystoneauth1.loading" in modules
