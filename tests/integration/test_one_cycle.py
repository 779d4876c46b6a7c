"""One cycle, three ways (STYLE.md habit 14): the same fixture host through
``node-agent --once`` (direct), the service process (direct) and
``node-agent --once`` with ``upstream = messaging`` (a real
node-agent-applier on a real RabbitMQ) leaves the same tree in the real
Placement, and the two ``--once`` runs print the same report. Each way
reports a host of its own name, so the three trees sit side by side."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from node_agent.policy.root_owner import MARK_PREFIX
from tests.integration.agent_process import AGENT, AgentProcess
from tests.integration.test_applier import bus, messaging_service  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

# A split host: PCPU and VCPU both published, so the CPU partition shows.
CPUS = "[compute]\ncpu_dedicated_set = 4-15\ncpu_shared_set = 0-3\n"


def placement_view(placement, host: str) -> dict:
    """The host's tree as Placement holds it, names relative to the host,
    without uuids and the machine's owner mark."""
    (root,) = placement.providers_named(host)
    by_uuid = {rp["uuid"]: rp for rp in placement.providers_in_tree(root["uuid"])}
    view = {}
    for rp in by_uuid.values():
        parent = by_uuid.get(rp.get("parent_provider_uuid") or "")
        view[rp["name"].replace(host, "HOST", 1)] = {
            "parent": parent["name"].replace(host, "HOST", 1) if parent else None,
            "inventories": placement.inventories(rp["uuid"])["inventories"],
            "traits": sorted(
                t for t in placement.traits(rp["uuid"])["traits"] if not t.startswith(MARK_PREFIX)
            ),
        }
    return view


def once(config, host: str) -> dict:
    """``node-agent --once --output json``: its report, names relative to the
    host and without uuids or owner marks (each host has its own)."""
    run = subprocess.run(
        [str(AGENT), "--once", "--output", "json", "--config-file", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    # Each host is a machine of its own (tests/machine_id.py): its mark too.
    report = json.loads(
        re.sub(r"CUSTOM_OWNER_NODE_AGENT_[0-9A-F]+", "MARK", run.stdout.replace(host, "HOST"))
    )
    for provider in report["providers"]:
        provider.pop("uuid", None)
    return {key: report[key] for key in ("providers", "reshape", "errors", "warnings", "guests")}


def split(agent: AgentProcess) -> None:
    agent.write_config(agent.config_text().replace("[compute]\n", CPUS, 1))


def test_once_the_service_and_the_applier_leave_the_same_tree_and_report(
    bus, tmp_path, placement, host_name
):
    direct = AgentProcess(tmp_path / "once", placement.endpoint, f"{host_name}-once")
    split(direct)
    direct_report = once(direct.config, direct.host)

    service = AgentProcess(tmp_path / "service", placement.endpoint, f"{host_name}-svc")
    split(service)
    service.start()
    try:
        service.status_after(lambda s: s.startswith("ok:"), timeout=60)
    finally:
        assert service.stop() == 0

    bus.start(1)
    via = messaging_service(bus, tmp_path / "via", f"{host_name}-via")
    via.write_config(via.config.read_text().replace("[compute]\n", CPUS, 1))
    via_report = once(via.config, via.host)

    expected = placement_view(placement, direct.host)
    assert {"VCPU", "PCPU"} <= set(expected["HOST"]["inventories"])
    assert placement_view(placement, service.host) == expected
    assert placement_view(placement, via.host) == expected
    assert via_report == direct_report
