"""The version, and the ``--version`` option of node-agent and
node-agent-applier.

The package version (pyproject.toml) stays the same between releases, so
alone it cannot tell two builds apart. The version shown is
``PACKAGE+gCOMMIT`` (a PEP 440 local version, ``.dirty`` when installed
from a checkout with uncommitted changes), from the first of:

1. ``node_agent/_build_version.py``, written by ``make install-service``
   into the copy it installs (the installed tree has no ``.git``);
2. the git checkout the package is imported from (``make install``'s
   editable install): ``.git/HEAD`` and the ref it names are read as files,
   no ``git`` process;
3. the package version alone (``pip install .`` of a copy, a wheel).

Nothing is read at import: only ``--version`` and the build-info metric ask.
"""

from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path
from typing import Optional

from node_agent import __version__ as PACKAGE_VERSION

PACKAGE_DIR = Path(__file__).resolve().parent
_HASH = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _git_dir(checkout: Path) -> Optional[Path]:
    """``checkout/.git``, or the directory a worktree's ``.git`` file names."""
    dot_git = checkout / ".git"
    if dot_git.is_dir():
        return dot_git
    text = _read(dot_git)
    if text and text.startswith("gitdir:"):
        return (checkout / text.split(":", 1)[1].strip()).resolve()
    return None


def _resolve(git_dir: Path, ref: str) -> Optional[str]:
    """The commit ``ref`` names: loose in the worktree's or the common
    directory, else in packed-refs."""
    common = _read(git_dir / "commondir")
    places = [git_dir] + ([(git_dir / common).resolve()] if common else [])
    for place in places:
        value = _read(place / ref)
        if value and _HASH.fullmatch(value):
            return value
    for place in places:
        for line in (_read(place / "packed-refs") or "").splitlines():
            value, _, name = line.partition(" ")
            if name == ref and _HASH.fullmatch(value):
                return value
    return None


def checkout_commit(checkout: Path) -> Optional[str]:
    """The commit HEAD points at in ``checkout``; None when it is not a git
    checkout or its files cannot be read."""
    git_dir = _git_dir(checkout)
    if git_dir is None:
        return None
    head = _read(git_dir / "HEAD")
    if not head:
        return None
    if head.startswith("ref:"):
        return _resolve(git_dir, head.split(":", 1)[1].strip())
    return head if _HASH.fullmatch(head) else None


def with_commit(package_version: str, commit: Optional[str], dirty: bool = False) -> str:
    """``0.1.0+g1a2b3c4d5e6f`` (``.dirty`` appended when it has changes)."""
    if not commit:
        return package_version
    return f"{package_version}+g{commit[:12]}" + (".dirty" if dirty else "")


@functools.lru_cache(maxsize=None)
def build_version() -> str:
    """The version of this build (see the module's docstring)."""
    try:
        from node_agent import _build_version  # type: ignore[attr-defined]

        return str(_build_version.VERSION)
    except ImportError:
        pass
    return with_commit(PACKAGE_VERSION, checkout_commit(PACKAGE_DIR.parent))


def installed_version() -> str:
    """Kept for callers of the earlier name."""
    return build_version()


class VersionAction(argparse.Action):
    """``--version``: prints ``PROG VERSION``."""

    def __init__(
        self,
        option_strings,
        dest=argparse.SUPPRESS,
        default=argparse.SUPPRESS,
        help="show the program's version number and exit",
    ):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {build_version()}")
        parser.exit()


def for_install(checkout: Path) -> str:
    """The version ``make install-service`` writes into the copy it installs:
    the checkout's commit, ``.dirty`` when tracked files differ from it (one
    ``git status``, at install time only)."""
    import subprocess

    commit = checkout_commit(checkout)
    try:
        status = subprocess.run(
            ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        status = ""
    return with_commit(PACKAGE_VERSION, commit, dirty=bool(status.strip()))


if __name__ == "__main__":  # make install-service: python -m node_agent.version
    print(for_install(Path.cwd()))
