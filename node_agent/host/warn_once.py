"""Host warnings said once per process: a service runs for months, and a
host fact that warrants a warning (a refused read, a disagreement between
sysfs and libvirt) stays true every cycle."""

from __future__ import annotations

import logging

# Under discovery's name, as before the split: operators filter on it.
LOG = logging.getLogger("node_agent.host.discover")

_LOGGED: set[str] = set()


def log_once(warnings: list[str], level: int = logging.WARNING) -> None:
    """A service runs for months: say each host warning once, not each cycle."""
    for warning in warnings:
        if warning not in _LOGGED:
            _LOGGED.add(warning)
            LOG.log(level, "%s", warning)
