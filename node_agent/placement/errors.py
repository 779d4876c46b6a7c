"""What Placement answered, as exceptions: one class per case a caller acts on.

Pure (no HTTP here), so the planner, the reshape engine's callers and the wire
format can name them without loading the HTTP gateway. The gateway
(:mod:`node_agent.placement.client`) raises them and re-exports them.
"""

from __future__ import annotations

from node_agent import errors


class PlacementError(errors.PlacementError):
    """Placement refused a request or could not be reached."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        detail: str = "",
        method: str = "",
        path: str = "",
        request_id: str | None = None,
    ):
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


class BadAnswer(PlacementError):
    """A success status whose body is not what Placement sends: not JSON,
    empty where a read needs a body, or without the fields asked for (a
    proxy's HTML login page, another service at the endpoint). The message
    names the request and shows the start of what came back."""


SHOWN_CHARS = 200  # how much of an unexpected body a message shows


def shown(text: str) -> str:
    """The start of an unexpected body for a message: one line, at most
    :data:`SHOWN_CHARS` characters (the request's headers, where the token
    is, are never shown)."""
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= SHOWN_CHARS else flat[:SHOWN_CHARS] + "...")


_CONFLICTS: dict[str, type[PlacementError]] = {
    "placement.concurrent_update": GenerationConflict,
    "placement.inventory.inuse": InventoryInUse,
    "placement.duplicate_name": DuplicateName,
}


def error_for(
    status: int, code: str | None, detail: str, method: str, path: str, request_id: str | None
) -> PlacementError:
    """The typed error for a refused request: by status, and for a 409 by
    Placement's error code."""
    cls: type[PlacementError]
    if status in (401, 403):
        cls = AuthError
    elif status == 404:
        cls = NotFound
    elif status == 409:
        cls = _CONFLICTS.get(code, PlacementError) if code else PlacementError
    elif status >= 500:
        cls = Unavailable
    else:
        cls = PlacementError
    message = f"{method} {path} -> {status}"
    if code and code != "placement.undefined_code":
        message += f" {code}"
    if detail:
        message += f": {detail}"
    return cls(
        message,
        status=status,
        code=code,
        detail=detail,
        method=method,
        path=path,
        request_id=request_id,
    )
