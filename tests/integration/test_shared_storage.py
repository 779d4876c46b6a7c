"""Shared storage declared, not multiplied, against the real Placement.

Two agent hosts (their own names, state files and libvirt) mount one
``instances_path``. Without ``[compute] shared_storage_aggregate`` each
root reports the whole filesystem; with it the filesystem is offered once,
by one sharing provider both hosts name alike, and the guests' DISK_GB
moves to it in one ``POST /reshaper`` per host; without it again, each
host's DISK_GB moves back to its root."""

import logging
import shutil
import threading
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from node_agent.cycle.desired import compute_desired
from node_agent.cycle.reconcile import Reconciler
from node_agent.errors import ReshapeError
from node_agent.model.provider_tree import Inventory
from node_agent.placement.client import PlacementClient
from node_agent.placement.shared_storage import ensure_sharing_provider
from node_agent.placement.sync import TreeSyncer
from node_agent.policy.shared_storage import provider_uuid, sharing_provider
from node_agent.state import SHARED_STORAGE, StateStore
from tests.cli.runner import run_agent
from tests.integration.reshape_driver import Host
from tests.integration.test_cli_reshape import write_config

pytestmark = pytest.mark.integration
LOG = logging.getLogger(__name__)


def once(config, *args):
    return run_agent("--config-file", config, "--once", *args)


def configure(host: Host, shared_dir, aggregate=None, extra="") -> str:
    extra = (f"shared_storage_aggregate = {aggregate}\n" if aggregate else "") + extra
    path = write_config(host, extra)
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace(f"instances_path = {host.tmp}\n", f"instances_path = {shared_dir}\n"))
    return path


def disk(client, rp) -> int:
    inventories = client.get(f"/resource_providers/{rp}/inventories")["inventories"]
    return inventories["DISK_GB"]["total"] if "DISK_GB" in inventories else 0


def disk_of(client, consumer) -> dict:
    body = client.get(f"/allocations/{consumer}")["allocations"]
    return {rp: a["resources"]["DISK_GB"] for rp, a in body.items() if "DISK_GB" in a["resources"]}


def candidates(client, query) -> list:
    return client.get(f"/allocation_candidates?{query}", microversion="1.36")["allocation_requests"]


@pytest.fixture
def hosts(placement_server, host_name, tmp_path):
    made = []
    for suffix in ("a", "b"):
        (tmp_path / suffix).mkdir()
        made.append(Host(tmp_path / suffix, placement_server.url, f"{host_name}-{suffix}"))
    (tmp_path / "shared").mkdir()
    return made, tmp_path / "shared"


def test_two_hosts_sharing_a_filesystem_offer_it_once_before_and_after_the_reshape_and_back(
    hosts, placement_server
):
    (a, b), shared = hosts
    aggregate = str(uuid.uuid4())
    share = provider_uuid(aggregate)
    placement = PlacementClient.for_endpoint(placement_server.url)
    for host in (a, b):
        assert once(configure(host, shared)).code == 0
    filesystem = disk(placement, a.root)
    assert filesystem > 0 and disk(placement, b.root) == filesystem  # counted twice
    a.boot(a.unpinned[0], vcpu=1, memory=512, disk=3)
    b.boot(b.unpinned[0], vcpu=1, memory=512, disk=4)

    for host in (a, b):
        done = once(configure(host, shared, aggregate), "--output", "json")
        assert done.code == 0, done.stderr
        assert done.json()["reshape"]["request_id"]  # one POST /reshaper moved its guest

    assert disk(placement, a.root) == disk(placement, b.root) == 0
    assert disk(placement, share) == filesystem  # the filesystem, once
    assert "MISC_SHARES_VIA_AGGREGATE" in placement.traits(share)["traits"]
    for rp in (share, a.root, b.root):
        assert aggregate in placement.aggregates(rp)["aggregates"]
    assert disk_of(placement, a.unpinned[0]) == {share: 3}
    assert disk_of(placement, b.unpinned[0]) == {share: 4}
    only_disk = candidates(placement, f"resources=DISK_GB:1&member_of={aggregate}")
    assert [list(r["allocations"]) for r in only_disk] == [[share]]
    with_cpu = candidates(placement, f"resources=VCPU:1,DISK_GB:1&member_of={aggregate}")
    assert sorted(sorted(r["allocations"]) for r in with_cpu) == sorted(
        [sorted([a.root, share]), sorted([b.root, share])]
    )
    assert all(r["allocations"][share]["resources"] == {"DISK_GB": 1} for r in with_cpu)
    steady = once(configure(a, shared, aggregate), "--output", "json")
    assert steady.code == 0 and steady.json()["reshape"] is None

    # And back: host a alone first; b's guest stays on the sharing provider.
    back = once(configure(a, shared), "--output", "json")
    assert back.code == 0, back.stderr
    assert back.json()["reshape"]["request_id"]
    assert disk_of(placement, a.unpinned[0]) == {a.root: 3}
    assert disk_of(placement, b.unpinned[0]) == {share: 4}
    assert disk(placement, a.root) == filesystem
    assert aggregate not in placement.aggregates(a.root)["aggregates"]
    assert StateStore(a.state_dir).load().get(SHARED_STORAGE) is None
    assert once(configure(b, shared)).code == 0
    assert disk_of(placement, b.unpinned[0]) == {b.root: 4}
    assert disk(placement, b.root) == filesystem


