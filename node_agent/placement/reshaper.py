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
with consumer generation), one ``POST /reshaper``. VCPU -> PCPU on a host
without NUMA children: N + 2, whatever other children the host has.
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
import uuid as uuidlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Optional

import tenacity

from node_agent.errors import ReshapeError
from node_agent.placement.errors import DuplicateName, GenerationConflict, InventoryInUse, NotFound
from node_agent.tree.ownership import (AGENT_CHILD_TRAIT, GPU, NUMA, ListedChild,
                                       agent_children, candidates)
from node_agent.model.provider_tree import Provider, ProviderTree
from node_agent.placement.reshape_engine import (Consumer, ProviderAllocations, Reshape, Rule,
                                                 affected_consumers, compute_reshape, move_targets,
                                                 rule_sources)
from node_agent.placement.reshape_rules import (children_to_root, guest_names, host_rule,
                                                rule_provider_names)
from node_agent.model.snapshot import Guest

LOG = logging.getLogger(__name__)

# A 409 means the scheduler (or someone) wrote meanwhile; each attempt
# re-reads everything the plan depends on. Four in a row is a storm.
ATTEMPTS = 4
READ_WORKERS = 8


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


def read_consumers(client, uuids: Iterable[str],
                   workers: int = READ_WORKERS) -> dict[str, Consumer]:
    """One GET per consumer, a few at a time: the count stays N, the wait
    shrinks (Placement answers reads concurrently)."""
    uuids = list(uuids)

    def one(uuid: str) -> Consumer:
        return Consumer.from_placement(uuid, client.consumer_allocations(uuid))

    if len(uuids) < 2 or workers < 2:
        return {uuid: one(uuid) for uuid in uuids}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(uuids, pool.map(one, uuids)))


def read_inventories(client, uuids: Iterable[str]) -> dict[str, dict]:
    """Current inventories of the providers Placement has."""
    found = {}
    for uuid in uuids:
        try:
            found[uuid] = client.inventories(uuid)["inventories"]
        except NotFound:
            continue
    return found


def _compute(client, tree: ProviderTree, rule: Rule, names: Mapping[str, str],
             absent: Iterable[str] = ()) -> tuple[Reshape, frozenset[str]]:
    """Read what the plan depends on and compute it (reads only). Also
    returns the targets moves go to that Placement does not have: they are
    in the plan as empty providers of generation 0 (what a new one has)."""
    absent = set(absent)
    providers = read_allocations(client, [u for u in rule_sources(rule, tree)
                                          if u not in absent])
    if not providers:
        return compute_reshape({}, {}, tree, rule, consumer_names=names), frozenset()
    targets = move_targets(providers, rule) - set(providers)
    providers.update(read_allocations(client, sorted(targets - absent)))
    new = frozenset(targets - set(providers))
    view = {**providers, **{uuid: ProviderAllocations(uuid, 0) for uuid in new}}
    consumers = read_consumers(client, affected_consumers(view, rule))
    plan = compute_reshape(view, consumers, tree, rule, consumer_names=names)
    if plan.missing_inventories:
        current = read_inventories(client, sorted(plan.missing_inventories - new))
        plan = compute_reshape(view, consumers, tree, rule,
                               current_inventories=current, consumer_names=names)
    return plan, new


def _with_uuids_or_fail(tree: ProviderTree) -> ProviderTree:
    if not tree.root.uuid:
        raise ValueError("the desired tree needs uuids (see resolve_uuids)")
    return tree


