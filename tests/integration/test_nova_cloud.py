"""Companion mode beside nova 34's own nova-compute (tests/integration/nova_cloud.py).

nova-compute, with nova's libvirt driver against the suite's private
libvirtd and a conductor, reports its compute node to a real Placement of
this module's own; the agent then runs in companion mode on the same host
with the same nova.conf. One cloud serves every test of the module.

``make test-nova-cloud`` runs this module alone.
"""

from __future__ import annotations

import json

import libvirt
import pytest

from devenv.embedded_placement import start_subprocess
from node_agent.placement.client import PlacementClient
from tests.cli.runner import Result, run_agent
from tests.integration.nova_cloud import ImageService, NovaCloud, unavailable_reason
from tests.integration.postgres_server import PostgresCluster, _pg_bin
from tests.machine_id import isolated_config
from tests.real_parts import skip_or_fail

pytestmark = pytest.mark.integration

# The host has 2 CPUs (CI's machine). nova-compute starts as a host before
# the CPU sets (every CPU is VCPU; nova pins "dedicated" guests on VCPU);
# the reshape test then makes the pinned guest's CPU dedicated, the other shared.
# Drift on the host nova-compute just reported is none: MEMORY_MB total is
# libvirt's virNodeGetInfo on both sides (this sandbox's NUMA node holds less
# than the kernel's MemTotal), and the CPU feature traits nova's table does
# not decide are not compared on nova's root.


@pytest.fixture(scope="module")
def nova_cloud(tmp_path_factory, libvirtd, rabbitmq):
    reason = unavailable_reason()
    if reason:
        skip_or_fail(reason)
    if _pg_bin("initdb") is None:
        skip_or_fail("PostgreSQL's server binaries are not installed (apt-get install postgresql)")
    base = tmp_path_factory.mktemp("nova-cloud")
    placement = start_subprocess(base / "placement")
    images = ImageService()
    postgres = PostgresCluster().start()
    cloud = None
    try:
        for name in ("nova_api", "nova", "nova_cell0"):
            postgres.createdb(name)
        cloud = NovaCloud(
            base / "nova",
            placement_url=placement.url,
            transport_url=rabbitmq,
            libvirt_uri=libvirtd.rw_uri,
            glance_url=images.url,
            database_url=f"postgresql+psycopg2://postgres@127.0.0.1:{postgres.port}/",
        )
        cloud.images = images
        cloud.create_databases()
        for service in ("nova-conductor", "nova-scheduler", "nova-compute"):
            cloud.start_service(service)
        cloud.start_api()
        cloud.placement = PlacementClient.for_endpoint(placement.url)
        cloud.root = cloud.wait_for(
            lambda: _reported_root(cloud),
            "nova-compute's compute node in Placement",
            "nova-compute",
        )
        cloud.discover_hosts()
        yield cloud
    finally:
        if cloud is not None:
            cloud.stop()
        for dom in libvirtd.rw().listAllDomains(0):
            if dom.name().startswith("instance-"):
                dom.destroy() if dom.isActive() else None
                dom.undefine()
        postgres.stop()
        images.stop()
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


def _memory_reported(cloud, libvirtd) -> bool:
    """Whether nova-compute's MEMORY_MB total is libvirt's figure now. This
    sandbox's VM hot-plugs memory under load, so the NUMA node's MemTotal
    moves and nova-compute reports the new figure only at its next periodic
    update (60 s)."""
    conn = libvirt.openReadOnly(libvirtd.ro_uri)
    try:
        total = conn.getInfo()[1]
    finally:
        conn.close()
    inventories = cloud.placement.get(f"/resource_providers/{cloud.root}/inventories")
    return inventories["inventories"]["MEMORY_MB"]["total"] == total


def test_drift_on_the_host_nova_compute_just_reported_is_none(nova_cloud, tmp_path, libvirtd):
    nova_cloud.wait_for(
        lambda: _memory_reported(nova_cloud, libvirtd),
        "nova-compute's report of the memory libvirt gives now",
        "nova-compute",
    )
    run = companion(nova_cloud, tmp_path, "--once", "--output", "json")
    report = run.json()["companion"]
    assert report["drift"] == [], json.dumps(report["drift"], indent=1)
    assert run.code == 0, (run.stderr, run.stdout)
    assert (report["found"], report["root_uuid"], report["owner"]) == (
        True,
        nova_cloud.root,
        "nova-compute",
    )
    assert run.json()["changes"] == []
    assert report["next_restart"]["reshape"] is None
    assert run.json()["audit"]["alarms"] == 0


