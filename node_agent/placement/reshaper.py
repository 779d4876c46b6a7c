"""The reshape shell: read Placement, ask the engine, send one POST /reshaper.

Whether a reshape is needed is decided from what Placement shows (for
example pinned consumers still holding VCPU), never from a local file, so a
restart or a lost state directory cannot reshape twice.

Only the providers the rule works on are read (see
:mod:`node_agent.placement.reshape_engine`): for S source providers (the root, plus the NUMA
children on a host that reports them), T target providers allocations
actually move to that are not sources, and N consumers to move:
S + T ``GET /resource_providers/{uuid}/allocations`` (generation and every
consumer's share), N ``GET /allocations/{consumer}`` (whole allocations
with consumer generation, several at a time: :mod:`node_agent.placement.read_pace`),
one ``POST /reshaper``. VCPU -> PCPU on a host without NUMA children: N + 2,
whatever other children the host has. After a 409, a retry reads the S + T
views again and only the consumers they show changed.

On a busy host one POST of many consumers may never get through: Placement
checks the providers' generations again after processing the whole body
(0.5-1.8 s for 150 consumers measured on the embedded Placement on two
busy cores), and any write meanwhile refuses it. After such a refusal the
plan goes in stages (:func:`node_agent.placement.reshape_engine.stage`),
each atomic for its consumers, sized from the time the last POST took.
Every stage costs one more view read and one POST.
Children that allocations move to but Placement does not have yet are
created first (one POST each, and the plan is computed again).

Call :func:`host_reshape` (or :func:`ensure_reshaped` with a rule of your
own) before the tree sync of a cycle, so the sync sees a tree that is
already reshaped.

Why one module over 400 lines: the reads, the children created first and
the retry on 409 share one plan-send-replan loop; the pure decisions are in
:mod:`node_agent.placement.reshape_engine` and
:mod:`node_agent.placement.reshape_rules`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid as uuidlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Optional

from node_agent.errors import HostBusy, ReshapeError
from node_agent.placement.errors import (DuplicateName, GenerationConflict, InventoryInUse,
                                        NotFound, Unavailable)
from node_agent.placement.read_pace import ReadPace
from node_agent.policy.child_owner import (AGENT_CHILD_TRAIT, GPU, NUMA, ListedChild,
                                       agent_children, candidates)
from node_agent.model.provider_tree import Provider, ProviderTree
from node_agent.placement.reshape_engine import (Consumer, ProviderAllocations, Reshape, Rule,
                                                 affected_consumers, compute_reshape, move_targets,
                                                 rule_sources, stage, stale_consumers)
from node_agent.placement.reshape_rules import (children_to_root, guest_names, host_rule,
                                                rule_provider_names)
from node_agent.model.snapshot import Guest

# uuid -> (generation, inventories): what the caller knows Placement holds
# (the syncer's cache), each provider's inventories as read at that generation.
KnownInventories = Mapping[str, tuple[int, Mapping[str, dict]]]

LOG = logging.getLogger(__name__)

# A 409 means the scheduler (or someone) wrote meanwhile. The first attempt
# reads everything; a retry reads the providers' view (their generations)
# and then only the consumers it shows changed, so its window is a few
# round trips whatever the number of consumers. Placement's own window is
# the time it takes to process the body (measured on the embedded one:
# 0.5-1.8 s for 150 consumers), so a refusal there makes the next POST
# smaller (_Stages.size). A host that refused this many POSTs of one
# reshape, and most of them or writes faster than its POSTs (_Stages.busy),
# is busier than a reshape can get through (HostBusy); the POSTs that went
# through stay.
ATTEMPTS = 16
# Other writes to the host more often than this: the scheduler is filling it
# right now. A staged reshape keeps the classes it moves closed while it runs,
# so it waits for a calmer cycle rather than stage on at whatever pace a fast
# Placement allows (issue 19: one write per 0.3 s completes; per 0.05 s is
# too busy, on a quiet machine as on a loaded one).
BUSY_WRITE_INTERVAL = 0.1
# Rounds of "view, changed consumers, view again" before a retry's POST.
SETTLE_ROUNDS = 3


@dataclass
class ReshapeOutcome:
    """What :func:`ensure_reshaped` did. ``reshape`` is the last plan;
    ``created``: uuids of the children created so allocations could move."""

    reshaped: bool
    reshape: Reshape
    attempts: int = 1
    requests: int = 0
    request_id: Optional[str] = None
    warnings: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    # The POST was committed but its answer was lost (the client's retry got
    # a 409): the moves were read back from Placement.
    response_lost: bool = False

    @property
    def consumers_moved(self) -> int:
        return len(self.reshape.moved_consumers) if self.reshaped else 0

    @property
    def inventories(self) -> dict[str, dict]:
        """Provider uuid -> the inventories the POST set (empty if none was sent)."""
        if not self.reshaped or self.reshape.body is None:
            return {}
        return {uuid: entry["inventories"]
                for uuid, entry in self.reshape.body["inventories"].items()}


def resolve_uuids(client, tree: ProviderTree,
                  known: Optional[Mapping[str, str]] = None,
                  names: Optional[Iterable[str]] = None) -> ProviderTree:
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
    return sum(n for (_method, status), n in client.stats.by_status.items()
               if status == 0 or status >= 500)


def read_consumers(client, uuids: Iterable[str],
                   pace: Optional[ReadPace] = None) -> dict[str, Consumer]:
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

    def paced(uuid: str) -> Consumer:
        nonlocal in_flight
        with gate:
            gate.wait_for(lambda: in_flight < pace.limit)
            in_flight += 1
            overloads = _overloads(client)
        start = time.monotonic()
        try:
            consumer = one(uuid)
        except Unavailable:
            with gate:
                pace.overloaded()
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

    with ThreadPoolExecutor(max_workers=min(pace.ceiling, len(uuids))) as pool:
        return dict(zip(uuids, pool.map(paced, uuids)))


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
class _Reads:
    """What one reshape read, kept across its attempts."""

    view: dict[str, ProviderAllocations] = field(default_factory=dict)
    new: frozenset[str] = frozenset()
    consumers: dict[str, Consumer] = field(default_factory=dict)
    pace: ReadPace = field(default_factory=ReadPace)
    consumer_conflict: bool = False  # the last 409 named a consumer generation
    inventories: dict[str, tuple[int, Mapping[str, dict]]] = field(default_factory=dict)


def _generations(view: Mapping[str, ProviderAllocations]) -> dict[str, int]:
    return {uuid: state.generation for uuid, state in view.items()}


def _read_view(client, tree: ProviderTree, rule: Rule, absent: set[str]
               ) -> tuple[dict[str, ProviderAllocations], frozenset[str]]:
    """The sources' allocations, then the targets moves go to (their
    generations and every consumer's share); the targets Placement does not
    have are in the view as empty providers of generation 0 (what a new one
    has) and returned apart."""
    providers = read_allocations(client, [u for u in rule_sources(rule, tree)
                                          if u not in absent])
    if not providers:
        return {}, frozenset()
    targets = move_targets(providers, rule) - set(providers)
    providers.update(read_allocations(client, sorted(targets - absent)))
    new = frozenset(targets - set(providers))
    return {**providers, **{uuid: ProviderAllocations(uuid, 0) for uuid in new}}, new


def _held_inventories(client, view: Mapping[str, ProviderAllocations], new: frozenset[str],
                      known: Optional[KnownInventories], reads: _Reads) -> dict[str, dict]:
    """Each viewed provider's inventories as Placement holds them: what
    ``known`` or an earlier attempt read at the view's generation, else one
    GET. The body replaces the whole inventory, so what it keeps (nova keeps
    a ratio an operator set in Placement) must be current: a ratio from
    before the provider's generation moved would be overwritten."""
    held = {}
    for uuid, state in view.items():
        if uuid in new:
            continue
        at = next((c for c in (reads.inventories.get(uuid), (known or {}).get(uuid))
                   if c is not None and c[0] == state.generation), None)
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
    return any(inv.keep_placement_ratio for p in tree.providers if p.uuid in view
               for inv in p.inventories.values())