def test_dry_run_shows_the_disk_moving_to_the_sharing_provider_and_writes_nothing(
    hosts, placement_server
):
    (a, _b), shared = hosts
    aggregate = str(uuid.uuid4())
    placement = PlacementClient.for_endpoint(placement_server.url)
    assert once(configure(a, shared)).code == 0
    a.boot(a.unpinned[0], vcpu=1, memory=512, disk=3)

    plan = once(configure(a, shared, aggregate), "--dry-run", "--output", "json")

    assert plan.code == 0, plan.stderr
    moves = plan.json()["reshape"]["consumers"]
    assert [m["consumer"] for m in moves] == [a.unpinned[0]]
    assert placement.providers_named(f"shared_storage_{aggregate}") == []
    assert disk_of(placement, a.unpinned[0]) == {a.root: 3}


def test_a_refused_move_leaves_a_new_sharing_provider_offering_nothing(hosts, placement_server):
    """The root's guests hold more DISK_GB than the sharing provider would
    offer (the root's ratio 2, the new one 1): the reshape is refused, the
    root keeps its DISK_GB and the guest's allocation, and the sharing
    provider, created and in the aggregate, offers no DISK_GB: the
    filesystem is still counted once."""
    (a, _b), shared = hosts
    aggregate = str(uuid.uuid4())
    share = provider_uuid(aggregate)
    placement = PlacementClient.for_endpoint(placement_server.url)
    assert once(configure(a, shared, extra="disk_allocation_ratio = 2.0\n")).code == 0
    filesystem = disk(placement, a.root)
    a.boot(a.unpinned[0], vcpu=1, memory=512, disk=filesystem)  # max_unit: the total
    a.boot(a.unpinned[1], vcpu=1, memory=512, disk=1)

    refused = once(configure(a, shared, aggregate), "--output", "json")

    assert refused.code != 0
    assert "DISK_GB" in refused.stderr + refused.stdout
    assert disk_of(placement, a.unpinned[0]) == {a.root: filesystem}
    assert disk_of(placement, a.unpinned[1]) == {a.root: 1}
    assert disk(placement, a.root) == filesystem
    assert disk(placement, share) == 0
    # The tree sync after the refusal leaves the sharing provider alone.
    assert share not in str(refused.json()["changes"])
    assert not [e for e in refused.json()["errors"] if "shared_storage_" in e.split(":")[0]]
    assert any("DISK_GB on shared_storage_" in e for e in refused.json()["errors"])
    assert placement.provider(share)["parent_provider_uuid"] is None
    assert share not in StateStore(Path(a.state_dir)).load()["owned_children"]


