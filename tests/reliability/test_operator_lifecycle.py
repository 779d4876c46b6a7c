"""Issue 15, crashes and hangs: what an operator meets on a real host, each
through the real CLI or the real service process. Every case ends with one
clear line and an exit code, never a traceback or a hang."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.cli.runner import run_agent, write_config
from tests.hostdata import HOSTDATA
from tests.integration.agent_process import AgentProcess
from tests.integration.rabbit import rabbitmq  # noqa: F401 (fixture)
from tests.integration.test_service_process import agent as service  # noqa: F401 (fixture)
from tests.reliability.nobody import (
    open_to_everyone,
    run_as_nobody,
    skip_unless_root_with_setpriv,
    stage_tree,
    world_readable_dir,
)
from tests.reliability.test_security import placement_section

TEST6 = HOSTDATA / "virhostcpudata" / "linux-test6"
NOBODY_UID = 65534


def assert_one_clear_line(result, code: int, *fragments: str) -> None:
    assert result.code == code, (result.code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


# ------------------------------------------------------------ non-UTF-8 config


@pytest.mark.parametrize("args", [("--check-config",), ("--once", "--dry-run")])
def test_config_file_with_a_non_utf8_byte_is_a_config_error_naming_file_and_offset(tmp_path, args):
    config = write_config(tmp_path, TEST6)
    text = config.read_bytes()
    config.write_bytes(text + b"# caf\xe9\n")
    result = run_agent("--config-file", str(config), *args)
    assert_one_clear_line(result, 78, str(config), f"offset {len(text) + 5}", "not UTF-8")


OVERLAP = "[compute]\ncpu_dedicated_set = 0-3\ncpu_shared_set = 3-4\n"


@pytest.mark.parametrize(
    "new_config, fragment",
    [
        (lambda text: text.encode() + b"# \xff\n", "is not UTF-8 text"),
        (lambda text: text.replace("[compute]\n", OVERLAP).encode(), "overlap on CPUs 3"),
        (
            lambda text: text.replace("[DEFAULT]\n", "[DEFAULT]\ndebug = maybe\n").encode(),
            "[DEFAULT] debug = 'maybe' in ",
        ),
    ],
    ids=["non-utf8-byte", "overlapping-cpu-sets", "bad-logging-value"],
)
def test_sighup_with_a_bad_config_keeps_the_running_config(service, new_config, fragment):
    service.start()
    service.status_after(lambda s: s.startswith("ok:"))
    service.config.write_bytes(new_config(service.config_text()))
    service.send(signal.SIGHUP)
    service.notify.wait_for(lambda d: d == "RELOADING=1")
    service.new_status(lambda s: s.startswith("ok:"))
    log = service.log()
    assert "reload refused, the running configuration stays" in log
    assert fragment in log
    assert "configuration reloaded" not in log
    assert "Traceback" not in log
    assert service.proc.poll() is None


# ------------------------------------------------------------ state file owner


@pytest.fixture
def shared_dir():
    """A directory tree ``nobody`` can read (root only, with setpriv)."""
    skip_unless_root_with_setpriv()
    base = world_readable_dir()
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_state_file_written_by_root_keeps_the_directory_owner_and_the_service_reads_it(shared_dir):
    """``sudo node-agent maintenance on`` on a state directory owned by the
    service user: the service user can still read the file afterwards."""
    base = shared_dir
    config = write_config(base, stage_tree(TEST6, base))
    open_to_everyone(base)
    state = base / "state"
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY_UID, NOBODY_UID)

    result = run_agent("maintenance", "on", "--config-file", str(config), "--reason", "disk swap")
    assert result.code == 0, result.stderr

    info = (state / "state.json").stat()
    assert (info.st_uid, info.st_gid) == (NOBODY_UID, NOBODY_UID)
    assert stat.S_IMODE(info.st_mode) == 0o600
    as_service = run_as_nobody("--config-file", str(config), "--once", "--dry-run")
    assert as_service.code == 0, as_service.stderr


def test_root_cli_and_a_service_running_as_nobody_share_the_state_file(
    shared_dir, placement_server, host_name
):
    """The unit's case: the service runs as its own user, the operator types
    `sudo node-agent maintenance on|off`. The running service (as nobody)
    reads what root wrote, applies it, and keeps writing its state file."""
    from tests.integration.test_service_process import root_inventory

    agent = AgentProcess(shared_dir, placement_server.url, host_name, as_nobody=True)
    state = shared_dir / "state" / "state.json"
    try:
        agent.start()
        agent.status_after(lambda s: s.startswith("ok:"))
        status = Path(f"/proc/{agent.proc.pid}/status").read_text()
        assert f"Uid:\t{NOBODY_UID}\t{NOBODY_UID}" in status  # setpriv exec'd the agent

        on = run_agent(
            "maintenance", "on", "--config-file", str(agent.config), "--reason", "disk swap"
        )  # as root: no control channel, the file
        assert on.code == 0, on.stderr
        assert (state.stat().st_uid, stat.S_IMODE(state.stat().st_mode)) == (NOBODY_UID, 0o600)
        agent.new_status(lambda s: s.startswith("ok:"))
        agent.new_status(lambda s: s.startswith("ok:"))  # a whole cycle after the write
        inventories = root_inventory(placement_server.url, host_name)
        assert inventories and all(i["reserved"] == i["total"] for i in inventories.values())

        off = run_agent("maintenance", "off", "--config-file", str(agent.config))
        assert off.code == 0, off.stderr
        agent.new_status(lambda s: s.startswith("ok:"))
        agent.new_status(lambda s: s.startswith("ok:"))
        inventories = root_inventory(placement_server.url, host_name)
        assert not any(i["reserved"] == i["total"] for i in inventories.values())
        assert agent.proc.poll() is None
    finally:
        agent.stop()
        agent.notify.close()
    log = agent.log()
    assert "Traceback" not in log and "Permission denied" not in log, log


def test_a_privileged_metrics_port_for_a_service_running_as_nobody_says_so(
    shared_dir, placement_server, host_name
):
    agent = AgentProcess(
        shared_dir,
        placement_server.url,
        host_name,
        as_nobody=True,
        agent_options="report_interval = 1\nmetrics_port = 81\n",
    )
    try:
        agent.start()
        code = agent.proc.wait(60)
    finally:
        agent.stop()
        agent.notify.close()
    log = agent.log()
    assert code == 69, log
    assert "metrics_port = 81: cannot listen on" in log and "Permission denied" in log, log
    assert "Ports below 1024 need privileges" in log and "Another process" not in log, log


def test_state_file_the_service_user_cannot_read_is_one_clear_line(shared_dir):
    base = shared_dir
    config = write_config(base, stage_tree(TEST6, base))
    open_to_everyone(base)
    state = base / "state"
    state.mkdir(mode=0o755)
    (state / "state.json").write_text("{}")
    (state / "state.json").chmod(0o600)  # root's, as older versions left it

    result = run_as_nobody("--config-file", str(config), "--once", "--dry-run")
    assert_one_clear_line(
        result,
        69,
        f"state file {state / 'state.json'} cannot be read",
        "Permission denied",
        "chown",
    )
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_nova_conf_the_service_user_cannot_read_is_fixed_by_its_group_not_by_chgrp(shared_dir):
    """nova.conf is root:nova 0640 and nova-compute reads it through that
    group: the advice is to join the group, never to change the file's."""
    base = shared_dir
    config = write_config(base, stage_tree(TEST6, base))
    open_to_everyone(base)
    nova = base / "nova.conf"
    nova.write_text("[DEFAULT]\nreserved_host_memory_mb = 512\n")
    os.chown(nova, 0, 1)  # group "daemon" stands for nova's group
    nova.chmod(0o640)

    result = run_as_nobody(
        "--config-file", str(nova), "--config-file", str(config), "--check-config"
    )
    assert_one_clear_line(
        result,
        78,
        f"permission denied reading config file {nova}",
        "SupplementaryGroups=daemon",
    )
    assert "chgrp" not in result.stderr, result.stderr


