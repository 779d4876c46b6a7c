"""The import contract: the pure core touches nothing outside the process.

The pure core is every module of ``model/``, ``policy/`` and ``tree/``, plus
the sync planner, the reshape engine and rules, Placement's error classes and
the microversion table in ``placement/``, and the wire format and its schema
in ``remote/``. It may import the standard library's
data and text modules, a few pure third-party libraries, ``node_agent.errors``
and other pure-core modules. It may not import anything that reads or writes
the world (config loading, keystoneauth, libvirt, psutil, HTTP, sockets,
processes, files), directly or through a node_agent module, nor call
``open()``. Imports under ``if TYPE_CHECKING:`` only name types and are
allowed. Function-local imports count: they are still imports.

The checker walks the source (AST), so it needs nothing installed and runs in
milliseconds; ``make lint`` and ``make unit`` run it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "node_agent"

PURE_PACKAGES = ("model", "policy", "tree")
PURE_MODULES = ("node_agent.placement.planner", "node_agent.placement.reshape_engine",
                "node_agent.placement.reshape_rules",
                "node_agent.placement.errors", "node_agent.placement.microversions",
                "node_agent.placement.routes",
                # The wire format and the JSON Schema it ships (read as package data).
                "node_agent.remote.wire", "node_agent.remote.schema",
                # The HMACs of signed messages (hmac, hashlib, json).
                "node_agent.remote.signing")
# Not pure themselves, but safe to import: the error hierarchy (it reads
# os.EX_CONFIG, a constant) and the packages' docstring-only __init__ files.
ALLOWED_INTERNAL = ({"node_agent", "node_agent.errors"}
                    | {name.rpartition(".")[0] for name in PURE_MODULES})

# Top-level modules that touch the world. yaml is not here: the core only
# parses text with it (yaml.safe_load(text)); reading the files is the shell's.
WORLD = {
    "oslo_config", "oslo_messaging", "oslo_service", "oslo_log", "oslo_concurrency",
    "oslo_utils", "keystoneauth1", "libvirt", "psutil", "requests", "urllib3",
    "http", "socket", "ssl", "subprocess", "os", "pathlib", "shutil", "tempfile",
    "fcntl", "glob", "io", "sqlite3", "signal", "multiprocessing", "prometheus_client",
    "systemd", "sdnotify", "select", "selectors", "asyncio", "pyroute2",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def pure_modules() -> dict[str, Path]:
    found = {}
    for package in PURE_PACKAGES:
        for path in sorted((PACKAGE / package).glob("*.py")):
            found[module_name(path)] = path
    for name in PURE_MODULES:
        module = ROOT / (name.replace(".", "/") + ".py")
        package = ROOT / name.replace(".", "/") / "__init__.py"
        found[name] = package if package.is_file() else module
    return found


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imports_and_opens(source: str) -> tuple[list[tuple[int, str]], list[int]]:
    """Every module a source imports (line, dotted name) outside TYPE_CHECKING
    blocks, and the lines that call ``open``."""
    tree = ast.parse(source)
    imported: list[tuple[int, str]] = []
    opens: list[int] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking_block(child):
                stack.extend(child.orelse)  # type: ignore[attr-defined]
                continue
            if isinstance(child, ast.Import):
                imported += [(child.lineno, alias.name) for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module:
                if child.module == "node_agent":
                    imported += [(child.lineno, f"node_agent.{alias.name}")
                                 for alias in child.names]
                else:
                    imported.append((child.lineno, child.module))
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Name)
                  and child.func.id == "open"):
                opens.append(child.lineno)
            stack.append(child)
    return sorted(imported), sorted(opens)


def violations(name: str, source: str, pure: set[str]) -> list[str]:
    """What breaks the contract in one pure module's source, one line each."""
    found = []
    imported, opens = imports_and_opens(source)
    for line, target in imported:
        top = target.split(".")[0]
        if top in WORLD:
            found.append(f"{name}:{line} imports {target}, which touches the world")
        elif top == "node_agent" and target not in pure and target not in ALLOWED_INTERNAL:
            found.append(f"{name}:{line} imports {target}, which is not in the pure core")
    found += [f"{name}:{line} calls open()" for line in opens]
    return found


def test_pure_core_imports_nothing_that_touches_the_world():
    modules = pure_modules()
    pure = set(modules)
    problems = [problem for name, path in modules.items()
                for problem in violations(name, path.read_text(), pure)]
    assert not problems, ("the pure core must take data and return data; move the "
                          "side effect to a shell module and pass its result in:\n"
                          + "\n".join(problems))


def test_pure_core_lists_real_modules():
    modules = pure_modules()
    missing = [name for name, path in modules.items() if not path.is_file()]
    assert not missing and len(modules) > 10, missing


@pytest.mark.parametrize("source, expected", [
    ("from node_agent.placement.client import Unavailable\n",
     "imports node_agent.placement.client, which is not in the pure core"),
    ("import libvirt\n", "imports libvirt, which touches the world"),
    ("def f():\n    from oslo_config import cfg\n", "imports oslo_config, which touches the world"),
    ("from node_agent import state\n", "imports node_agent.state, which is not in the pure core"),
    ("def f(p):\n    return open(p).read()\n", "calls open()"),
])
def test_contract_flags_a_world_import_in_the_core(source, expected):
    (problem,) = violations("node_agent.tree.example", source, set(pure_modules()))
    assert problem.endswith(expected)


def test_contract_allows_type_checking_imports_and_pure_neighbours():
    source = ("from typing import TYPE_CHECKING\n"
              "from node_agent.model.cpuset import CpuSet\n"
              "from node_agent.errors import ConfigError\n"
              "if TYPE_CHECKING:\n    from node_agent.state import StateStore\n")
    assert violations("node_agent.tree.example", source, set(pure_modules())) == []
