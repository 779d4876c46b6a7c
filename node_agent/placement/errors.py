"""What Placement answered, as exceptions: one class per case a caller acts on.

Pure (no HTTP here), so the planner, the reshape engine's callers and the wire
format can name them without loading the HTTP gateway. The gateway
(:mod:`node_agent.placement.client`) raises them and re-exports them.
"""

from __future__ import annotations

from node_agent import errors


class PlacementError(errors.PlacementError):
    """Placement refused a request or could not be reached."""

    def __init__(self, message: str, *, status: int | None = None,
                 code: str | None = None, detail: str = "", method: str = "",
                 path: str = "", request_id: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.detail = detail
        self.method = method
        self.path = path
        self.request_id = request_id


class GenerationConflict(PlacementError):
    """409 placement.concurrent_update: provider or consumer generation."""


class InventoryInUse(PlacementError):
    """409 placement.inventory.inuse."""


class DuplicateName(PlacementError):
    """409 placement.duplicate_name."""


class NotFound(PlacementError):
    """404."""


class AuthError(PlacementError):
    """401 or 403: bad credentials or a policy that refuses this user."""


class Unavailable(PlacementError):
    """No usable answer after the bounded retries."""
