"""State files and directories that cannot be used, never a traceback: a
directory the file system refuses (read-only, full) is a clear error with
the real cause and exit 69, on the command line and in the running
service's control RPC; a file of the wrong shape is rebuilt from Placement
as a lost one is."""

import json
import subprocess

import pytest

from node_agent.errors import StateError
from node_agent.state import FILE_NAME, MAINTENANCE, ROOT_UUID, StateStore, encode
from tests.cli.runner import run_agent, write_config
from tests.hostdata import HOSTDATA
from tests.integration.test_messaging import NODE_AGENT, agent  # noqa: F401 (fixture)
from tests.state_dir_faults import full, read_only

pytestmark = pytest.mark.integration

TEST6 = HOSTDATA / "virhostcpudata" / "linux-test6"


def test_a_full_state_directory_is_refused_naming_enospc(tmp_path):
    store = StateStore(tmp_path / "state")
    with full(store.directory):
        with pytest.raises(StateError) as refused:
            store.put(MAINTENANCE, {"on": True})
    assert refused.value.cause == "ENOSPC"
    assert "(ENOSPC)" in str(refused.value)


def test_maintenance_through_the_service_with_a_read_only_state_directory_exits_69(
    agent,
    rabbitmq,
):
    agent.status_after(lambda s: s.startswith("ok:"))
    with read_only(agent.dir / "state") as cause:
        result = run_agent("maintenance", "on", "--config-file", str(agent.config))
        answered = subprocess.run(
            [str(NODE_AGENT), "ctl", "--host", agent.host, "--transport-url", rabbitmq]
            + ["--timeout", "60", "maintenance", "on"],
            capture_output=True,
            text=True,
            timeout=90,
        )

    assert result.code == 69, result.stderr
    assert f"({cause})" in result.stderr and "Traceback" not in result.stderr
    assert answered.returncode == 69, answered.stderr
    answer = json.loads(answered.stdout)
    assert answer["exit_code"] == 69 and f"({cause})" in answer["error"]
    assert "Traceback" not in agent.log()
    assert f"maintenance on refused: state file {agent.dir / 'state'}" in agent.log()


def test_once_with_a_wrong_shaped_state_file_rebuilds_it_with_one_warning(
    tmp_path, placement_server, host_name
):
    config = write_config(
        tmp_path,
        TEST6,
        host=host_name,
        extra="[placement]\nauth_type = admin_token\ntoken = admin\n"
        f"endpoint_override = {placement_server.url}\n",
    )
    once = ("--config-file", str(config), "--once")
    assert run_agent(*once).code == 0
    store = StateStore(tmp_path / "state")
    root = store.load()[ROOT_UUID]
    # A valid checksum over a shape no reader expects: an AttributeError
    # traceback at every run before.
    bad = encode({**store.load(), "providers": [host_name]})
    store.path.write_text(bad)

    first, second = run_agent(*once), run_agent(*once)

    assert first.code == 0 and "Traceback" not in first.stderr, first.stderr
    assert first.stderr.count("WARNING") == 1, first.stderr
    assert f"state file {store.path} has a valid checksum but its 'providers'" in first.stderr
    assert second.code == 0 and "WARNING" not in second.stderr, second.stderr
    assert store.load()[ROOT_UUID] == root
    assert store.path.with_name(FILE_NAME + ".corrupt").read_text() == bad
