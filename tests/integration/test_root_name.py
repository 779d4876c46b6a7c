"""The root's name is libvirt's hostname, as nova-compute names its compute
node, when no file sets [DEFAULT] host; an upgrade from a release that named
it after the machine's hostname renames the root once, its children with it,
and creates no second root -- also when the state file is lost. Against the
real Placement, with libvirt's test driver."""

from __future__ import annotations

import shutil
import subprocess

import libvirt
import pytest

from tests.hostdata import HOSTDATA
from tests.integration.agent_process import AGENT, AgentProcess

pytestmark = pytest.mark.integration

NUMA_HOST = HOSTDATA / "vircaps2xmldata/linux-basic/system"


def libvirt_hostname() -> str:
    conn = libvirt.openReadOnly("test:///default")
    try:
        return conn.getHostname()
    finally:
        conn.close()


def once(agent: AgentProcess) -> None:
    run = subprocess.run(
        [str(AGENT), "--once", "--config-file", str(agent.config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr


def tree(placement, name: str) -> dict[str, str]:
    """name -> uuid of the tree whose root is called ``name``."""
    (root,) = placement.providers_named(name)
    return {rp["name"]: rp["uuid"] for rp in placement.providers_in_tree(root["uuid"])}


def test_upgrade_renames_the_root_to_libvirts_hostname_once(tmp_path, placement, host_name):
    new = libvirt_hostname()
    agent = AgentProcess(tmp_path, placement.endpoint, host_name, system_dir=NUMA_HOST)
    text = agent.config_text().replace("connection_uri =\n", "connection_uri = test:///default\n")
    text = text.replace("[compute]\n", "[compute]\nnuma_in_placement = true\n", 1)
    agent.write_config(text)
    once(agent)
    before = tree(placement, host_name)
    assert len(before) > 1, "no child: the children's rename is not tested"

    # The upgrade: no [DEFAULT] host, so the name is libvirt's.
    agent.write_config(text.replace(f"host = {host_name}\n", ""))
    once(agent)
    assert placement.providers_named(host_name) == []
    after = tree(placement, new)
    assert sorted(after.values()) == sorted(before.values())
    assert sorted(after) == sorted(name.replace(host_name, new, 1) for name in before)

    # The state file lost, and the name changed back: the root is found by
    # this machine's mark, not created a second time.
    shutil.rmtree(tmp_path / "state")
    agent.write_config(text)
    once(agent)
    assert placement.providers_named(new) == []
    assert tree(placement, host_name) == before


def test_dry_run_names_the_root_as_nova_compute_does(tmp_path):
    """No [DEFAULT] host: libvirt's hostname; a set host keeps its name."""
    from tests.cli.runner import run_agent, write_config

    config = write_config(tmp_path, NUMA_HOST, host="set-by-operator")
    config.write_text(
        config.read_text().replace("connection_uri =\n", "connection_uri = test:///default\n")
    )
    named = run_agent("--config-file", str(config), "--once", "--dry-run", "--output", "json")
    assert named.code == 0, named.stderr
    assert named.json()["providers"][0]["name"] == "set-by-operator"
    config.write_text(config.read_text().replace("host = set-by-operator\n", ""))
    default = run_agent("--config-file", str(config), "--once", "--dry-run", "--output", "json")
    assert default.code == 0, default.stderr
    assert default.json()["providers"][0]["name"] == libvirt_hostname()
