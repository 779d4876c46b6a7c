"""A deferred library is loaded by its first attribute read, into the same
module object, as a normal import would load it (node_agent/deferred_imports.py)."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from node_agent import deferred_imports


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package ``slowpkg`` whose ``__init__`` counts its runs and imports a
    submodule, the way netaddr's and stevedore's do."""
    root = tmp_path / "slowpkg"
    root.mkdir()
    (root / "__init__.py").write_text(
        "import builtins\n"
        "builtins.slowpkg_runs = getattr(builtins, 'slowpkg_runs', 0) + 1\n"
        "from slowpkg.parts import VALUE\n"
        "def value():\n    return VALUE\n"
    )
    (root / "parts.py").write_text("VALUE = 42\n")
    (root / "extra.py").write_text("from slowpkg import VALUE as FROM_PARENT\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins

    monkeypatch.setattr(builtins, "slowpkg_runs", 0, raising=False)
    yield "slowpkg"
    for name in [m for m in sys.modules if m == "slowpkg" or m.startswith("slowpkg.")]:
        del sys.modules[name]


def runs() -> int:
    import builtins

    return builtins.slowpkg_runs


def test_an_import_statement_alone_does_not_run_a_deferred_package(package):
    deferred_imports.defer(package)
    import slowpkg

    assert runs() == 0
    assert "slowpkg.parts" not in sys.modules
    assert slowpkg.__spec__.name == "slowpkg"  # what `import` reads, still not run
    assert runs() == 0


def test_the_first_attribute_read_runs_it_once_into_the_same_module(package):
    deferred_imports.defer(package)
    import slowpkg

    placeholder = slowpkg
    assert slowpkg.VALUE == 42
    assert slowpkg.value() == 42
    assert runs() == 1
    assert type(slowpkg) is types.ModuleType
    assert sys.modules["slowpkg"] is placeholder
    # Its functions see the module they were defined in: patching it works.
    slowpkg.VALUE = 7
    assert slowpkg.value() == 7


def test_from_import_and_a_submodule_first_run_the_package_first(package):
    deferred_imports.defer(package)
    import slowpkg.extra

    assert runs() == 1
    assert slowpkg.extra.FROM_PARENT == 42
    from slowpkg import parts

    assert parts.VALUE == 42 and runs() == 1


def test_a_library_already_imported_is_left_alone(package):
    import slowpkg

    deferred_imports.defer(package)
    assert sys.modules["slowpkg"] is slowpkg and type(slowpkg) is types.ModuleType


def test_an_unknown_name_is_skipped():
    deferred_imports.defer("no_such_library_here")
    assert "no_such_library_here" not in sys.modules


def test_a_package_that_fails_raises_its_own_error_and_is_not_kept(package, tmp_path):
    (tmp_path / "slowpkg" / "__init__.py").write_text("raise RuntimeError('broken library')\n")
    deferred_imports.defer(package)
    import slowpkg

    with pytest.raises(RuntimeError, match="broken library"):
        _ = slowpkg.anything
    assert "slowpkg" not in sys.modules


def test_a_missing_attribute_after_loading_is_an_attribute_error(package):
    deferred_imports.defer(package)
    import slowpkg

    with pytest.raises(AttributeError, match="no_such_name"):
        _ = slowpkg.no_such_name
    assert runs() == 1


def test_threads_reading_at_once_run_it_once_and_all_see_it_whole(package, tmp_path):
    (tmp_path / "slowpkg" / "parts.py").write_text("import time\ntime.sleep(0.2)\nVALUE = 42\n")
    deferred_imports.defer(package)
    import slowpkg

    seen = []
    threads = [threading.Thread(target=lambda: seen.append(slowpkg.value())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert seen == [42] * 8
    assert runs() == 1


def test_oslo_config_loads_with_its_uri_and_address_types_deferred_and_still_checks_them():
    """The types that use the deferred libraries still load them and check
    values (whether this process deferred them depends on its import order)."""
    from oslo_config import types as oslo_types

    assert oslo_types.URI()("http://placement:8778/") == "http://placement:8778/"
    with pytest.raises(ValueError):
        oslo_types.URI()("not a uri at all ::")
    assert oslo_types.IPAddress()("10.0.0.1") == "10.0.0.1"
    with pytest.raises(ValueError):
        oslo_types.IPAddress()("10.0.0.300")
