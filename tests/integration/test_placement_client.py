"""The Placement client against the real Placement (embedded, noauth2)."""

import json
import os
import socket
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from oslo_config import cfg

from node_agent import errors
from node_agent.config.options import register_opts
from node_agent.placement import microversions
from node_agent.placement.client import (
    AuthError,
    DuplicateName,
    GenerationConflict,
    InventoryInUse,
    NotFound,
    PlacementClient,
    PlacementError,
    Unavailable,
    version_refusal,
)

pytestmark = pytest.mark.integration

OPENSTACK = Path(sys.executable).parent / "openstack"


def _provider(client, name, inventories=None):
    rp = client.post("/resource_providers", {"name": name})
    if inventories:
        client.put(
            f"/resource_providers/{rp['uuid']}/inventories",
            {"resource_provider_generation": rp["generation"], "inventories": inventories},
        )
    return client.get(f"/resource_providers/{rp['uuid']}")


class NovaLikeClient(PlacementClient):
    """Writes allocations the way nova does today: typed, at 1.38."""

    MICROVERSION = "1.38"


def _allocate(client, rp_uuid, resources):
    nova = NovaLikeClient(client.adapter)
    consumer = str(uuid.uuid4())
    nova.put(
        f"/allocations/{consumer}",
        {
            "allocations": {rp_uuid: {"resources": resources}},
            "project_id": str(uuid.uuid4()),
            "user_id": str(uuid.uuid4()),
            "consumer_generation": None,
            "consumer_type": "INSTANCE",
        },
    )
    return consumer


def _closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_server_offers_the_microversion_the_agent_needs(placement):
    server_max = placement.check_version()

    assert microversions.at_least(server_max, PlacementClient.MICROVERSION)


def test_client_needing_a_newer_version_than_the_server_is_refused(placement_server):
    class FutureClient(PlacementClient):
        MICROVERSION = "1.999"

    client = FutureClient.for_endpoint(placement_server.url)

    with pytest.raises(PlacementError) as exc:
        client.check_version()
    assert f"Placement at {placement_server.url}" in str(exc.value)
    assert "node-agent needs 1.999" in str(exc.value)


def test_real_root_document_of_a_pre_reshaper_server_names_what_is_missing(placement):
    root = placement.get("/")["versions"][0]

    refusal = version_refusal("http://placement", root["min_version"], "1.29")

    assert refusal.startswith(
        "Placement at http://placement supports up to 1.29; node-agent "
        f"needs {microversions.REQUIRED}"
    )
    assert "1.30 POST /reshaper" in refusal
    assert version_refusal("http://placement", root["min_version"], root["max_version"]) is None


def test_unknown_provider_is_not_found(placement):
    with pytest.raises(NotFound) as exc:
        placement.get(f"/resource_providers/{uuid.uuid4()}")

    assert exc.value.status == 404
    assert exc.value.request_id == placement.last_request_id
    assert exc.value.request_id.startswith("req-")


def test_inventory_write_with_stale_generation_is_a_generation_conflict(placement, host_name):
    rp = _provider(placement, host_name, {"VCPU": {"total": 8}})
    stale = rp["generation"] - 1

    with pytest.raises(GenerationConflict) as exc:
        placement.put(
            f"/resource_providers/{rp['uuid']}/inventories",
            {"resource_provider_generation": stale, "inventories": {"VCPU": {"total": 16}}},
        )

    assert exc.value.status == 409
    assert exc.value.code == "placement.concurrent_update"
    assert exc.value.method == "PUT"


def test_removing_an_allocated_resource_class_is_inventory_in_use(placement, host_name):
    rp = _provider(placement, host_name, {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 4096}})
    _allocate(placement, rp["uuid"], {"VCPU": 6})
    rp = placement.get(f"/resource_providers/{rp['uuid']}")

    with pytest.raises(InventoryInUse) as exc:
        placement.put(
            f"/resource_providers/{rp['uuid']}/inventories",
            {
                "resource_provider_generation": rp["generation"],
                "inventories": {"MEMORY_MB": {"total": 4096}},
            },
        )

    assert exc.value.code == "placement.inventory.inuse"
    assert "VCPU" in exc.value.detail


def test_shrinking_total_below_usage_is_accepted_by_placement(placement, host_name):
    # Placement only refuses removing an allocated class, not overcommit:
    # the sync engine must not count on a 409 to protect running guests.
    rp = _provider(placement, host_name, {"VCPU": {"total": 8}})
    _allocate(placement, rp["uuid"], {"VCPU": 6})
    rp = placement.get(f"/resource_providers/{rp['uuid']}")

    placement.put(
        f"/resource_providers/{rp['uuid']}/inventories",
        {"resource_provider_generation": rp["generation"], "inventories": {"VCPU": {"total": 2}}},
    )

    usages = placement.get(f"/resource_providers/{rp['uuid']}/usages")
    assert usages["usages"] == {"VCPU": 6}


def test_second_provider_with_the_same_name_is_a_duplicate_name(placement, host_name):
    placement.post("/resource_providers", {"name": host_name})

    with pytest.raises(DuplicateName):
        placement.post("/resource_providers", {"name": host_name})


def test_token_without_admin_role_is_an_auth_error(placement_server):
    client = PlacementClient.for_endpoint(placement_server.url, token="somebody")

    with pytest.raises(AuthError) as exc:
        client.get("/resource_providers")

    assert exc.value.status == 403


def test_closed_port_is_unavailable_after_bounded_retries():
    url = f"http://127.0.0.1:{_closed_port()}"
    client = PlacementClient.for_endpoint(url, retries=2, backoff=0.01)

    with pytest.raises(Unavailable) as exc:
        client.get("/resource_providers")

    assert url in str(exc.value)
    assert client.stats.log == [("GET", "/resource_providers", 0)] * 3


