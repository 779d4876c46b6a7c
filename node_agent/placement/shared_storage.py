"""The sharing provider of a shared ``instances_path`` in Placement (the
gateway of :mod:`node_agent.policy.shared_storage`).

:func:`ensure_sharing_provider` makes Placement hold the sharing provider
with the trait ``MISC_SHARES_VIA_AGGREGATE``, in the aggregate, and with
the filesystem's DISK_GB. Every host of the aggregate calls it each time its
reshape check runs; they write the same provider (its uuid comes from the
aggregate's), each write with the generation it read, so a race between
two hosts ends with both seeing one provider: a 409 on create means
another host made it first (it is read), a 409 on a PUT means another host
wrote in between (read again, merged, sent again).
"""

from __future__ import annotations

import logging
from typing import Callable

from node_agent.errors import ReshapeError
from node_agent.model.provider_tree import Provider
from node_agent.placement.errors import DuplicateName, GenerationConflict, NotFound, PlacementError
from node_agent.policy import shared_storage as policy
from node_agent.policy.capacity import shared_disk_problems

LOG = logging.getLogger(__name__)

ATTEMPTS = 5


def ensure_sharing_provider(client, wanted: Provider, tree_classes, filesystem_gb: int) -> dict:
    """Create or update the sharing provider ``wanted``
    (:func:`node_agent.policy.shared_storage.sharing_provider`): the two
    steps below; returns its inventories as Placement holds them after."""
    join_sharing_provider(client, wanted, tree_classes, filesystem_gb)
    return write_disk(client, wanted)


def join_sharing_provider(client, wanted: Provider, tree_classes, filesystem_gb: int) -> dict:
    """Create the sharing provider if no host did yet, with its trait and
    aggregate, and return the inventories it holds: this host's DISK_GB is
    not written yet (the reshape that moves the root's allocations writes
    it in the same request, or :func:`write_disk` after it), so a refused
    reshape leaves a new sharing provider offering nothing while the root
    still does.

    Raises ReshapeError, before any write, when the capacity invariant
    (:func:`~node_agent.policy.capacity.shared_disk_problems`) does not hold;
    PlacementError when the provider's name belongs to another uuid (a
    provider an operator made by hand) or when other writers keep moving
    its generation for ``ATTEMPTS`` tries."""
    uuid = str(wanted.uuid)
    disk = wanted.inventories[policy.DISK_GB]
    problems = shared_disk_problems(tree_classes, disk.total, filesystem_gb)
    if problems:
        raise ReshapeError("shared storage not published: " + "; ".join(problems))
    _create(client, wanted)
    _retry(lambda: _join(client, uuid, wanted.traits, wanted.aggregates))
    return client.inventories(uuid)["inventories"]


def write_disk(client, wanted: Provider) -> dict:
    """Write this host's DISK_GB record on the sharing provider, merged with
    the one Placement holds (:func:`~node_agent.policy.shared_storage.record_to_write`:
    the smaller total wins); no write when they agree. Returns the
    inventories Placement holds after."""
    disk = wanted.inventories[policy.DISK_GB]
    return _retry(lambda: _inventory(client, str(wanted.uuid), disk.as_placement()))


def _create(client, wanted: Provider) -> None:
    try:
        client.provider(str(wanted.uuid))
        return
    except NotFound:
        pass
    try:
        client.create_provider({"name": wanted.name, "uuid": wanted.uuid})
        LOG.info("shared storage: created sharing provider %s (%s)", wanted.name, wanted.uuid)
    except DuplicateName:
        # Another host of the aggregate created it first: the same uuid.
        try:
            client.provider(str(wanted.uuid))
            LOG.info("shared storage: %s was created by another host first", wanted.name)
        except NotFound:
            raise PlacementError(
                f"shared storage: a provider named {wanted.name} exists with another "
                f"uuid than {wanted.uuid}, the one node-agent derives from the "
                "aggregate; delete or rename it (`openstack resource provider delete`)"
            ) from None


def _retry(write: Callable[[], dict]) -> dict:
    for _ in range(ATTEMPTS - 1):
        try:
            return write()
        except GenerationConflict:
            continue  # another host wrote in between: read again
    return write()


def _join(client, uuid: str, traits, aggregates) -> dict:
    held = client.traits(uuid)
    want = set(held["traits"]) | {t for t, on in traits.items() if on}
    generation = held["resource_provider_generation"]
    if want != set(held["traits"]):
        generation = client.put_traits(
            uuid, {"resource_provider_generation": generation, "traits": sorted(want)}
        )["resource_provider_generation"]
    groups = client.aggregates(uuid)
    joined = set(groups["aggregates"]) | set(aggregates)
    if joined == set(groups["aggregates"]):
        return groups
    return client.put_aggregates(
        uuid,
        {
            "resource_provider_generation": groups["resource_provider_generation"],
            "aggregates": sorted(joined),
        },
    )


def _inventory(client, uuid: str, measured: dict) -> dict:
    held = client.inventories(uuid)
    current = held["inventories"].get(policy.DISK_GB)
    record = policy.record_to_write(measured, current)
    if current is not None and all(current.get(k) == v for k, v in record.items()):
        return held["inventories"]
    if current is not None and record["total"] < measured["total"]:
        LOG.info(
            "shared storage: this host measures %d GiB, Placement holds %d: the smaller is kept",
            measured["total"],
            record["total"],
        )
    result = client.put_inventories(
        uuid,
        {
            "resource_provider_generation": held["resource_provider_generation"],
            "inventories": {**held["inventories"], policy.DISK_GB: record},
        },
    )
    return result["inventories"]
