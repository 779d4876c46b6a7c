"""Guests that do not fit new CPU sets are refused by name, before any write
(issue 12, item 4), through the real ``node-agent`` command and the
service's reconciler. Guests: tests/data/libvirt/host.xml (instance-00000001
pinned to 2,3,10,11; instance-00000002 to 4,12; 03, 05, 06 floating)."""

import logging
from pathlib import Path

import pytest

from node_agent.cycle.desired import compute_desired
from node_agent.cycle.reconcile import Reconciler
from node_agent.placement.sync import TreeSyncer
from node_agent.state import StateStore
from tests.cli.runner import run_agent
from tests.integration.reshape_driver import (
    Host,
    boot_legacy_guests,
    expected_after_reshape,
    reshaper_posts,
)
from tests.integration.test_cli_reshape import once, write_config

pytestmark = pytest.mark.integration
LOG = logging.getLogger(__name__)


@pytest.fixture
def host(tmp_path, placement_server, host_name):
    host = Host(tmp_path, placement_server.url, host_name)
    assert once(write_config(host)).code == 0
    boot_legacy_guests(host)
    return host


def test_pinned_guest_on_shared_cpus_is_a_warning_by_name_and_is_reshaped(host):
    """nova-compute only warns at start about dedicated vCPUs outside
    cpu_dedicated_set; the agent, writing the root itself, warns too and
    moves them to PCPU, dry run and real run. (nova-compute's own resource
    updates then fail on such a guest: companion mode's preview, not this.)"""
    before = host.allocations()
    # CPUs 10-11 of instance-00000001 and 12 of instance-00000002 go to the shared set.
    stale = write_config(host, "cpu_dedicated_set = 2-9\ncpu_shared_set = 0-1,10-15\n")

    plan = once(stale, "--dry-run", "--output", "json")
    assert plan.code == 0, plan.stderr
    assert not plan.json()["reshape"].get("refused")
    warned = [w for w in plan.json()["warnings"] if "outside cpu_dedicated_set" in w]
    assert len(warned) == 2 and "dedicated guest instance-00000001 (" in warned[0]
    assert "CPUs 10-11 are in cpu_shared_set = '0-1,10-15'" in warned[0]
    assert "dedicated guest instance-00000002 (" in warned[1] and "CPUs 12 are in" in warned[1]

    checked = run_agent("--config-file", stale, "--check-config")
    assert checked.code == 0, checked.stderr
    assert (
        "but 2 with dedicated vCPUs run outside cpu_dedicated_set "
        "(instance-00000001, instance-00000002)" in checked.stdout
    )
    as_json = run_agent("--config-file", stale, "--check-config", "--output", "json").json()
    assert as_json["guests"]["pinned_outside_dedicated"] == [
        "instance-00000001",
        "instance-00000002",
    ]

    result = once(stale)
    assert result.code == 0 and "Traceback" not in result.stderr
    assert f"dedicated guest instance-00000001 ({host.pinned})" in result.stdout
    assert host.allocations() == expected_after_reshape(before, [host.pinned, host.pinned_2])
    assert len(reshaper_posts(host.scheduler)) == 0  # the agent's client posted, not this one


def test_floating_guests_with_no_shared_set_left_are_refused_each_cycle_until_fixed(host, caplog):
    before, inventories = host.allocations(), host.inventories()
    store = StateStore(Path(host.state_dir))
    syncer = TreeSyncer(host.agent, store)
    reconciler = Reconciler(host.agent, syncer)  # one long-lived service
    host.agent.stats.reset()
    only_dedicated = host.settings(dedicated="2-15")
    for _cycle in range(2):
        outcome = reconciler.apply(compute_desired(only_dedicated, state=store.load_or_empty(LOG)))
        assert not outcome.ok
        text = "\n".join(outcome.errors)
        for name in ("instance-00000003", "instance-00000005", "instance-00000006"):
            assert f"shared guest {name} (" in text
        assert "cpu_shared_set is empty" in text and "VCPU and PCPU were kept" in text
    assert host.agent.stats.writes == 0  # nothing but the CPU sets changed
    assert host.allocations() == before and host.inventories() == inventories
    # The reconciler leaves the refusal to its caller, which says it once
    # while it stays the same (the service: tests/integration/test_metrics.py).
    assert not [
        r for r in caplog.records if r.levelno >= logging.ERROR and "shared guest" in r.getMessage()
    ]

    # The operator gives floating guests a shared set: the next cycle applies.
    fixed = host.settings(dedicated="2-7,10-15", shared="0-1,8-9")
    outcome = reconciler.apply(compute_desired(fixed, state=store.load_or_empty(LOG)))
    assert outcome.ok, outcome.errors
    assert outcome.reshape.consumers_moved == 2


def test_check_config_refuses_guests_the_cpu_sets_leave_without_cpus(tmp_path):
    """Issue 28: --check-config said "valid" for CPU sets the guests block.
    With libvirt answering it judges the guests as a cycle does (exit 78,
    naming them); without libvirt it says the guest checks were skipped."""
    host = Host(tmp_path, "http://127.0.0.1:9", "check-host")  # Placement is not asked
    blocked = run_agent("--config-file", write_config(host, DEDICATED_ONLY), "--check-config")
    assert blocked.code == 78, blocked.stdout + blocked.stderr
    assert "valid" not in blocked.stdout and "Traceback" not in blocked.stderr
    for name in ("instance-00000003", "instance-00000005", "instance-00000006"):
        assert f"shared guest {name} (" in blocked.stderr
    assert "cpu_shared_set is empty" in blocked.stderr

    fits = run_agent("--config-file", write_config(host, SPLIT), "--check-config")
    assert fits.code == 0, fits.stderr
    assert "Configuration is valid" in fits.stdout and "Guests: the " in fits.stdout

    host.uri = f"test://{tmp_path / 'no-such-host.xml'}"
    unreachable = run_agent("--config-file", write_config(host, DEDICATED_ONLY), "--check-config")
    assert unreachable.code == 0, unreachable.stderr
    assert "Guest checks skipped: libvirt at test://" in unreachable.stdout
    assert "cannot be reached" in unreachable.stdout
    as_json = run_agent(
        "--config-file", write_config(host, DEDICATED_ONLY), "--check-config", "--output", "json"
    )
    assert as_json.json()["guests"]["checked"] is False


DEDICATED_ONLY = "cpu_dedicated_set = 2-15\n"
SPLIT = "cpu_dedicated_set = 2-7,10-15\ncpu_shared_set = 0-1,8-9\n"
