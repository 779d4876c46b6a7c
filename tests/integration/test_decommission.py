"""``node-agent decommission`` through the real CLI against the real Placement."""

import uuid

import pytest

from node_agent.state import StateStore
from tests.cli.runner import run_agent
from tests.integration.reshape_driver import allocate
from tests.integration.test_root_owner import ID_A, once_config, root_of

pytestmark = pytest.mark.integration


@pytest.fixture
def reported(tmp_path, placement_server, placement, host_name):
    """A host reported with NUMA children (numa_in_placement)."""
    config = once_config(tmp_path, host_name, placement_server.url, ID_A, extra="").read_text()
    config = config.replace("[compute]\n", "[compute]\nnuma_in_placement = true\n")
    path = tmp_path / "decommission.conf"
    path.write_text(config)
    assert run_agent("--config-file", str(path), "--once").code == 0
    root = root_of(placement, host_name)
    tree = placement.get(f"/resource_providers?in_tree={root['uuid']}")["resource_providers"]
    assert len(tree) > 1, "the fixture host should have NUMA children"
    return path, root["uuid"], tree


def decommission(config, *args):
    return run_agent("decommission", *args, "--config-file", str(config))


def in_tree(placement, root):
    return placement.get(f"/resource_providers?in_tree={root}")["resource_providers"]


def test_decommission_is_refused_while_a_consumer_holds_resources_and_lists_it(reported, placement):
    config, root, tree = reported
    child = next(p for p in tree if p["parent_provider_uuid"])
    rc = sorted(placement.get(f"/resource_providers/{child['uuid']}/inventories")["inventories"])[0]
    consumer = str(uuid.uuid4())
    allocate(placement, consumer, {child["uuid"]: {rc: 1}})

    for args in ((), ("--dry-run",)):
        result = decommission(config, *args)
        assert result.code == 1, result.stderr
        assert consumer in result.stderr and f"{rc}=1" in result.stderr
        assert child["name"] in result.stderr and "nothing was removed" in result.stderr
    assert len(in_tree(placement, root)) == len(tree)

    placement.delete(f"/allocations/{consumer}")
    plan = decommission(config, "--dry-run")
    assert plan.code == 0, plan.stderr
    assert all(p["name"] in plan.stdout for p in tree)
    assert len(in_tree(placement, root)) == len(tree)

    done = decommission(config, "--output", "json")
    assert done.code == 0, done.stderr
    deleted = [d["uuid"] for d in done.json()["deleted"]]
    assert set(deleted) == {p["uuid"] for p in tree} and deleted[-1] == root
    assert placement.get(f"/resource_providers?in_tree={root}")["resource_providers"] == []
    state = StateStore(config.parent / "state").load()
    assert "root_uuid" not in state and "owned_children" not in state

    again = decommission(config)
    assert again.code == 0 and "nothing to remove" in again.stdout


def test_decommission_leaves_a_tree_with_someone_elses_child_alone(reported, placement):
    config, root, tree = reported
    foreign = placement.post(
        "/resource_providers",
        {"name": f"cyborg-{uuid.uuid4().hex[:6]}", "parent_provider_uuid": root},
    )

    result = decommission(config)

    assert result.code == 1
    assert foreign["name"] in result.stderr and "not this agent's" in result.stderr
    assert len(in_tree(placement, root)) == len(tree) + 1


def test_decommission_of_a_root_nova_manages_is_refused(
    tmp_path, placement_server, placement, host_name
):
    created = placement.post("/resource_providers", {"name": host_name})
    placement.put(
        f"/resource_providers/{created['uuid']}/traits",
        {"resource_provider_generation": 0, "traits": ["OWNER_NOVA"]},
    )
    config = once_config(tmp_path, host_name, placement_server.url, ID_A)

    result = decommission(config)

    assert result.code == 78 and "OWNER_NOVA" in result.stderr
    assert root_of(placement, host_name)["uuid"] == created["uuid"]
