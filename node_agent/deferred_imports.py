"""Libraries oslo.config imports at once but node-agent rarely runs, loaded
on first use instead.

``oslo_config.types`` imports netaddr and rfc3986 for option types
node-agent's own options do not declare (IP addresses, URIs), and
``oslo_config.cfg`` imports stevedore for configuration-source drivers.
Together they were half of what ``import oslo_config.cfg`` costs (about
30 ms CPU, BENCHMARKS.md section 3) in every process, while a dry run or
``--check-config`` touches none of them. A process that does (keystoneauth's
plugins and oslo.messaging's drivers use stevedore) loads each the moment it
reads an attribute of it.

``importlib.util.LazyLoader`` cannot do this on Python 3.11: an ``import``
statement reads the module's ``__spec__`` and that alone runs the module.
Here the placeholder holds its spec, file and loader as plain attributes, and
only a missing attribute runs the module's code, in the placeholder itself,
as a normal import would.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from importlib.abc import Loader
from importlib.machinery import ModuleSpec

DEFERRED = ("netaddr", "rfc3986", "stevedore")

_LOCK = threading.RLock()
_RUNNING: set[str] = set()
_SPECS: dict[str, tuple[ModuleSpec, Loader]] = {}


class _Deferred(types.ModuleType):
    def __getattr__(self, attr: str):
        name = self.__name__
        with _LOCK:
            if type(self) is _Deferred:
                if name in _RUNNING:
                    # The module's own code reads a name it has not yet set:
                    # the error a normal import would give.
                    raise AttributeError(
                        f"partially initialized module {name!r} has no attribute {attr!r}"
                    )
                _load(self)
        return types.ModuleType.__getattribute__(self, attr)


def _load(module: types.ModuleType) -> None:
    name = module.__name__
    spec, loader = _SPECS[name]
    _RUNNING.add(name)
    try:
        if spec.submodule_search_locations is not None:
            module.__path__ = spec.submodule_search_locations
        loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        _RUNNING.discard(name)
    module.__class__ = types.ModuleType


def defer(*names: str) -> None:
    """Place a placeholder for each top-level module not yet imported."""
    with _LOCK:
        for name in names:
            if name in sys.modules:
                continue
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                continue
            module = importlib.util.module_from_spec(spec)
            # Without __path__, importing a submodule first reads it through
            # __getattr__ and so runs the package, as a normal import would.
            if spec.submodule_search_locations is not None:
                del module.__path__
            _SPECS[name] = (spec, spec.loader)
            module.__class__ = _Deferred
            sys.modules[name] = module