# ------------------------------------------------------------ unwritable state


def test_unwritable_state_path_after_placement_write_names_the_path_and_what_was_written(
    shared_dir, placement_server, host_name
):
    base = shared_dir
    config = write_config(
        base, stage_tree(TEST6, base), host=host_name, extra=placement_section(placement_server.url)
    )
    open_to_everyone(base)
    (base / "state").mkdir(mode=0o755)  # root's: nobody cannot write into it

    result = run_as_nobody("--config-file", str(config), "--once")
    assert_one_clear_line(
        result,
        69,
        f"state file {base / 'state' / 'state.json'} cannot be written",
        "Permission denied",
        "Placement was already written",
        "POST /resource_providers",
    )


@pytest.mark.parametrize("args", [("--once", "--dry-run"), ("maintenance", "on")])
def test_state_path_that_is_a_file_is_named_as_such_not_as_a_permission_problem(tmp_path, args):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    config = write_config(tmp_path, TEST6)
    config.write_text(
        config.read_text().replace(f"state_path = {tmp_path / 'state'}", f"state_path = {blocker}")
    )
    result = run_agent("--config-file", str(config), *args)
    assert_one_clear_line(result, 69, f"state_path {blocker}: {blocker} is not a directory")
    assert "sudo" not in result.stderr and "chown" not in result.stderr


