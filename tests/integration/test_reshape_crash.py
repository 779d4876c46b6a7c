"""SIGKILL the agent's reshape cycle at random points; the restart converges.

Each round puts Placement back in the legacy shape (pinned guests on VCPU,
VCPU-only inventory) with a reverse reshape written by the test, runs the
agent (``python -m tests.integration.reshape_driver``) with the new CPU
sets, kills it after a random delay, then runs it again to completion.
Every consumer's allocations, summed by class, must be what they were
before (pinned guests' VCPU counted as PCPU), on the same providers, and
the inventory must match the configuration.
"""

import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node_agent.cycle.desired import compute_desired
from tests.integration.reshape_driver import Host, boot_legacy_guests, expected_after_reshape

pytestmark = pytest.mark.integration

ROUNDS = 20
SEED = int(os.environ.get("RESHAPE_CRASH_SEED", "20240607"))
DEDICATED, SHARED = "2-5,10-13", "0-1,6-9,14-15"
REPO = Path(__file__).resolve().parents[2]


def driver_args(host, settings):
    return [
        sys.executable,
        "-u",
        "-m",
        "tests.integration.reshape_driver",
        host.url,
        host.name,
        host.sysfs,
        host.uri,
        host.state_dir,
        str(host.tmp),
        "--dedicated",
        DEDICATED,
        "--shared",
        SHARED,
    ]


def back_to_legacy(host, legacy_inventories, legacy_allocations):
    """The test's own reverse reshape: the state before the operator's change."""
    root = host.root
    generation = host.scheduler.get(f"/resource_providers/{root}/inventories")[
        "resource_provider_generation"
    ]
    allocations = {}
    for consumer, by_rp in legacy_allocations.items():
        current = host.scheduler.get(f"/allocations/{consumer}")
        allocations[consumer] = {
            "allocations": {rp: {"resources": res} for rp, res in by_rp.items()},
            "project_id": current["project_id"],
            "user_id": current["user_id"],
            "consumer_generation": current["consumer_generation"],
        }
    host.scheduler.post(
        "/reshaper",
        {
            "inventories": {
                root: {
                    "resource_provider_generation": generation,
                    "inventories": legacy_inventories,
                }
            },
            "allocations": allocations,
        },
    )


@pytest.fixture
def host(tmp_path, placement_server, host_name):
    return Host(tmp_path, placement_server.url, host_name)


def cycle_span(args, env) -> float:
    """Seconds from "ready" to exit of one uninterrupted run: where to aim."""
    agent = subprocess.Popen(
        args, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert agent.stdout.readline().strip() == "ready"
    start = time.monotonic()
    agent.stdout.read()
    assert agent.wait() == 0
    return time.monotonic() - start


def on_root(host, allocations=None):
    """consumer -> resources on the root: given, or as Placement shows it now."""
    if allocations is not None:
        return {c: by_rp[host.root] for c, by_rp in allocations.items()}
    body = host.scheduler.get(f"/resource_providers/{host.root}/allocations")
    return {c: a["resources"] for c, a in body["allocations"].items()}


def by_class(by_rp):
    totals = collections.Counter()
    for res in by_rp.values():
        totals.update(res)
    return dict(totals)


def test_sigkill_at_random_points_converges_without_losing_allocations(host):
    rng = random.Random(SEED)
    print(f"crash test seed {SEED} (set RESHAPE_CRASH_SEED to replay)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    settings = host.settings(dedicated=DEDICATED, shared=SHARED)
    wanted_inventories = {
        rc: inv.as_placement()
        for rc, inv in compute_desired(settings).tree.root.inventories.items()
    }

    subprocess.run(
        driver_args(host, settings)[:-4], env=env, check=True, capture_output=True, cwd=REPO
    )  # legacy: creates the tree
    boot_legacy_guests(host)
    legacy_inventories = host.inventories()
    legacy = host.allocations()
    expected = expected_after_reshape(legacy, [host.pinned, host.pinned_2])

    span = cycle_span(driver_args(host, settings), env)
    killed_mid_cycle, seen = 0, collections.Counter()
    for round_ in range(ROUNDS):
        back_to_legacy(host, legacy_inventories, legacy)
        assert host.allocations() == legacy
        agent = subprocess.Popen(
            driver_args(host, settings),
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert agent.stdout.readline().strip() == "ready"
        delay = rng.uniform(0, span)
        time.sleep(delay)
        agent.send_signal(signal.SIGKILL)
        rest = agent.stdout.read()
        agent.wait()
        killed_mid_cycle += "done" not in rest
        # Whatever the moment, Placement holds one shape or the other, never a
        # mix. One GET of the root's allocations is one consistent snapshot
        # (a POST cut off by the kill may still be committing meanwhile).
        at_kill = on_root(host)
        assert at_kill in (on_root(host, legacy), on_root(host, expected)), (round_, delay)
        seen["before POST /reshaper" if at_kill == on_root(host, legacy) else "after"] += 1

        restart = subprocess.run(
            driver_args(host, settings), env=env, cwd=REPO, capture_output=True, text=True
        )
        assert restart.returncode == 0, (round_, delay, restart.stderr[-2000:])
        now = host.allocations()
        assert now == expected, (round_, delay)
        for consumer in legacy:
            assert by_class(now[consumer]) == by_class(expected[consumer])
        assert host.inventories() == wanted_inventories, (round_, delay)
    print(
        f"{ROUNDS} rounds, {killed_mid_cycle} killed before the cycle finished "
        f"({dict(seen)}), cycle span {span:.2f}s"
    )
    assert killed_mid_cycle >= ROUNDS // 4  # the kills did land inside cycles
