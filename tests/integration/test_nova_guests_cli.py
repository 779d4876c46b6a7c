"""Guests as nova 34's libvirt driver writes them, on a real agent run.

The domains are the corpus nova's own driver wrote (``tests/data/nova_guests``),
served by libvirt's test driver; the host is the 16-CPU fixture
``virhostcpudata/linux-test4``. Before the agent read nova's extra specs, a
floating guest with a NUMA topology (every vCPU pinned to its cell's shared
CPUs) was taken for a pinned one outside ``cpu_dedicated_set`` and refused
every configuration, so every ``--once`` exited 1.
"""

import re
import uuid
from pathlib import Path

import pytest

from tests.integration.reshape_driver import HOST_XML, Host, allocate
from tests.integration.test_cli_reshape import once, write_config

pytestmark = pytest.mark.integration

CORPUS = Path(__file__).resolve().parents[1] / "data" / "nova_guests" / "xml"
# Cases of the corpus's two-node host: shared 0-1,6-7, dedicated 2-5,8-11.
SETS = "cpu_dedicated_set = 2-5,8-11\ncpu_shared_set = 0-1,6-7\n"
GUESTS = {
    "floating-numa": "two-nodes-smt--shared-numa1",
    "dedicated": "two-nodes-smt--dedicated",
    "mixed": "two-nodes-smt--mixed-mask",
}


def nova_host(host: Host, cases: dict[str, str]) -> dict[str, str]:
    """Point ``host`` at a test-driver file holding the corpus domains;
    returns name -> uuid."""
    head = HOST_XML.read_text().split("<domain", 1)[0]
    domains, uuids = [], {}
    for name, case in cases.items():
        xml = (CORPUS / f"{case}.xml").read_text()
        uuids[name] = str(uuid.uuid4())
        # The domain's uuid, and the same in nova's <sysinfo> (libvirt checks).
        xml = xml.replace(re.search(r"<uuid>([^<]+)</uuid>", xml).group(1), uuids[name])
        xml = re.sub(r"<name>[^<]+</name>", f"<name>{name}</name>", xml, count=1)
        domains.append(xml.replace('<domain type="kvm">', '<domain type="test">', 1))
    path = host.tmp / "nova-host.xml"
    path.write_text(head + "\n".join(domains) + "\n</node>\n")
    host.uri = f"test://{path}"
    return uuids


@pytest.fixture
def host(tmp_path, placement_server, host_name):
    return Host(tmp_path, placement_server.url, host_name)


def test_a_floating_numa_guest_nova_wrote_does_not_refuse_the_cpu_sets(host):
    uuids = nova_host(host, GUESTS)
    config = write_config(host, SETS)

    plan = once(config, "--dry-run", "--output", "json")
    assert plan.code == 0, plan.stderr
    report = plan.json()
    assert not (report["reshape"] or {}).get("refused")
    counted = {g["name"]: (g["policy"], g["rule"], g["VCPU"], g["PCPU"]) for g in report["guests"]}
    assert counted == {
        "floating-numa": ("shared", "flavor extra specs", 2, 0),
        "dedicated": ("dedicated", "flavor extra specs", 0, 4),
        "mixed": ("mixed", "flavor extra specs", 2, 2),
    }
    assert not [w for w in report["warnings"] if "floating-numa" in w]

    done = once(config, "--output", "json")
    assert done.code == 0, done.stderr
    inventories = host.inventories()
    assert (inventories["VCPU"]["total"], inventories["PCPU"]["total"]) == (4, 8)
    assert set(uuids) == {"floating-numa", "dedicated", "mixed"}


def test_the_audit_expects_what_nova_claims_for_each_guest(host):
    uuids = nova_host(host, GUESTS)
    config = write_config(host, SETS)
    assert once(config).code == 0
    root = host.root
    claims = {
        "floating-numa": {"VCPU": 2, "MEMORY_MB": 1024},
        "dedicated": {"PCPU": 4, "MEMORY_MB": 1024},
        "mixed": {"VCPU": 2, "PCPU": 2, "MEMORY_MB": 1024},
    }
    for name, resources in claims.items():
        allocate(host.scheduler, uuids[name], {root: resources})
    # Twice: a first sighting is pending, not an alarm.
    once(config, "--dry-run")
    audit = once(config, "--dry-run", "--output", "json").json()["audit"]
    assert [f for f in audit["findings"] if f["state"] == "alarm"] == []


def owner_of(case: str) -> tuple[str, str]:
    xml = (CORPUS / f"{case}.xml").read_text()
    project = re.search(r'<nova:project uuid="([^"]+)"', xml).group(1)
    user = re.search(r'<nova:user uuid="([^"]+)"', xml).group(1)
    return project.replace("-", ""), user.replace("-", "")


def test_nova_unit_test_expectations_of_the_pcpu_reshape_hold(host):
    """nova's test_update_provider_tree_for_pcpu_reshape, on the real
    Placement with domains nova's driver wrote: of a floating NUMA guest
    (a), a dedicated one (b), a floating one without NUMA (c) and a
    migration record whose dedicated instance (d) is being moved to another
    host, only b and the migration move from VCPU to PCPU."""
    cases = {
        "a": "one-node--shared-numa1",
        "b": "one-node--dedicated",
        "c": "one-node--shared",
        "d": "one-node--dedicated-hugepages",
    }
    uuids = nova_host(host, cases)
    assert once(write_config(host)).code == 0  # before the upgrade: VCPU only
    root = host.root
    migration, elsewhere = str(uuid.uuid4()), str(uuid.uuid4())
    host.scheduler.post("/resource_providers", {"name": f"{host.name}-2", "uuid": elsewhere})
    host.scheduler.put(
        f"/resource_providers/{elsewhere}/inventories",
        {
            "resource_provider_generation": 0,
            "inventories": {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}},
        },
    )
    vcpus = {"a": 2, "b": 4, "c": 4}
    claims = {
        uuids[k]: {root: {"VCPU": n, "MEMORY_MB": 1024, "DISK_GB": 10}} for k, n in vcpus.items()
    }
    claims[migration] = {root: {"VCPU": 2, "MEMORY_MB": 1024, "DISK_GB": 10}}
    claims[uuids["d"]] = {elsewhere: {"VCPU": 2, "MEMORY_MB": 1024}}
    project, user = owner_of(cases["a"])
    host.scheduler.post(
        "/allocations",
        {
            consumer: {
                "allocations": {rp: {"resources": res} for rp, res in by_rp.items()},
                "project_id": project,
                "user_id": user,
                "consumer_generation": None,
            }
            for consumer, by_rp in claims.items()
        },
    )

    assert once(write_config(host, SETS)).code == 0

    def held(consumer):
        return host.scheduler.get(f"/allocations/{consumer}")["allocations"]

    moved = {k: held(uuids[k])[root]["resources"] for k in ("a", "b", "c")}
    assert moved == {
        "a": {"VCPU": 2, "MEMORY_MB": 1024, "DISK_GB": 10},
        "b": {"PCPU": 4, "MEMORY_MB": 1024, "DISK_GB": 10},
        "c": {"VCPU": 4, "MEMORY_MB": 1024, "DISK_GB": 10},
    }
    assert held(migration)[root]["resources"] == {"PCPU": 2, "MEMORY_MB": 1024, "DISK_GB": 10}
    assert held(uuids["d"])[elsewhere]["resources"] == {"VCPU": 2, "MEMORY_MB": 1024}