@pytest.fixture
def full_filesystem(tmp_path):
    """A 16 KiB tmpfs filled to the last byte (root only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        (mount / "state").mkdir()
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 512):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        yield mount / "state"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_state_path_on_a_full_filesystem_names_the_path_after_placement_was_written(
    tmp_path, placement_server, host_name, full_filesystem
):
    config = write_config(
        tmp_path, TEST6, host=host_name, extra=placement_section(placement_server.url)
    )
    config.write_text(
        config.read_text().replace(
            f"state_path = {tmp_path / 'state'}", f"state_path = {full_filesystem}"
        )
    )
    result = run_agent("--config-file", str(config), "--once")
    assert_one_clear_line(
        result,
        69,
        f"state file {full_filesystem / 'state.json'} cannot be written",
        "No space left on device",
        "Placement was already written",
    )


def test_maintenance_on_a_full_filesystem_names_the_path(tmp_path, full_filesystem):
    config = write_config(tmp_path, TEST6)
    config.write_text(
        config.read_text().replace(
            f"state_path = {tmp_path / 'state'}", f"state_path = {full_filesystem}"
        )
    )
    result = run_agent("maintenance", "on", "--config-file", str(config))
    assert_one_clear_line(
        result, 69, str(full_filesystem / "state.json"), "No space left on device"
    )


# ------------------------------------------------------------ metrics port


def test_metrics_port_in_use_stops_the_service_with_one_clear_line(
    tmp_path, placement_server, host_name
):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    agent = AgentProcess.with_metrics(tmp_path, placement_server.url, host_name, port)
    try:
        agent.start()
        code = agent.proc.wait(30)
        log = agent.log()
        assert code == 69, log
        assert f"metrics_port = {port}" in log and f"127.0.0.1:{port}" in log, log
        assert "Traceback" not in log, log
        assert "READY=1" not in agent.notify.received
    finally:
        busy.close()
        agent.stop()
        agent.notify.close()


# ------------------------------------------------------------ hung endpoint


@pytest.fixture
def hung_endpoint():
    """A TCP listener that completes every handshake and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_hung_placement_endpoint_is_an_error_naming_it_within_the_timeout(tmp_path, hung_endpoint):
    config = write_config(tmp_path, TEST6, extra=placement_section(hung_endpoint, "timeout = 2"))
    started = time.monotonic()
    result = run_agent("--config-file", str(config), "--once", timeout=60)
    elapsed = time.monotonic() - started
    assert_one_clear_line(
        result, 75, hung_endpoint, "did not answer within 2.0s", "[placement] timeout"
    )
    assert elapsed < 2 * 2 + 5, elapsed  # one timeout, not one per retry


def test_placement_timeout_defaults_to_30_seconds(tmp_path):
    from node_agent.config.files import load_conf

    # [placement] is registered when a file has the section (it loads keystoneauth).
    config = write_config(tmp_path, TEST6, extra="[placement]\nauth_type = none\n")
    assert load_conf(["--config-file", str(config)]).placement.timeout == 30


# ------------------------------------------------------------ one validation


def drain(notify) -> list[str]:
    """Every datagram the process sent so far."""
    notify.sock.setblocking(False)
    try:
        while True:
            notify.received.append(notify.sock.recv(4096).decode())
    except BlockingIOError:
        pass
    return notify.received


