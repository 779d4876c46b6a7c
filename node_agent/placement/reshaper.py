"""The reshape shell's POST: read Placement, ask the engine, send
``POST /reshaper``, and retry on 409 until it goes through or the host is
too busy.

Whether a reshape is needed is decided from what Placement shows (for
example pinned consumers still holding VCPU), never from a local file, so a
restart or a lost state directory cannot reshape twice.

The parts, by module:

- :mod:`node_agent.placement.reshape_reads`: the view, the consumers, the
  inventories and the plan computed from them (reads only; also
  :func:`~node_agent.placement.reshape_reads.plan_reshape` for ``--dry-run``);
- :mod:`node_agent.placement.reshape_stages`: the staging state and its
  tuning constants, when Placement refuses large POSTs;
- this module: :func:`ensure_reshaped`, the plan-send-replan loop, with the
  children created first (one POST each, and the plan is computed again)
  and the POST whose answer was lost;
- :mod:`node_agent.placement.reshape_host`: one cycle's inputs (the uuids,
  the agent's retired children, the rule chain) and
  :func:`~node_agent.placement.reshape_host.host_reshape`.

VCPU -> PCPU on a host without NUMA children costs N + 2 requests for N
consumers, whatever other children the host has.

Call :func:`~node_agent.placement.reshape_host.host_reshape` (or
:func:`ensure_reshaped` with a rule of your own) before the tree sync of a
cycle, so the sync sees a tree that is already reshaped.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Optional

from node_agent.errors import HostBusy, ReshapeError
from node_agent.model.provider_tree import ProviderTree
from node_agent.model.snapshot import Guest
from node_agent.placement.errors import DuplicateName, GenerationConflict, InventoryInUse
from node_agent.placement.reshape_engine import Reshape, Rule
from node_agent.placement.reshape_reads import KnownInventories, Reads, compute_plan, uuid_of_root
from node_agent.placement.reshape_rules import guest_names
from node_agent.placement.reshape_stages import ATTEMPTS, Stages, busy_text, stage_of

LOG = logging.getLogger(__name__)


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
        return {
            uuid: entry["inventories"] for uuid, entry in self.reshape.body["inventories"].items()
        }


def ensure_reshaped(
    client,
    tree: ProviderTree,
    guests: Iterable[Guest],
    rule: Rule,
    *,
    attempts: int = ATTEMPTS,
    before_post: Optional[Callable[[dict], None]] = None,
    absent: Iterable[str] = (),
    known: Optional[KnownInventories] = None,
    guests_now: Optional[Callable[[], Iterable[Guest]]] = None,
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
    reads = Reads()
    run = Stages()
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
            plan = _plan_for_post(
                client, tree, rule, names, absent, outcome, reads, retry=run.posts > 0, known=known
            )
            run.seen()
            if run.refused_last is not None:
                _check_lost(client, run, plan, outcome)
            if plan.body is None:
                break
            sent = stage_of(client, plan, reads, run)
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
        raise HostBusy(busy_text(run, plan, time.monotonic() - started, exc)) from exc
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
        LOG.info(
            "reshape: moved %d consumers (%s) in %d POST /reshaper (%d refused), "
            "last request id %s, %d requests",
            outcome.consumers_moved,
            _totals_text(outcome.reshape),
            run.through,
            run.refusals,
            outcome.request_id,
            outcome.requests,
        )
    else:
        LOG.debug("reshape: nothing to move (%d requests)", outcome.requests)
    return outcome


def _plan_for_post(
    client,
    tree: ProviderTree,
    rule: Rule,
    names,
    absent: set[str],
    outcome: ReshapeOutcome,
    reads: Reads,
    retry: bool,
    known: Optional[KnownInventories],
) -> Reshape:
    plan, new = compute_plan(client, tree, rule, names, absent, reads, conflict=retry, known=known)
    _refuse(plan)
    if plan.needed and new:
        _create_missing(client, tree, new)
        outcome.created += sorted(new)
        absent -= new
        plan, new = compute_plan(client, tree, rule, names, absent, reads, known=known)
        _refuse(plan)
        if new:
            raise ValueError(
                "providers created for the reshape are gone: " + ", ".join(sorted(new))
            )
    return plan


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
                raise ValueError(
                    f"provider {provider.name}: its parent {provider.parent} has no uuid"
                )
            body["parent_provider_uuid"] = parent.uuid
        try:
            client.create_provider(body)
        except DuplicateName as exc:
            raise ReshapeError(
                f"cannot create provider {provider.name} for the reshape: {exc}; "
                "the next cycle looks it up again"
            ) from exc
        LOG.info(
            "reshape: created provider %s (%s) to move allocations onto",
            provider.name,
            provider.uuid,
        )


def _refuse(plan: Reshape) -> None:
    if plan.refusals:
        raise ReshapeError(
            "\n".join(
                ["reshape refused; allocations in Placement were left as they are:", *plan.refusals]
            )
        )


def _to_pcpu(plan: Reshape) -> bool:
    return any(m.from_class == "VCPU" and m.to_class == "PCPU" for m in plan.moves)


def _check_lost(client, run: Stages, plan: Reshape, outcome: ReshapeOutcome) -> None:
    """A refused POST whose consumers the new plan no longer moves may have
    gone through though its answer was lost (the client's retry got the
    409): if they hold what it set, it is a stage this run made."""
    lost, run.refused_last = run.refused_last, None
    if (
        lost is not None
        and not set(lost.moved_consumers) & set(plan.moved_consumers)
        and _committed(client, lost)
    ):
        run.went_through(lost)
        outcome.reshaped = outcome.response_lost = True


def _committed(client, sent: Reshape) -> bool:
    """Every consumer of ``sent`` holds exactly the allocations it set."""
    if sent.body is None:  # it set nothing
        return False
    for consumer, entry in sent.body["allocations"].items():
        held = client.consumer_allocations(consumer)["allocations"]
        if {rp: a["resources"] for rp, a in held.items()} != {
            rp: a["resources"] for rp, a in entry["allocations"].items()
        }:
            return False
    return True


def _totals_text(plan: Reshape) -> str:
    return ", ".join(f"{n} {what}" for what, n in plan.totals()["moved"].items())
