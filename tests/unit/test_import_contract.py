"""The import contract: the packages have floors, and the pure core touches
nothing outside the process. This file is where both lists live; the docs
point here.

Floors (:data:`FLOORS`): every area of ``node_agent`` (a package, or a
top-level module) has a floor. A module imports from its own area and from
the floors below, never from a floor above nor from another area of its own
floor; and no import closes a cycle of modules (a function-local import that
does is how a cycle hides). Imports under ``if TYPE_CHECKING:`` are allowed.

The pure core (:data:`PURE_PACKAGES`, :data:`PURE_MODULES`) may import the
standard library's data and text modules, a few pure third-party libraries,
``node_agent.errors`` and other pure-core modules. It may not import anything that reads or writes
the world (config loading, keystoneauth, libvirt, psutil, HTTP, sockets,
processes, files), directly or through a node_agent module, nor use
``open()``, nor load code by name (``importlib`` beyond the package data of
``importlib.resources``, ``__import__``, ``builtins``, ``exec``/``eval``).
Imports under ``if TYPE_CHECKING:`` only name types and are allowed.
Function-local and relative imports count: they are still imports;
``from pkg import mod`` counts as importing ``pkg.mod``.

The floors are checked on the source (AST). The pure core has two checks.
The static one walks the source: it needs nothing installed, runs in
milliseconds and names the line. The runtime one imports each pure module
in a fresh interpreter and looks at ``sys.modules``: it sees what any import
path really loads, however it was spelled.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "node_agent"

PURE_PACKAGES = ("model", "policy", "tree")
PURE_MODULES = (
    "node_agent.placement.planner",
    "node_agent.placement.reshape_engine",
    "node_agent.placement.reshape_rules",
    "node_agent.placement.errors",
    "node_agent.placement.microversions",
    "node_agent.placement.routes",
    # The syncer's cache bookkeeping and its per-sync working set.
    "node_agent.placement.tree_cache",
    "node_agent.placement.sync_context",
    # The wire format and the JSON Schema it ships (read as package data).
    "node_agent.remote.wire",
    "node_agent.remote.schema",
    # The HMACs of signed messages (hmac, hashlib, json).
    "node_agent.remote.signing",
    # How many reads run at once (the caller measures and reports).
    "node_agent.placement.read_pace",
    # The libvirt XML and meminfo parsers: text in, records out.
    "node_agent.host.libvirt_xml",
    "node_agent.host.capabilities",
    "node_agent.host.domain_capabilities",
    "node_agent.host.domain",
    "node_agent.host.nodedev",
    "node_agent.host.meminfo",
    # nova's option names (a generated table).
    "node_agent.config.nova_options",
    # What --dry-run and --once print: a report in, text out.
    "node_agent.cli.render",
)
# Not pure themselves, but safe to import: the error hierarchy (it reads
# os.EX_CONFIG, a constant) and the packages' docstring-only __init__ files.
ALLOWED_INTERNAL = {"node_agent", "node_agent.errors"} | {
    name.rpartition(".")[0] for name in PURE_MODULES
}

# Top-level modules that touch the world. yaml is not here: the core only
# parses text with it (yaml.safe_load(text)); reading the files is the shell's.
WORLD = {
    "oslo_config",
    "oslo_messaging",
    "oslo_service",
    "oslo_log",
    "oslo_concurrency",
    "oslo_utils",
    "keystoneauth1",
    "libvirt",
    "psutil",
    "requests",
    "urllib3",
    "http",
    "socket",
    "ssl",
    "subprocess",
    "os",
    "pathlib",
    "shutil",
    "tempfile",
    "fcntl",
    "glob",
    "io",
    "sqlite3",
    "signal",
    "multiprocessing",
    "prometheus_client",
    "systemd",
    "sdnotify",
    "select",
    "selectors",
    "asyncio",
    "pyroute2",
    "tooz",
    "redis",
    "sqlalchemy",
    "psycopg2",
    "pymysql",
    "jwt",
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
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package (not a name inside one).
    node_agent is looked up on disk, the standard library by its finder;
    a third-party package's submodules are not resolved: its top-level name
    already decides."""
    top = dotted.split(".")[0]
    if top == "node_agent":
        path = ROOT / dotted.replace(".", "/")
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()
    if top in sys.stdlib_module_names and top not in WORLD:
        try:
            return importlib.util.find_spec(dotted) is not None
        except (ImportError, ValueError):
            return False
    return False