def plan_reshape(client, tree: ProviderTree, guests: Iterable[Guest], rule: Rule,
                 absent: Iterable[str] = ()) -> Reshape:
    """The reshape a cycle would send now, for ``--dry-run``. Reads only;
    refusals are in the result, not raised. ``absent``: uuids of providers
    of ``tree`` that Placement does not have yet (not read)."""
    _with_uuids_or_fail(tree)
    try:
        plan, new = _compute(client, tree, rule, guest_names(guests), absent)
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
            body["parent_provider_uuid"] = tree.by_name(provider.parent).uuid
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
                    absent: Iterable[str] = ()) -> ReshapeOutcome:
    """Make Placement's allocations fit ``tree`` under ``rule``, atomically.

    Reads the rule's providers and the consumers the rule moves, and sends
    one ``POST /reshaper`` if anything moves. On 409 (a provider or consumer
    generation moved, or inventory became in use) everything is read again
    and the plan recomputed: a stale plan is never sent. ``before_post``
    is called with the body just before it is sent (tests use it to race).
    ``absent``: uuids given to providers of ``tree`` Placement does not have
    yet; those that allocations move to are created before the POST.

    Raises ReshapeError (before any write) when the rule refuses (a pinned
    guest outside cpu_dedicated_set, fewer PCPU than pinned vCPUs in use, a
    guest that cannot be attributed to a GPU or NUMA node), or when the
    conflicts do not stop after ``attempts`` tries.
    Placement being unreachable raises the client's ``Unavailable``.
    """
    _with_uuids_or_fail(tree)
    names = guest_names(guests)
    absent = set(absent)
    start = client.stats.total
    outcome = ReshapeOutcome(False, Reshape(None))
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(max(1, attempts)),
        retry=tenacity.retry_if_exception_type((GenerationConflict, InventoryInUse)),
        wait=tenacity.wait_random(0, 0.05),
        reraise=True)
    sent: Optional[Reshape] = None
    try:
        for attempt in retrying:
            with attempt:
                outcome.attempts = attempt.retry_state.attempt_number
                outcome.reshape = plan = _plan_for_post(client, tree, rule, names,
                                                        absent, outcome)
                if plan.needed:
                    if before_post is not None:
                        try:
                            before_post(plan.body)
                        except ReshapeError as exc:
                            # Say who keeps what where (the consumers it does not move).
                            raise ReshapeError("; ".join([str(exc), *plan.warnings])) from exc
                    sent = plan
                    client.reshape(plan.body)
                    outcome.reshaped = True
                    outcome.request_id = client.last_request_id
                elif sent is not None and _committed(client, sent):
                    # An earlier POST of this run went through though its
                    # answer was lost: it is still the reshape this run made.
                    outcome.reshape, outcome.reshaped = sent, True
                    outcome.response_lost = True
    except (GenerationConflict, InventoryInUse) as exc:
        raise ReshapeError(
            f"reshape abandoned after {outcome.attempts} attempts: Placement kept "
            f"changing under it ({exc}); the next cycle tries again") from exc
    except ValueError as exc:
        raise ReshapeError(f"cannot plan the reshape: {exc}") from exc
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


def _committed(client, sent: Reshape) -> bool:
    """Every consumer of ``sent`` holds exactly the allocations it set."""
    for consumer, entry in sent.body["allocations"].items():
        held = client.consumer_allocations(consumer)["allocations"]
        if {rp: a["resources"] for rp, a in held.items()} != {
                rp: a["resources"] for rp, a in entry["allocations"].items()}:
            return False
    return True


def _plan_for_post(client, tree: ProviderTree, rule: Rule, names, absent: set[str],
                   outcome: ReshapeOutcome) -> Reshape:
    plan, new = _compute(client, tree, rule, names, absent)
    _refuse(plan)
    if plan.needed and new:
        _create_missing(client, tree, new)
        outcome.created += sorted(new)
        absent -= new
        plan, new = _compute(client, tree, rule, names, absent)
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
    mark or by ``owned`` (:mod:`node_agent.tree.ownership`). Reads: one GET for
    the tree unless ``listed`` is given, then two per child named like the
    agent's that the tree does not keep."""
    root = tree.root
    children = candidates(root.name, root.uuid, _listed_children(client, root.uuid, listed),
                          tree.names())
    detailed = [_with_details(client, c) for c in children]
    mine = agent_children(root.name, root.uuid, detailed, owned)
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
                tree.root.uuid, {u: c.name for u, c in children.items()},
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
    fresh = {name: str(uuidlib.uuid4()) for name in names[1:]
             if tree.by_name(name).uuid is None}
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
