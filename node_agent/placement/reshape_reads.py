"""The reshape's reads: the providers' view, the consumers, the
inventories, and the plan computed from them. Reads only; what moves where
is decided by :mod:`node_agent.placement.reshape_engine` and
:mod:`node_agent.placement.reshape_rules`, and the POST is
:mod:`node_agent.placement.reshaper`'s.

Only the providers the rule works on are read: for S source providers (the
root, plus the NUMA children on a host that reports them), T target
providers allocations actually move to that are not sources, and N
consumers to move: S + T ``GET /resource_providers/{uuid}/allocations``
(generation and every consumer's share), N ``GET /allocations/{consumer}``
(whole allocations with consumer generation, several at a time:
:mod:`node_agent.placement.read_pace`). After a 409, a retry reads the
S + T views again and only the consumers they show changed
(:func:`compute_plan` with the :class:`Reads` of the earlier attempts).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Optional

from node_agent.errors import ReshapeError
from node_agent.model.provider_tree import ProviderTree
from node_agent.model.snapshot import Guest
from node_agent.placement.errors import NotFound, Unavailable
from node_agent.placement.read_pace import ReadPace
from node_agent.placement.reshape_engine import (
    Consumer,
    ProviderAllocations,
    Reshape,
    Rule,
    affected_consumers,
    compute_reshape,
    move_targets,
    rule_sources,
    stale_consumers,
)
from node_agent.placement.reshape_rules import guest_names

# uuid -> (generation, inventories): what the caller knows Placement holds
# (the syncer's cache), each provider's inventories as read at that generation.
KnownInventories = Mapping[str, tuple[int, Mapping[str, dict]]]

# Rounds of "view, changed consumers, view again" before a retry's POST.
SETTLE_ROUNDS = 3


def resolve_uuids(
    client,
    tree: ProviderTree,
    known: Optional[Mapping[str, str]] = None,
    names: Optional[Iterable[str]] = None,
) -> ProviderTree:
    """``tree`` with uuids: from the tree itself, then ``known`` (name ->
    uuid, e.g. the state file's), then Placement by name (one GET each).
    Only ``names`` (default: every provider) are resolved. Providers
    Placement does not have keep uuid None."""
    known = dict(known or {})
    wanted = None if names is None else set(names)
    uuids = {}
    for provider in tree.providers:
        if wanted is not None and provider.name not in wanted:
            continue
        uuid = provider.uuid or known.get(provider.name)
        if uuid is None:
            listed = client.providers_named(provider.name)
            uuid = listed[0]["uuid"] if listed else None
        if uuid is not None:
            uuids[provider.name] = uuid
    return tree.with_uuids(uuids)


def read_allocations(client, uuids: Iterable[str]) -> dict[str, ProviderAllocations]:
    """Each provider's generation and consumers; ones Placement lacks are left out."""
    found = {}
    for uuid in uuids:
        try:
            body = client.provider_allocations(uuid)
        except NotFound:
            continue
        found[uuid] = ProviderAllocations.from_placement(uuid, body)
    return found


def _overloads(client) -> int:
    """Answers so far that say Placement is past what it sustains: 5xx, or
    none at all (a timeout), retries included."""
    return sum(
        n for (_method, status), n in client.stats.by_status.items() if status == 0 or status >= 500
    )


def read_consumers(
    client, uuids: Iterable[str], pace: Optional[ReadPace] = None
) -> dict[str, Consumer]:
    """One GET per consumer, several at a time: the count stays N, the wait
    shrinks. How many at once adapts to what Placement sustains
    (:class:`~node_agent.placement.read_pace.ReadPace`, carried between the
    calls of one reshape)."""
    uuids = list(uuids)
    pace = pace or ReadPace()

    def one(uuid: str) -> Consumer:
        return Consumer.from_placement(uuid, client.consumer_allocations(uuid))

    if len(uuids) < 2:
        return {uuid: one(uuid) for uuid in uuids}
    gate = threading.Condition()
    in_flight = 0
    # The first read Placement did not answer (refused after the client's
    # retries, or a timeout): the reads not yet sent are not sent. Each would
    # wait the whole [placement] timeout against a dead or frozen Placement:
    # 116 reads cost 578.8 s at timeout = 5 (issue 28).
    failed: list[Unavailable] = []

    def paced(uuid: str) -> Consumer:
        nonlocal in_flight
        with gate:
            gate.wait_for(lambda: failed or in_flight < pace.limit)
            if failed:
                raise failed[0]
            in_flight += 1
            overloads = _overloads(client)
        start = time.monotonic()
        try:
            consumer = one(uuid)
        except Unavailable as exc:
            with gate:
                pace.overloaded()
                failed.append(exc)
            raise
        finally:
            with gate:
                in_flight -= 1
                gate.notify_all()
        with gate:
            if _overloads(client) > overloads:  # the client retried a 5xx or a timeout
                pace.overloaded()
            else:
                pace.answered(time.monotonic() - start)
        return consumer

    pool = ThreadPoolExecutor(max_workers=min(pace.ceiling, len(uuids)))
    try:
        return dict(zip(uuids, pool.map(paced, uuids)))
    finally:
        # On a failure, drop the queued reads instead of draining them; the
        # ones in flight end within their timeout.
        pool.shutdown(wait=True, cancel_futures=True)


def read_inventories(client, uuids: Iterable[str]) -> dict[str, dict]:
    """Current inventories of the providers Placement has."""
    found = {}
    for uuid in uuids:
        try:
            found[uuid] = client.inventories(uuid)["inventories"]
        except NotFound:
            continue
    return found


@dataclass
class Reads:
    """What one reshape read, kept across its attempts."""

    view: dict[str, ProviderAllocations] = field(default_factory=dict)
    new: frozenset[str] = frozenset()
    consumers: dict[str, Consumer] = field(default_factory=dict)
    pace: ReadPace = field(default_factory=ReadPace)
    consumer_conflict: bool = False  # the last 409 named a consumer generation
    inventories: dict[str, tuple[int, Mapping[str, dict]]] = field(default_factory=dict)


def _generations(view: Mapping[str, ProviderAllocations]) -> dict[str, int]:
    return {uuid: state.generation for uuid, state in view.items()}


def _read_view(
    client, tree: ProviderTree, rule: Rule, absent: set[str]
) -> tuple[dict[str, ProviderAllocations], frozenset[str]]:
    """The sources' allocations, then the targets moves go to (their
    generations and every consumer's share); the targets Placement does not
    have are in the view as empty providers of generation 0 (what a new one
    has) and returned apart."""
    providers = read_allocations(client, [u for u in rule_sources(rule, tree) if u not in absent])
    if not providers:
        return {}, frozenset()
    targets = move_targets(providers, rule) - set(providers)
    providers.update(read_allocations(client, sorted(targets - absent)))
    new = frozenset(targets - set(providers))
    return {**providers, **{uuid: ProviderAllocations(uuid, 0) for uuid in new}}, new


def _held_inventories(
    client,
    view: Mapping[str, ProviderAllocations],
    new: frozenset[str],
    known: Optional[KnownInventories],
    reads: Reads,
) -> dict[str, dict]:
    """Each viewed provider's inventories as Placement holds them: what
    ``known`` or an earlier attempt read at the view's generation, else one
    GET. The body replaces the whole inventory, so what it keeps (nova keeps
    a ratio an operator set in Placement) must be current: a ratio from
    before the provider's generation moved would be overwritten."""
    held = {}
    for uuid, state in view.items():
        if uuid in new:
            continue
        at = next(
            (
                c
                for c in (reads.inventories.get(uuid), (known or {}).get(uuid))
                if c is not None and c[0] == state.generation
            ),
            None,
        )
        if at is None:
            try:
                body = client.inventories(uuid)
            except NotFound:
                continue
            at = (body["resource_provider_generation"], body["inventories"])
            reads.inventories[uuid] = at
        held[uuid] = dict(at[1])
    return held


def _keeps_held_ratio(tree: ProviderTree, view: Mapping[str, ProviderAllocations]) -> bool:
    """Whether the body keeps a ratio Placement holds (no explicit ratio in
    the config) on a provider it writes; with explicit ratios the tree alone
    gives every record."""
    return any(
        inv.keep_placement_ratio
        for p in tree.providers
        if p.uuid in view
        for inv in p.inventories.values()
    )


def compute_plan(
    client,
    tree: ProviderTree,
    rule: Rule,
    names: Mapping[str, str],
    absent: Iterable[str] = (),
    reads: Optional[Reads] = None,
    conflict: bool = False,
    known: Optional[KnownInventories] = None,
) -> tuple[Reshape, frozenset[str]]:
    """Read what the plan depends on and compute it (reads only). Also
    returns the targets moves go to that Placement does not have.

    With ``reads`` from an earlier computation, the consumers whose records
    still match the new view are not read again. After a 409
    (``conflict``) the view (the generations) is also read last: after the
    changed consumers, again, until it holds still (at most
    :data:`SETTLE_ROUNDS` rounds)."""
    absent = set(absent)
    retry = conflict
    reads = reads if reads is not None else Reads()
    view, new = _read_view(client, tree, rule, absent)
    if not view:
        return compute_reshape({}, {}, tree, rule, consumer_names=names), frozenset()
    rounds = 0
    while True:
        by_consumer = _by_consumer(view)
        probed: list[str] = getattr(rule, "migration_candidates", lambda _: [])(by_consumer)
        wanted = sorted(set(affected_consumers(view, rule)) | set(probed))
        stale = stale_consumers(view, reads.consumers, wanted)
        if (
            retry
            and rounds == 0
            and not stale
            and (reads.consumer_conflict or _generations(view) == _generations(reads.view))
        ):
            # A consumer changed where the view does not show it (on another
            # provider, or rewritten as it was): read them all.
            stale = set(wanted)
        if stale:
            reads.consumers.update(read_consumers(client, sorted(stale), reads.pace))
        rounds += 1
        if not (retry and stale) or rounds >= SETTLE_ROUNDS:
            break
        view, new = _read_view(client, tree, rule, absent)  # the generations, last
    reads.view, reads.new = view, new
    if probed:  # a dedicated guest's migration record moves with it
        # getattr: the Rule type is a plain callable; a rule that probed has the method.
        rule = getattr(rule, "with_migrations")(  # noqa: B009
            {c: reads.consumers[c] for c in probed if c in reads.consumers},
            by_consumer,
        )
        names = {**getattr(rule, "migration_names", dict)(), **names}
    consumers = {
        c: reads.consumers[c] for c in affected_consumers(view, rule) if c in reads.consumers
    }
    plan = compute_reshape(view, consumers, tree, rule, consumer_names=names)
    if plan.missing_inventories or (plan.body is not None and _keeps_held_ratio(tree, view)):
        current = _held_inventories(client, view, new, known, reads)
        plan = compute_reshape(
            view, consumers, tree, rule, current_inventories=current, consumer_names=names
        )
    return plan, new


def _by_consumer(view: Mapping[str, ProviderAllocations]) -> dict[str, dict[str, int]]:
    """consumer -> class -> what it holds on the view's providers."""
    found: dict[str, dict[str, int]] = {}
    for state in view.values():
        for consumer, resources in state.consumers.items():
            held = found.setdefault(consumer, {})
            for rc, amount in resources.items():
                held[rc] = held.get(rc, 0) + int(amount)
    return found


def uuid_of_root(tree: ProviderTree) -> str:
    """The root's uuid, which every reshape needs; ValueError without one."""
    if not tree.root.uuid:
        raise ValueError("the desired tree needs uuids (see resolve_uuids)")
    return tree.root.uuid


def plan_reshape(
    client,
    tree: ProviderTree,
    guests: Iterable[Guest],
    rule: Rule,
    absent: Iterable[str] = (),
    known: Optional[KnownInventories] = None,
) -> Reshape:
    """The reshape a cycle would send now, for ``--dry-run``. Reads only;
    refusals are in the result, not raised. ``absent``: uuids of providers
    of ``tree`` that Placement does not have yet (not read); ``known`` as
    for :func:`ensure_reshaped`."""
    uuid_of_root(tree)
    try:
        plan, new = compute_plan(client, tree, rule, guest_names(guests), absent, known=known)
    except ValueError as exc:
        raise ReshapeError(f"cannot plan the reshape: {exc}") from exc
    if not new:
        return plan
    shown = {
        uuid: f"{name} (to be created)" if uuid in new else name
        for uuid, name in plan.provider_names.items()
    }
    return replace(plan, provider_names=shown)
