"""The command line of ``node-agent``: every subcommand, option and exit code.

One argparse tree, so ``--help`` (of the command and of each subcommand)
and docs/reference/cli.md are generated from what is parsed and cannot
leave a subcommand out. It imports no subcommand's module: a dry-run pays
for none of their libraries to parse its arguments
(tests/cli/test_start_cost.py).

Two conventions the tree keeps from the hand-made parser it replaced:

* ``--config-file``, ``--config-dir`` and ``--debug`` may come before or
  after a subcommand (also after ``ctl``'s own subcommand); files named in
  both places are all read, in the order given.
* An option of the plain command given before a subcommand goes to the
  subcommand when it takes it (``node-agent --output json audit``) and is
  refused with exit 2 otherwise (``node-agent --once maintenance on``).
"""

from __future__ import annotations

import argparse
import functools
import textwrap
from typing import Generator, Iterator, Optional, Sequence

from node_agent.config.files import DEFAULT_CONFIG_FILE
from node_agent.errors import exit_codes
from node_agent.version import VersionAction

PROG = "node-agent"

# The CLI's own exit codes; the errors' codes come from node_agent.errors.
EX_OK = 0
EX_NOT_IN_SYNC = 1
EX_USAGE = 2  # argparse's
EX_DRIFT = 3
OUTCOMES = (
    (EX_OK, "success (a dry-run: whatever it found)"),
    (
        EX_NOT_IN_SYNC,
        "Placement does not match the host after a sync; the audit found an "
        "alarm; decommission refused (nothing removed); companion: no provider "
        "of the host's name",
    ),
    (EX_USAGE, "bad arguments (a usage line says which)"),
    (EX_DRIFT, "companion mode --once: drift or audit alarms"),
)

# Options of the plain command: (flags, dest, the value when not given).
# A subcommand that takes one declares it with the same dest and no default,
# so the value given before the subcommand carries through.
_PLAIN_OPTIONS = (
    ("--once", "once", False),
    ("--dry-run", "dry_run", False),
    ("--output", "output", None),
    ("--check-config", "check_config", False),
    ("--connect", "connect", False),
)
_GLOBAL_LISTS = ("config_file", "config_dir")
# How deep a parser is: its --config-file values go to config_file, then
# config_file_1 (a subcommand), config_file_2 (ctl's subcommand). argparse
# parses a subcommand into a namespace of its own and copies it over the
# command's, so one dest would keep only the files given after.
_DEPTHS = ("", "_1", "_2")

_OUTPUT_HELP = "text (default) or json"
_CONNECT_HELP = (
    "also check that Placement answers (endpoint, credentials, microversion), "
    "or with [agent] upstream = messaging that the broker does"
)