def test_stats_count_every_request_sent(placement, host_name):
    rp = _provider(placement, host_name, {"VCPU": {"total": 4}})
    with pytest.raises(NotFound):
        placement.delete(f"/resource_providers/{uuid.uuid4()}")

    assert placement.stats.log == [
        ("POST", "/resource_providers", 200),
        ("PUT", f"/resource_providers/{rp['uuid']}/inventories", 200),
        ("GET", f"/resource_providers/{rp['uuid']}", 200),
        ("DELETE", placement.stats.log[-1][1], 404),
    ]
    assert (placement.stats.reads, placement.stats.writes, placement.stats.total) == (1, 3, 4)
    placement.stats.reset()
    assert placement.stats.total == 0


def test_reshaper_is_open_to_the_admin_token_and_keeps_consumer_type(placement, host_name):
    root = _provider(placement, host_name, {"VCPU": {"total": 8}})
    child = placement.post(
        "/resource_providers", {"name": f"{host_name}-numa0", "parent_provider_uuid": root["uuid"]}
    )
    consumer = _allocate(placement, root["uuid"], {"VCPU": 2})
    allocation = placement.get(f"/allocations/{consumer}")
    root = placement.get(f"/resource_providers/{root['uuid']}")

    placement.post(
        "/reshaper",
        {
            "inventories": {
                root["uuid"]: {
                    "resource_provider_generation": root["generation"],
                    "inventories": {},
                },
                child["uuid"]: {
                    "resource_provider_generation": child["generation"],
                    "inventories": {"VCPU": {"total": 8}},
                },
            },
            "allocations": {
                consumer: {
                    "allocations": {child["uuid"]: {"resources": {"VCPU": 2}}},
                    "project_id": allocation["project_id"],
                    "user_id": allocation["user_id"],
                    "consumer_generation": allocation["consumer_generation"],
                }
            },
        },
    )

    moved = NovaLikeClient(placement.adapter).get(f"/allocations/{consumer}")
    assert list(moved["allocations"]) == [child["uuid"]]
    assert moved["consumer_type"] == "INSTANCE"
    assert placement.get(f"/resource_providers/{root['uuid']}/inventories")["inventories"] == {}


def test_osc_placement_reads_back_inventory_written_by_the_client(
    placement_server, placement, host_name
):
    rp = _provider(
        placement, host_name, {"VCPU": {"total": 12, "reserved": 2, "allocation_ratio": 4.0}}
    )

    result = subprocess.run(
        [
            str(OPENSTACK),
            "--os-auth-type",
            "admin_token",
            "--os-token",
            "admin",
            "--os-endpoint",
            placement_server.url,
            "--os-placement-api-version",
            PlacementClient.MICROVERSION,
            "resource",
            "provider",
            "inventory",
            "list",
            rp["uuid"],
            "-f",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OS_CLOUD": ""},
        check=False,
    )

    assert result.returncode == 0, result.stderr
    [row] = json.loads(result.stdout)
    assert (row["resource_class"], row["total"], row["reserved"], row["allocation_ratio"]) == (
        "VCPU",
        12,
        2,
        4.0,
    )


def test_server_serves_concurrent_requests(placement_server, host_name):
    def create(i):
        client = PlacementClient.for_endpoint(placement_server.url)
        return client.post("/resource_providers", {"name": f"{host_name}-{i}"})

    with ThreadPoolExecutor(8) as pool:
        created = list(pool.map(create, range(16)))

    assert len({rp["uuid"] for rp in created}) == 16


def test_restarted_server_keeps_its_url_and_providers(fresh_placement_server, host_name):
    client = PlacementClient.for_endpoint(fresh_placement_server.url, retries=0)
    rp = _provider(client, host_name, {"VCPU": {"total": 8}})
    url = fresh_placement_server.url

    fresh_placement_server.kill()
    with pytest.raises(Unavailable):
        client.get(f"/resource_providers/{rp['uuid']}")
    fresh_placement_server.restart()

    assert fresh_placement_server.url == url
    assert client.get(f"/resource_providers/{rp['uuid']}") == rp


def _conf_from(tmp_path, text):
    path = tmp_path / "node-agent.conf"
    path.write_text(text)
    conf = cfg.ConfigOpts()
    register_opts(conf)
    conf(args=[], default_config_files=[str(path)])
    return conf


def test_client_from_config_file_talks_to_placement(placement_server, tmp_path, host_name):
    conf = _conf_from(
        tmp_path,
        (
            "[placement]\nauth_type = admin_token\ntoken = admin\n"
            f"endpoint = {placement_server.url}\n"
            f"endpoint_override = {placement_server.url}\n"
        ),
    )

    client = PlacementClient.from_conf(conf)

    assert microversions.at_least(client.check_version(), microversions.REQUIRED)
    client.post("/resource_providers", {"name": host_name})
    found = client.get(f"/resource_providers?name={host_name}")
    assert [rp["name"] for rp in found["resource_providers"]] == [host_name]


def test_config_without_auth_type_is_a_config_error(tmp_path):
    conf = _conf_from(tmp_path, "[placement]\n")

    with pytest.raises(errors.ConfigError, match=r"\[placement\] auth_type"):
        PlacementClient.from_conf(conf)


def test_password_auth_without_auth_url_names_the_missing_option(tmp_path):
    conf = _conf_from(
        tmp_path, ("[placement]\nauth_type = password\nusername = agent\npassword = s3cret-value\n")
    )

    with pytest.raises(errors.ConfigError) as exc:
        PlacementClient.from_conf(conf)

    assert "[placement] auth_url" in str(exc.value)
    assert "s3cret-value" not in str(exc.value)