def _from_targets(node: ast.ImportFrom, name: str, is_package: bool) -> list[str]:
    """The modules ``from base import a, b`` loads: ``base.a`` when that is a
    module (``from node_agent.placement import client``), else ``base``.
    A relative base is resolved against ``name``'s package by its level."""
    base = node.module or ""
    if node.level:
        package = name.split(".") if is_package else name.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return [
        f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base
        for alias in node.names
    ]


# Ways to load code or reach the builtins past the import statement.
DYNAMIC = {"__import__", "__builtins__", "builtins", "exec", "eval", "compile"}


def imports_and_opens(
    source: str, name: str = "node_agent.tree.example", is_package: bool = False
) -> tuple[list[tuple[int, str]], list[int], list[tuple[int, str]]]:
    """Every module a source imports (line, dotted name) outside TYPE_CHECKING
    blocks, the lines that use ``open``, and the lines that load code by name
    (``importlib`` beyond its ``resources``, ``__import__``, ``builtins``,
    ``exec``/``eval``/``compile``). ``name`` is the module's own dotted
    name, for relative imports."""
    tree = ast.parse(source)
    imported: list[tuple[int, str]] = []
    opens: list[int] = []
    dynamic: list[tuple[int, str]] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking_block(child):
                stack.extend(child.orelse)  # type: ignore[attr-defined]
                continue
            if isinstance(child, ast.Import):
                imported += [(child.lineno, alias.name) for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                imported += [
                    (child.lineno, target) for target in _from_targets(child, name, is_package)
                ]
            elif isinstance(child, ast.Name) and child.id == "open":
                opens.append(child.lineno)
            elif isinstance(child, ast.Name) and child.id in DYNAMIC:
                dynamic.append((child.lineno, child.id))
            elif (
                isinstance(child, ast.Attribute)
                and isinstance(child.value, ast.Name)
                and child.value.id == "importlib"
                and child.attr != "resources"
            ):
                dynamic.append((child.lineno, f"importlib.{child.attr}"))
            stack.append(child)
    return sorted(imported), sorted(opens), sorted(dynamic)


def violations(name: str, source: str, pure: set[str], is_package: bool = False) -> list[str]:
    """What breaks the contract in one pure module's source, one line each."""
    found = []
    imported, opens, dynamic = imports_and_opens(source, name, is_package)
    for line, target in imported:
        top = target.split(".")[0]
        if top in WORLD:
            found.append(f"{name}:{line} imports {target}, which touches the world")
        elif top in DYNAMIC or (top == "importlib" and target != "importlib.resources"):
            found.append(f"{name}:{line} imports {target}, which loads code by name")
        elif top == "node_agent" and target not in pure and target not in ALLOWED_INTERNAL:
            found.append(f"{name}:{line} imports {target}, which is not in the pure core")
    found += [f"{name}:{line} uses open()" for line in opens]
    found += [f"{name}:{line} uses {what}, which loads code by name" for line, what in dynamic]
    return found


def test_pure_core_imports_nothing_that_touches_the_world():
    modules = pure_modules()
    pure = set(modules)
    problems = [
        problem
        for name, path in modules.items()
        for problem in violations(
            name, path.read_text(), pure, is_package=path.name == "__init__.py"
        )
    ]
    assert not problems, (
        "the pure core must take data and return data; move the "
        "side effect to a shell module and pass its result in:\n" + "\n".join(problems)
    )


def test_pure_core_lists_real_modules():
    modules = pure_modules()
    missing = [name for name, path in modules.items() if not path.is_file()]
    assert not missing and len(modules) > 10, missing


@pytest.mark.parametrize(
    "source, expected",
    [
        (
            "from node_agent.placement.client import Unavailable\n",
            "imports node_agent.placement.client, which is not in the pure core",
        ),
        ("import libvirt\n", "imports libvirt, which touches the world"),
        (
            "def f():\n    from oslo_config import cfg\n",
            "imports oslo_config, which touches the world",
        ),
        (
            "from node_agent import state\n",
            "imports node_agent.state, which is not in the pure core",
        ),
        ("def f(p):\n    return open(p).read()\n", "uses open()"),
        ("read = open\n", "uses open()"),
        # A module named in the from-list is imported, not its package.
        (
            "from node_agent.placement import client\n",
            "imports node_agent.placement.client, which is not in the pure core",
        ),
        (
            "from node_agent.host import sysfs as fs\n",
            "imports node_agent.host.sysfs, which is not in the pure core",
        ),
        # Relative imports resolve against the module's package, by level.
        (
            "from ..placement import client\n",
            "imports node_agent.placement.client, which is not in the pure core",
        ),
        ("from .. import state\n", "imports node_agent.state, which is not in the pure core"),
        (
            "from ..host.sysfs import SysFS\n",
            "imports node_agent.host.sysfs, which is not in the pure core",
        ),
        # Loading code by name goes round every import statement.
        ("import importlib\n", "imports importlib, which loads code by name"),
        ("from importlib import import_module\n", "imports importlib, which loads code by name"),
        (
            "import importlib.resources\nimportlib.import_module('x')\n",
            "uses importlib.import_module, which loads code by name",
        ),
        ("m = __import__('socket')\n", "uses __import__, which loads code by name"),
        ("import builtins\n", "imports builtins, which loads code by name"),
        ("from builtins import open as read\n", "imports builtins, which loads code by name"),
        ("exec('import os')\n", "uses exec, which loads code by name"),
    ],
)
def test_contract_flags_a_world_import_in_the_core(source, expected):
    (problem,) = violations("node_agent.tree.example", source, set(pure_modules()))
    assert problem.endswith(expected)


def test_contract_allows_type_checking_imports_and_pure_neighbours():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from importlib import resources\n"
        "from node_agent.model.cpuset import CpuSet\n"
        "from node_agent.errors import ConfigError\n"
        "from ..model import provider_tree\n"
        "from .numa import numa_children\n"
        "from . import pci\n"
        "if TYPE_CHECKING:\n    from node_agent.state import StateStore\n"
    )
    assert violations("node_agent.tree.example", source, set(pure_modules())) == []