class _Formatter(argparse.HelpFormatter):
    """argparse's, with the subcommands listed one per line flush with the
    options (``  maintenance   on: reserve ...``) instead of under a
    ``{check-config,maintenance,...}`` line; a text of several lines (the
    exit codes) kept as it is; paths not broken at their hyphens."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return "\n".join(
            textwrap.wrap(
                " ".join(text.split()),
                width,
                initial_indent=indent,
                subsequent_indent=indent,
                break_on_hyphens=False,
            )
        )

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _format_action(self, action: argparse.Action) -> str:
        if isinstance(action, argparse._SubParsersAction):
            return self._join_parts([self._format_action(sub) for sub in action._get_subactions()])
        return super()._format_action(action)

    def _iter_indented_subactions(
        self, action: argparse.Action
    ) -> Generator[argparse.Action, None, None]:
        if isinstance(action, argparse._SubParsersAction):
            yield from action._get_subactions()


def _add_globals(parser: argparse.ArgumentParser, depth: int) -> None:
    group = parser.add_argument_group(
        "global options",
        None
        if depth == 0
        else "the same as before the subcommand; they may come before or after it",
    )
    suffix = _DEPTHS[depth]
    top = depth == 0
    group.add_argument(
        "--config-file",
        action="append",
        dest="config_file" + suffix,
        default=[] if top else argparse.SUPPRESS,
        metavar="FILE",
        help="config file; repeat to layer several (later ones win). "
        f"Default: {DEFAULT_CONFIG_FILE}",
    )
    group.add_argument(
        "--config-dir",
        action="append",
        dest="config_dir" + suffix,
        default=[] if top else argparse.SUPPRESS,
        metavar="DIR",
        help="directory of *.conf files, read after --config-file",
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="log at DEBUG level",
    )


def _exit_codes_epilog() -> str:
    rows = [(code, text) for code, text in OUTCOMES] + [
        (row.code, f"{row.name}: {row.summary}")
        for row in exit_codes()
        if row.own_code and row.parent
    ]
    width = 70
    lines = ["exit codes:"]
    for code, text in rows:
        words, line = text.split(), ""
        first = True
        for word in words:
            if line and len(line) + 1 + len(word) > width:
                lines.append(f"  {code:<4}{line}" if first else f"      {line}")
                line, first = word, False
            else:
                line = f"{line} {word}" if line else word
        lines.append(f"  {code:<4}{line}" if first else f"      {line}")
    return "\n".join(lines)


def build_parser(width: Optional[int] = None) -> argparse.ArgumentParser:
    """The whole command line. ``width`` fixes the help's line width (the
    generated docs); None takes the terminal's, as argparse does."""
    formatter = functools.partial(_Formatter, width=width) if width else _Formatter
    parser = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=formatter,
        description="Report this compute node's resources to OpenStack Placement. "
        "Without a subcommand or --once it runs as a service.",
        epilog=_exit_codes_epilog(),
    )
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument("--once", action="store_true", help="run one cycle and exit")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="write nothing anywhere; print the tree and the planned requests",
    )
    parser.add_argument(
        "--output",
        choices=["text", "json"],
        default=None,
        help="output format of --dry-run, --once and --check-config: " + _OUTPUT_HELP,
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="validate the configuration against this host and print "
        "the CPU partition per NUMA node; when libvirt answers, also check its "
        "guests against the CPU sets (exit 78 naming a guest left without CPUs), "
        "else say the guest checks were skipped",
    )
    parser.add_argument(
        "--connect", action="store_true", help="with --check-config: " + _CONNECT_HELP
    )
    _add_globals(parser, 0)
    sub = parser.add_subparsers(title="subcommands", dest="command", metavar="COMMAND")

    def subcommand(
        name: str, summary: str, description: str, depth: int = 1, within=sub
    ) -> argparse.ArgumentParser:
        child = within.add_parser(
            name, help=summary, description=description, formatter_class=formatter
        )
        _add_globals(child, depth)
        return child

    check = subcommand(
        "check-config",
        "same as --check-config",
        "Validate the configuration against this host and print the CPU partition per "
        "NUMA node. When libvirt answers, its guests are checked against the CPU sets "
        "as a cycle checks them; when it does not, the output says the guest checks "
        "were skipped. Exit 78 naming every problem found.",
    )
    check.add_argument(
        "--connect", action="store_true", default=argparse.SUPPRESS, help=_CONNECT_HELP
    )
    check.add_argument(
        "--output", choices=["text", "json"], default=argparse.SUPPRESS, help=_OUTPUT_HELP
    )
    check.set_defaults(passed_on=("output", "connect", "check_config"))

    maintenance = subcommand(
        "maintenance",
        "on: reserve every inventory; off: release them; "
        "status: compare the state file with Placement",
        "on/off ask the running service over its control channel when one answers; "
        "else they record the wish in the state file and the next cycle (the "
        "service's, or --once) applies it. status compares the state file, Placement "
        "and the running service; it reads only.",
    )
    maintenance.add_argument(
        "switch",
        choices=["on", "off", "status"],
        help="on: every inventory reserved = total and the root "
        "marked; off: the configured reservations back; "
        "status: what is recorded and what Placement shows",
    )
    maintenance.add_argument(
        "--reason", default="", help="why (on/off), kept with the record and shown by status"
    )
    maintenance.add_argument(
        "--provider",
        metavar="NAME",
        help="on/off: one child provider only (a GPU, a PF, a NUMA node, by its "
        "provider name): its inventories reserved = total, its siblings and the "
        "root stay open. A name that is not a child of this host exits 2, "
        "listing the children",
    )
    maintenance.add_argument(
        "--output",
        choices=["text", "json"],
        default=argparse.SUPPRESS,
        help="output format of status: " + _OUTPUT_HELP,
    )
    maintenance.set_defaults(passed_on=("output",))

    ctl = subcommand(
        "ctl",
        "ask a running agent over the message bus (status, sync-now, maintenance)",
        "Talk to the node-agent of one host over the message bus ([DEFAULT] "
        "transport_url). Answers are printed as JSON. Exit 0 answered; the agent's "
        "refusal's code when it answered with one (69: it cannot write its state "
        "file); 78 no transport configured; 75 the agent did not answer in time.",
    )
    ctl.add_argument("--host", required=True, help="the agent's [DEFAULT] host")
    ctl.add_argument("--transport-url", help="overrides [DEFAULT] transport_url")
    ctl.add_argument(
        "--timeout",
        type=float,
        default=150,
        help="seconds to wait for the answer (sync-now waits for a whole cycle; default 150)",
    )
    ctl.set_defaults(passed_on=())
    ctl_sub = ctl.add_subparsers(
        title="subcommands", dest="ctl_command", metavar="COMMAND", required=True
    )
    subcommand(
        "status",
        "tree summary, last sync, maintenance, warnings",
        "The agent's tree summary, last sync, maintenance and warnings.",
        depth=2,
        within=ctl_sub,
    )
    subcommand(
        "sync-now",
        "run a cycle now and wait for it",
        "Run a cycle now and wait for it (up to --timeout).",
        depth=2,
        within=ctl_sub,
    )
    ctl_maintenance = subcommand(
        "maintenance",
        "set or clear the maintenance flag",
        "Set or clear the maintenance flag; the agent applies it in a cycle at once.",
        depth=2,
        within=ctl_sub,
    )
    ctl_maintenance.add_argument(
        "state", choices=["on", "off"], help="on: reserve every inventory; off: release them"
    )
    ctl_maintenance.add_argument("--reason", help="why, shown in status")
    ctl_maintenance.add_argument(
        "--provider", metavar="NAME", help="one child provider only (see `maintenance --provider`)"
    )

    decommission = subcommand(
        "decommission",
        "remove this host's providers from Placement (refused while anything is allocated on them)",
        "Remove this host's providers (the root and the agent's children) from "
        "Placement, when no allocation remains on them. Exit 0 removed (or nothing "
        "to remove); 1 refused, nothing deleted; 75 Placement; 78 configuration, or "
        "the root is another writer's.",
    )
    decommission.add_argument(
        "--dry-run",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show what would be removed, or why not; remove nothing",
    )
    decommission.add_argument(
        "--output", choices=["text", "json"], default=argparse.SUPPRESS, help=_OUTPUT_HELP
    )
    decommission.set_defaults(passed_on=("dry_run", "output"))

    audit = subcommand(
        "audit",
        "compare the allocations on this host's providers with its guests; "
        "reads Placement, never writes it",
        "Compare the allocations on this host's providers with its guests. Reads "
        "Placement, never writes it; keeps when it first saw each finding in the "
        "state file. Exit 0 no alarm; 1 an alarm, or no provider of this host yet.",
    )
    audit.add_argument(
        "--output", choices=["text", "json"], default=argparse.SUPPRESS, help=_OUTPUT_HELP
    )
    audit.set_defaults(passed_on=("output",))
    return parser


