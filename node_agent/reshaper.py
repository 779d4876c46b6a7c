"""The reshape shell: read Placement, ask the engine, send one POST /reshaper.

Whether a reshape is needed is decided from what Placement shows (for
example pinned consumers still holding VCPU), never from a local file, so a
restart or a lost state directory cannot reshape twice.

Requests for a tree of P existing providers and N consumers to move:
P ``GET /resource_providers/{uuid}/allocations`` (generation and every
consumer's share), N ``GET /allocations/{consumer}`` (whole allocations
with consumer generation), one ``POST /reshaper``: N + 2 for a flat host.

Call :func:`ensure_reshaped` before the tree sync of a cycle, so the sync
sees a tree that is already reshaped.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional
from urllib.parse import quote

import tenacity

from node_agent.errors import ReshapeError
from node_agent.placement import GenerationConflict, InventoryInUse, NotFound
from node_agent.provider_tree import ProviderTree
from node_agent.reshape import (Consumer, ProviderAllocations, Reshape, Rule,
                                affected_consumers, compute_reshape, guest_names,
                                pinned_to_pcpu)
from node_agent.topology import Guest

LOG = logging.getLogger(__name__)

# A 409 means the scheduler (or someone) wrote meanwhile; each attempt
# re-reads everything the plan depends on. Four in a row is a storm.
ATTEMPTS = 4
READ_WORKERS = 8


@dataclass
class ReshapeOutcome:
    """What :func:`ensure_reshaped` did. ``reshape`` is the last plan."""

    reshaped: bool
    reshape: Reshape
    attempts: int = 1
    requests: int = 0
    request_id: Optional[str] = None
    warnings: list[str] = field(default_factory=list)

    @property
    def consumers_moved(self) -> int:
        return len(self.reshape.moved_consumers) if self.reshaped else 0


def resolve_uuids(client, tree: ProviderTree,
                  known: Optional[Mapping[str, str]] = None) -> ProviderTree:
    """``tree`` with uuids: from the tree itself, then ``known`` (name ->
    uuid, e.g. the state file's), then Placement by name (one GET each).
    Providers Placement does not have keep uuid None."""
    known = dict(known or {})
    uuids = {}
    for provider in tree.providers:
        uuid = provider.uuid or known.get(provider.name)
        if uuid is None:
            found = client.get(f"/resource_providers?name={quote(provider.name)}")
            listed = found["resource_providers"]
            uuid = listed[0]["uuid"] if listed else None
        if uuid is not None:
            uuids[provider.name] = uuid
    return tree.with_uuids(uuids)


def read_providers(client, tree: ProviderTree) -> dict[str, ProviderAllocations]:
    """Each existing provider of ``tree``: generation and consumers."""
    found = {}
    for provider in tree.providers:
        if not provider.uuid:
            continue
        try:
            body = client.get(f"/resource_providers/{provider.uuid}/allocations")
        except NotFound:
            continue
        found[provider.uuid] = ProviderAllocations.from_placement(provider.uuid, body)
    return found


def read_consumers(client, uuids: Iterable[str],
                   workers: int = READ_WORKERS) -> dict[str, Consumer]:
    """One GET per consumer, a few at a time: the count stays N, the wait
    shrinks (Placement answers reads concurrently)."""
    uuids = list(uuids)

    def one(uuid: str) -> Consumer:
        return Consumer.from_placement(uuid, client.get(f"/allocations/{uuid}"))

    if len(uuids) < 2 or workers < 2:
        return {uuid: one(uuid) for uuid in uuids}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(uuids, pool.map(one, uuids)))


def read_inventories(client, uuids: Iterable[str]) -> dict[str, dict]:
    return {uuid: client.get(f"/resource_providers/{uuid}/inventories")["inventories"]
            for uuid in uuids}


def _compute(client, tree: ProviderTree, rule: Rule, names: Mapping[str, str]) -> Reshape:
    """Read what the plan depends on and compute it (reads only)."""
    providers = read_providers(client, tree)
    if not providers:
        return compute_reshape({}, {}, tree, rule, consumer_names=names)
    host = [p.uuid for p in tree.providers if p.uuid]
    consumers = read_consumers(client, affected_consumers(providers, rule, host))
    plan = compute_reshape(providers, consumers, tree, rule, consumer_names=names)
    if plan.missing_inventories:
        current = read_inventories(client, sorted(plan.missing_inventories))
        plan = compute_reshape(providers, consumers, tree, rule,
                               current_inventories=current, consumer_names=names)
    return plan


def _with_uuids_or_fail(tree: ProviderTree) -> ProviderTree:
    if not tree.root.uuid:
        raise ValueError("the desired tree needs uuids (see resolve_uuids)")
    return tree


def plan_reshape(client, tree: ProviderTree, guests: Iterable[Guest], rule: Rule) -> Reshape:
    """The reshape a cycle would send now, for ``--dry-run``. Reads only;
    refusals are in the result, not raised."""
    _with_uuids_or_fail(tree)
    try:
        return _compute(client, tree, rule, guest_names(guests))
    except ValueError as exc:
        raise ReshapeError(f"cannot plan the reshape: {exc}") from exc


def _create_missing(client, tree: ProviderTree, existing: Iterable[str]) -> None:
    """The reshaper moves allocations only between existing providers;
    create new children (empty) first. The tree sync adopts them by name."""
    existing = set(existing)
    for provider in tree.providers:
        if provider.uuid in existing:
            continue
        body = {"name": provider.name, "uuid": provider.uuid}
        if provider.parent is not None:
            body["parent_provider_uuid"] = tree.by_name(provider.parent).uuid
        client.post("/resource_providers", body)


def ensure_reshaped(client, tree: ProviderTree, guests: Iterable[Guest], rule: Rule, *,
                    attempts: int = ATTEMPTS,
                    before_post: Optional[Callable[[dict], None]] = None) -> ReshapeOutcome:
    """Make Placement's allocations fit ``tree`` under ``rule``, atomically.

    Reads the host's providers and the consumers the rule moves, and sends
    one ``POST /reshaper`` if anything moves. On 409 (a provider or consumer
    generation moved, or inventory became in use) everything is read again
    and the plan recomputed: a stale plan is never sent. ``before_post``
    is called with the body just before it is sent (tests use it to race).

    Raises ReshapeError (before any write) when the rule refuses (a pinned
    guest outside cpu_dedicated_set, fewer PCPU than pinned vCPUs in use),
    or when the conflicts do not stop after ``attempts`` tries.
    Placement being unreachable raises the client's ``Unavailable``.
    """
    _with_uuids_or_fail(tree)
    names = guest_names(guests)
    start = client.stats.total
    outcome = ReshapeOutcome(False, Reshape(None))
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(max(1, attempts)),
        retry=tenacity.retry_if_exception_type((GenerationConflict, InventoryInUse)),
        wait=tenacity.wait_random(0, 0.05),
        reraise=True)
    try:
        for attempt in retrying:
            with attempt:
                outcome.attempts = attempt.retry_state.attempt_number
                outcome.reshape = plan = _plan_for_post(client, tree, rule, names)
                if plan.needed:
                    if before_post is not None:
                        before_post(plan.body)
                    client.post("/reshaper", plan.body)
                    outcome.reshaped = True
                    outcome.request_id = client.last_request_id
    except (GenerationConflict, InventoryInUse) as exc:
        raise ReshapeError(
            f"reshape abandoned after {outcome.attempts} attempts: Placement kept "
            f"changing under it ({exc}); the next cycle tries again") from exc
    finally:
        outcome.requests = client.stats.total - start
    outcome.warnings = list(outcome.reshape.warnings)
    for warning in outcome.warnings:
        LOG.warning("reshape: %s", warning)
    if outcome.reshaped:
        LOG.info("reshape: moved %d consumers (%s) in one POST /reshaper, "
                 "request id %s, %d requests, %d attempts",
                 outcome.consumers_moved, _totals_text(outcome.reshape),
                 outcome.request_id, outcome.requests, outcome.attempts)
    else:
        LOG.debug("reshape: nothing to move (%d requests)", outcome.requests)
    return outcome


def _plan_for_post(client, tree: ProviderTree, rule: Rule, names) -> Reshape:
    try:
        plan = _compute(client, tree, rule, names)
    except ValueError:
        # Something moves onto a provider that does not exist yet.
        _create_missing(client, tree, read_providers(client, tree))
        plan = _compute(client, tree, rule, names)
    if plan.refusals:
        raise ReshapeError("\n".join(["reshape refused; allocations in Placement "
                                      "were left as they are:", *plan.refusals]))
    return plan


def _totals_text(plan: Reshape) -> str:
    return ", ".join(f"{n} {what}" for what, n in plan.totals()["moved"].items())


# ---------------------------------------------------------------- VCPU -> PCPU

def _existing_only(tree: ProviderTree) -> ProviderTree:
    """Providers not in Placement yet hold no allocations and cannot be in a
    /reshaper body; the tree sync creates them afterwards."""
    return ProviderTree(tuple(p for p in tree.providers if p.uuid))


def _pcpu_inputs(client, desired, known_uuids):
    tree = _existing_only(resolve_uuids(client, desired.tree, known_uuids))
    if not tree.providers or tree.root.name != desired.tree.root.name:
        return None, None  # the root is not in Placement yet
    rule = pinned_to_pcpu(desired.host.guests, tree.root.uuid, desired.partition.dedicated)
    return tree, rule


def pcpu_reshape(client, desired, known_uuids: Optional[Mapping[str, str]] = None,
                 **kw) -> ReshapeOutcome:
    """:func:`ensure_reshaped` with the pinned-VCPU-to-PCPU rule for one
    cycle's ``Desired`` (``cycle.desired_from``). ``known_uuids``: name ->
    uuid (the state file's ``providers``); missing ones are looked up by
    name. A host whose root is not in Placement has nothing to reshape."""
    tree, rule = _pcpu_inputs(client, desired, known_uuids)
    if tree is None:
        return ReshapeOutcome(False, Reshape(None))
    return ensure_reshaped(client, tree, desired.host.guests, rule, **kw)


def plan_pcpu_reshape(client, desired,
                      known_uuids: Optional[Mapping[str, str]] = None) -> Reshape:
    """:func:`plan_reshape` for ``--dry-run``: reads only."""
    tree, rule = _pcpu_inputs(client, desired, known_uuids)
    if tree is None:
        return Reshape(None)
    return plan_reshape(client, tree, desired.host.guests, rule)