def test_contract_resolves_a_package_s_relative_imports_from_the_package():
    # In node_agent/remote/schema/__init__.py, "." is node_agent.remote.schema.
    (problem,) = violations(
        "node_agent.remote.schema",
        "from .. import upstream\n",
        set(pure_modules()),
        is_package=True,
    )
    assert problem.endswith("imports node_agent.remote.upstream, which is not in the pure core")


# What a bare interpreter of this venv has loaded before any import of ours
# (os, io, pathlib...) cannot be told apart at run time; the static check
# covers those. importlib.resources is allowed (package data) and loads
# tempfile and shutil for its own use: it is loaded before the count starts.
PROBE = """
import importlib, importlib.resources, json, sys
before = set(sys.modules)
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted({m.split(".")[0] for m in set(sys.modules) - before})))
"""


def world_loaded_by(*names: str) -> list[str]:
    """The world modules importing ``names`` loads, in one fresh interpreter."""
    run = subprocess.run(
        [sys.executable, "-c", PROBE, *names], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, f"importing {', '.join(names)} failed:\n{run.stderr}"
    return sorted(set(json.loads(run.stdout)) & WORLD)


def test_importing_a_pure_module_loads_nothing_that_touches_the_world():
    # All of them in one interpreter: whatever one of them loads alone, it
    # loads among the others too, so a clean run clears each. Only when it
    # is not is each one imported in its own interpreter, to name it.
    names = sorted(pure_modules())
    if not world_loaded_by(*names):
        return
    problems = {name: world for name in names if (world := world_loaded_by(name))}
    assert not problems, (
        "importing these pure modules loaded world modules "
        "(follow the import chain with python -X importtime):\n"
        + "\n".join(f"{n}: {', '.join(w)}" for n, w in problems.items())
    )


def test_runtime_probe_sees_a_gateway_loaded_through_any_spelling():
    # The probe itself must be able to fail: a shell module loads the world.
    assert "keystoneauth1" in world_loaded_by("node_agent.placement.client")
    assert "libvirt" in world_loaded_by("node_agent.host.hypervisor")
    assert "oslo_config" in world_loaded_by("node_agent.model.cpuset", "node_agent.config.files")


# ---------------------------------------------------------------- floors

# The floors of node_agent, lowest first (issue 25; STYLE.md habit 15). A
# module may import from its own area and from the floors below; not from a
# floor above, nor from another area of its own floor (areas on one floor do
# not know each other). A module's area is the longest entry that names it or
# a package above it ("remote.applier" before "remote"); the package itself,
# node_agent/__init__.py, is below everything.
FLOORS: tuple[tuple[str, ...], ...] = (
    # the error hierarchy; the --version action; libraries loaded on first use
    ("errors", "version", "deferred_imports"),
    ("model", "state"),  # frozen data; the crash-safe state file
    ("policy",),  # pure decisions on data
    ("tree",),  # snapshot + partition + settings -> desired tree
    ("placement", "host", "logs"),  # Placement (planner, reshape, the gateway);
    # reading the machine; oslo.log
    ("config",),  # config and provider files -> Settings
    ("cycle",),  # one cycle: desired, reconcile, companion
    ("remote",),  # the message bus, the wire, coordination, keys
    ("startup", "runner"),  # the start-up check; one cycle per mode, composed
    ("service",),  # the agent's loop
    ("applier", "cli"),  # the entry points (node-agent-applier runs service/'s loop)
)
FLOOR_OF = {area: number for number, areas in enumerate(FLOORS, 1) for area in areas}


def area_of(module: str) -> str | None:
    """The area (a FLOORS entry) of a dotted node_agent module, or None for
    the package root and for a module no entry names."""
    parts = module.split(".")[1:]
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in FLOOR_OF:
            return ".".join(parts[:end])
    return None


def function_local_lines(source: str) -> set[int]:
    """The lines of the imports inside a function body (run on a call, not
    on import: the way a cycle is usually hidden)."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines |= {
                inner.lineno
                for inner in ast.walk(node)
                if isinstance(inner, (ast.Import, ast.ImportFrom))
            }
    return lines


def internal_imports(
    name: str, source: str, is_package: bool = False
) -> list[tuple[int, str, bool]]:
    """(line, node_agent module, function-local) for each import of a
    node_agent module outside TYPE_CHECKING blocks, the package root left out."""
    local = function_local_lines(source)
    imported, _opens, _dynamic = imports_and_opens(source, name, is_package)
    return sorted(
        {
            (line, target, line in local)
            for line, target in imported
            if target.startswith("node_agent.") and target != name
        }
    )


def floor_violations(name: str, source: str, is_package: bool = False) -> list[str]:
    """Imports of one module that go up a floor or sideways on its floor."""
    found = []
    area = area_of(name)
    if area is None:
        return [f"{name} has no floor: add its area to FLOORS"]
    for line, target, local in internal_imports(name, source, is_package):
        other = area_of(target)
        if other is None or other == area:
            continue
        where = f"{name}:{line} imports {target}{' in a function' if local else ''}"
        if FLOOR_OF[other] > FLOOR_OF[area]:
            found.append(
                f"{where}: {area} (floor {FLOOR_OF[area]}) imports {other} "
                f"(floor {FLOOR_OF[other]}), upward"
            )
        elif FLOOR_OF[other] == FLOOR_OF[area]:
            found.append(
                f"{where}: {area} and {other} share floor {FLOOR_OF[area]}, "
                "and neither imports the other"
            )
    return found


def cycle_violations(graph: dict[str, list[tuple[int, str, bool]]]) -> list[str]:
    """Each import that closes a cycle: its target imports, through any chain
    of modules, the module it is in. Function-local ones say so."""

    def path_back(start: str, goal: str) -> list[str] | None:
        seen, queue = {start: [start]}, [start]
        while queue:
            here = queue.pop(0)
            for _line, there, _local in graph.get(here, ()):
                if there == goal:
                    return seen[here] + [there]
                if there not in seen:
                    seen[there] = seen[here] + [there]
                    queue.append(there)
        return None

    found = []
    for name, imports in sorted(graph.items()):
        for line, target, local in imports:
            back = path_back(target, name)
            if back is not None:
                how = "a function-local import" if local else "an import"
                found.append(
                    f"{name}:{line} {how} of {target} closes the cycle "
                    f"{name} -> {' -> '.join(back)}"
                )
    return found


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_imports_from_a_floor_above_or_beside_its_own():
    problems = [
        problem
        for name, path in package_modules().items()
        if name != "node_agent"
        for problem in floor_violations(name, path.read_text(), path.name == "__init__.py")
    ]
    assert not problems, (
        "the packages import downward only (FLOORS in "
        "tests/unit/test_import_contract.py): move the code to the floor "
        "its callers are on, or pass what it needs in:\n" + "\n".join(problems)
    )


def test_no_import_closes_a_cycle():
    graph = {
        name: internal_imports(name, path.read_text(), path.name == "__init__.py")
        for name, path in package_modules().items()
    }
    problems = cycle_violations(graph)
    assert not problems, (
        "modules import each other; a function-local import only "
        "hides it. Move what both need below both:\n" + "\n".join(problems)
    )


def test_floors_name_real_areas():
    missing = [
        area
        for area in FLOOR_OF
        if not (PACKAGE / area.replace(".", "/")).with_suffix(".py").is_file()
        and not (PACKAGE / area.replace(".", "/") / "__init__.py").is_file()
    ]
    assert not missing, missing


@pytest.mark.parametrize(
    "name, source, expected",
    [
        (
            "node_agent.placement.client",
            "from node_agent.config.options import PLACEMENT_GROUP\n",
            "node_agent.placement.client:1 imports node_agent.config.options: placement (floor 5) "
            "imports config (floor 6), upward",
        ),
        # Function-local imports count.
        (
            "node_agent.config.files",
            "def f():\n    from node_agent.cycle import desired\n",
            "node_agent.config.files:2 imports node_agent.cycle.desired in a function: config "
            "(floor 6) imports cycle (floor 7), upward",
        ),
        (
            "node_agent.policy.drift",
            "from ..placement.planner import Change\n",
            "imports node_agent.placement.planner: policy (floor 3) imports placement (floor 5), "
            "upward",
        ),
        (
            "node_agent.placement.sync",
            "from node_agent.host import machine_id\n",
            "imports node_agent.host.machine_id: placement and host share floor 5, and neither "
            "imports the other",
        ),
        (
            "node_agent.remote.wire",
            "import node_agent.service.loop\n",
            "remote (floor 8) imports service (floor 10), upward",
        ),
        (
            "node_agent.example",
            "import os\n",
            "node_agent.example has no floor: add its area to FLOORS",
        ),
    ],
)
def test_floors_flag_an_upward_or_sideways_import(name, source, expected):
    (problem,) = floor_violations(name, source)
    assert problem.endswith(expected), problem


def test_floors_allow_downward_own_area_and_type_checking_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from node_agent.policy.partition import partition_cpus\n"
        "from node_agent.errors import ConfigError\n"
        "from node_agent import __version__\n"
        "from . import numa\n"
        "def f():\n    from node_agent.model import cpuset\n"
        "if TYPE_CHECKING:\n    from node_agent.cycle.desired import Desired\n"
    )
    assert floor_violations("node_agent.tree.build", source) == []
    assert (
        floor_violations(
            "node_agent.cli.main", "from node_agent.service.loop import systemd_notifier\n"
        )
        == []
    )


def test_a_function_local_import_that_closes_a_cycle_is_named():
    graph = {
        "node_agent.logs": [(112, "node_agent.config.files", True)],
        "node_agent.config.files": [(28, "node_agent.config.options", False)],
        "node_agent.config.options": [(504, "node_agent.logs", True)],
        "node_agent.model.cpuset": [(18, "node_agent.errors", False)],
    }
    problems = cycle_violations(graph)
    assert len(problems) == 3, problems
    assert (
        "node_agent.logs:112 a function-local import of node_agent.config.files closes "
        "the cycle node_agent.logs -> node_agent.config.files -> "
        "node_agent.config.options -> node_agent.logs"
    ) in problems
    assert cycle_violations({k: v for k, v in graph.items() if k != "node_agent.logs"}) == []