def test_two_hosts_creating_the_sharing_provider_converge_on_one(hosts, placement_server):
    """The second host finds the provider the first created (same uuid) and
    writes no second one: one provider by that name, one DISK_GB record."""
    (a, b), shared = hosts
    aggregate = str(uuid.uuid4())
    placement = PlacementClient.for_endpoint(placement_server.url)
    for host in (a, b):
        assert once(configure(host, shared)).code == 0
    filesystem = disk(placement, a.root)
    for host in (a, b):
        assert once(configure(host, shared, aggregate)).code == 0
    named = placement.providers_named(f"shared_storage_{aggregate}")
    assert [p["uuid"] for p in named] == [provider_uuid(aggregate)]
    assert (
        disk(placement, a.root)
        + disk(placement, b.root)
        + disk(placement, provider_uuid(aggregate))
        == filesystem
    )


def test_a_bad_shared_storage_aggregate_exits_78_and_writes_nothing(hosts, placement_server):
    (a, _b), shared = hosts
    result = once(configure(a, shared, "nfs-hosts"))
    assert result.code == 78, result.stderr
    assert "[compute] shared_storage_aggregate: 'nfs-hosts'" in result.stderr
    assert PlacementClient.for_endpoint(placement_server.url).providers_named(a.name) == []


def test_hosts_racing_to_create_the_sharing_provider_leave_one_at_the_smallest_size(
    placement_server, caplog
):
    """Four hosts at once, each with its own client and its own measure of
    the filesystem: the creates collide on the derived uuid, the writes on
    the generation, and one provider is left, holding the smallest total."""
    caplog.set_level(logging.INFO, logger="node_agent.placement.shared_storage")
    aggregate = str(uuid.uuid4())
    measures = [251, 250, 252, 251]
    start, looked = threading.Barrier(len(measures)), threading.Barrier(len(measures))
    errors = []

    def host(total):
        client = PlacementClient.for_endpoint(placement_server.url)
        read = client.provider
        first = [True]

        def provider(uuid):
            # Every host reads "not there" before any creates it.
            try:
                return read(uuid)
            finally:
                if first:
                    first.pop()
                    looked.wait()

        client.provider = provider
        wanted = sharing_provider(aggregate, Inventory(total=total))
        start.wait()
        try:
            ensure_sharing_provider(client, wanted, {"VCPU", "MEMORY_MB"}, total)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=host, args=(t,)) for t in measures]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert caplog.text.count("created sharing provider") == 1
    assert caplog.text.count("was created by another host first") == len(measures) - 1
    placement = PlacementClient.for_endpoint(placement_server.url)
    named = placement.providers_named(f"shared_storage_{aggregate}")
    assert [p["uuid"] for p in named] == [provider_uuid(aggregate)]
    assert disk(placement, provider_uuid(aggregate)) == min(measures)
    assert placement.aggregates(provider_uuid(aggregate))["aggregates"] == [aggregate]


def test_a_sharing_provider_larger_than_the_filesystem_is_never_written(placement_server):
    aggregate = str(uuid.uuid4())
    placement = PlacementClient.for_endpoint(placement_server.url)
    with pytest.raises(ReshapeError, match="exceeds the filesystem's 250 GiB"):
        ensure_sharing_provider(
            placement, sharing_provider(aggregate, Inventory(total=251)), {"VCPU"}, 250
        )
    assert placement.providers_named(f"shared_storage_{aggregate}") == []


