"""TreeSyncer.export_cache / import_cache: the cache another process (the
central applier) hands over through the state file. No server: any
request to Placement trips the test."""

import pytest

from node_agent.model.provider_state import ProviderState
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.placement.sync import TreeSyncer
from node_agent.state import StateStore

ROOT = "11111111-1111-4111-8111-111111111111"
NIC = "22222222-2222-4222-8222-222222222222"
NOW = 1_800_000_000.0


class Unreachable(AssertionError):
    pass


class NoPlacement:
    """A client that must not be used."""

    def __getattr__(self, name):
        raise Unreachable(f"the syncer sent a request ({name})")


def desired(reserved: int = 512) -> ProviderTree:
    return ProviderTree(
        (
            Provider(
                "host1",
                uuid=None,
                inventories={
                    "MEMORY_MB": Inventory(65536, reserved=reserved),
                    "DISK_GB": Inventory(900),
                },
                traits={"HW_CPU_X86_AVX2": True},
            ),
            Provider(
                "host1_nic",
                parent="host1",
                inventories={"SRIOV_NET_VF": Inventory(8)},
                traits={"CUSTOM_PHYSNET_A": True},
            ),
        )
    )


def in_sync(tree: ProviderTree) -> dict:
    """What export_cache returns for Placement holding ``tree``."""
    root, nic = tree.providers
    states = [
        ProviderState(
            ROOT,
            "host1",
            7,
            None,
            {rc: i.as_placement() for rc, i in root.inventories.items()},
            frozenset({"HW_CPU_X86_AVX2", "COMPUTE_STATUS_DISABLED"}),
        ),
        ProviderState(
            NIC,
            "host1_nic",
            2,
            ROOT,
            {rc: i.as_placement() for rc, i in nic.inventories.items()},
            frozenset({"CUSTOM_PHYSNET_A"}),
        ),
    ]
    return {
        "verified_at": NOW - 10,
        "providers": [
            {
                "uuid": s.uuid,
                "name": s.name,
                "generation": s.generation,
                "parent_uuid": s.parent_uuid,
                "inventories": s.inventories,
                "traits": sorted(s.traits),
            }
            for s in states
        ],
    }


def syncer(tmp_path, now: float = NOW) -> TreeSyncer:
    store = StateStore(tmp_path / "host1")
    if not store.path.exists():
        store.save(
            {
                "root_uuid": ROOT,
                "providers": {"host1": ROOT, "host1_nic": NIC},
                "owned_children": [NIC],
            }
        )
    return TreeSyncer(NoPlacement(), store, full_verify_interval=300, clock=lambda: now)


def test_imported_cache_plans_a_change_without_a_request(tmp_path):
    first = syncer(tmp_path)
    assert first.import_cache(in_sync(desired()))
    # Through the state file, as the appliers share it.
    store = StateStore(tmp_path / "shared")
    store.save({"cache": first.export_cache()})
    second = syncer(tmp_path, now=NOW + 200)
    assert second.import_cache(store.load()["cache"])
    assert second.export_cache() == first.export_cache()

    assert second.plan(desired()) == []
    (change,) = second.plan(desired(reserved=1024))
    assert change.path == f"/resource_providers/{ROOT}/inventories"
    assert change.body["resource_provider_generation"] == 7  # the cached one
    assert "MEMORY_MB reserved 512→1024" in change.summary


def test_imported_cache_past_its_full_verify_is_read_again(tmp_path):
    late = syncer(tmp_path, now=NOW + 300)
    assert late.import_cache(in_sync(desired()))
    with pytest.raises(Unreachable):
        late.plan(desired())


def test_verify_time_ahead_of_this_clock_counts_as_now(tmp_path):
    behind = syncer(tmp_path, now=NOW - 1000)
    assert behind.import_cache(in_sync(desired()))
    assert behind.export_cache()["verified_at"] == NOW - 1000


@pytest.mark.parametrize(
    "data",
    [
        None,
        {"providers": []},
        {"verified_at": NOW, "providers": [{"uuid": ROOT}]},
        {"verified_at": "yesterday", "providers": []},
        {
            "verified_at": NOW,
            "providers": [{**in_sync(desired())["providers"][0], "inventories": ["MEMORY_MB"]}],
        },
    ],
)
def test_missing_or_malformed_cache_is_not_used(tmp_path, data):
    fresh = syncer(tmp_path)
    fresh.import_cache(in_sync(desired()))
    assert fresh.import_cache(data) is False
    assert fresh.export_cache() is None
    with pytest.raises(Unreachable):
        fresh.plan(desired())
