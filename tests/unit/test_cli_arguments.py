"""node-agent's argparse tree (node_agent/cli/parser.py): what each
invocation parses to, what it refuses, and that --help is complete."""

from __future__ import annotations

import argparse

import pytest

from node_agent.cli.parser import build_parser, parse, walk
from node_agent.errors import exit_codes

SUBCOMMANDS = ("check-config", "maintenance", "ctl", "decommission", "audit")


def refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: node-agent"), err
    return err


def help_of(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        build_parser(width=100).parse_args([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_the_plain_command_runs_the_service_with_text_output():
    args = parse([])
    assert (args.command, args.once, args.dry_run, args.check_config) == (None, False, False, False)
    assert args.output == "text" and args.config_file == [] and args.debug is False


@pytest.mark.parametrize(
    "argv", [["--once", "--dry-run", "--output", "json"], ["--output=json", "--dry-run", "--once"]]
)
def test_once_dry_run_json(argv):
    args = parse(argv)
    assert args.once and args.dry_run and args.output == "json" and args.command is None


def test_config_files_before_and_after_a_subcommand_are_all_read_in_order():
    args = parse(
        [
            "--config-file",
            "a",
            "--config-dir",
            "d1",
            "maintenance",
            "on",
            "--config-file",
            "b",
            "--reason",
            "disk swap",
            "--config-dir",
            "d2",
        ]
    )
    assert args.config_file == ["a", "b"] and args.config_dir == ["d1", "d2"]
    assert (args.command, args.switch, args.reason) == ("maintenance", "on", "disk swap")


def test_global_options_after_ctls_own_subcommand_are_read():
    args = parse(
        [
            "--config-file",
            "a",
            "ctl",
            "--config-file",
            "b",
            "--host",
            "h1",
            "maintenance",
            "off",
            "--config-file",
            "c",
            "--debug",
        ]
    )
    assert args.config_file == ["a", "b", "c"] and args.debug
    assert (args.command, args.ctl_command, args.state, args.host) == (
        "ctl",
        "maintenance",
        "off",
        "h1",
    )
    assert args.timeout == 150 and args.transport_url is None


@pytest.mark.parametrize("argv", [["--output", "json", "audit"], ["audit", "--output", "json"]])
def test_output_before_or_after_audit(argv):
    args = parse(argv)
    assert args.command == "audit" and args.output == "json"


@pytest.mark.parametrize("argv", [["--dry-run", "decommission"], ["decommission", "--dry-run"]])
def test_dry_run_before_or_after_decommission(argv):
    args = parse(argv)
    assert args.command == "decommission" and args.dry_run and args.output == "text"


@pytest.mark.parametrize(
    "argv",
    [
        ["check-config", "--connect", "--output", "json"],
        ["--output", "json", "check-config", "--connect"],
        ["--check-config", "--connect", "--output", "json"],
    ],
)
def test_check_config_subcommand_is_the_option(argv):
    args = parse(argv)
    assert args.check_config and args.connect and args.output == "json"


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--once", "maintenance", "on"], "--once cannot be used with `maintenance`"),
        (["--dry-run", "ctl", "--host", "h", "status"], "--dry-run cannot be used with `ctl`"),
        (["--check-config", "audit"], "--check-config cannot be used with `audit`"),
        (["--once", "decommission"], "--once cannot be used with `decommission`"),
    ],
)
def test_a_plain_option_before_a_subcommand_that_does_not_take_it_exits_2(argv, named, capsys):
    assert named in refused(argv, capsys)


def test_connect_without_check_config_exits_2(capsys):
    assert "--connect goes with --check-config" in refused(["--once", "--connect"], capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["--bogus"],
        ["maintenance"],
        ["maintenance", "maybe"],
        ["ctl", "status"],
        ["ctl", "--host", "h"],
        ["--output", "yaml"],
        ["decommission", "--force"],
    ],
)
def test_bad_arguments_exit_2_with_a_usage_line(argv, capsys):
    refused(argv, capsys)


def test_help_lists_every_subcommand_and_every_exit_code(capsys):
    text = help_of([], capsys)
    listed = [
        line.split()[0]
        for line in text.split("\nsubcommands:\n", 1)[1].splitlines()
        if line.startswith("  ") and not line.startswith("   ")
    ]
    assert tuple(listed[: len(SUBCOMMANDS)]) == SUBCOMMANDS
    codes = text.split("\nexit codes:\n", 1)[1]
    for row in exit_codes():
        assert f"  {row.code:<4}" in codes
    for option in (
        "--once",
        "--dry-run",
        "--output",
        "--check-config",
        "--connect",
        "--config-file",
        "--config-dir",
        "--debug",
        "--version",
    ):
        assert f"  {option}" in text


def test_maintenance_help_names_status(capsys):
    text = help_of(["maintenance"], capsys)
    assert "{on,off,status}" in text and "status:" in text
    assert "--reason REASON" in text and "--output {text,json}" in text


def test_every_option_of_every_subcommand_has_help_text():
    parsers = list(walk(build_parser()))
    assert [p.prog for p in parsers] == [
        "node-agent",
        "node-agent check-config",
        "node-agent maintenance",
        "node-agent ctl",
        "node-agent ctl status",
        "node-agent ctl sync-now",
        "node-agent ctl maintenance",
        "node-agent decommission",
        "node-agent audit",
    ]
    for parser in parsers:
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help, (parser.prog, action.option_strings or action.dest)
