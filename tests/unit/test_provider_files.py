"""Reading the operator's provider files: bad files are a ConfigError, never a traceback."""

import pytest

from node_agent.config.provider_files import load_provider_configs
from node_agent.errors import ConfigError

GOOD = """meta:
  schema_version: "1.0"
providers:
  - identification: {uuid: $COMPUTE_NODE}
    traits:
      additional: [CUSTOM_RACK_A1]
"""


def test_non_utf8_provider_file_is_a_config_error_naming_file_byte_and_line(tmp_path):
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "b.yaml").write_bytes(b'meta:\n  schema_version: "1.0"\n# caf\xe9\n')

    with pytest.raises(ConfigError) as refused:
        load_provider_configs(str(tmp_path))

    (problem,) = refused.value.problems
    assert str(tmp_path / "b.yaml") in problem
    assert "not UTF-8 text: byte 0xe9 at offset 35 (line 3)" in problem
    assert refused.value.exit_code == 78


def test_every_bad_file_is_reported_in_one_error(tmp_path):
    (tmp_path / "a.yaml").write_bytes(b"\xff")
    (tmp_path / "b.yaml").write_text("meta: {schema_version: '1.0'}\nproviders: 3\n")

    with pytest.raises(ConfigError) as refused:
        load_provider_configs(str(tmp_path))

    assert len(refused.value.problems) == 2
    assert "a.yaml is not UTF-8" in refused.value.problems[0]
    assert "b.yaml" in refused.value.problems[1]


def test_good_files_still_load(tmp_path):
    (tmp_path / "a.yaml").write_text(GOOD)
    (config,) = load_provider_configs(str(tmp_path))
    assert "CUSTOM_RACK_A1" in config.traits
