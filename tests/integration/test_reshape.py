"""The VCPU -> PCPU transition, states a to d, against the real Placement.

Guests come from libvirt's test driver (tests/data/libvirt/host.xml: two
pinned guests, 4 vCPUs on 2,10,3,11 and 2 vCPUs on 4,12, and unpinned
ones); the host topology is the 16-CPU fixture virhostcpudata/linux-test4.
The "scheduler" writes allocations through its own client; request counts
are the agent's client's.
"""

import logging
import re
import uuid
from dataclasses import replace

import pytest

from node_agent.cycle.reconcile import ReshapeRefused
from node_agent.errors import ConfigError
from node_agent.placement.client import PlacementClient
from node_agent.placement.reshape_host import pcpu_reshape, plan_pcpu_reshape
from tests.integration.reshape_driver import (
    PROJECT,
    USER,
    Host,
    agent_cycle,
    boot_legacy_guests,
    cpu_view,
    expected_after_reshape,
    reshaper_posts,
)

pytestmark = pytest.mark.integration

DEDICATED, SHARED = "2-5,10-13", "0-1,6-9,14-15"


@pytest.fixture
def host(tmp_path, placement_server, host_name):
    return Host(tmp_path, placement_server.url, host_name)


def test_transition_from_legacy_to_dedicated_reshapes_once(host, caplog):
    # a. Legacy: VCPU only; pinned and unpinned guests both hold VCPU.
    agent_cycle(host.agent, host.settings())
    boot_legacy_guests(host)
    before = host.allocations()
    outcome, report, _ = agent_cycle(host.agent, host.settings())
    assert not outcome.reshaped and report.ok
    assert cpu_view(host.inventories()) == {"VCPU": 16}
    assert host.allocations() == before

    # b. Transition mode (VCPU and PCPU both on every CPU) is refused before
    # anything is written: it would count each CPU twice.
    with pytest.raises(ConfigError, match="pcpu_transition_mode"):
        agent_cycle(host.agent, host.settings(transition=True))
    assert cpu_view(host.inventories()) == {"VCPU": 16}
    assert host.allocations() == before

    # c. The operator sets cpu_dedicated_set and cpu_shared_set: one POST /reshaper.
    host.agent.stats.reset()
    caplog.set_level(logging.INFO, logger="node_agent.placement.reshaper")
    outcome, report, _ = agent_cycle(host.agent, host.settings(dedicated=DEDICATED, shared=SHARED))
    assert outcome.reshaped and outcome.consumers_moved == 2 and report.ok
    assert len(reshaper_posts(host.agent)) == 1
    assert outcome.requests <= 2 + 2 + 1  # N consumers + 2, and the read after the POST
    assert cpu_view(host.inventories()) == {"VCPU": 8, "PCPU": 8}
    assert host.allocations() == expected_after_reshape(before, [host.pinned, host.pinned_2])
    assert report.applied == []  # the sync found the tree already reshaped
    assert any(
        "moved 2 consumers" in r.message and outcome.request_id in r.message for r in caplog.records
    )

    # d. Done: later cycles, and a fresh process with an empty state dir, do nothing.
    after = host.allocations()
    for state_dir in (None, str(host.tmp / "fresh-state")):
        fresh = PlacementClient.for_endpoint(host.url)
        outcome, report, _ = agent_cycle(
            fresh, host.settings(state_dir=state_dir, dedicated=DEDICATED, shared=SHARED)
        )
        assert not outcome.reshaped and report.ok and report.applied == []
        assert reshaper_posts(fresh) == []
    assert host.allocations() == after
    assert cpu_view(host.inventories()) == {"VCPU": 8, "PCPU": 8}


def test_dry_run_plan_reads_only_and_shows_each_move(host):
    agent_cycle(host.agent, host.settings())
    boot_legacy_guests(host)
    before = host.allocations()
    from node_agent.cycle.desired import compute_desired

    desired = compute_desired(host.settings(dedicated=DEDICATED, shared=SHARED))
    host.agent.stats.reset()
    plan = plan_pcpu_reshape(host.agent, desired, {host.name: host.root})
    assert host.agent.stats.writes == 0
    shown = plan.as_dict()
    assert shown["totals"] == {"consumers": 2, "moved": {"VCPU -> PCPU": 6}}
    assert [c["name"] for c in shown["consumers"]] == ["instance-00000001", "instance-00000002"]
    assert host.allocations() == before


