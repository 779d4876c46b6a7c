"""The reshape through the real ``node-agent`` command: dry-run shows it, --once does it once."""

import pytest

from tests.cli.runner import run_agent
from tests.integration.reshape_driver import (
    Host,
    boot_legacy_guests,
    cpu_view,
    expected_after_reshape,
    reshaper_posts,
)
from tests.machine_id import isolated_config

pytestmark = pytest.mark.integration


def write_config(host: Host, extra: str = "") -> str:
    path = host.tmp / "node-agent.conf"
    path.write_text(
        isolated_config(host.tmp, host.name)
        + f"[DEFAULT]\nhost = {host.name}\n[agent]\nstate_path = {host.state_dir}\n"
        f"[host]\nsysfs_root = {host.sysfs}\n[libvirt]\nconnection_uri = {host.uri}\n"
        f"[compute]\ninstances_path = {host.tmp}\n{extra}"
        f"[placement]\nauth_type = admin_token\ntoken = admin\n"
        f"endpoint_override = {host.url}\n"
    )
    return str(path)


def once(config, *args):
    return run_agent("--config-file", config, "--once", *args)


def test_dedicated_set_reshapes_pinned_guests_once_through_the_cli(
    placement_server, host_name, tmp_path
):
    host = Host(tmp_path, placement_server.url, host_name)
    legacy = write_config(host)
    assert once(legacy).code == 0
    boot_legacy_guests(host)
    before = host.allocations()

    pinned = write_config(host, "cpu_dedicated_set = 2-7,10-15\ncpu_shared_set = 0-1,8-9\n")
    plan = once(pinned, "--dry-run", "--output", "json")
    assert plan.code == 0, plan.stderr
    moved = {c["consumer"] for c in plan.json()["reshape"]["consumers"]}
    assert moved == {host.pinned, host.pinned_2}
    assert host.allocations() == before  # dry-run wrote nothing

    done = once(pinned, "--output", "json")
    assert done.code == 0, done.stderr
    assert done.json()["reshape"]["request_id"]
    assert cpu_view(host.inventories()) == {"VCPU": 4, "PCPU": 12}
    assert host.allocations() == expected_after_reshape(before, {host.pinned, host.pinned_2})

    again = once(pinned, "--output", "json")
    assert again.code == 0 and again.json()["reshape"] is None
    assert again.json()["changes"] == []
    assert len(reshaper_posts(host.scheduler)) == 0  # the scheduler client never reshapes


def test_pinned_guest_outside_the_new_dedicated_set_is_a_warning_and_reshaped_as_in_nova(
    placement_server, host_name, tmp_path
):
    host = Host(tmp_path, placement_server.url, host_name)
    assert once(write_config(host)).code == 0
    boot_legacy_guests(host)
    before = host.allocations()
    # instance-00000001 is pinned to 2,3,10,11: leave 10-11 out of the dedicated set.
    stale = write_config(host, "cpu_dedicated_set = 2-9\ncpu_shared_set = 0-1,10-15\n")
    result = once(stale)
    assert result.code == 0, result.stderr
    assert "Traceback" not in result.stderr
    shown = result.stdout + result.stderr  # the report's warnings
    assert "outside cpu_dedicated_set" in shown and "CPUs 10-11" in shown
    assert host.allocations() == expected_after_reshape(before, [host.pinned, host.pinned_2])
    assert cpu_view(host.inventories()) == {"VCPU": 8, "PCPU": 8}


def test_a_root_adopted_with_a_reshape_due_is_marked_before_the_reshape_moves_anything(
    placement_server, host_name, tmp_path
):
    """Issue 28: adopting a root no machine marked (an older agent's, the
    state file lost) in a cycle that also reshapes sent the POST /reshaper
    first and the owner mark after it: a second machine adopting the same
    root at that moment could have its allocations moved by this one. The
    mark is now written (compare-and-set, read back) before the reshape."""
    import shutil

    from tests.integration.test_applier import RequestLog

    host = Host(tmp_path, placement_server.url, host_name)
    assert once(write_config(host)).code == 0
    boot_legacy_guests(host)
    root = host.root
    traits = host.scheduler.get(f"/resource_providers/{root}/traits")
    unmarked = [t for t in traits["traits"] if not t.startswith("CUSTOM_OWNER_NODE_AGENT_")]
    host.scheduler.put(
        f"/resource_providers/{root}/traits",
        {
            "resource_provider_generation": traits["resource_provider_generation"],
            "traits": unmarked,
        },
    )
    shutil.rmtree(host.state_dir)
    log = RequestLog(placement_server)

    done = once(write_config(host, "cpu_dedicated_set = 2-7,10-15\ncpu_shared_set = 0-1,8-9\n"))

    assert done.code == 0, done.stderr
    requests = log.requests()
    mark = requests.index(f"PUT /resource_providers/{root}/traits 200")
    assert mark < requests.index("POST /reshaper 204"), requests
    assert cpu_view(host.inventories()) == {"VCPU": 4, "PCPU": 12}