# -- guests booted through nova's API and scheduler

FLAVORS = {
    "pinned": {"hw:cpu_policy": "dedicated"},
    "floating": {},
    "floating-numa": {"hw:numa_nodes": "1"},
    "floating-big": {},  # the resize target: more memory, same vCPUs
}


def _wait_status(cloud, server: str, status: str) -> dict:
    def reached():
        shown = cloud.api("GET", f"/servers/{server}")["server"]
        if shown["status"] == "ERROR":
            raise AssertionError(f"{shown['name']}: {shown.get('fault', {}).get('message')}")
        return shown if shown["status"] == status else None

    return cloud.wait_for(reached, f"server {server} {status}", "nova-compute")


@pytest.fixture(scope="module")
def guests(nova_cloud):
    """name -> server uuid: a pinned guest, a floating one, a floating one
    with a NUMA topology, and one resized (same host) and left unconfirmed.
    Huge pages: only where the host has free ones (CI's machine has none);
    mixed: needs a shared and a dedicated CPU free at once, more than two
    CPUs give once the pinned guest holds the only dedicated one."""
    cloud = nova_cloud
    flavor_ids = {}
    for name, extra in FLAVORS.items():
        ram = 128 if name == "floating-big" else 64
        made = cloud.api(
            "POST", "/flavors", {"flavor": {"name": name, "vcpus": 1, "ram": ram, "disk": 1}}
        )["flavor"]
        if extra:
            cloud.api("POST", f"/flavors/{made['id']}/os-extra_specs", {"extra_specs": extra})
        flavor_ids[name] = made["id"]
    booted = {}
    for name, flavor in (
        ("pinned", "pinned"),
        ("floating", "floating"),
        ("floating-numa", "floating-numa"),
        ("resizing", "floating"),
    ):
        booted[name] = cloud.api(
            "POST",
            "/servers",
            {
                "server": {
                    "name": name,
                    "imageRef": cloud.images.IMAGE_ID,
                    "flavorRef": flavor_ids[flavor],
                    "networks": "none",
                }
            },
        )["server"]["id"]
        # One at a time: the scheduler's claims of concurrent boots race for
        # the root's generation on this one host.
        _wait_status(cloud, booted[name], "ACTIVE")
    cloud.api(
        "POST",
        f"/servers/{booted['resizing']}/action",
        {"resize": {"flavorRef": flavor_ids["floating-big"]}},
    )
    _wait_status(cloud, booted["resizing"], "VERIFY_RESIZE")
    return booted


def _allocations(cloud) -> dict:
    """consumer -> {resource class: amount} on nova's root."""
    held = cloud.placement.get(f"/resource_providers/{cloud.root}/allocations")["allocations"]
    return {consumer: dict(a["resources"]) for consumer, a in held.items()}


def test_audit_raises_no_alarm_on_novas_own_guests(nova_cloud, guests, tmp_path):
    held = _allocations(nova_cloud)
    # The resize in flight: the instance holds the new flavor, its migration the old.
    assert set(guests.values()) <= set(held)
    assert len(held) == len(guests) + 1, held
    first = companion(nova_cloud, tmp_path, "audit", "--output", "json")
    again = companion(nova_cloud, tmp_path, "audit", "--output", "json")
    audit = again.json()["audit"]
    print("audit beside nova:", json.dumps(audit["findings"], indent=1))
    assert (first.code, again.code) == (0, 0), first.stderr
    assert audit["alarms"] == 0, json.dumps(audit["findings"], indent=1)
    assert audit["consumers"] == len(held)
    states = {f["consumer"]: f["state"] for f in audit["findings"] if "consumer" in f}
    assert set(states.values()) <= {"in_flight"}, audit["findings"]


def _restart_nova_compute(cloud) -> int:
    """Restart nova-compute; the size its log had before (where the new
    process's lines begin)."""
    log = cloud.logs / "nova-compute.log"
    cloud.stop_service("nova-compute")
    offset = log.stat().st_size if log.exists() else 0
    cloud.start_service("nova-compute")
    return offset


def _log_since(cloud, offset: int) -> str:
    with open(cloud.logs / "nova-compute.log", errors="replace") as log:
        log.seek(offset)
        return log.read()


