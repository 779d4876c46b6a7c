"""Companion mode beside nova 34's own nova-compute (tests/integration/nova_cloud.py).

nova-compute, with nova's libvirt driver against the suite's private
libvirtd and a conductor, reports its compute node to a real Placement of
this module's own; the agent then runs in companion mode on the same host
with the same nova.conf. One cloud serves every test of the module.

``make test-nova-cloud`` runs this module alone.
"""

from __future__ import annotations

import json

import pytest

from devenv.embedded_placement import start_subprocess
from node_agent.placement.client import PlacementClient
from tests.cli.runner import Result, run_agent
from tests.integration.nova_cloud import NovaCloud, unavailable_reason
from tests.machine_id import isolated_config
from tests.real_parts import skip_or_fail

pytestmark = pytest.mark.integration

# The host has 2 CPUs (CI's machine): CPU 0 shared, CPU 1 dedicated, so
# nova reports both VCPU and PCPU.
CPU_SETS = "cpu_shared_set = 0\ncpu_dedicated_set = 1\n"

# Differences between what nova-compute reported and what the agent would
# publish on this host, each with its reason. Anything else is a failure.
#
# * MEMORY_MB total: nova reads libvirt's virNodeGetInfo, which sums the
#   NUMA nodes' meminfo; the agent reads the kernel's MemTotal. On a machine
#   whose node meminfo does not add up to MemTotal (this sandbox: the agent
#   warns about it) they differ.
# * HW_CPU_X86_* traits the agent finds and nova does not: nova takes CPU
#   features from baselineCPU(host-model, EXPAND_FEATURES) through its
#   CPU_TRAITS_MAPPING; the agent from the capabilities' host CPU. The
#   whole-driver conformance work aligns them.
KNOWN_INVENTORY_DRIFT = {"MEMORY_MB total"}


def _known_trait_drift(item: dict) -> bool:
    return (
        item["kind"] == "trait"
        and item["subject"].startswith("trait HW_CPU_X86_")
        and (item["placement"], item["host"]) == ("absent", "present")
    )


@pytest.fixture(scope="module")
def nova_cloud(tmp_path_factory, libvirtd, rabbitmq):
    reason = unavailable_reason()
    if reason:
        skip_or_fail(reason)
    base = tmp_path_factory.mktemp("nova-cloud")
    placement = start_subprocess(base / "placement")
    cloud = NovaCloud(
        base / "nova",
        placement_url=placement.url,
        transport_url=rabbitmq,
        libvirt_uri=libvirtd.rw_uri,
        compute=CPU_SETS,
    )
    try:
        cloud.create_databases()
        cloud.start_service("nova-conductor")
        cloud.start_service("nova-compute")
        cloud.placement = PlacementClient.for_endpoint(placement.url)
        cloud.root = cloud.wait_for(
            lambda: _reported_root(cloud),
            "nova-compute's compute node in Placement",
            "nova-compute",
        )
        yield cloud
    finally:
        cloud.stop()
        placement.stop()


def _reported_root(cloud) -> str | None:
    """The compute node provider's uuid once nova-compute has set its
    inventory and its traits (its first update), else None."""
    found = cloud.placement.get(f"/resource_providers?name={cloud.host}")["resource_providers"]
    if not found:
        return None
    uuid = found[0]["uuid"]
    inventories = cloud.placement.get(f"/resource_providers/{uuid}/inventories")["inventories"]
    traits = cloud.placement.get(f"/resource_providers/{uuid}/traits")["traits"]
    return uuid if inventories and "OWNER_NOVA" in traits else None


def companion(cloud, tmp_path, *args: str) -> Result:
    """The agent in companion mode with nova's nova.conf, as on the host."""
    conf = tmp_path / "node-agent.conf"
    conf.write_text(
        isolated_config(tmp_path) + f"[agent]\nmode = companion\nstate_path = {tmp_path}/state\n"
    )
    return run_agent("--config-file", str(cloud.conf), "--config-file", str(conf), *args)


def test_drift_on_the_host_nova_compute_just_reported_is_only_the_explained_differences(
    nova_cloud, tmp_path
):
    run = companion(nova_cloud, tmp_path, "--once", "--output", "json")
    assert run.code in (0, 3), run.stderr
    report = run.json()["companion"]
    assert (report["found"], report["root_uuid"], report["owner"]) == (
        True,
        nova_cloud.root,
        "nova-compute",
    )
    unexplained = [
        d
        for d in report["drift"]
        if not (_known_trait_drift(d) or d["subject"] in KNOWN_INVENTORY_DRIFT)
    ]
    assert unexplained == [], json.dumps(report["drift"], indent=1)
    # CPU sets, reserved values, ratios, disk: nova's and the agent's agree.
    subjects = {d["subject"] for d in report["drift"]}
    for rc in ("VCPU", "PCPU", "DISK_GB"):
        assert not any(s.startswith(rc) for s in subjects), subjects
    assert run.json()["changes"] == []
    assert report["next_restart"]["reshape"] is None
    assert run.json()["audit"]["alarms"] == 0
    print("drift beside nova-compute:", json.dumps(report["drift"], indent=1))