def test_a_running_agent_brings_an_overstated_or_deleted_sharing_provider_back_each_cycle(
    hosts, placement_server
):
    """One long-lived reconciler (the service): a cycle whose tree did not
    change still sets the sharing provider back to the filesystem when
    another writer raised it, and recreates it after an operator deleted it."""
    (a, _b), shared = hosts
    aggregate = str(uuid.uuid4())
    share = provider_uuid(aggregate)
    placement = PlacementClient.for_endpoint(placement_server.url)
    settings = replace(a.settings(), instances_path=str(shared), shared_storage_aggregate=aggregate)
    store = StateStore(Path(a.state_dir))
    reconciler = Reconciler(a.agent, TreeSyncer(a.agent, store))

    def cycle():
        outcome = reconciler.apply(compute_desired(settings, state=store.load_or_empty(LOG)))
        assert outcome.ok, outcome.errors

    cycle()  # a new host: the sharing provider is made in its first cycle
    filesystem = disk(placement, share)
    assert filesystem > 0
    assert store.load()[SHARED_STORAGE] == {"aggregate": aggregate, "uuid": share}
    a.agent.stats.reset()
    cycle()  # steady: the sharing provider's inventory, nothing else
    assert [(m, p) for m, p, _ in a.agent.stats.log] == [
        ("GET", f"/resource_providers/{share}/inventories")
    ]
    held = placement.inventories(share)
    placement.put(
        f"/resource_providers/{share}/inventories/DISK_GB",
        {
            "resource_provider_generation": held["resource_provider_generation"],
            "total": filesystem * 3,
        },
    )
    cycle()
    assert disk(placement, share) == filesystem

    placement.delete(f"/resource_providers/{share}")
    cycle()  # finds it gone
    cycle()  # checks the reshape again: recreated
    assert disk(placement, share) == filesystem
    assert "MISC_SHARES_VIA_AGGREGATE" in placement.traits(share)["traits"]


def shared_pair(hosts, placement_server, aggregate):
    """Hosts a and b on one sharing provider, a guest on each (a: 3 GiB,
    b: 4 GiB); returns the client, the filesystem's size, the roots."""
    (a, b), shared = hosts
    placement = PlacementClient.for_endpoint(placement_server.url)
    for host in (a, b):
        assert once(configure(host, shared)).code == 0
    filesystem = disk(placement, a.root)
    a.boot(a.unpinned[0], vcpu=1, memory=512, disk=3)
    b.boot(b.unpinned[0], vcpu=1, memory=512, disk=4)
    for host in (a, b):
        assert once(configure(host, shared, aggregate)).code == 0
    assert disk_of(placement, a.unpinned[0]) == {provider_uuid(aggregate): 3}
    return placement, filesystem, a.root, b.root


def offered_disk(placement, root) -> list:
    """Where allocation candidates take DISK_GB for a guest on ``root``."""
    found = candidates(placement, "resources=VCPU:1,DISK_GB:1")
    return sorted(
        rp
        for r in found
        if root in r["allocations"]
        for rp, a in r["allocations"].items()
        if "DISK_GB" in a["resources"]
    )


def test_the_way_back_after_a_lost_state_file_finds_the_sharing_provider_in_placement(
    hosts, placement_server
):
    """The state file is deleted, then the option removed: the sharing
    provider is found from the root's aggregates (its derived uuid, its
    trait), the host's guest has its DISK_GB moved back whole in one reshape,
    and the root leaves the aggregate: the filesystem is offered to this host
    once, by its root, not by the sharing provider too."""
    (a, b), shared = hosts
    aggregate = str(uuid.uuid4())
    share = provider_uuid(aggregate)
    placement, filesystem, root_a, root_b = shared_pair(hosts, placement_server, aggregate)
    shutil.rmtree(a.state_dir)

    plan = once(configure(a, shared), "--dry-run", "--output", "json")
    assert plan.code == 0, plan.stderr
    assert [m["consumer"] for m in plan.json()["reshape"]["consumers"]] == [a.unpinned[0]]
    assert any(f"-{aggregate}" in c["summary"] for c in plan.json()["changes"])
    assert plan.json()["shared_storage"]["moved"] is False
    assert disk_of(placement, a.unpinned[0]) == {share: 3}  # the dry run wrote nothing
    shutil.rmtree(a.state_dir, ignore_errors=True)  # nor a state file that helps

    back = once(configure(a, shared), "--output", "json")

    assert back.code == 0, back.stderr
    assert back.json()["reshape"]["request_id"]
    whole = placement.get(f"/allocations/{a.unpinned[0]}")["allocations"]
    assert {rp: x["resources"] for rp, x in whole.items()} == {
        root_a: {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 3}
    }
    assert disk_of(placement, b.unpinned[0]) == {share: 4}
    assert disk(placement, root_a) == filesystem
    assert aggregate not in placement.aggregates(root_a)["aggregates"]
    assert offered_disk(placement, root_a) == [root_a]
    assert offered_disk(placement, root_b) == [share]
    assert back.json()["shared_storage"]["moved_from"] == [
        {"aggregate": aggregate, "provider": f"shared_storage_{aggregate}", "uuid": share}
    ]
    again = once(configure(a, shared), "--output", "json")
    assert again.code == 0 and again.json()["reshape"] is None
    assert again.json()["shared_storage"] is None


