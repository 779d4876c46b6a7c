"""[placement]'s credentials are checked against the configured auth_type's
own options, as keystoneauth's plugin loader lists them."""

from __future__ import annotations

import pytest

from node_agent.config.files import load_conf
from node_agent.errors import ConfigError
from node_agent.placement.client import PlacementClient

OAUTH2 = """
[placement]
auth_type = v3oauth2clientcredential
auth_url = https://keystone.example/v3
oauth2_endpoint = https://keystone.example/v3/OS-OAUTH2/token
oauth2_client_id = node-agent
oauth2_client_secret = secret
"""


def load(tmp_path, text: str):
    path = tmp_path / "node-agent.conf"
    path.write_text(text)
    return load_conf(["--config-file", str(path)])


def test_any_installed_auth_plugin_may_be_configured(tmp_path):
    conf = load(tmp_path, OAUTH2)
    assert conf.placement.auth_type == "v3oauth2clientcredential"


def test_a_misspelt_credential_of_the_configured_plugin_is_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, OAUTH2.replace("oauth2_client_secret", "oauth2_client_secrte"))
    assert any(
        "unknown option [placement] oauth2_client_secrte" in p for p in err.value.problems
    ), err.value.problems


def test_a_credential_the_plugin_needs_is_named_not_a_traceback(tmp_path):
    conf = load(
        tmp_path,
        "\n".join(
            line for line in OAUTH2.splitlines() if not line.startswith("oauth2_client_secret")
        ),
    )
    with pytest.raises(ConfigError) as err:
        PlacementClient.from_conf(conf)
    (problem,) = err.value.problems
    assert problem.startswith("[placement] auth_type=v3oauth2clientcredential: ")
    assert "secret" in problem and "Set the plugin's options in [placement]" in problem


def test_the_client_names_the_section_the_option_table_registers():
    # The client takes the section's name, not the option table (placement/
    # does not import config/): the two spellings must stay one name.
    from node_agent.config.options import PLACEMENT_GROUP
    from node_agent.placement.client import CONF_GROUP

    assert CONF_GROUP == PLACEMENT_GROUP