def parse(
    argv: Sequence[str], parser: Optional[argparse.ArgumentParser] = None
) -> argparse.Namespace:
    """``argv`` parsed, with one ``config_file``/``config_dir`` list and one
    ``debug`` wherever they were given, ``output`` resolved, and
    ``check_config`` set by the ``check-config`` subcommand. Exits 2 with a
    usage line on a bad argument."""
    parser = parser or build_parser()
    args = parser.parse_args(list(argv))
    for name in _GLOBAL_LISTS:
        merged: list[str] = []
        for suffix in _DEPTHS:
            merged += getattr(args, name + suffix, None) or []
            if suffix:
                vars(args).pop(name + suffix, None)
        setattr(args, name, merged)
    if args.command is not None:
        taken = getattr(args, "passed_on", ())
        refused = [
            flags
            for flags, dest, unset in _PLAIN_OPTIONS
            if dest not in taken and getattr(args, dest) != unset
        ]
        if refused:
            takes = ", ".join(
                ["--config-file", "--config-dir", "--debug"]
                + [flags for flags, dest, _ in _PLAIN_OPTIONS if dest in taken]
            )
            parser.error(
                f"{' '.join(refused)} cannot be used with `{args.command}`; only {takes} can"
            )
    if args.command == "check-config":
        args.check_config = True
    if args.connect and not args.check_config:
        parser.error("--connect goes with --check-config")
    if args.output is None:
        args.output = "text"
    return args


def walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser under it, in the order
    ``--help`` lists them."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield from walk(child)