def test_check_config_lists_every_problem_in_one_pass(tmp_path):
    """A typo, a bad value, a CPU the host lacks and no [placement]: all four
    in one run, not one per fix."""
    config = write_config(
        tmp_path,
        TEST6,
        extra="cpu_dedicated_sets = 1\nreserved_host_memory_mb = -4\ncpu_dedicated_set = 0-99\n",
    )
    result = run_agent("--config-file", str(config), "--check-config")
    assert_one_clear_line(
        result,
        78,
        "unknown option [compute] cpu_dedicated_sets",
        "reserved_host_memory_mb has an invalid value '-4'",
        "names CPUs 8-99 that this host does not have",
        "no Placement is configured",
    )
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [("--check-config",), ("--once", "--dry-run"), ()],
    ids=["check-config", "dry-run", "service"],
)
def test_a_bad_logging_value_is_a_config_error_named_with_the_other_problems(tmp_path, args):
    """oslo.config exits 1 on a bad value of an option it could take on its
    command line (oslo.log's), hiding the rest; it is one problem among the others."""
    config = write_config(tmp_path, TEST6, extra="reserved_host_memory_mb = -4\n")
    config.write_text(
        config.read_text().replace("[DEFAULT]\n", "[DEFAULT]\ndebug = maybe\nuse_json = perhaps\n")
    )
    result = run_agent("--config-file", str(config), *args)
    assert_one_clear_line(
        result,
        78,
        f"[DEFAULT] debug = 'maybe' in {config} is not valid",
        f"[DEFAULT] use_json = 'perhaps' in {config} is not valid",
        "reserved_host_memory_mb has an invalid value '-4'",
    )
    assert "argument --debug" not in result.stderr


def test_check_config_refuses_messaging_mode_without_transport_url(tmp_path):
    config = write_config(tmp_path, TEST6, extra="[agent]\nupstream = messaging\n")
    result = run_agent("--config-file", str(config), "--check-config")
    assert_one_clear_line(
        result,
        78,
        "[agent] upstream = messaging needs [DEFAULT] transport_url",
        "needs [agent] upstream_key_file",
        "node-agent-applier derive-key fixture-host --output FILE",
    )


def host_key_file(tmp_path, mode: int = 0o600) -> Path:
    """A host key as node-agent-applier derive-key writes it."""
    from node_agent.remote import keys

    path = tmp_path / "upstream.key"
    keys.write_host_key(str(path), bytes(range(32)))
    path.chmod(mode)
    return path


def test_check_config_refuses_a_host_key_readable_by_others_naming_the_fix(tmp_path):
    key = host_key_file(tmp_path, 0o644)
    config = write_config(
        tmp_path,
        TEST6,
        extra=(
            f"[agent]\nupstream = messaging\nupstream_key_file = {key}\n"
            "[DEFAULT]\ntransport_url = rabbit://agent:pw@127.0.0.1:5672/\n"
        ),
    )
    result = run_agent("--config-file", str(config), "--check-config")
    assert_one_clear_line(
        result,
        78,
        f"[agent] upstream_key_file = {key}: the key is open to its group or others (mode 0644)",
        f"chmod 0600 {key}",
    )
    assert bytes(range(32)).hex() not in result.stdout + result.stderr


def test_service_started_with_overlapping_cpu_sets_exits_78_before_ready(service):
    service.write_config(service.config_text().replace("[compute]\n", OVERLAP))
    service.start()
    code = service.proc.wait(30)
    log = service.log()
    assert code == 78, log
    assert "overlap on CPUs 3" in log, log
    assert "READY=1" not in drain(service.notify)


def test_missing_default_config_file_is_exit_78(tmp_path):
    if Path("/etc/node-agent/node-agent.conf").exists():
        pytest.skip("this machine has a default config file")
    for args in (("maintenance", "on"), ("--once", "--dry-run")):
        result = run_agent(*args)
        assert_one_clear_line(result, 78, "/etc/node-agent/node-agent.conf does not exist")


def test_missing_config_file_is_exit_78(tmp_path):
    missing = tmp_path / "nope.conf"
    for args in (
        ("maintenance", "on", "--config-file", str(missing)),
        ("--config-file", str(missing), "--check-config"),
    ):
        result = run_agent(*args)
        assert_one_clear_line(result, 78, str(missing))


def test_check_config_connect_reports_a_placement_that_answers(
    tmp_path, placement_server, host_name
):
    config = write_config(
        tmp_path, TEST6, host=host_name, extra=placement_section(placement_server.url)
    )
    result = run_agent("--config-file", str(config), "--check-config", "--connect")
    assert result.code == 0, result.stderr
    assert f"Placement answers: {placement_server.url}" in result.stdout


def test_check_config_connect_names_a_placement_that_does_not_answer(tmp_path, hung_endpoint):
    config = write_config(tmp_path, TEST6, extra=placement_section(hung_endpoint, "timeout = 1"))
    result = run_agent("--config-file", str(config), "check-config", "--connect")
    assert_one_clear_line(result, 75, hung_endpoint, "did not answer within 1.0s")
    plain = run_agent("--config-file", str(config), "check-config")
    assert plain.code == 0, plain.stderr  # without --connect nothing is contacted


