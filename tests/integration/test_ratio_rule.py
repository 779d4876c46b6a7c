"""nova's allocation-ratio rule against a real Placement.

``ComputeDriver._get_allocation_ratios``: an explicit ``*_allocation_ratio``
wins; otherwise ``initial_*_allocation_ratio`` applies only when the class is
new on the provider; otherwise the ratio Placement already has is kept,
because operators manage ratios through the API.
"""

import pytest

from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from tests.integration.test_sync import FakeClock, client, inventories, other, store, synced  # noqa: F401

pytestmark = pytest.mark.integration


def tree(host, ratio, keep):
    return ProviderTree(
        (
            Provider(
                host,
                inventories={
                    "VCPU": Inventory(16, allocation_ratio=ratio, keep_placement_ratio=keep),
                    "MEMORY_MB": Inventory(4096, reserved=512),
                },
            ),
        )
    )


def operator_sets_ratio(other, rp_uuid, ratio):
    body = other.get(f"/resource_providers/{rp_uuid}/inventories")
    body["inventories"]["VCPU"]["allocation_ratio"] = ratio
    other.put(f"/resource_providers/{rp_uuid}/inventories", body)


def registered_then_operator_sets_16(client, other, store, host_name, ratio, keep):
    """Sync once, let the operator set VCPU's ratio to 16.0: (syncer, root uuid)."""
    clock = FakeClock()
    syncer = synced(
        client, store, tree(host_name, ratio, keep=keep), full_verify_interval=0, clock=clock
    )
    root = store.load()["root_uuid"]
    assert inventories(other, root)["VCPU"]["allocation_ratio"] == ratio
    operator_sets_ratio(other, root, 16.0)
    clock.now += 1
    return syncer, root


def test_initial_ratio_applies_to_a_new_class_then_the_operators_ratio_is_kept(
    client, other, store, host_name
):
    syncer, root = registered_then_operator_sets_16(client, other, store, host_name, 4.0, keep=True)
    report = syncer.sync(tree(host_name, 4.0, keep=True))

    assert report.ok and report.full_verify, report.errors
    assert inventories(other, root)["VCPU"]["allocation_ratio"] == 16.0
    assert client.stats.writes == 0


def test_explicit_ratio_overrides_the_operators_ratio_every_cycle(client, other, store, host_name):
    syncer, root = registered_then_operator_sets_16(
        client, other, store, host_name, 2.0, keep=False
    )
    report = syncer.sync(tree(host_name, 2.0, keep=False))

    assert report.ok, report.errors
    assert inventories(other, root)["VCPU"]["allocation_ratio"] == 2.0


def test_a_total_change_keeps_the_operators_ratio(client, other, store, host_name):
    syncer, root = registered_then_operator_sets_16(client, other, store, host_name, 4.0, keep=True)
    grown = ProviderTree(
        (
            Provider(
                host_name,
                inventories={
                    "VCPU": Inventory(24, allocation_ratio=4.0, keep_placement_ratio=True),
                    "MEMORY_MB": Inventory(4096, reserved=512),
                },
            ),
        )
    )
    report = syncer.sync(grown)

    assert report.ok, report.errors
    vcpu = inventories(other, root)["VCPU"]
    assert (vcpu["total"], vcpu["allocation_ratio"]) == (24, 16.0)


def test_dry_run_shows_the_ratio_placement_holds_where_nova_keeps_it(
    placement_server, host_name, tmp_path
):
    """No ratio in the config: the tree a dry run shows is what would be
    published, the operator's ratio and not the initial one."""
    from tests.integration.reshape_driver import Host
    from tests.integration.test_cli_reshape import once, write_config
    from tests.integration.test_reshape_cost import set_memory_ratio

    host = Host(tmp_path, placement_server.url, host_name)
    config = write_config(host)
    assert once(config).code == 0
    set_memory_ratio(1.25)(host)

    plan = once(config, "--dry-run", "--output", "json")

    assert plan.code == 0, plan.stderr
    assert plan.json()["changes"] == []
    root = plan.json()["providers"][0]
    assert root["inventories"]["MEMORY_MB"]["allocation_ratio"] == 1.25
    assert "ratio 1.25" in once(config, "--dry-run").stdout
