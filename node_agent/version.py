"""The installed version, and the ``--version`` option of node-agent and
node-agent-applier."""

import argparse


def installed_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("node-agent")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


class VersionAction(argparse.Action):
    """``--version``, read from the package metadata only when asked:
    importlib.metadata costs every other run a noticeable part of its
    start-up. Prints ``PROG VERSION``."""

    def __init__(
        self,
        option_strings,
        dest=argparse.SUPPRESS,
        default=argparse.SUPPRESS,
        help="show the program's version number and exit",
    ):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {installed_version()}")
        parser.exit()