def _compute(client, tree: ProviderTree, rule: Rule, names: Mapping[str, str],
             absent: Iterable[str] = (), reads: Optional[_Reads] = None,
             conflict: bool = False, known: Optional[KnownInventories] = None
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
    reads = reads if reads is not None else _Reads()
    view, new = _read_view(client, tree, rule, absent)
    if not view:
        return compute_reshape({}, {}, tree, rule, consumer_names=names), frozenset()
    rounds = 0
    while True:
        by_consumer = _by_consumer(view)
        probed: list[str] = getattr(rule, "migration_candidates", lambda _: [])(by_consumer)
        wanted = sorted(set(affected_consumers(view, rule)) | set(probed))
        stale = stale_consumers(view, reads.consumers, wanted)
        if (retry and rounds == 0 and not stale and (
                reads.consumer_conflict or _generations(view) == _generations(reads.view))):
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
        rule = getattr(rule, "with_migrations")({c: reads.consumers[c]  # noqa: B009
                                                 for c in probed
                                                 if c in reads.consumers}, by_consumer)
        names = {**getattr(rule, "migration_names", dict)(), **names}
    consumers = {c: reads.consumers[c] for c in affected_consumers(view, rule)
                 if c in reads.consumers}
    plan = compute_reshape(view, consumers, tree, rule, consumer_names=names)
    if plan.missing_inventories or (plan.body is not None and _keeps_held_ratio(tree, view)):
        current = _held_inventories(client, view, new, known, reads)
        plan = compute_reshape(view, consumers, tree, rule,
                               current_inventories=current, consumer_names=names)
    return plan, new


def _to_pcpu(plan: Reshape) -> bool:
    return any(m.from_class == "VCPU" and m.to_class == "PCPU" for m in plan.moves)


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


def plan_reshape(client, tree: ProviderTree, guests: Iterable[Guest], rule: Rule,
                 absent: Iterable[str] = (), known: Optional[KnownInventories] = None
                 ) -> Reshape:
    """The reshape a cycle would send now, for ``--dry-run``. Reads only;
    refusals are in the result, not raised. ``absent``: uuids of providers
    of ``tree`` that Placement does not have yet (not read); ``known`` as
    for :func:`ensure_reshaped`."""
    uuid_of_root(tree)
    try:
        plan, new = _compute(client, tree, rule, guest_names(guests), absent, known=known)
    except ValueError as exc:
        raise ReshapeError(f"cannot plan the reshape: {exc}") from exc
    if not new:
        return plan
    shown = {uuid: f"{name} (to be created)" if uuid in new else name
             for uuid, name in plan.provider_names.items()}
    return replace(plan, provider_names=shown)


def _create_missing(client, tree: ProviderTree, uuids: Iterable[str]) -> None:
    """The reshaper moves allocations only between existing providers:
    create the new children (empty) first. The tree sync adopts them by name."""
    uuids = set(uuids)
    for provider in tree.providers:
        if provider.uuid not in uuids:
            continue
        body = {"name": provider.name, "uuid": provider.uuid}
        if provider.parent is not None:
            parent = tree.by_name(provider.parent)
            if parent is None or not parent.uuid:
                raise ValueError(f"provider {provider.name}: its parent {provider.parent} "
                                 "has no uuid")
            body["parent_provider_uuid"] = parent.uuid
        try:
            client.create_provider(body)
        except DuplicateName as exc:
            raise ReshapeError(
                f"cannot create provider {provider.name} for the reshape: {exc}; "
                "the next cycle looks it up again") from exc
        LOG.info("reshape: created provider %s (%s) to move allocations onto",
                 provider.name, provider.uuid)


def _refuse(plan: Reshape) -> None:
    if plan.refusals:
        raise ReshapeError("\n".join(["reshape refused; allocations in Placement "
                                      "were left as they are:", *plan.refusals]))


def ensure_reshaped(client, tree: ProviderTree, guests: Iterable[Guest], rule: Rule, *,
                    attempts: int = ATTEMPTS,
                    before_post: Optional[Callable[[dict], None]] = None,
                    absent: Iterable[str] = (),
                    known: Optional[KnownInventories] = None,
                    guests_now: Optional[Callable[[], Iterable[Guest]]] = None
                    ) -> ReshapeOutcome:
    """Make Placement's allocations fit ``tree`` under ``rule``.

    Reads the rule's providers and the consumers the rule moves, and sends
    one ``POST /reshaper`` if anything moves. On 409 (a provider or consumer
    generation moved, or inventory became in use) the providers' view is
    read again, then the consumers it shows changed, and the plan is
    recomputed: a stale plan is never sent. When Placement itself refused
    the POST because another write landed while it processed the body, the
    rest goes in stages (:func:`~node_agent.placement.reshape_engine.stage`)
    of as many consumers as Placement processes in about half the time
    between other writes: each POST moves its consumers whole, and until the
    last one the classes being moved are published closed at what is
    allocated. ``before_post`` is called with each body just before it is
    sent (tests use it to race; the reconciler checks the capacity
    invariant with it). ``absent``: uuids given to providers of ``tree``
    Placement does not have yet; those that allocations move to are created
    before the POST. ``known``: the inventories the caller last read
    (:data:`KnownInventories`); the body keeps what Placement holds where
    the tree says so (an operator's ratio), and a provider whose generation
    moved since is read again first. ``guests_now``: the guests libvirt
    lists now; before a retry and before the read after a VCPU -> PCPU POST
    the rule takes them, so a guest nova started meanwhile is one it knows.

    Raises ReshapeError (before any write) when the rule refuses (a pinned
    guest outside cpu_dedicated_set, fewer PCPU than pinned vCPUs in use, a
    guest that cannot be attributed to a GPU or NUMA node); HostBusy when
    ``attempts`` POSTs were refused, and two in three of all or other
    writes come faster than three of its quickest POSTs: the consumers
    moved by the stages that went through stay moved, the rest keep what
    they hold. So a reshape makes at most ``attempts`` + 3 x (its
    consumers) POSTs.
    Placement being unreachable raises the client's ``Unavailable``.
    """
    uuid_of_root(tree)
    names = guest_names(guests)
    absent = set(absent)
    start = client.stats.total
    outcome = ReshapeOutcome(False, Reshape(None))
    reads = _Reads()
    run = _Stages()
    plan = Reshape(None)
    started = time.monotonic()
    rechecked = False
    try:
        while True:
            if run.posts and guests_now is not None:
                guests = list(guests_now())
                # B023: the default is called at once, before ``rule`` is rebound.
                rule = getattr(rule, "with_guests", lambda _: rule)(guests)  # noqa: B023
                names = guest_names(guests)
            plan = _plan_for_post(client, tree, rule, names, absent, outcome, reads,
                                  retry=run.posts > 0, known=known)
            run.seen()
            if run.refused_last is not None:
                _check_lost(client, run, plan, outcome)
            if plan.body is None:
                break
            sent = _stage_of(client, plan, reads, run)
            assert sent.body is not None  # a stage of a plan that moves something
            if before_post is not None:
                try:
                    before_post(sent.body)
                except ReshapeError as exc:
                    # Say who keeps what where (the consumers it does not move).
                    raise ReshapeError("; ".join([str(exc), *plan.warnings])) from exc
            run.posts += 1
            outcome.attempts = run.posts
            posted = time.monotonic()
            try:
                client.reshape(sent.body)
            except (GenerationConflict, InventoryInUse) as exc:
                run.refused(sent, exc, time.monotonic() - posted)
                reads.consumer_conflict = "consumer generation" in str(exc)
                if run.busy(attempts):
                    raise
                time.sleep(random.uniform(0, 0.05))
                continue
            run.went_through(sent, time.monotonic() - posted)
            reads.consumer_conflict = False
            outcome.reshaped = True
            outcome.request_id = client.last_request_id
            if sent is plan:
                if rechecked or not _to_pcpu(sent):
                    break
                # One more read of the view. VCPU stays on the provider, and
                # nova's fallback query places pinned guests on it while the
                # upgrade runs: one that landed while this POST was prepared
                # moves now, in this cycle, not at the next shape change.
                rechecked = True
    except (GenerationConflict, InventoryInUse) as exc:
        raise HostBusy(_busy_text(run, plan, time.monotonic() - started, exc)) from exc
    except ValueError as exc:
        raise ReshapeError(f"cannot plan the reshape: {exc}") from exc
    finally:
        outcome.requests = client.stats.total - start
    if outcome.reshaped and run.last is not None:
        # The plan of the last POST, with every move the stages made.
        outcome.reshape = replace(run.last, moves=tuple(run.moves))
    else:
        outcome.reshape = plan
    outcome.warnings = list(plan.warnings)
    for warning in outcome.warnings:
        LOG.warning("reshape: %s", warning)
    if outcome.reshaped:
        LOG.info("reshape: moved %d consumers (%s) in %d POST /reshaper (%d refused), "
                 "last request id %s, %d requests",
                 outcome.consumers_moved, _totals_text(outcome.reshape),
                 run.through, run.refusals, outcome.request_id,
                 outcome.requests)
    else:
        LOG.debug("reshape: nothing to move (%d requests)", outcome.requests)
    return outcome


@dataclass
class _Stages:
    """One reshape's POSTs: how many consumers the next carries, what went
    through, what was refused, and the figures a HostBusy message gives."""

    limit: Optional[int] = None  # consumers per POST; None: all of them
    posts: int = 0
    refusals: int = 0
    through: int = 0             # POSTs that went through
    moves: list = field(default_factory=list)
    last: Optional[Reshape] = None       # the last POST that went through
    refused_last: Optional[Reshape] = None
    current: Optional[dict] = None       # uuid -> inventories, once staging
    timed: Optional[tuple[int, float, bool]] = None  # consumers, seconds, refused
    last_post: tuple[int, float] = (0, 0.0)  # consumers, seconds of the last refused POST
    # Once staging: seconds from the view read to the answer, summed over
    # the POSTs, and how many of them were refused. Writes by others come
    # about every windows / refused seconds.
    _read_at: float = 0.0
    windows: float = 0.0
    staged_refusals: int = 0
    fastest: float = float("inf")  # the shortest window of a POST that went through

    def seen(self) -> None:
        self._read_at = time.monotonic()

    def busy(self, attempts: int) -> bool:
        """Too busy: ``attempts`` POSTs refused, and either two in three of
        all, or other writes so frequent that even the quickest staged POST
        that went through would be refused one time in three (its window
        over the interval), or more often than ``BUSY_WRITE_INTERVAL``."""
        if self.refusals < max(1, attempts):
            return False
        interval = self.interval
        return (self.refusals > 2 * self.through
                or (interval is not None and (self.fastest * 3 > interval
                                              or interval < BUSY_WRITE_INTERVAL)))

    @property
    def interval(self) -> Optional[float]:
        """Seconds between other writes, as the staged POSTs found them: the
        time from their reads to their answers over how many were refused
        (for writes that come at a steady pace, a window that long is hit
        once)."""
        return self.windows / self.staged_refusals if self.staged_refusals else None

    def _answered(self, processed: bool = False) -> None:
        if self.limit is not None:
            window = time.monotonic() - self._read_at
            self.windows += window
            if processed:  # not refused on arrival, before Placement read the body
                self.fastest = min(self.fastest, window)

    def refused(self, sent: Reshape, exc: Exception, seconds: float) -> None:
        self._answered()
        self.refusals += 1
        self.staged_refusals += self.limit is not None
        self.refused_last = sent
        self.last_post = (len(sent.moved_consumers), seconds)
        if "concurrently updated" in str(exc):
            # Refused by Placement's own check after it processed the body:
            # another write landed meanwhile. A smaller body is processed sooner.
            self.timed = (len(sent.moved_consumers), seconds, True)

    def went_through(self, sent: Reshape, seconds: float = 0.0) -> None:
        self._answered(processed=True)
        self.through += 1
        self.moves += sent.moves
        self.last, self.refused_last = sent, None
        if self.current is not None and sent.body is not None:
            self.current.update({u: e["inventories"]
                                 for u, e in sent.body["inventories"].items()})
        if self.limit is not None and seconds:
            self.timed = (len(sent.moved_consumers), seconds, False)

    def size(self) -> None:
        """Consumers for the next POST: as many as Placement processes in
        half the time between other writes, from the last POST's time per
        consumer (an over-estimate: part of it is the same for any size).
        Half the refused one at most, twice the one that went through at
        most (and so before any staged POST was refused)."""
        if self.timed is None:
            return
        consumers, seconds, refused = self.timed
        self.timed = None
        most = consumers // 2 if refused else 2 * consumers
        interval = self.interval
        fit = int(consumers * interval / 2 / seconds) if interval and seconds > 0 else most
        self.limit = max(1, min(fit, most))


def _stage_of(client, plan: Reshape, reads: _Reads, run: _Stages) -> Reshape:
    """What the next POST sends: ``plan``, or its first ``run.limit``
    consumers when Placement refused larger ones (the plan whole when it
    cannot be staged)."""
    moved = plan.moved_consumers
    run.size()
    if run.limit is None or run.limit >= len(moved) or plan.body is None:
        return plan
    if run.current is None:
        # What the stages leave untouched; after each stage, what it set.
        run.current = read_inventories(client, sorted(plan.body["inventories"]))
    staged = stage(plan, reads.view, run.current, moved[:run.limit])
    if staged is None:
        LOG.debug("reshape: this plan cannot be sent in stages; sending it whole")
        return plan
    return staged


def _check_lost(client, run: _Stages, plan: Reshape, outcome: ReshapeOutcome) -> None:
    """A refused POST whose consumers the new plan no longer moves may have
    gone through though its answer was lost (the client's retry got the
    409): if they hold what it set, it is a stage this run made."""
    lost, run.refused_last = run.refused_last, None
    if (lost is not None and not set(lost.moved_consumers) & set(plan.moved_consumers)
            and _committed(client, lost)):
        run.went_through(lost)
        outcome.reshaped = outcome.response_lost = True


def _busy_text(run: _Stages, plan: Reshape, seconds: float, exc: Exception) -> str:
    moved = len({m.consumer for m in run.moves})
    left = len(plan.moved_consumers)
    consumers, took = run.last_post
    interval = run.interval
    pace = (f"; other writes came about every {interval:.2f} s and the quickest POST "
            f"that went through took {run.fastest:.2f} s from its read to its answer"
            if interval is not None and run.fastest < float("inf") else "")
    done = (f"{moved} consumers were moved, each whole, by the {run.through} that went "
            "through; until the rest are, the classes being moved are published closed "
            "at what is allocated"
            if moved else "nothing was moved and the inventory it would move is kept "
            "as Placement holds it")
    return (f"reshape not done, this host is too busy: {run.refusals} POST /reshaper "
            f"refused in {seconds:.1f} s because allocations on the host changed "
            f"while they were read or processed (the last one carried {consumers} "
            f"consumers and was answered in {took:.2f} s{pace}; last: {exc}). "
            f"{done}; {left} consumers still to move. The next cycle tries again. To "
            "let it through now, stop scheduling to this host for a moment (openstack "
            "compute service set --disable, or node-agent maintenance on) and run "
            "node-agent --once.")


def _committed(client, sent: Reshape) -> bool:
    """Every consumer of ``sent`` holds exactly the allocations it set."""
    if sent.body is None:  # it set nothing
        return False
    for consumer, entry in sent.body["allocations"].items():
        held = client.consumer_allocations(consumer)["allocations"]
        if {rp: a["resources"] for rp, a in held.items()} != {
                rp: a["resources"] for rp, a in entry["allocations"].items()}:
            return False
    return True


def _plan_for_post(client, tree: ProviderTree, rule: Rule, names, absent: set[str],
                   outcome: ReshapeOutcome, reads: _Reads, retry: bool,
                   known: Optional[KnownInventories]) -> Reshape:
    plan, new = _compute(client, tree, rule, names, absent, reads, conflict=retry, known=known)
    _refuse(plan)
    if plan.needed and new:
        _create_missing(client, tree, new)
        outcome.created += sorted(new)
        absent -= new
        plan, new = _compute(client, tree, rule, names, absent, reads, known=known)
        _refuse(plan)
        if new:
            raise ValueError("providers created for the reshape are gone: "
                             + ", ".join(sorted(new)))
    return plan


def _totals_text(plan: Reshape) -> str:
    return ", ".join(f"{n} {what}" for what, n in plan.totals()["moved"].items())


# ---------------------------------------------------------------- one host

@dataclass(frozen=True)
class HostReshape:
    """What :func:`ensure_reshaped` needs for one cycle's ``Desired``:
    the tree with uuids for the rule's providers, the rule chain
    (:func:`node_agent.placement.reshape_rules.host_rule`), and the uuids given to children
    Placement does not have yet."""

    tree: ProviderTree
    rule: Rule
    absent: frozenset[str] = frozenset()
    # The agent's own children the desired tree no longer has: in ``tree``
    # with empty inventories, their allocations moved back to the root.
    retired: frozenset[str] = frozenset()


_BACK_HINTS = {NUMA: "numa_in_placement is off, or the node is no longer reported",
               GPU: "its GPU is gone or no longer offers a type in "
                    "[devices] enabled_mdev_types"}


def _listed_children(client, root_uuid: str, listed) -> list[ListedChild]:
    """The root's tree as a list (``listed``: the syncer's cache, or None
    for one ``GET ?in_tree``)."""
    if listed is not None:
        return [ListedChild(p.uuid, p.name, p.parent_uuid, frozenset(p.traits),
                            dict(p.inventories)) for p in listed]
    found = client.providers_in_tree(root_uuid)
    return [ListedChild(rp["uuid"], rp["name"], rp.get("parent_provider_uuid"))
            for rp in found]


def _with_details(client, child: ListedChild) -> ListedChild:
    if child.inventories is not None:
        return child
    try:
        traits = client.traits(child.uuid)["traits"]
        inventories = client.inventories(child.uuid)["inventories"]
    except NotFound:
        return replace(child, inventories={})
    return replace(child, traits=frozenset(traits), inventories=inventories)


def retired_children(client, tree: ProviderTree, owned: Iterable[str] = (),
                     listed=None) -> dict[str, tuple[ListedChild, str]]:
    """uuid -> (child, kind) of the agent's NUMA and GPU children that
    ``tree`` (with the root's uuid) no longer has, recognised by name and
    mark or by ``owned`` (:mod:`node_agent.policy.child_owner`). Reads: one GET for
    the tree unless ``listed`` is given, then two per child named like the
    agent's that the tree does not keep."""
    root, root_uuid = tree.root, uuid_of_root(tree)
    children = candidates(root.name, root_uuid, _listed_children(client, root_uuid, listed),
                          tree.names())
    detailed = [_with_details(client, c) for c in children]
    mine = agent_children(root.name, root_uuid, detailed, owned)
    for child in detailed:
        if child.uuid not in mine:
            LOG.info("provider %s (%s) is named like the agent's children but bears "
                     "neither its mark %s nor a record in the state file: left alone",
                     child.name, child.uuid, AGENT_CHILD_TRAIT)
    return {c.uuid: (c, mine[c.uuid]) for c in detailed if c.uuid in mine}


def _back_rules(tree: ProviderTree, retired: Mapping[str, tuple[ListedChild, str]],
                guests: Iterable[Guest]) -> list[Rule]:
    rules: list[Rule] = []
    for kind in (NUMA, GPU):
        children = {u: c for u, (c, k) in retired.items() if k == kind}
        if children:
            rules.append(children_to_root(
                uuid_of_root(tree), {u: c.name for u, c in children.items()},
                tree.root.inventories,
                {u: set(c.inventories or {}) for u, c in children.items()},
                guests, _BACK_HINTS[kind]))
    return rules


def host_reshape_inputs(client, desired,
                        known_uuids: Optional[Mapping[str, str]] = None,
                        owned: Iterable[str] = (), listed=None
                        ) -> Optional[HostReshape]:
    """Resolve the uuids of the root and of the NUMA and GPU children
    (``known_uuids``: name -> uuid, the state file's ``providers``; the
    rest by name, one GET each), find the agent's children going away
    (:func:`retired_children`; ``owned`` and ``listed`` as there) and build
    the rule. None when the root is not in Placement: a host not there yet
    has nothing to reshape."""
    names = rule_provider_names(desired.tree, desired.host)
    tree = resolve_uuids(client, desired.tree, known_uuids, names)
    if not tree.root.uuid:
        return None
    placed = {p.name for p in tree.providers if p.uuid is not None}
    fresh = {name: str(uuidlib.uuid4()) for name in names[1:] if name not in placed}
    tree = tree.with_uuids(fresh)
    retired = retired_children(client, tree, owned, listed)
    back = _back_rules(tree, retired, desired.host.guests)
    tree = ProviderTree(tree.providers + tuple(
        Provider(c.name, parent=tree.root.name, uuid=u) for u, (c, _k) in retired.items()))
    return HostReshape(tree, host_rule(tree, desired.host, desired.partition.dedicated,
                                       back),
                       frozenset(fresh.values()), frozenset(retired))


def host_reshape(client, desired, known_uuids: Optional[Mapping[str, str]] = None,
                 **kw) -> ReshapeOutcome:
    """:func:`ensure_reshaped` with the rule chain that fits one cycle's
    ``Desired`` (``cycle.desired_from``)."""
    inputs = host_reshape_inputs(client, desired, known_uuids)
    if inputs is None:
        return ReshapeOutcome(False, Reshape(None))
    return ensure_reshaped(client, inputs.tree, desired.host.guests, inputs.rule,
                           absent=inputs.absent, **kw)


def plan_host_reshape(client, desired,
                      known_uuids: Optional[Mapping[str, str]] = None) -> Reshape:
    """:func:`plan_reshape` for ``--dry-run``: reads only."""
    inputs = host_reshape_inputs(client, desired, known_uuids)
    if inputs is None:
        return Reshape(None)
    return plan_reshape(client, inputs.tree, desired.host.guests, inputs.rule, inputs.absent)


# The names the first version had; the chain now covers more than VCPU -> PCPU.
pcpu_reshape = host_reshape
plan_pcpu_reshape = plan_host_reshape