@pytest.mark.parametrize("lose_state", [False, True], ids=["state-kept", "state-lost"])
def test_changing_the_aggregate_moves_this_hosts_disk_to_the_new_sharing_provider(
    hosts, placement_server, lose_state
):
    """Aggregate A to B on host a: its guest's DISK_GB goes from A's sharing
    provider to B's in one reshape, b's stays on A's, a's root leaves A and
    joins B; nothing is offered twice."""
    (a, b), shared = hosts
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    share_a, share_b = provider_uuid(first), provider_uuid(second)
    placement, filesystem, root_a, root_b = shared_pair(hosts, placement_server, first)
    if lose_state:
        shutil.rmtree(a.state_dir)

    moved = once(configure(a, shared, second), "--output", "json")

    assert moved.code == 0, moved.stderr
    assert moved.json()["reshape"]["request_id"]
    assert disk_of(placement, a.unpinned[0]) == {share_b: 3}
    assert disk_of(placement, b.unpinned[0]) == {share_a: 4}
    assert disk(placement, root_a) == 0
    assert disk(placement, share_b) == disk(placement, share_a) == filesystem
    assert placement.aggregates(root_a)["aggregates"] == [second]
    assert offered_disk(placement, root_a) == [share_b]
    assert offered_disk(placement, root_b) == [share_a]
    report = moved.json()["shared_storage"]
    assert (report["aggregate"], report["uuid"], report["moved"]) == (second, share_b, True)
    assert [f["uuid"] for f in report["moved_from"]] == [share_a]
    assert StateStore(Path(a.state_dir)).load()[SHARED_STORAGE] == {
        "aggregate": second,
        "uuid": share_b,
    }
    steady = once(configure(a, shared, second), "--output", "json")
    assert steady.code == 0 and steady.json()["reshape"] is None
    assert steady.json()["shared_storage"]["moved_from"] == []


def test_the_running_service_shows_shared_storage_in_its_status_and_metrics(
    tmp_path, placement_server, host_name, rabbitmq
):
    """ctl status names the aggregate, the sharing provider, its DISK_GB
    and whether this host's DISK_GB moved; the metrics (promtool-clean)
    say the same."""
    from tests import promlint
    from tests.integration.agent_process import AgentProcess
    from tests.integration.rabbit import free_port
    from tests.integration.test_messaging import ctl
    from tests.integration.test_metrics import samples, scrape

    aggregate = str(uuid.uuid4())
    share = provider_uuid(aggregate)
    port = free_port()
    agent = AgentProcess(
        tmp_path,
        placement_server.url,
        host_name,
        agent_options=f"report_interval = 3600\nmetrics_port = {port}\n"
        f"[compute]\nshared_storage_aggregate = {aggregate}\n",
        extra=f"transport_url = {rabbitmq}\n",
    ).start()
    try:
        agent.status_after(lambda s: s.startswith("ok:"))
        status = ctl(rabbitmq, host_name, "status")["shared_storage"]
        text = scrape(port)
    finally:
        agent.stop()
        agent.notify.close()
    filesystem = disk(PlacementClient.for_endpoint(placement_server.url), share)
    assert filesystem > 0
    assert (status["aggregate"], status["uuid"], status["provider"]) == (
        aggregate,
        share,
        f"shared_storage_{aggregate}",
    )
    assert (status["disk_gb"], status["moved"], status["moved_from"]) == (filesystem, True, [])
    assert promlint.problems(text) == []
    assert promlint.promtool_problems(text) in (None, [])
    scraped = samples(text)
    labels = (("aggregate", aggregate), ("provider", f"shared_storage_{aggregate}"))
    assert scraped[("node_agent_shared_storage_moved", labels)] == 1
    disk_gb = (("provider", f"shared_storage_{aggregate}"), ("resource_class", "DISK_GB"))
    assert scraped[("node_agent_inventory", disk_gb)] == filesystem