def test_reshape_preview_is_what_nova_compute_does_at_its_restart(
    nova_cloud, guests, tmp_path, libvirtd
):
    cloud = nova_cloud
    before = _allocations(cloud)
    xml = libvirtd.rw().lookupByUUIDString(guests["pinned"]).XMLDesc(0)
    pinned_cpu = xml.split("<vcpupin vcpu='0' cpuset='", 1)[1].split("'", 1)[0]
    other_cpu = 1 - int(pinned_cpu)

    # First the CPU nova pinned the guest to left out of cpu_dedicated_set:
    # nova-compute starts, but its resource tracker pins the guest on the
    # dedicated CPUs again at its first update and fails (CPUPinningUnknown),
    # so it never reshapes. The preview says so instead of a reshape.
    cloud.write_conf(f"cpu_shared_set = {pinned_cpu}\ncpu_dedicated_set = {other_cpu}\n")
    preview = companion(cloud, tmp_path, "--once", "--dry-run", "--output", "json")
    assert preview.code == 0, preview.stderr
    restart = preview.json()["companion"]["next_restart"]
    assert restart["reshape"] is None, restart
    (blocked,) = restart["blocking"]
    assert f"({guests['pinned']}) is pinned to host CPUs {pinned_cpu};" in blocked, blocked
    assert f"CPUs {pinned_cpu} are outside cpu_dedicated_set = '{other_cpu}'" in blocked
    assert "CPUPinningUnknown" in blocked and "does not reshape" in blocked

    offset = _restart_nova_compute(cloud)
    failed = cloud.wait_for(
        lambda: "CPUPinningUnknown" in _log_since(cloud, offset) and _log_since(cloud, offset),
        "nova-compute's first resource update after its restart",
        "nova-compute",
    )
    assert "Error updating resources for node" in failed
    print(
        "nova-compute after the blocking change:\n",
        "\n".join(
            line for line in failed.splitlines() if "CPUPinningUnknown" in line or "ERROR" in line
        )[:3000],
    )
    assert cloud.procs["nova-compute"].poll() is None  # it runs, reporting nothing
    inventories = cloud.placement.get(f"/resource_providers/{cloud.root}/inventories")
    assert "PCPU" not in inventories["inventories"]
    assert _allocations(cloud) == before

    # Then the pinned guest's CPU dedicated, the other shared: nova reshapes.
    cloud.write_conf(f"cpu_shared_set = {other_cpu}\ncpu_dedicated_set = {pinned_cpu}\n")
    preview = companion(cloud, tmp_path, "--once", "--dry-run", "--output", "json")
    assert preview.code == 0, preview.stderr
    restart = preview.json()["companion"]["next_restart"]
    assert restart["blocking"] == [], restart
    predicted = {
        c["consumer"]: sorted((m["from_class"], m["to_class"], m["amount"]) for m in c["moves"])
        for c in (restart["reshape"] or {}).get("consumers", [])
    }

    _restart_nova_compute(cloud)

    def reshaped():
        inventories = cloud.placement.get(f"/resource_providers/{cloud.root}/inventories")
        return "PCPU" in inventories["inventories"]

    cloud.wait_for(reshaped, "nova-compute's PCPU inventory after its restart", "nova-compute")
    after = _allocations(cloud)
    assert set(after) == set(before)
    done = {}
    for consumer, resources in after.items():
        gone = {rc: n for rc, n in before[consumer].items() if resources.get(rc) != n}
        new = {rc: n for rc, n in resources.items() if before[consumer].get(rc) != n}
        if gone or new:
            assert len(gone) == len(new) == 1, (consumer, before[consumer], resources)
            ((src, amount),) = gone.items()
            ((dst, moved),) = new.items()
            assert amount == moved
            done[consumer] = [(src, dst, amount)]
    # Consumer by consumer: the pinned guest's VCPU became PCPU; the
    # floating guests, the NUMA one and both halves of the resize stayed.
    assert predicted == done, json.dumps({"preview": predicted, "nova": done}, indent=1)
    assert done == {guests["pinned"]: [("VCPU", "PCPU", 1)]}


def test_audit_alarms_on_a_guest_whose_allocation_we_removed(nova_cloud, guests, tmp_path):
    cloud = nova_cloud
    cloud.placement.delete(f"/allocations/{guests['floating']}")
    companion(cloud, tmp_path, "audit", "--output", "json")  # first seen: pending
    run = companion(cloud, tmp_path, "audit", "--output", "json")
    assert run.code == 1, (run.stderr, run.stdout)
    findings = run.json()["audit"]["findings"]
    alarms = [f for f in findings if f["state"] == "alarm" and f["kind"] == "no_allocation"]
    assert [f["consumer"] for f in alarms] == [guests["floating"]], json.dumps(findings, indent=1)
