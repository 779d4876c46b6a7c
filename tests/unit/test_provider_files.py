"""Reading the operator's provider files: bad files are a ConfigError, never a traceback."""

import pytest

from node_agent.config.provider_files import load_provider_configs, load_provider_files
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


def _refused_problem(tmp_path, text):
    (tmp_path / "good.yaml").write_text(GOOD)
    (tmp_path / "bad.yaml").write_text(text)
    configs, problems = load_provider_files(str(tmp_path))
    assert [c.traits for c in configs] == [frozenset({"CUSTOM_RACK_A1"})]
    (problem,) = problems
    assert problem.startswith(f"provider file {tmp_path / 'bad.yaml'} ")
    return problem


@pytest.mark.parametrize(
    "text",
    [
        GOOD + "    deep: " + "[" * 600 + "]" * 600 + "\n",
        GOOD + "    deep:\n" + "".join("  " * (n + 3) + "-\n" for n in range(600)),
        GOOD + "    deep: " + "{a: " * 40 + "1" + "}" * 40 + "\n",
    ],
    ids=["flow-600", "block-600", "mapping-40"],
)
def test_a_deeply_nested_provider_file_is_refused_by_name_and_the_others_load(tmp_path, text):
    assert "nests deeper than 32 levels" in _refused_problem(tmp_path, text)


def test_a_provider_file_whose_aliases_nest_too_deep_is_refused(tmp_path):
    chain = "".join(f"x{n}: &x{n} [*x{n - 1}]\n" for n in range(1, 40))
    assert "nests deeper than 32 levels" in _refused_problem(tmp_path, "x0: &x0 [1]\n" + chain)


def test_a_provider_file_whose_aliases_expand_to_millions_is_refused(tmp_path):
    text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n" for a, b in zip("abcdef", "bcdefg")
    )
    assert "holds more than 100000 values" in _refused_problem(tmp_path, text)


def test_a_provider_file_with_an_alias_inside_its_own_anchor_is_refused(tmp_path):
    assert "(a loop)" in _refused_problem(tmp_path, GOOD + "    loop: &me [*me]\n")


def test_a_provider_file_over_the_size_limit_is_refused_unread(tmp_path):
    text = GOOD + "#" * (1024 * 1024) + "\n"
    assert "larger than 1048576 bytes" in _refused_problem(tmp_path, text)
