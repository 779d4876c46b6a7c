"""TreeSyncer against the real Placement (embedded, noauth2).

Request counts come from the syncer's own client (``client.stats``); what
the "scheduler" and the "operator" do goes through a second client so it
is not counted.
"""

import itertools
import logging
import uuid

import pytest

from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.placement.client import PlacementClient, Unavailable
from node_agent.placement.sync import TreeSyncer
from node_agent.state import FILE_NAME, StateStore, encode

pytestmark = pytest.mark.integration

CHILDREN = 4


class FakeClock:
    """The syncer's notion of time, moved by the test."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def numa(host, node, vcpu=16, pcpu=8, ratio=4.0):
    inventories = {}
    if vcpu:
        inventories["VCPU"] = Inventory(vcpu, allocation_ratio=ratio)
    if pcpu:
        inventories["PCPU"] = Inventory(pcpu)
    return Provider(f"{host}_NUMA{node}", parent=host, inventories=inventories)


def host_tree(host, children=CHILDREN, root_traits=None, **numa0):
    root = Provider(
        host,
        inventories={
            "MEMORY_MB": Inventory(262144, reserved=4096, allocation_ratio=1.0),
            "DISK_GB": Inventory(1800),
        },
        traits=root_traits or {"HW_CPU_X86_AVX2": True, "COMPUTE_STATUS_DISABLED": False},
    )
    nodes = [numa(host, 0, **numa0)] + [numa(host, n) for n in range(1, children)]
    return ProviderTree((root, *nodes))


@pytest.fixture
def client(placement_server):
    return PlacementClient.for_endpoint(placement_server.url)


@pytest.fixture
def other(placement_server):
    """The scheduler / the operator: requests not made by the agent."""
    return PlacementClient.for_endpoint(placement_server.url)


@pytest.fixture
def store(tmp_path):
    return StateStore(tmp_path / "state")


def tree_in_placement(other, root_uuid):
    listing = other.get(f"/resource_providers?in_tree={root_uuid}")
    return {rp["name"]: rp for rp in listing["resource_providers"]}


def inventories(other, rp_uuid):
    return other.get(f"/resource_providers/{rp_uuid}/inventories")["inventories"]


def traits(other, rp_uuid):
    return set(other.get(f"/resource_providers/{rp_uuid}/traits")["traits"])


def allocate(other, rp_uuid, resources):
    consumer = str(uuid.uuid4())
    other.put(
        f"/allocations/{consumer}",
        {
            "allocations": {rp_uuid: {"resources": resources}},
            "project_id": str(uuid.uuid4()),
            "user_id": str(uuid.uuid4()),
            "consumer_generation": None,
        },
    )
    return consumer


def synced(client, store, desired, **kw):
    syncer = TreeSyncer(client, store, **kw)
    report = syncer.sync(desired)
    assert report.ok, report.errors
    client.stats.reset()
    return syncer


def test_first_registration_of_root_and_four_children_is_12_requests(
    client, other, store, host_name
):
    desired = host_tree(host_name)

    report = TreeSyncer(client, store).sync(desired)

    assert report.ok, report.errors
    root = store.load()["root_uuid"]
    rp = lambda name: tree_in_placement(other, root)[name]["uuid"]  # noqa: E731
    assert [(m, p) for m, p, _ in client.stats.log] == (
        [("GET", f"/resource_providers?name={host_name}")]
        + [("POST", "/resource_providers")] * 5
        + [("PUT", f"/resource_providers/{rp(p.name)}/inventories") for p in desired.providers]
        + [("PUT", f"/resource_providers/{root}/traits")]
    )
    assert report.requests == client.stats.total <= 18
    assert sorted(tree_in_placement(other, root)) == sorted(desired.names())
    assert inventories(other, rp(f"{host_name}_NUMA2"))["VCPU"]["total"] == 16
    assert traits(other, root) == {"HW_CPU_X86_AVX2"}


def test_steady_state_cycle_makes_no_write_and_at_most_one_read(client, other, store, host_name):
    desired = host_tree(host_name)
    syncer = synced(client, store, desired)
    providers = tree_in_placement(other, store.load()["root_uuid"])
    for name, amount in itertools.product([f"{host_name}_NUMA0", f"{host_name}_NUMA1"], [1, 2, 3]):
        allocate(other, providers[name]["uuid"], {"VCPU": amount})

    for _ in range(3):
        report = syncer.sync(desired)
        assert report.ok and report.applied == []
    assert client.stats.writes == 0
    assert client.stats.reads <= 1


def test_inventory_change_after_scheduler_activity_costs_three_requests(
    client, other, store, host_name
):
    syncer = synced(client, store, host_tree(host_name))
    numa0 = tree_in_placement(other, store.load()["root_uuid"])[f"{host_name}_NUMA0"]["uuid"]
    allocate(other, numa0, {"VCPU": 2})  # bumps NUMA0's generation

    report = syncer.sync(host_tree(host_name, vcpu=32))

    assert report.ok, report.errors
    path = f"/resource_providers/{numa0}/inventories"
    assert client.stats.log == [("PUT", path, 409), ("GET", path, 200), ("PUT", path, 200)]
    assert inventories(other, numa0)["VCPU"]["total"] == 32
    assert [c.summary for c in report.applied] == [
        f"set VCPU total 16→32, max_unit 16→32 on {host_name}_NUMA0"
    ]


def test_inventory_shrink_after_scheduler_activity_costs_two_requests(
    client, other, store, host_name
):
    syncer = synced(client, store, host_tree(host_name))
    numa0 = tree_in_placement(other, store.load()["root_uuid"])[f"{host_name}_NUMA0"]["uuid"]
    allocate(other, numa0, {"VCPU": 2})  # bumps NUMA0's generation

    report = syncer.sync(host_tree(host_name, vcpu=8))

    assert report.ok, report.errors
    # The usage check a shrink needs also returns the fresh generation.
    assert client.stats.log == [
        ("GET", f"/resource_providers/{numa0}/usages", 200),
        ("PUT", f"/resource_providers/{numa0}/inventories", 200),
    ]
    assert inventories(other, numa0)["VCPU"]["total"] == 8


def test_root_uuid_is_kept_in_state_across_restarts(client, other, store, host_name):
    desired = host_tree(host_name)
    synced(client, store, desired)
    root = store.load()["root_uuid"]

    restarted = TreeSyncer(client, store)
    report = restarted.sync(desired)

    assert report.ok and report.applied == []
    assert client.stats.writes == 0
    assert store.load()["root_uuid"] == root
    assert (
        other.get(f"/resource_providers?name={host_name}")["resource_providers"][0]["uuid"] == root
    )


def test_lost_state_adopts_existing_root_and_children_by_name(client, other, tmp_path, host_name):
    desired = host_tree(host_name)
    synced(client, StateStore(tmp_path / "old"), desired)
    root = StateStore(tmp_path / "old").load()["root_uuid"]
    lost = StateStore(tmp_path / "new")

    report = TreeSyncer(client, lost).sync(desired)

    assert report.ok and report.applied == []
    assert client.stats.writes == 0
    assert lost.load()["root_uuid"] == root
    assert len(tree_in_placement(other, root)) == 1 + CHILDREN
    owned = set(lost.load()["owned_children"])
    assert owned == {
        rp["uuid"] for name, rp in tree_in_placement(other, root).items() if name != host_name
    }


def test_corrupt_state_file_is_rebuilt_by_adoption(client, other, store, host_name):
    desired = host_tree(host_name)
    synced(client, store, desired)
    root = store.load()["root_uuid"]
    (store.directory / FILE_NAME).write_text('{"version": 1, "payload": {}')

    report = TreeSyncer(client, store).sync(desired)

    assert report.ok and client.stats.writes == 0
    assert store.load()["root_uuid"] == root


def test_a_wrong_shaped_state_file_with_a_valid_checksum_is_rebuilt_as_a_lost_one(
    client, other, store, host_name, caplog
):
    desired = host_tree(host_name)
    synced(client, store, desired)
    root = store.load()["root_uuid"]
    path = store.directory / FILE_NAME
    key = "root_uuid"  # Placement refused it (400): exit 75 at every run
    bad = encode({**store.load(), key: "not-a-uuid"})  # its checksum holds
    path.write_text(bad)

    with caplog.at_level(logging.WARNING):
        report = TreeSyncer(client, store).sync(desired)
        report_again = TreeSyncer(client, store).sync(desired)

    assert report.ok and report_again.ok and client.stats.writes == 0
    assert store.load()["root_uuid"] == root
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"state file {path} has a valid checksum but its {key!r}" in warning
    assert path.with_name(FILE_NAME + ".corrupt").read_text() == bad


def test_duplicate_name_on_create_leads_to_adoption(client, other, tmp_path, host_name):
    desired = host_tree(host_name)
    synced(client, StateStore(tmp_path / "real"), desired)
    root = StateStore(tmp_path / "real").load()["root_uuid"]
    stale = StateStore(tmp_path / "stale")  # e.g. Placement's DB restored
    stale.save({"root_uuid": str(uuid.uuid4()), "providers": {}, "owned_children": []})

    report = TreeSyncer(client, stale).sync(desired)

    assert report.ok, report.errors
    assert ("POST", "/resource_providers", 409) in client.stats.log
    assert stale.load()["root_uuid"] == root
    assert len(other.get(f"/resource_providers?name={host_name}")["resource_providers"]) == 1
    assert len(tree_in_placement(other, root)) == 1 + CHILDREN


def test_drift_seen_only_through_a_trait_read_is_still_healed_by_the_verify(
    client, other, store, host_name
):
    clock = FakeClock()
    syncer = synced(client, store, host_tree(host_name), full_verify_interval=300, clock=clock)
    root = store.load()["root_uuid"]
    edited = other.get(f"/resource_providers/{root}/inventories")
    edited["inventories"]["DISK_GB"]["total"] = 7  # out of band, generation +1
    other.put(f"/resource_providers/{root}/inventories", edited)

    # A trait change makes the agent read the root's traits at the new
    # generation; its cached inventories are still those of before.
    flipped = host_tree(
        host_name, root_traits={"HW_CPU_X86_AVX2": False, "COMPUTE_STATUS_DISABLED": False}
    )
    assert syncer.sync(flipped).ok
    assert inventories(other, root)["DISK_GB"]["total"] == 7

    clock.now += 300
    assert syncer.sync(flipped).ok
    assert inventories(other, root)["DISK_GB"]["total"] == 1800


def test_full_verification_heals_out_of_band_drift(client, other, store, host_name):
    clock = FakeClock()
    desired = host_tree(host_name)
    syncer = synced(client, store, desired, full_verify_interval=300, clock=clock)
    providers = tree_in_placement(other, store.load()["root_uuid"])
    other.delete(f"/resource_providers/{providers[f'{host_name}_NUMA3']['uuid']}")
    numa1 = providers[f"{host_name}_NUMA1"]["uuid"]
    edited = other.get(f"/resource_providers/{numa1}/inventories")
    edited["inventories"]["VCPU"]["total"] = 2
    other.put(f"/resource_providers/{numa1}/inventories", edited)

    clock.now += 299
    assert syncer.sync(desired).requests == 0  # not due: trusts its cache

    clock.now += 1
    report = syncer.sync(desired)

    assert report.ok and report.full_verify, report.errors
    healed = tree_in_placement(other, store.load()["root_uuid"])
    assert sorted(healed) == sorted(desired.names())
    assert healed[f"{host_name}_NUMA3"]["uuid"] == providers[f"{host_name}_NUMA3"]["uuid"]
    assert inventories(other, numa1)["VCPU"]["total"] == 16
    # One tree read, then inventories+traits only of the edited provider.
    assert client.stats.reads == 3
    assert client.stats.writes == 3  # POST NUMA3, its inventory, NUMA1's


def test_operator_trait_survives_cycles_and_a_restart(client, other, store, host_name):
    clock = FakeClock()
    syncer = synced(client, store, host_tree(host_name), clock=clock, full_verify_interval=300)
    root = store.load()["root_uuid"]
    other.put("/traits/CUSTOM_RACK_7", None)
    current = other.get(f"/resource_providers/{root}/traits")
    other.put(
        f"/resource_providers/{root}/traits",
        {
            "resource_provider_generation": current["resource_provider_generation"],
            "traits": current["traits"] + ["CUSTOM_RACK_7"],
        },
    )
    with_avx512 = host_tree(
        host_name, root_traits={"HW_CPU_X86_AVX2": True, "HW_CPU_X86_AVX512F": True}
    )

    for _step in range(3):
        clock.now += 200
        assert syncer.sync(with_avx512).ok
    assert traits(other, root) == {"CUSTOM_RACK_7", "HW_CPU_X86_AVX2", "HW_CPU_X86_AVX512F"}

    report = TreeSyncer(client, store).sync(
        host_tree(host_name, root_traits={"HW_CPU_X86_AVX2": True, "HW_CPU_X86_AVX512F": False})
    )

    assert report.ok, report.errors
    assert traits(other, root) == {"CUSTOM_RACK_7", "HW_CPU_X86_AVX2"}


def test_foreign_child_survives_every_cycle(client, other, store, host_name):
    clock = FakeClock()
    syncer = synced(client, store, host_tree(host_name), clock=clock, full_verify_interval=300)
    root = store.load()["root_uuid"]
    foreign = other.post(
        "/resource_providers",
        {"name": f"{host_name}:neutron-agent:bandwidth", "parent_provider_uuid": root},
    )
    numa3 = tree_in_placement(other, root)[f"{host_name}_NUMA3"]["uuid"]

    for _step in range(3):
        clock.now += 301
        report = syncer.sync(host_tree(host_name, children=3))
        assert report.ok, report.errors

    names = set(tree_in_placement(other, root))
    assert f"{host_name}:neutron-agent:bandwidth" in names
    assert f"{host_name}_NUMA3" not in names  # ours, no longer wanted
    assert numa3 not in store.load()["owned_children"]
    assert foreign["uuid"] not in store.load()["owned_children"]


def test_inventory_in_use_is_reported_and_the_rest_of_the_tree_syncs(
    client, other, store, host_name
):
    syncer = synced(client, store, host_tree(host_name))
    providers = tree_in_placement(other, store.load()["root_uuid"])
    numa0 = providers[f"{host_name}_NUMA0"]["uuid"]
    numa1 = providers[f"{host_name}_NUMA1"]["uuid"]
    allocate(other, numa0, {"VCPU": 4})
    # All of NUMA0's CPUs go dedicated; NUMA1 grows.
    desired = host_tree(host_name, vcpu=0, pcpu=24)
    desired = ProviderTree(
        desired.providers[:2] + (numa(host_name, 1, vcpu=20),) + desired.providers[3:]
    )

    report = syncer.sync(desired)

    assert not report.ok
    [error] = report.errors
    assert f"VCPU on {host_name}_NUMA0" in error
    assert "4 VCPU in use" in error and "capacity 0" in error
    assert "migrate or delete instances using 4 VCPU" in error
    assert "cpu_shared_set" in error
    assert inventories(other, numa1)["VCPU"]["total"] == 20
    assert inventories(other, numa0)["PCPU"]["total"] == 24
    assert inventories(other, numa0)["VCPU"]["total"] == 16  # kept: in use


def test_capacity_cut_below_usage_is_published_and_reported_not_refused(
    client, other, store, host_name
):
    """Placement takes an inventory below usage (it refuses new claims), as
    nova's resource tracker writes it: VCPU 16 x 4.0 cut to 1 x 4.0 under
    6 in use. Before, the guard kept the old capacity open (an error)."""
    syncer = synced(client, store, host_tree(host_name))
    numa0 = tree_in_placement(other, store.load()["root_uuid"])[f"{host_name}_NUMA0"]["uuid"]
    holder = allocate(other, numa0, {"VCPU": 6})

    report = syncer.sync(host_tree(host_name, vcpu=1, ratio=4.0))

    assert report.ok, report.errors
    [cut] = report.cuts
    assert (cut.provider, cut.rc, cut.used, cut.capacity, cut.over) == (
        f"{host_name}_NUMA0",
        "VCPU",
        6,
        4,
        2,
    )
    assert cut.holders == ((holder, None, 6),)
    assert inventories(other, numa0)["VCPU"]["total"] == 1
    assert other.get(f"/allocations/{holder}")["allocations"][numa0]["resources"] == {"VCPU": 6}


def test_removing_a_class_in_use_is_kept_while_a_cut_beside_it_is_published(
    client, other, store, host_name
):
    """NUMA0 loses VCPU (Placement refuses to delete a class in use: kept,
    an error); NUMA1's VCPU is cut below its usage in the same sync
    (published, reported). Before, both were kept."""
    syncer = synced(client, store, host_tree(host_name))
    providers = tree_in_placement(other, store.load()["root_uuid"])
    numa0 = providers[f"{host_name}_NUMA0"]["uuid"]
    numa1 = providers[f"{host_name}_NUMA1"]["uuid"]
    allocate(other, numa0, {"VCPU": 4})
    allocate(other, numa1, {"VCPU": 12})
    desired = host_tree(host_name, vcpu=0, pcpu=24)
    desired = ProviderTree(
        desired.providers[:2] + (numa(host_name, 1, vcpu=2),) + desired.providers[3:]
    )

    report = syncer.sync(desired)

    [error] = report.errors
    assert f"cannot lower VCPU on {host_name}_NUMA0" in error and "4 VCPU in use" in error
    assert inventories(other, numa0)["VCPU"]["total"] == 16  # kept: removal refused
    assert inventories(other, numa0)["PCPU"]["total"] == 24
    assert inventories(other, numa1)["VCPU"]["total"] == 2  # cut: published
    assert [(c.provider, c.rc, c.over) for c in report.cuts] == [(f"{host_name}_NUMA1", "VCPU", 4)]


def test_plan_reads_but_never_writes(client, other, store, host_name):
    syncer = synced(client, store, host_tree(host_name))

    changes = syncer.plan(host_tree(host_name, vcpu=8, children=2))

    assert client.stats.writes == 0
    assert [c.method for c in changes] == ["PUT", "DELETE", "DELETE"]
    numa0 = tree_in_placement(other, store.load()["root_uuid"])[f"{host_name}_NUMA0"]["uuid"]
    assert inventories(other, numa0)["VCPU"]["total"] == 16


def test_unreachable_placement_fails_the_cycle_and_keeps_the_state_file(
    fresh_placement_server, tmp_path, host_name
):
    client = PlacementClient.for_endpoint(fresh_placement_server.url, retries=1, backoff=0.01)
    store = StateStore(tmp_path / "state")
    syncer = synced(client, store, host_tree(host_name))
    before = (store.directory / FILE_NAME).read_bytes()
    fresh_placement_server.stop()

    with pytest.raises(Unavailable):
        syncer.sync(host_tree(host_name, children=5))  # fails on the POST

    assert client.stats.log[0][:2] == ("POST", "/resource_providers")
    assert (store.directory / FILE_NAME).read_bytes() == before
    fresh_placement_server.start()
    report = syncer.sync(host_tree(host_name, children=5))
    assert report.ok, report.errors
    root = store.load()["root_uuid"]
    assert len(tree_in_placement(client, root)) == 6


def test_provider_deleted_behind_the_cache_is_recreated_in_the_same_cycle(
    client, other, store, host_name
):
    syncer = synced(client, store, host_tree(host_name))
    root = store.load()["root_uuid"]
    numa0 = tree_in_placement(other, root)[f"{host_name}_NUMA0"]["uuid"]
    other.delete(f"/resource_providers/{numa0}")

    report = syncer.sync(host_tree(host_name, vcpu=24))

    assert report.ok, report.errors
    assert ("PUT", f"/resource_providers/{numa0}/inventories", 404) in client.stats.log
    assert tree_in_placement(other, root)[f"{host_name}_NUMA0"]["uuid"] == numa0
    assert inventories(other, numa0)["VCPU"]["total"] == 24


def test_a_reloaded_syncer_follows_what_another_run_wrote_before_the_reload(
    client, other, store, host_name
):
    """The service reloads (SIGHUP) after ``sudo node-agent --once`` wrote
    Placement and the state file: the new syncer reads the file when it is
    made, but carries the old one's cache, which the other run left stale.
    Its first cycle follows the file (tried under systemd: the refusal of a
    reshape then lasted until the next full verify)."""
    from node_agent.cycle import provider_cache

    TRAIT = "COMPUTE_STATUS_DISABLED"
    service = synced(client, store, host_tree(host_name))
    provider_cache.keep(service)
    closed = host_tree(host_name, root_traits={"HW_CPU_X86_AVX2": True, TRAIT: True})
    once = TreeSyncer(PlacementClient.for_endpoint(client.endpoint), store)
    provider_cache.restore(once)
    assert once.sync(closed).ok
    provider_cache.keep(once)

    reloaded = TreeSyncer(client, store)
    provider_cache.carry_over(service, reloaded)
    assert TRAIT not in reloaded.root_traits(closed)  # the stale cache, believed

    assert provider_cache.follow(reloaded) is True
    assert TRAIT in reloaded.root_traits(closed)
    assert reloaded.sync(closed).ok
    provider_cache.keep(reloaded)
    assert provider_cache.follow(reloaded) is False  # its own cache kept: in step