def test_check_config_connect_names_a_broker_that_refuses(tmp_path):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there
    config = write_config(
        tmp_path,
        TEST6,
        extra=(
            f"[agent]\nupstream = messaging\nupstream_key_file = {host_key_file(tmp_path)}\n"
            f"[DEFAULT]\ntransport_url = rabbit://agent:S3cret@127.0.0.1:{port}/\n"
        ),
    )
    result = run_agent("--config-file", str(config), "--check-config", "--connect")
    assert_one_clear_line(result, 75, f"the broker at 127.0.0.1:{port}")
    assert "S3cret" not in result.stdout + result.stderr


def test_check_config_connect_reports_a_broker_that_answers(tmp_path, rabbitmq):
    config = write_config(
        tmp_path,
        TEST6,
        extra=(
            f"[agent]\nupstream = messaging\nupstream_key_file = {host_key_file(tmp_path)}\n"
            f"[DEFAULT]\ntransport_url = {rabbitmq}\n"
        ),
    )
    result = run_agent("--config-file", str(config), "--check-config", "--connect")
    assert result.code == 0, result.stderr
    assert "Broker answers: 127.0.0.1:" in result.stdout


# ------------------------------------------------------------ CLI conventions


def test_global_options_work_before_and_after_a_subcommand(tmp_path):
    config = write_config(tmp_path, TEST6)
    before = run_agent("--config-file", str(config), "maintenance", "on", "--reason", "a")
    assert before.code == 0, before.stderr
    after = run_agent("maintenance", "off", "--config-file", str(config))
    assert after.code == 0, after.stderr
    check_before = run_agent("--config-file", str(config), "check-config", "--output", "json")
    check_after = run_agent("check-config", "--config-file", str(config), "--output", "json")
    assert check_before.code == check_after.code == 78  # no [placement]: same verdict
    assert check_before.stderr == check_after.stderr


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if " error: " in line]


@pytest.mark.parametrize(
    "command",
    [
        ("ctl", "--host", "h1", "--timeout", "5", "status"),
        ("decommission", "--dry-run"),
        ("audit",),
        ("maintenance", "status", "--output", "json"),
    ],
    ids=["ctl", "decommission", "audit", "maintenance"],
)
def test_global_options_work_before_and_after_every_subcommand(tmp_path, command):
    config = write_config(tmp_path, TEST6)
    global_options = ("--config-file", str(config), "--debug")
    before = run_agent(*global_options, *command)
    after = run_agent(*command, *global_options)
    # The config was read either way (no [placement], no transport_url: 78;
    # maintenance status needs neither): the same verdict, no usage error.
    assert before.code == after.code == (0 if command[0] == "maintenance" else 78), (
        before.stderr,
        after.stderr,
    )
    assert error_lines(before) == error_lines(after)
    assert before.stdout == after.stdout


