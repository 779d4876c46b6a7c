"""``[placement] aggregates`` against the real Placement: the root joins
them, an operator's aggregate survives every cycle and the removal of ours,
and a lost state file never makes the agent remove one.

The syncer's requests are counted on its own client; the operator writes
through a second one."""

import json
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from node_agent.model.provider_tree import ProviderTree
from node_agent.placement.client import PlacementClient
from node_agent.placement.sync import TreeSyncer
from node_agent.state import AGGREGATES, FILE_NAME, StateStore
from tests.cli.runner import run_agent
from tests.integration.reshape_driver import Host
from tests.integration.test_cli_reshape import write_config
from tests.integration.test_sync import host_tree

pytestmark = pytest.mark.integration

A, B, OPERATOR = (str(uuid.uuid4()) for _ in range(3))


@pytest.fixture
def client(placement_server):
    return PlacementClient.for_endpoint(placement_server.url)


@pytest.fixture
def operator(placement_server):
    return PlacementClient.for_endpoint(placement_server.url)


def joining(tree: ProviderTree, *aggregates: str) -> ProviderTree:
    return ProviderTree(
        (replace(tree.root, aggregates=frozenset(aggregates)),) + tree.providers[1:]
    )


def held(client, root: str) -> set:
    return set(client.get(f"/resource_providers/{root}/aggregates")["aggregates"])


def operator_adds(client, root: str, aggregate: str) -> None:
    got = client.get(f"/resource_providers/{root}/aggregates")
    client.put(
        f"/resource_providers/{root}/aggregates",
        {
            "resource_provider_generation": got["resource_provider_generation"],
            "aggregates": sorted(set(got["aggregates"]) | {aggregate}),
        },
    )


def aggregate_requests(client) -> list:
    return [(m, p) for m, p, _ in client.stats.log if p.endswith("/aggregates")]


def test_operators_aggregate_survives_every_cycle_and_the_removal_of_ours(
    client, operator, tmp_path, host_name
):
    store = StateStore(tmp_path / "state")
    syncer = TreeSyncer(client, store)
    assert syncer.sync(host_tree(host_name)).ok
    root = store.load()["root_uuid"]
    operator_adds(operator, root, OPERATOR)

    report = syncer.sync(joining(host_tree(host_name), A, B))

    assert report.ok, report.errors
    assert held(operator, root) == {OPERATOR, A, B}
    assert store.load()[AGGREGATES] == {"root_uuid": root, "ours": sorted([A, B])}

    client.stats.reset()
    for _ in range(3):  # steady: no aggregate request at all
        assert syncer.sync(joining(host_tree(host_name), A, B)).applied == []
    assert aggregate_requests(client) == []

    assert syncer.sync(joining(host_tree(host_name), A)).ok
    assert held(operator, root) == {OPERATOR, A}
    assert syncer.sync(host_tree(host_name)).ok  # the option emptied
    assert held(operator, root) == {OPERATOR}
    assert store.load()[AGGREGATES]["ours"] == []


def test_the_next_process_reads_no_aggregates_when_the_root_did_not_move(
    client, tmp_path, host_name
):
    """The provider cache the state file keeps carries the root's
    aggregates: a restarted agent's verify reads the listing, not them."""
    store = StateStore(tmp_path / "state")
    first = TreeSyncer(client, store)
    assert first.sync(joining(host_tree(host_name), A)).ok
    restarted = TreeSyncer(client, store)
    assert restarted.import_cache(first.export_cache(), verify_now=True)
    client.stats.reset()

    report = restarted.sync(joining(host_tree(host_name), A))

    assert report.ok and report.applied == []
    assert aggregate_requests(client) == []
    assert client.stats.reads == 1  # the listing


def test_an_aggregate_the_operator_had_set_is_not_taken_for_ours(
    client, operator, tmp_path, host_name
):
    """Configured and already on the root (set by the operator first):
    dropping it from the option leaves it there."""
    store = StateStore(tmp_path / "state")
    syncer = TreeSyncer(client, store)
    assert syncer.sync(host_tree(host_name)).ok
    root = store.load()["root_uuid"]
    operator_adds(operator, root, OPERATOR)
    assert syncer.sync(joining(host_tree(host_name), OPERATOR, A)).ok

    assert syncer.sync(host_tree(host_name)).ok

    assert held(operator, root) == {OPERATOR}


def test_a_lost_state_file_never_removes_an_aggregate(
    client, operator, tmp_path, host_name, caplog
):
    store = StateStore(tmp_path / "state")
    assert TreeSyncer(client, store).sync(joining(host_tree(host_name), A)).ok
    root = store.load()["root_uuid"]
    (tmp_path / "state" / FILE_NAME).unlink()

    again = TreeSyncer(client, store)
    report = again.sync(joining(host_tree(host_name), A))
    assert report.ok and report.applied == []
    assert f"aggregate(s) {A} already on provider {host_name}" in caplog.text
    assert again.sync(host_tree(host_name)).ok  # A no longer configured

    assert held(operator, root) == {A}


def test_an_operator_write_between_read_and_put_is_merged_not_overwritten(
    client, operator, tmp_path, host_name
):
    store = StateStore(tmp_path / "state")
    syncer = TreeSyncer(client, store)
    assert syncer.sync(joining(host_tree(host_name), A)).ok
    root = store.load()["root_uuid"]
    operator_adds(operator, root, OPERATOR)  # the cache does not know

    report = syncer.sync(joining(host_tree(host_name), A, B))

    assert report.ok, report.errors
    assert held(operator, root) == {OPERATOR, A, B}


# --- through the real command


def once(config, *args):
    return run_agent("--config-file", config, "--once", *args)


def with_aggregates(config: str, *aggregates: str) -> str:
    # [placement] is the file's last section (write_config).
    text = Path(config).read_text()
    Path(config).write_text(text + f"aggregates = {','.join(aggregates)}\n")
    return config


def test_dry_run_shows_the_aggregates_to_add_and_remove_and_writes_none(
    placement_server, host_name, tmp_path
):
    host = Host(tmp_path, placement_server.url, host_name)
    assert once(with_aggregates(write_config(host), A.upper())).code == 0
    operator = PlacementClient.for_endpoint(placement_server.url)
    operator_adds(operator, host.root, OPERATOR)
    config = with_aggregates(write_config(host), B)

    plan = once(config, "--dry-run", "--output", "json")

    assert plan.code == 0, plan.stderr
    summaries = [c["summary"] for c in plan.json()["changes"]]
    assert summaries == [f"aggregates +{B} -{A} on {host_name}"]
    assert plan.json()["changes"][0]["path"] == f"/resource_providers/{host.root}/aggregates"
    assert held(operator, host.root) == {A, OPERATOR}
    assert once(config).code == 0
    assert held(operator, host.root) == {B, OPERATOR}
    steady = once(config, "--output", "json")
    assert steady.code == 0 and steady.json()["changes"] == []


def test_companion_mode_refuses_aggregates_and_writes_none(placement_server, host_name, tmp_path):
    host = Host(tmp_path, placement_server.url, host_name)
    config = with_aggregates(write_config(host, "[agent]\nmode = companion\n"), A)

    result = once(config)

    assert result.code == 78, result.stderr
    assert f"[placement] aggregates = {A}" in result.stderr
    assert "companion" in result.stderr
    assert (
        json.loads(
            json.dumps(
                PlacementClient.for_endpoint(placement_server.url).providers_named(host_name)
            )
        )
        == []
    )
