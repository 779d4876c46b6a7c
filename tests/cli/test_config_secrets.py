"""A ``$`` in a config value and a line missing its ``=`` (issue 28): one
clear config error (exit 78) naming the option and the fix, never a
traceback, and a secret's value is never echoed."""

from __future__ import annotations

import pytest

from tests.cli.runner import run_agent, write_config
from tests.hostdata import HOSTDATA

TEST6 = HOSTDATA / "virhostcpudata" / "linux-test6"
PASSWORD_AUTH = (
    "[placement]\nauth_type = password\nauth_url = http://127.0.0.1:9/v3\n"
    "username = agent\nproject_name = service\nuser_domain_name = Default\n"
    "project_domain_name = Default\n"
)


def _refused(result, *fragments):
    assert "Traceback" not in result.stderr, result.stderr
    assert result.code == 78, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["--once", "--check-config"])
def test_dollar_in_a_password_is_a_config_error_naming_the_option_and_the_escape(tmp_path, command):
    config = write_config(tmp_path, TEST6, extra=PASSWORD_AUTH + "password = Sup3r$ecretWord\n")
    result = run_agent("--config-file", str(config), command)
    _refused(result, "[placement] password", "Write $$ for a literal $")
    assert "ecretWord" not in result.stderr + result.stdout  # no part of the secret


def test_dollar_in_a_plain_option_names_the_reference(tmp_path):
    config = write_config(tmp_path, TEST6, extra="cpu_dedicated_set = $cpus\n")
    result = run_agent("--config-file", str(config), "--check-config")
    _refused(result, "[compute] cpu_dedicated_set", "$cpus", "Write $$ for a literal $")


def test_doubled_dollar_is_a_literal_dollar_and_a_reference_to_an_option_still_works(tmp_path):
    auth = PASSWORD_AUTH.replace("username = agent", "username = agent-${compute.cpu_shared_set}")
    config = write_config(
        tmp_path, TEST6, extra="cpu_shared_set = 0-3\n" + auth + "password = pa$$word\n"
    )
    result = run_agent("--config-file", str(config), "--check-config")
    assert result.code == 0, result.stderr
    assert "Traceback" not in result.stderr


def test_dollar_naming_a_section_says_so(tmp_path):
    # [DEFAULT] host is an option, but oslo.config finds the section [host] first.
    auth = PASSWORD_AUTH.replace("username = agent", "username = agent-$host")
    config = write_config(tmp_path, TEST6, extra=auth + "password = pa$$word\n")
    result = run_agent("--config-file", str(config), "--check-config")
    _refused(result, "[placement] username", "$host names the section [host]")


def test_password_line_without_equals_is_not_echoed(tmp_path):
    config = write_config(tmp_path, TEST6, extra=PASSWORD_AUTH + "password TopSecret99\n")
    result = run_agent("--config-file", str(config), "--once")
    _refused(result, "cannot be parsed", "node-agent.conf:", "No ':' or '=' found")
    assert "TopSecret99" not in result.stderr + result.stdout


def test_dollar_in_a_transport_url_password_is_refused_without_showing_it(tmp_path):
    config = write_config(
        tmp_path, TEST6, extra=("[DEFAULT]\ntransport_url = rabbit://agent:pa$word@127.0.0.1:9//\n")
    )
    result = run_agent("--config-file", str(config), "--check-config")
    _refused(result, "[DEFAULT] transport_url", "Write $$ for a literal $")
    assert "word" not in result.stderr.replace("password", "")
