"""Every Placement microversion node-agent relies on, and why.

The client sends one version on every request, the highest of this table
(``REQUIRED``), so all features below are available everywhere and
request/response shapes never change between calls. Sources: placement's
``rest_api_version_history.rst`` and ``placement/microversion.py``.
"""

from __future__ import annotations

# (version, what the agent needs from it), oldest first.
FEATURES: tuple[tuple[str, str], ...] = (
    (
        "1.14",
        "nested providers: parent_provider_uuid/root_provider_uuid, "
        "GET /resource_providers?in_tree= reads our whole tree at once",
    ),
    ("1.19", "provider aggregates carry and check resource_provider_generation"),
    (
        "1.20",
        "POST /resource_providers returns the new provider (uuid, "
        "generation) so no GET follows a create",
    ),
    (
        "1.23",
        "JSON errors carry a 'code' (placement.concurrent_update, "
        "placement.inventory.inuse, placement.duplicate_name) to tell "
        "409s apart",
    ),
    (
        "1.26",
        "inventory with reserved == total: a device in maintenance "
        "keeps its inventory but offers none of it",
    ),
    (
        "1.28",
        "consumer_generation in allocations: reshaper and allocation "
        "writes are refused if a consumer changed meanwhile",
    ),
    ("1.30", "POST /reshaper moves inventory and allocations atomically"),
    (
        "1.37",
        "PUT /resource_providers/{uuid} may change "
        "parent_provider_uuid: a child moves without delete+create",
    ),
    # Not 1.38 on purpose: from 1.38 every allocation written (PUT/POST
    # /allocations and /reshaper) must carry consumer_type matching
    # ^[A-Z0-9_]+$, yet consumers nova wrote without one read back as
    # 'unknown', which cannot be written. At 1.37 a reshape leaves each
    # consumer's type as it is, and the agent never creates allocations.
)


def parse(version: str) -> tuple[int, int]:
    """'1.38' -> (1, 38). Raises ValueError for anything else."""
    major, sep, minor = version.strip().partition(".")
    if not sep or not major.isdigit() or not minor.isdigit():
        raise ValueError(f"not a microversion: {version!r}")
    return int(major), int(minor)


def at_least(version: str, wanted: str) -> bool:
    """True if ``version`` is ``wanted`` or newer (numeric, so 1.9 < 1.10)."""
    return parse(version) >= parse(wanted)


def missing_features(server_max: str) -> list[tuple[str, str]]:
    """The table rows a server whose newest version is ``server_max`` lacks."""
    return [(v, why) for v, why in FEATURES if not at_least(server_max, v)]


REQUIRED: str = max((v for v, _ in FEATURES), key=parse)


# Read-only, per request: GET /allocations/{consumer} names the consumer's
# type (INSTANCE, MIGRATION) from 1.38. Only the audit asks for it, only
# when the server offers it; the note above on why writes stay at 1.37
# does not apply to a read. GET /resource_providers/{uuid}/allocations
# never shows consumer_type, at any version.
CONSUMER_TYPE_READ: str = "1.38"


def version_refusal(
    url: str, server_min: str, server_max: str, required: str = REQUIRED
) -> str | None:
    """Why a server offering ``server_min``..``server_max`` cannot serve the
    agent, or None if it can."""
    if not at_least(server_max, required):
        lacking = "; ".join(f"{v} {why}" for v, why in missing_features(server_max))
        return (
            f"Placement at {url} supports up to {server_max}; node-agent "
            f"needs {required}. Missing: {lacking}. Upgrade Placement "
            f"(Xena or newer)."
        )
    if not at_least(required, server_min):
        return (
            f"Placement at {url} supports {server_min} to {server_max}; "
            f"node-agent speaks {required}, which it no longer accepts. "
            f"Upgrade node-agent."
        )
    return None
