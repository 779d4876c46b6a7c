"""docs/reference/ is generated from the code (devenv/reference.py), never hand-edited."""

import pytest

from devenv import reference


@pytest.mark.parametrize("name", sorted(reference.FILES))
def test_committed_reference_matches_what_the_code_generates_now(name):
    text = reference.FILES[name]()
    path = reference.REFERENCE / name
    assert path.exists(), f"docs/reference/{name} is missing: run `make docs` and commit it"
    assert path.read_text() == text, (
        f"docs/reference/{name} is stale: run `make docs` and commit the result"
    )


def test_every_subcommand_and_every_section_is_in_the_reference():
    from node_agent.cli.parser import build_parser, walk
    from node_agent.config.options import list_opts

    cli = (reference.REFERENCE / "cli.md").read_text()
    for parser in walk(build_parser()):
        assert f"\n## {parser.prog}\n" in cli
    assert "{on,off,status}" in cli
    configuration = (reference.REFERENCE / "configuration.md").read_text()
    for group, opts in list_opts():
        assert f"\n## {group}\n" in configuration
        section = configuration.split(f"\n## {group}\n", 1)[1].split("\n## ", 1)[0]
        for opt in opts:
            assert f"\n### `{opt.name}`\n" in section, (group, opt.name)
