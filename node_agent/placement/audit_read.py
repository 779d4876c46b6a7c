"""The allocation audit's reads (thin): one ``GET
/resource_providers/{uuid}/allocations`` per provider that can hold
allocations, then ``GET /allocations/{consumer}`` for the few consumers the
audit cannot judge from those alone (:func:`node_agent.policy.audit.to_look_up`).

Reads only; the audit never writes an allocation.
"""

from __future__ import annotations

from typing import Iterable, Optional

from node_agent.placement import microversions
from node_agent.placement.errors import NotFound


def read_provider_allocations(client, providers: Iterable[str]) -> dict[str, dict]:
    """provider uuid -> Placement's body. A provider deleted meanwhile
    (404) holds nothing and is left out."""
    found = {}
    for uuid in providers:
        try:
            found[uuid] = client.provider_allocations(uuid)
        except NotFound:
            continue
    return found


def consumer_type_version(server_max: Optional[str]) -> Optional[str]:
    """The microversion to read a consumer at: 1.38 (which names its type)
    when the server offers it, else the client's own (type unknown)."""
    wanted = microversions.CONSUMER_TYPE_READ
    if server_max and microversions.at_least(server_max, wanted):
        return wanted
    return None


def read_consumers(client, consumers: Iterable[str]) -> dict[str, dict]:
    """consumer -> body of ``GET /allocations/{consumer}`` (allocations by
    provider, and ``consumer_type`` when the server has 1.38)."""
    version = consumer_type_version(getattr(client, "server_max", None))
    return {c: client.consumer_allocations(c, microversion=version) for c in consumers}