def test_once_and_dry_run_show_shared_storage_in_text_json_and_the_textfile(
    hosts, placement_server, tmp_path
):
    from tests import promlint
    from tests.integration.test_metrics import samples

    (a, _b), shared = hosts
    aggregate = str(uuid.uuid4())
    placement = PlacementClient.for_endpoint(placement_server.url)
    assert once(configure(a, shared)).code == 0
    a.boot(a.unpinned[0], vcpu=1, memory=512, disk=3)
    textfile = tmp_path / "node_agent.prom"
    config = configure(a, shared, aggregate, extra=f"[agent]\nmetrics_textfile = {textfile}\n")

    plan = once(config, "--dry-run", "--output", "json")
    assert plan.code == 0, plan.stderr
    planned = plan.json()["shared_storage"]
    assert (planned["aggregate"], planned["moved"]) == (aggregate, False)
    text = once(config, "--dry-run").stdout
    assert "Shared storage:" in text
    assert f"this host's DISK_GB is not on shared_storage_{aggregate} yet" in text
    assert not textfile.exists()  # a dry run writes nothing

    done = once(config, "--output", "json")
    assert done.code == 0, done.stderr
    filesystem = disk(placement, provider_uuid(aggregate))
    report = done.json()["shared_storage"]
    assert (report["moved"], report["disk_gb"]) == (True, filesystem)
    written = textfile.read_text()
    assert promlint.problems(written) == []
    labels = (("aggregate", aggregate), ("provider", f"shared_storage_{aggregate}"))
    assert samples(written)[("node_agent_shared_storage_moved", labels)] == 1
    steady = once(config, "--dry-run")
    assert f"this host's DISK_GB is on shared_storage_{aggregate}" in steady.stdout
    assert f"DISK_GB {filesystem}" in steady.stdout


def test_a_refused_change_of_aggregate_moves_nothing_and_keeps_the_way_to_the_former(
    hosts, placement_server
):
    """B's sharing provider (ratio 1) cannot hold what a's guests use on
    A's (ratio 2): the reshape is refused, nothing moves, the root offers no
    DISK_GB and stays in A, so the next cycle (state file lost or not) still
    finds where the guests' DISK_GB is."""
    (a, _b), shared = hosts
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    share_a, share_b = provider_uuid(first), provider_uuid(second)
    placement = PlacementClient.for_endpoint(placement_server.url)
    assert once(configure(a, shared, extra="disk_allocation_ratio = 2.0\n")).code == 0
    filesystem = disk(placement, a.root)
    a.boot(a.unpinned[0], vcpu=1, memory=512, disk=filesystem)  # max_unit: the total
    a.boot(a.unpinned[1], vcpu=1, memory=512, disk=1)
    assert once(configure(a, shared, first, extra="disk_allocation_ratio = 2.0\n")).code == 0
    assert disk_of(placement, a.unpinned[0]) == {share_a: filesystem}
    root = a.root

    for lose_state in (False, True):
        if lose_state:
            shutil.rmtree(a.state_dir)
        refused = once(configure(a, shared, second), "--output", "json")

        assert refused.code != 0
        assert disk_of(placement, a.unpinned[0]) == {share_a: filesystem}
        assert disk_of(placement, a.unpinned[1]) == {share_a: 1}
        assert disk(placement, root) == 0
        assert sorted(placement.aggregates(root)["aggregates"]) == sorted([first, second])
        report = refused.json()["shared_storage"]
        assert report["moved"] is False
        assert [f["uuid"] for f in report["moved_from"]] == [share_a]
        assert disk(placement, share_b) == 0  # B's offers nothing while refused
