"""A Placement gateway that can only read: what companion mode is given.

Companion mode (``[agent] mode = companion``) runs beside another writer of
the host's provider, nova-compute above all. Its promise, no write request
ever, is kept by construction rather than by care: the companion cycle and
everything it calls (the audit's reads, the reshape planner) receive this
object, which has no way to send PUT, POST or DELETE. A code path that
tries raises :class:`WriteRefused` before anything leaves the process.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

from node_agent.errors import NodeAgentError
from node_agent.placement.client import PlacementReads


class WriteRefused(NodeAgentError):
    """A write was attempted through the read-only gateway: a bug in the
    companion path, never an operator's mistake. Nothing was sent."""

    exit_code = 70  # EX_SOFTWARE


class ReadOnlyPlacement(PlacementReads):
    """Wraps a :class:`~node_agent.placement.client.PlacementClient` and
    forwards reads only. It shares the client's request counters, so the
    metrics and the benchmarks count companion reads as any others."""

    def __init__(self, client):
        # Only the reads are kept, not the client: no attribute of this
        # object leads to a write method.
        self._get = client.get
        self._check_version = client.check_version
        self._attribute = lambda name: getattr(client, name)
        self.stats = client.stats
        self._view: Optional[dict] = None

    @property
    def endpoint(self) -> str:
        return self._attribute("endpoint")

    @property
    def server_max(self):
        return self._attribute("server_max")

    def check_version(self) -> str:
        return self._check_version()

    def get(self, path: str, microversion=None) -> dict:
        if self._view is None:
            return self._get(path, microversion=microversion)
        key = (path, microversion)
        if key not in self._view:
            self._view[key] = self._get(path, microversion=microversion)
        return self._view[key]

    @contextmanager
    def one_view(self) -> Iterator[None]:
        """Within the block the same read is sent once: the audit and the
        reshape preview of one verify read a provider's allocations once,
        and see the same answer (nothing acts on it in between)."""
        self._view = {}
        try:
            yield
        finally:
            self._view = None

    def _refuse(self, method: str, path: str):
        raise WriteRefused(
            f"{method} {path} refused: companion mode never writes to Placement "
            "(a bug: please report it with this message). Nothing was sent."
        )

    def put(self, path: str, body=None):
        self._refuse("PUT", path)

    def post(self, path: str, body=None):
        self._refuse("POST", path)

    def delete(self, path: str):
        self._refuse("DELETE", path)