def test_guest_booted_between_read_and_post_is_moved_by_the_retry(host):
    agent_cycle(host.agent, host.settings())
    boot_legacy_guests(host, pinned_2=False)
    calls = []

    def scheduler_boots_pinned_guest(body):
        calls.append(sorted(body["allocations"]))
        if len(calls) == 1:
            host.boot(host.pinned_2, vcpu=2, memory=2048)

    before_race = host.allocations()
    outcome, report, _ = agent_cycle(
        host.agent,
        host.settings(dedicated=DEDICATED, shared=SHARED),
        before_post=scheduler_boots_pinned_guest,
    )
    assert outcome.reshaped and outcome.attempts == 2 and report.ok
    assert calls == [
        [host.pinned],
        sorted([host.pinned, host.pinned_2]),
    ]  # the stale plan was never sent
    assert len(reshaper_posts(host.agent)) == 2  # the first one got a 409
    assert host.allocations()[host.pinned_2] == {host.root: {"PCPU": 2, "MEMORY_MB": 2048}}
    assert (
        host.allocations()[host.pinned]
        == expected_after_reshape(before_race, [host.pinned])[host.pinned]
    )


def test_pinned_guest_outside_the_new_dedicated_set_is_reshaped_with_a_warning_as_nova_does(host):
    """nova's _validate_pinning_configuration only warns about pins outside
    cpu_dedicated_set (a live migration may leave them stale), and its PCPU
    reshape moves every dedicated instance."""
    agent_cycle(host.agent, host.settings())
    boot_legacy_guests(host)
    before = host.allocations()
    outcome, report, desired = agent_cycle(
        host.agent, host.settings(dedicated="2-3,10-11,5-7", shared="0-1,8-9")
    )
    assert outcome.reshaped and report.ok
    assert any("instance-00000002" in w and "CPUs 4,12" in w for w in desired.warnings)
    assert len(reshaper_posts(host.agent)) == 1
    assert host.allocations() == expected_after_reshape(before, [host.pinned, host.pinned_2])
    assert cpu_view(host.inventories()) == {"VCPU": 4, "PCPU": 7}


def test_every_cpu_dedicated_under_floating_guests_keeps_the_cpu_classes_and_names_them(host):
    # Every CPU dedicated while floating guests run: nova-compute would refuse
    # to start, so the CPU sets are refused and VCPU/PCPU keep what
    # Placement holds; nothing else changed, so nothing is written.
    agent_cycle(host.agent, host.settings())
    boot_legacy_guests(host)
    host.boot(host.not_a_guest, vcpu=3, memory=512)
    before, inventories = host.allocations(), host.inventories()
    host.agent.stats.reset()
    outcome, report, _ = agent_cycle(host.agent, host.settings(dedicated="0-15"))
    assert isinstance(outcome, ReshapeRefused)
    for name in ("instance-00000003", "instance-00000005", "instance-00000006"):
        assert f"shared guest {name} (" in str(outcome)
    assert "cpu_shared_set" in str(outcome) and "VCPU and PCPU were kept" in str(outcome)
    assert reshaper_posts(host.agent) == [] and report.applied == []
    assert host.allocations() == before and host.inventories() == inventories


def test_a_refused_cpu_set_still_writes_an_unrelated_change(host):
    """One refusal holds back only the classes it is about: a memory
    reservation raised in the same change is written."""
    agent_cycle(host.agent, host.settings())
    boot_legacy_guests(host)
    before, inventories = host.allocations(), host.inventories()
    settings = replace(host.settings(dedicated="0-15"), reserved_host_memory_mb=1024)
    outcome, report, _ = agent_cycle(host.agent, settings)
    assert isinstance(outcome, ReshapeRefused) and report.ok
    after = host.inventories()
    assert {rc: after[rc] for rc in ("VCPU",)} == {rc: inventories[rc] for rc in ("VCPU",)}
    assert "PCPU" not in after
    assert after["MEMORY_MB"]["reserved"] == 1024 != inventories["MEMORY_MB"]["reserved"]
    assert host.allocations() == before


def test_host_not_yet_in_placement_has_nothing_to_reshape(host):
    from node_agent.cycle.desired import compute_desired

    desired = compute_desired(host.settings(dedicated=DEDICATED, shared=SHARED))
    outcome = pcpu_reshape(host.agent, desired, {})
    assert not outcome.reshaped and host.agent.stats.writes == 0


