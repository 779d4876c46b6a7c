"""The version changes with each commit (PACKAGE+gCOMMIT), read from the
checkout's files without a git process at start, or from the file
`make install-service` writes; the package version alone elsewhere."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node_agent import __version__
from node_agent.version import checkout_commit, for_install, with_commit

ROOT = Path(__file__).resolve().parents[2]


def git(cwd, *args):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "f").write_text("1")
    git(path, "add", "f")
    git(path, "commit", "-q", "-m", "one")
    return path


def test_each_commit_gives_another_version(repo):
    first = checkout_commit(repo)
    assert first == git(repo, "rev-parse", "HEAD")
    (repo / "f").write_text("2")
    git(repo, "commit", "-q", "-am", "two")
    second = checkout_commit(repo)
    assert second == git(repo, "rev-parse", "HEAD") != first
    assert with_commit("0.1.0", second) == f"0.1.0+g{second[:12]}"


def test_packed_refs_a_worktree_and_a_detached_head_are_read(repo, tmp_path):
    head = git(repo, "rev-parse", "HEAD")
    git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert checkout_commit(repo) == head
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "other", str(worktree))
    assert checkout_commit(worktree) == head
    git(repo, "checkout", "-q", "--detach")
    assert checkout_commit(repo) == head


def test_outside_a_checkout_the_package_version_stands_alone(tmp_path):
    assert checkout_commit(tmp_path) is None
    assert with_commit(__version__, None) == __version__


def test_an_install_from_an_edited_checkout_says_dirty(repo):
    head = git(repo, "rev-parse", "HEAD")
    assert for_install(repo) == f"{__version__}+g{head[:12]}"
    (repo / "f").write_text("changed")
    assert for_install(repo) == f"{__version__}+g{head[:12]}.dirty"


def test_version_option_names_this_checkouts_commit():
    commit = checkout_commit(ROOT)
    if commit is None:
        pytest.skip("not run from a git checkout")
    result = subprocess.run(
        [sys.executable, "-m", "node_agent.cli.main", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.stdout.strip() == f"node-agent {__version__}+g{commit[:12]}"
