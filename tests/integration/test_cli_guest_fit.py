"""Guests that do not fit new CPU sets are refused by name, before any write
(issue 12, item 4), through the real ``node-agent`` command and the
service's reconciler. Guests: tests/data/libvirt/host.xml (instance-00000001
pinned to 2,3,10,11; instance-00000002 to 4,12; 03, 05, 06 floating)."""

import logging
from pathlib import Path

import pytest

from node_agent.cycle.desired import compute_desired
from node_agent.cycle.reconcile import Reconciler
from node_agent.state import StateStore
from node_agent.placement.sync import TreeSyncer
from tests.integration.reshape_driver import Host, boot_legacy_guests, reshaper_posts
from tests.integration.test_cli_reshape import once, write_config

pytestmark = pytest.mark.integration
LOG = logging.getLogger(__name__)


@pytest.fixture
def host(tmp_path, placement_server, host_name):
    host = Host(tmp_path, placement_server.url, host_name)
    assert once(write_config(host)).code == 0
    boot_legacy_guests(host)
    return host


def test_pinned_guest_on_shared_cpus_is_refused_by_name_with_exit_1_writing_nothing(host):
    before, inventories = host.allocations(), host.inventories()
    # CPUs 10-11 of instance-00000001 and 12 of instance-00000002 go to the shared set.
    bad = write_config(host, "cpu_dedicated_set = 2-9\ncpu_shared_set = 0-1,10-15\n")

    plan = once(bad, "--dry-run", "--output", "json")
    assert plan.code == 0, plan.stderr
    refused = plan.json()["reshape"]["refused"]
    assert len(refused) == 2 and "pinned guest instance-00000001 (" in refused[0]
    assert "CPUs 10-11 are in cpu_shared_set = '0-1,10-15'" in refused[0]
    assert "pinned guest instance-00000002 (" in refused[1] and "CPUs 12 are in" in refused[1]
    assert plan.json()["changes"] == []

    result = once(bad)
    assert result.code == 1 and "Traceback" not in result.stderr
    assert f"pinned guest instance-00000001 ({host.pinned})" in result.stderr
    assert "cpu_dedicated_set = '2-9'" in result.stderr
    assert "nothing was written to Placement" in result.stderr
    assert host.allocations() == before and host.inventories() == inventories
    assert reshaper_posts(host.scheduler) == []


def test_floating_guests_with_no_shared_set_left_are_refused_each_cycle_until_fixed(
        host, caplog):
    before, inventories = host.allocations(), host.inventories()
    store = StateStore(Path(host.state_dir))
    syncer = TreeSyncer(host.agent, store)
    reconciler = Reconciler(host.agent, syncer)       # one long-lived service
    host.agent.stats.reset()
    only_dedicated = host.settings(dedicated="2-15")
    for _cycle in range(2):
        outcome = reconciler.apply(compute_desired(only_dedicated,
                                                   state=store.load_or_empty(LOG)))
        assert not outcome.ok
        text = "\n".join(outcome.errors)
        for name in ("instance-00000003", "instance-00000005", "instance-00000006"):
            assert f"floating guest {name} (" in text
        assert "cpu_shared_set is empty" in text
    assert host.agent.stats.writes == 0
    assert host.allocations() == before and host.inventories() == inventories
    assert sum("floating guest instance-00000003" in r.getMessage()
               for r in caplog.records if r.levelno >= logging.ERROR) == 2

    # The operator gives floating guests a shared set: the next cycle applies.
    fixed = host.settings(dedicated="2-7,10-15", shared="0-1,8-9")
    outcome = reconciler.apply(compute_desired(fixed, state=store.load_or_empty(LOG)))
    assert outcome.ok, outcome.errors
    assert outcome.reshape.consumers_moved == 2