def resize_away(host, instance, dest_name):
    """What nova's move_allocations does when ``instance`` is resized off
    this host: its allocation here moves whole to a new consumer, the
    migration (same owner, no consumer type), and the instance claims on
    the destination. The domain stays defined here until the confirm."""
    migration = str(uuid.uuid4())
    held = host.scheduler.get(f"/allocations/{instance}")["allocations"]
    dest = str(uuid.uuid4())
    host.scheduler.post("/resource_providers", {"name": dest_name, "uuid": dest})
    host.scheduler.put(
        f"/resource_providers/{dest}/inventories",
        {
            "resource_provider_generation": 0,
            "inventories": {"VCPU": {"total": 16}, "MEMORY_MB": {"total": 65536}},
        },
    )
    host.scheduler.post(
        "/allocations",
        {
            migration: {
                "allocations": {rp: {"resources": a["resources"]} for rp, a in held.items()},
                "project_id": PROJECT,
                "user_id": USER,
                "consumer_generation": None,
            },
            instance: {
                "allocations": {dest: {"resources": {"VCPU": 4, "MEMORY_MB": 4096}}},
                "project_id": PROJECT,
                "user_id": USER,
                "consumer_generation": 1,
            },
        },
    )
    return migration, dest


def test_a_resize_in_flight_moves_its_migration_record_to_pcpu_with_the_guest(host):
    """nova's PCPU reshape moves the allocations of in-progress migrations
    whose instance is dedicated (test_update_provider_tree_for_pcpu_reshape):
    the resized guest's record on this host holds the pinned CPUs until the
    confirm, so left on VCPU it would double-book them."""
    agent_cycle(host.agent, host.settings())
    boot_legacy_guests(host)
    migration, dest = resize_away(host, host.pinned, f"{host.name}-dest")
    root = host.root
    outcome, report, _ = agent_cycle(host.agent, host.settings(dedicated=DEDICATED, shared=SHARED))
    assert outcome.reshaped and report.ok
    moved = host.scheduler.get(f"/allocations/{migration}")["allocations"]
    assert moved[root]["resources"] == {"PCPU": 4, "MEMORY_MB": 4096, "DISK_GB": 20}
    assert host.scheduler.get(f"/allocations/{host.pinned}")["allocations"] == {
        dest: {"generation": 2, "resources": {"VCPU": 4, "MEMORY_MB": 4096}}
    }
    usages = host.scheduler.get(f"/resource_providers/{root}/usages")["usages"]
    assert usages["PCPU"] == 4 + 2 and usages["VCPU"] == 6  # the floating guests only


def test_a_pinned_guest_claimed_as_vcpu_after_the_upgrade_moves_at_the_next_cycle(host):
    """While controllers still run nova's fallback query a pinned guest can
    be claimed as VCPU on a host that already offers PCPU; the service's
    next cycle sees a new dedicated guest and moves it."""
    from pathlib import Path

    from node_agent.cycle.desired import compute_desired
    from node_agent.cycle.reconcile import Reconciler
    from node_agent.host.libvirt_facts import read_guests
    from node_agent.placement.sync import TreeSyncer
    from node_agent.state import StateStore

    agent_cycle(host.agent, host.settings())
    boot_legacy_guests(host)
    settings = host.settings(dedicated=DEDICATED, shared=SHARED)
    store = StateStore(Path(host.state_dir))
    service = Reconciler(
        host.agent, TreeSyncer(host.agent, store), guests_now=lambda: read_guests(settings)
    )
    assert service.apply(compute_desired(settings, state=store.load())).ok

    # nova defines a pinned guest on CPUs 5 and 13, claimed through the fallback query.
    late = str(uuid.uuid4())
    xml_path = Path(host.uri[len("test://") :])
    text = xml_path.read_text()
    second = text.index("<domain", text.index("<name>instance-00000001</name>"))
    domain = text[second : text.index("</domain>", second) + len("</domain>")]
    clone = (
        domain.replace("instance-00000002", "instance-00000009")
        .replace('cpuset="4"', 'cpuset="5"')
        .replace('cpuset="12"', 'cpuset="13"')
    )
    clone = re.sub(r"<uuid>[^<]+</uuid>", f"<uuid>{late}</uuid>", clone, count=1)
    xml_path.write_text(text.replace("</node>", clone + "\n</node>"))
    host.boot(late, vcpu=2, memory=2048)

    outcome = service.apply(compute_desired(settings, state=store.load()))
    assert outcome.ok and outcome.reshape is not None and outcome.reshape.reshaped
    held = host.scheduler.get(f"/allocations/{late}")["allocations"][host.root]["resources"]
    assert held == {"PCPU": 2, "MEMORY_MB": 2048}
