"""The documented write paths work under the shipped unit's sandbox: the
real CLI, as nobody, in a mount namespace made from systemd/node-agent.service
(tests/reliability/unit_sandbox.py says what is emulated; systemd itself
does not run in CI)."""

from __future__ import annotations

import subprocess

from tests.cli.runner import write_config
from tests.reliability.nobody import (
    as_nobody,
    open_to_everyone,
    skip_unless_root_with_setpriv,
    stage_tree,
    world_readable_dir,
)
from tests.reliability.test_operator_lifecycle import TEST6
from tests.reliability.test_security import placement_section
from tests.reliability.unit_sandbox import in_sandbox, skip_unless_namespaces

TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"


def sandboxed_config(placement_url: str, host: str, extra: str):
    """A directory nobody can traverse and a config in it for TEST6 against
    ``placement_url`` with ``extra``; skips where the sandbox cannot run."""
    skip_unless_root_with_setpriv()
    skip_unless_namespaces()
    base = world_readable_dir()
    config = write_config(
        base, stage_tree(TEST6, base), host=host, extra=placement_section(placement_url) + extra
    )
    return base, config


def test_state_log_dir_and_textfile_of_the_docs_are_written_under_the_unit(
    placement_server, host_name
):
    base, config = sandboxed_config(
        placement_server.url,
        host_name,
        f"[DEFAULT]\nlog_dir = /var/log/node-agent\n"
        f"[agent]\nmetrics_textfile = {TEXTFILE_DIR}/node-agent.prom\n",
    )
    # The unit's default state directory, not the fixture's.
    text = config.read_text()
    config.write_text(text.replace(f"state_path = {base / 'state'}\n", ""))
    open_to_everyone(base)
    command, env = as_nobody("-m", "node_agent.cli.main", "--config-file", str(config), "--once")
    proc = subprocess.run(
        in_sandbox(
            command,
            existing=(TEXTFILE_DIR,),
            after="find /var/lib /var/log -type f | sort | sed 's/^/written: /'",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env=env,
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    written = [
        line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("written: ")
    ]
    assert "/var/lib/node-agent/state.json" in written, written
    assert f"{TEXTFILE_DIR}/node-agent.prom" in written, (written, proc.stderr)
    assert any(path.startswith("/var/log/node-agent/") for path in written), written
    assert "Read-only file system" not in proc.stderr, proc.stderr


def test_a_log_dir_the_unit_keeps_read_only_names_the_fix_and_the_restart(
    placement_server, host_name
):
    """The service, as systemd starts it (INVOCATION_ID set), with a log
    directory outside what the unit grants: exit 78, the cause and the fix,
    and how to start it again (systemd will not, RestartPreventExitStatus=78)."""
    base, config = sandboxed_config(
        placement_server.url, host_name, "[DEFAULT]\nlog_dir = /var/log\n"
    )
    open_to_everyone(base)
    command, env = as_nobody("-m", "node_agent.cli.main", "--config-file", str(config))
    proc = subprocess.run(
        in_sandbox(command),
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={**env, "INVOCATION_ID": "0123456789abcdef0123456789abcdef"},
    )
    assert proc.returncode == 78, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "Read-only file system" in proc.stderr, proc.stderr
    assert "log_dir = /var/log/node-agent" in proc.stderr, proc.stderr
    assert "`systemctl restart node-agent`" in proc.stderr, proc.stderr
