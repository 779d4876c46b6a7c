"""pyproject.toml declares what the package needs at run time: the same
packages as requirements.txt, so `pip install .` (and `make install-service`,
which installs from pyproject.toml) gives a working node-agent."""

import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import pytest

    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]


def distribution_name(requirement):
    """The normalised (PEP 503) name of a requirement line."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements_file_names(path):
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(distribution_name(line))
    return names


def test_pyproject_runtime_dependencies_are_the_packages_of_requirements_txt():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {distribution_name(r) for r in project["dependencies"]}
    required = requirements_file_names(ROOT / "requirements.txt")
    assert declared == required, (
        f"only in requirements.txt: {sorted(required - declared)}; "
        f"only in pyproject.toml: {sorted(declared - required)}"
    )


def test_no_test_package_is_a_runtime_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {distribution_name(r) for r in project["dependencies"]}
    tests_only = requirements_file_names(ROOT / "test-requirements.txt")
    assert not declared & tests_only


def test_the_journal_extra_is_the_systemd_bindings():
    """`use_journal = true` needs the `journal` extra (Debian's python3-systemd
    is not seen by a virtualenv); `make install-service JOURNAL=yes` installs
    it (tests/integration/test_install_service.py)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    journal = {distribution_name(r) for r in project["optional-dependencies"]["journal"]}
    assert journal == {"systemd-python"}