def test_help_lists_the_subcommands_and_version_exists():
    result = run_agent("--help")
    assert result.code == 0
    listed = [
        line.split()[0]
        for line in result.stdout.split("subcommands", 1)[-1].splitlines()
        if line.startswith("  ") and not line.startswith("   ")
    ]
    for command in ("check-config", "maintenance", "ctl", "decommission", "audit"):
        assert command in listed, result.stdout
    from importlib.metadata import version as installed

    from node_agent.version import build_version

    # The package's version, with the commit of this checkout (0.1.0+g...).
    expected = build_version()
    assert expected.startswith(installed("node-agent")), expected
    version = run_agent("--version")
    assert version.code == 0
    assert version.stdout.strip() == f"node-agent {expected}"
    applier = subprocess.run(
        [sys.executable, "-m", "node_agent.applier", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert applier.returncode == 0, applier.stderr
    assert applier.stdout.strip() == f"node-agent-applier {expected}"


# ------------------------------------------------------------ logging, metrics


def test_debug_output_keeps_library_noise_out(tmp_path):
    config = write_config(tmp_path, TEST6)
    result = run_agent("--config-file", str(config), "--once", "--dry-run", "--debug")
    assert result.code == 0, result.stderr
    lines = result.stderr.splitlines()
    assert any("DEBUG node_agent." in line for line in lines), result.stderr
    noisy = [line for line in lines if "stevedore" in line]
    assert not noisy, noisy[:3]


def test_log_options_come_from_the_config_file(tmp_path):
    log_file = tmp_path / "agent.log"
    config = write_config(tmp_path, TEST6)
    config.write_text(
        config.read_text().replace(
            "[DEFAULT]\n", f"[DEFAULT]\ndebug = true\nuse_json = true\nlog_file = {log_file}\n"
        )
    )
    result = run_agent("--config-file", str(config), "--once", "--dry-run")
    assert result.code == 0, result.stderr
    assert result.stderr == ""  # the log goes to log_file only
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert records and all(r["levelname"] for r in records)
    assert any(r["levelname"] == "DEBUG" and r["name"].startswith("node_agent") for r in records)


def test_the_services_start_up_warnings_use_the_configured_log_format_and_file(
    tmp_path, placement_server, host_name
):
    """The host is read (and warned about) while the config is validated,
    before the service starts: oslo.log is set up first."""
    log_file = tmp_path / "service.log"
    agent = AgentProcess(
        tmp_path, placement_server.url, host_name, extra=f"use_json = true\nlog_file = {log_file}\n"
    )
    try:
        agent.start()
        agent.status_after(lambda s: s.startswith("ok:"))
    finally:
        agent.stop()
        agent.notify.close()
    assert agent.log() == ""  # nothing on stderr: everything went to log_file
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert any(
        r["name"] == "node_agent.host.discover"
        and r["levelname"] == "WARNING"
        and "connection_uri is empty" in r["message"]
        for r in records
    ), records[:5]


def test_use_journal_without_the_bindings_names_the_environment_to_install_them_in(tmp_path):
    try:
        import systemd.journal  # noqa: F401

        pytest.skip("this environment has the systemd Python bindings")
    except ImportError:
        pass
    config = write_config(tmp_path, TEST6)
    config.write_text(config.read_text().replace("[DEFAULT]\n", "[DEFAULT]\nuse_journal = true\n"))
    result = run_agent("--config-file", str(config), "--once", "--dry-run")
    assert_one_clear_line(
        result,
        78,
        f"node-agent's environment, {sys.prefix}",
        f"{sys.prefix}/bin/pip install systemd-python",
    )


def scrape(port: int) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


def test_steady_cycles_are_silent_and_metrics_have_proper_types(
    tmp_path, placement_server, host_name
):
    from tests.integration.rabbit import free_port

    port = free_port()
    agent = AgentProcess.with_metrics(tmp_path, placement_server.url, host_name, port)
    try:
        agent.start()
        agent.status_after(lambda s: s.startswith("ok:"))
        for _ in range(3):
            agent.new_status(lambda s: "no change" in s)
        families = scrape(port)
    finally:
        agent.stop()
        agent.notify.close()
    log = agent.log()
    assert "no change" not in log, log  # steady cycles say nothing at INFO
    assert "placement sync:" in log  # the first cycle's changes are logged
    assert families["node_agent_cycles"].type == "counter"
    assert families["node_agent_reshapes"].type == "counter"
    assert families["node_agent_placement_requests"].type == "counter"
    durations = families["node_agent_cycle_duration_seconds"]
    assert durations.type == "histogram"
    count = next(
        s.value for s in durations.samples if s.name == "node_agent_cycle_duration_seconds_count"
    )
    assert count >= 4


def test_once_writes_the_metrics_textfile(tmp_path, placement_server, host_name):
    from prometheus_client.parser import text_string_to_metric_families

    textfile = tmp_path / "node_agent.prom"
    config = write_config(
        tmp_path,
        TEST6,
        host=host_name,
        extra=f"[agent]\nmetrics_textfile = {textfile}\n" + placement_section(placement_server.url),
    )
    result = run_agent("--config-file", str(config), "--once")
    assert result.code == 0, result.stderr
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(textfile.read_text())
        for s in f.samples
    }
    assert (
        samples[("node_agent_inventory", (("provider", host_name), ("resource_class", "VCPU")))]
        == 6
    )
    assert samples[("node_agent_last_success_timestamp_seconds", ())] > 0
    assert (
        samples[("node_agent_placement_requests_total", (("method", "POST"), ("status", "200")))]
        == 1
    )


# ------------------------------------------------------------ devices


def add_sriov_pf(sysroot: Path, address: str, total: int, enabled: int) -> None:
    """A PF as the kernel shows it: devices/pci.../ADDR, bus/pci/devices/ADDR -> it."""
    real = sysroot / "devices" / "pci0000:3a" / address
    (real / "net" / "ens1f0").mkdir(parents=True)
    for name, text in (
        ("vendor", "0x8086"),
        ("device", "0x158b"),
        ("numa_node", "0"),
        ("sriov_totalvfs", str(total)),
        ("sriov_numvfs", str(enabled)),
    ):
        (real / name).write_text(text + "\n")
    link = sysroot / "bus" / "pci" / "devices" / address
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(real)


def test_sriov_reports_enabled_vfs_and_unmatched_device_options_are_warned(tmp_path):
    config = write_config(
        tmp_path,
        TEST6,
        extra=(
            "[devices]\nenabled_mdev_types = nvidia-999\n"
            "[pci]\n"
            'device_spec = {"devname": "ens1f0", "physical_network": "physnet1"}\n'
            'device_spec = {"address": "0000:99:00.0", "physical_network": "physnet2"}\n'
        ),
    )
    add_sriov_pf(tmp_path / "sysroot", "0000:3b:00.0", total=7, enabled=2)
    result = run_agent("--config-file", str(config), "--once", "--dry-run", "--output", "json")
    assert result.code == 0, result.stderr
    report = result.json()
    child = next(p for p in report["providers"] if p["name"].endswith("0000:3b:00.0"))
    assert child["inventories"]["SRIOV_NET_VF"]["total"] == 2
    warnings = "\n".join(report["warnings"])
    assert "enabled_mdev_types names nvidia-999" in warnings, warnings
    assert '"address": "0000:99:00.0"' in warnings and "matches no SR-IOV PF" in warnings
    assert "ens1f0" not in warnings  # the spec that matches is not warned about


# ------------------------------------------------------------ provider files

GOOD_FILE = (
    "meta:\n  schema_version: '1.0'\nproviders:\n"
    "  - identification:\n      uuid: $COMPUTE_NODE\n"
    "    traits:\n      additional:\n        - CUSTOM_GOOD\n"
)
BAD_FILE = "meta:\n  schema_version: '1.0'\nproviders: [\n"


def root_traits(placement, host: str) -> set:
    found = placement.get(f"/resource_providers?name={host}")["resource_providers"]
    if not found:
        return set()
    return set(placement.get(f"/resource_providers/{found[0]['uuid']}/traits")["traits"])


# 600 levels: PyYAML's composer recursed past Python's limit (RecursionError).
DEEP_FILE = GOOD_FILE + "    deep: " + "[" * 600 + "]" * 600 + "\n"


def provider_files(tmp_path: Path, bad: str = BAD_FILE) -> Path:
    directory = tmp_path / "provider_config"
    directory.mkdir()
    (directory / "good.yaml").write_text(GOOD_FILE)
    (directory / "bad.yaml").write_text(bad)
    return directory


def test_a_bad_provider_file_is_refused_while_the_service_reports_the_rest(
    tmp_path, placement_server, placement, host_name
):
    files = provider_files(tmp_path)
    agent = AgentProcess(tmp_path, placement_server.url, host_name)
    agent.write_config(
        agent.config_text().replace(
            "[compute]\n", f"[compute]\nprovider_config_location = {files}\n"
        )
    )
    try:
        agent.start()
        agent.status_after(lambda s: s.startswith("ok:"))
        agent.new_status(lambda s: s.startswith("ok:"))
        assert "CUSTOM_GOOD" in root_traits(placement, host_name)
        log = agent.log()
        assert log.count("operator provider files refused") == 1, log
        assert f"{files / 'bad.yaml'}" in log and "not valid YAML" in log
    finally:
        agent.stop()
        agent.notify.close()


@pytest.mark.parametrize(
    "bad, problem",
    [(BAD_FILE, "not valid YAML"), (DEEP_FILE, "nests deeper than 32 levels")],
    ids=["unparsable", "nested-600-deep"],
)
def test_once_with_a_bad_provider_file_syncs_the_rest_then_exits_78(
    tmp_path, placement_server, placement, host_name, bad, problem
):
    files = provider_files(tmp_path, bad)
    config = write_config(
        tmp_path,
        TEST6,
        host=host_name,
        extra=f"provider_config_location = {files}\n" + placement_section(placement_server.url),
    )
    result = run_agent("--config-file", str(config), "--once")
    assert_one_clear_line(result, 78, str(files / "bad.yaml"), problem)
    assert "CUSTOM_GOOD" in root_traits(placement, host_name)


def with_provider_files(tmp_path: Path, placement_url: str, host: str) -> tuple[Path, Path]:
    """An empty provider-file directory and a TEST6 config reading it."""
    files = tmp_path / "provider_config"
    files.mkdir()
    config = write_config(
        tmp_path,
        TEST6,
        host=host,
        extra=f"provider_config_location = {files}\n" + placement_section(placement_url),
    )
    return files, config


def licence_file(total: int) -> str:
    return (
        "meta:\n  schema_version: '1.0'\nproviders:\n"
        "  - identification:\n      uuid: $COMPUTE_NODE\n"
        "    inventories:\n      additional:\n"
        f"        - CUSTOM_LICENCE:\n            total: {total}\n"
        "    traits:\n      additional:\n        - CUSTOM_LICENSED\n"
    )


def test_a_provider_file_refused_after_a_typo_keeps_the_inventory_it_gave(
    tmp_path, placement_server, placement, host_name
):
    """Found under systemd: a typo in the file that gave the root
    CUSTOM_LICENCE took the class out of Placement at the next cycle (its
    trait stayed), and with the class in use the service went on failing to
    remove it, advising to delete the instances using it. While a file is
    refused, what the files gave at the last cycle is kept; fixed, the file
    decides again; removed, its class goes."""
    files, config = with_provider_files(tmp_path, placement_server.url, host_name)

    def licences():
        found = placement.get(f"/resource_providers?name={host_name}")["resource_providers"]
        uuid = found[0]["uuid"]
        inventory = placement.get(f"/resource_providers/{uuid}/inventories")["inventories"]
        return inventory.get("CUSTOM_LICENCE", {}).get("total")

    (files / "licence.yaml").write_text(licence_file(4))
    assert run_agent("--config-file", str(config), "--once").code == 0
    assert licences() == 4

    (files / "licence.yaml").write_text(licence_file(4).replace("total: 4", "total: [4"))
    for _run in range(2):  # the refusal, then the cycle after it
        result = run_agent("--config-file", str(config), "--once")
        assert_one_clear_line(result, 78, str(files / "licence.yaml"), "not valid YAML")
        assert licences() == 4
        assert "CUSTOM_LICENSED" in root_traits(placement, host_name)

    (files / "licence.yaml").write_text(licence_file(2))
    assert run_agent("--config-file", str(config), "--once").code == 0
    assert licences() == 2

    (files / "licence.yaml").unlink()
    assert run_agent("--config-file", str(config), "--once").code == 0
    assert licences() is None


def file_with_traits(*traits: str) -> str:
    listed = "".join(f"        - {t}\n" for t in traits)
    return (
        "meta:\n  schema_version: '1.0'\nproviders:\n"
        "  - identification:\n      uuid: $COMPUTE_NODE\n"
        f"    traits:\n      additional:\n{listed}"
    )


def test_a_provider_file_removes_only_the_traits_it_added(
    tmp_path, placement_server, placement, host_name
):
    files, config = with_provider_files(tmp_path, placement_server.url, host_name)
    once = ("--config-file", str(config), "--once")
    assert run_agent(*once).code == 0
    root = placement.get(f"/resource_providers?name={host_name}")["resource_providers"][0]
    path = f"/resource_providers/{root['uuid']}/traits"
    # The operator sets a trait by hand, then a file lists it too.
    placement.put("/traits/CUSTOM_BY_HAND", None)
    held = placement.get(path)
    placement.put(
        path,
        {
            "resource_provider_generation": held["resource_provider_generation"],
            "traits": held["traits"] + ["CUSTOM_BY_HAND"],
        },
    )
    (files / "gold.yaml").write_text(file_with_traits("CUSTOM_BY_HAND", "CUSTOM_FROM_FILE"))
    assert run_agent(*once).code == 0
    assert {"CUSTOM_BY_HAND", "CUSTOM_FROM_FILE"} <= root_traits(placement, host_name)

    (files / "gold.yaml").write_text(file_with_traits("CUSTOM_FROM_FILE"))
    assert run_agent(*once).code == 0
    assert "CUSTOM_BY_HAND" in root_traits(placement, host_name)

    (files / "gold.yaml").unlink()
    result = run_agent(*once)
    assert result.code == 0, result.stderr
    traits = root_traits(placement, host_name)
    assert "CUSTOM_FROM_FILE" not in traits  # the file added it: gone with the file
    assert "CUSTOM_BY_HAND" in traits  # the operator's: stays
