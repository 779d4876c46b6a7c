"""The syncer's writes: each planned change sent to Placement, in order,
with its 409 cases.

* a provider POST that meets a duplicate name adopts the provider when it
  is this host's root or in its tree (the syncer re-plans), else reports it;
* an inventory PUT goes through the usage guard
  (:mod:`node_agent.placement.usage_guard`: a class removed while in use is
  held, a cut below usage is written and noted) and, on a concurrent update,
  re-reads that provider and retries (bounded); traits are merged into
  what Placement holds, never replaced;
* a DELETE refused because something is allocated (409) is reported and
  retried next cycle;
* a root that does not carry this machine's owner mark yet gets it first,
  before any other write on the tree: a compare-and-set (the traits PUT
  carries the generation of the traits just read; a 409 reads and judges
  again), then a read-back. Of two machines with one host name that create
  or adopt the root together, the second's PUT fails on the generation or
  its read finds the first's mark: it raises ProviderOwned having written
  nothing but, at most, the provider it created.

Each answer updates the syncer's cache (:mod:`node_agent.placement.tree_cache`)
at the generation Placement returned. A 404 (a provider gone behind the
cache's back) raises :class:`~node_agent.placement.sync_context.Replan`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable, Optional

import tenacity

from node_agent.model.provider_state import ProviderState, inventories_equal
from node_agent.placement.errors import (
    BadAnswer,
    DuplicateName,
    GenerationConflict,
    InventoryInUse,
    NotFound,
    PlacementError,
)
from node_agent.placement.planner import Change, merged_traits
from node_agent.placement.root_claim import RootClaim
from node_agent.placement.sync_context import Replan, SyncContext, SyncReport, body_of
from node_agent.placement.tree_cache import TreeCache
from node_agent.placement.usage_guard import UsageGuard, cuts
from node_agent.policy import aggregates as aggs

# Under the syncer's name, as before the split: operators filter on it.
LOG = logging.getLogger("node_agent.placement.sync")

# Each attempt after a 409 concurrent_update re-reads one provider; the
# scheduler bumping a generation twice in a row is rare, three times is a storm.
CONFLICT_ATTEMPTS = 3


class TreeWriter:
    """Sends one plan over ``client``, keeping ``cache`` to what Placement
    answered. ``adopted(name, uuid, is_root)`` and ``deleted(uuid)`` tell
    the syncer's state what changed hands."""

    def __init__(
        self,
        client,
        cache: TreeCache,
        guard: UsageGuard,
        adopted: Callable[[str, str, bool], None],
        deleted: Callable[[str], None],
        claim: Optional[RootClaim] = None,
        aggregates_ours: Callable[[str], Optional[frozenset]] = lambda _root: None,
        aggregates_written: Callable[[str, frozenset, frozenset], None] = lambda *_: None,
    ):
        self.client = client
        self._aggregates_ours = aggregates_ours
        self._aggregates_written = aggregates_written
        self._claim = claim
        self._cache = cache
        self._guard = guard
        self._adopted = adopted
        self._deleted = deleted
        # Classes and traits defined by this process: not defined again.
        self.known_classes: set[str] = set()
        self.known_traits: set[str] = set()

    @property
    def _held(self) -> dict[str, ProviderState]:
        return self._cache.held

    def apply(
        self, ctx: SyncContext, changes: list[Change], report: SyncReport, attempt: int
    ) -> None:
        handlers = {
            "resource_class": self._define,
            "trait": self._define,
            "create": self._create,
            "update": self._update,
            "inventories": self._put_inventories,
            "traits": self._put_traits,
            "aggregates": self._put_aggregates,
            "delete": self._delete,
        }
        root = ctx.tree.root_uuid
        for change in changes:
            if (
                ctx.unclaimed
                and change.kind not in ("resource_class", "trait")
                and not (change.kind == "create" and change.target == root)
            ):
                self._mark_root(ctx)
            if self._blocked(ctx, change):
                report.errors.append(
                    f"skipped ({change.summary}): its provider or parent could not be created"
                )
                continue
            if change.kind == "inventories" and ctx.shrink_failed and change.target in ctx.grows:
                report.errors.append(
                    f"skipped ({change.summary}): an earlier inventory "
                    "change failed, and growing now could overstate "
                    "the host"
                )
                continue
            try:
                applied, errors = handlers[change.kind](ctx, change, attempt)
            except NotFound:
                raise Replan() from None
            except (GenerationConflict, InventoryInUse, DuplicateName) as exc:
                applied, errors = False, [f"{change.summary}: {exc}"]
            except PlacementError as exc:
                status = getattr(exc, "status", None)
                # BadAnswer: not Placement at the endpoint; no other change will fare better.
                if (
                    status is None
                    or status >= 500
                    or status in (401, 403)
                    or isinstance(exc, BadAnswer)
                ):
                    raise
                applied, errors = False, [f"{change.summary}: {exc}"]
            if applied:
                report.applied.append(change)
            elif errors and change.kind == "inventories":
                ctx.shrink_failed = True
            if errors and change.kind == "create":
                ctx.failed.add(change.provider)
            report.errors += errors

    def mark_root(self, ctx: SyncContext, defines: list[Change]) -> None:
        """The mark-first write alone, its trait defined first (``defines``,
        the plan's trait changes): for a reshape about to write to a root
        this machine adopts (:meth:`TreeSyncer.mark_before_reshape`)."""
        for change in defines:
            self._define(ctx, change, 0)
        try:
            self._mark_root(ctx)
        except Replan:
            raise GenerationConflict(
                "the root's generation kept moving while its owner mark was written"
            ) from None

    def _mark_root(self, ctx: SyncContext) -> None:
        """Set this machine's mark on the root, compare-and-set on its
        generation, and read it back; ProviderOwned when another machine's
        mark is there first. Raises Replan when its generation keeps moving.
        A root that could not be created is left: its changes are skipped."""
        uuid, host = ctx.tree.root_uuid, ctx.tree.root.name
        if uuid not in self._held or self._claim is None:
            return
        try:
            for try_ in self._retrying():
                with try_:
                    got = self.client.traits(uuid)
                    generation = got["resource_provider_generation"]
                    self._cache.mark_if_moved(uuid, generation)
                    current = frozenset(got["traits"])
                    owner = self._claim.recheck(current, host, uuid)
                    merged = (current - {t for t, on in owner.items() if not on}) | {
                        t for t, on in owner.items() if on
                    }
                    if merged != current:
                        generation = self.client.put_traits(
                            uuid,
                            {"resource_provider_generation": generation, "traits": sorted(merged)},
                        )["resource_provider_generation"]
        except GenerationConflict:
            raise Replan() from None
        # The read-back: under the compare-and-set no other agent can have
        # added its mark after ours, and this says so at the cost of one GET.
        got = self.client.traits(uuid)
        self._claim.recheck(got["traits"], host, uuid)
        if got["resource_provider_generation"] != generation:
            self._cache.partial.add(uuid)
        self._held[uuid] = replace(
            self._held[uuid],
            traits=frozenset(got["traits"]),
            generation=got["resource_provider_generation"],
        )
        ctx.unclaimed = False

    def _blocked(self, ctx: SyncContext, change: Change) -> bool:
        if change.provider is None:
            return False
        if change.provider in ctx.failed:
            return True
        provider = ctx.tree.by_name(change.provider)
        if provider is not None and provider.parent in ctx.failed:
            ctx.failed.add(change.provider)
            return True
        return False

    def _define(self, ctx: SyncContext, change: Change, attempt: int) -> tuple[bool, list[str]]:
        self.client.send(change)
        (self.known_classes if change.kind == "resource_class" else self.known_traits).add(
            change.target
        )
        return True, []

    def _create(self, ctx: SyncContext, change: Change, attempt: int) -> tuple[bool, list[str]]:
        """POST the provider. 409 duplicate name: adopt the provider of that
        name if it is our root or in our tree, then re-plan; else an error."""
        try:
            created = self.client.send(change) or {}
        except DuplicateName:
            return False, self._adopt(ctx, change, attempt)
        body = body_of(change)
        self._held[body["uuid"]] = ProviderState(
            body["uuid"],
            body["name"],
            created.get("generation", 0),
            body.get("parent_provider_uuid"),
        )
        ctx.created.add(body["uuid"])
        return True, []

    def _adopt(self, ctx: SyncContext, change: Change, attempt: int) -> list[str]:
        name = body_of(change)["name"]
        found = next(iter(self.client.providers_named(name)), None)
        root = ctx.tree.root
        if (
            found is not None
            and attempt == 0
            and (name == root.name or found.get("root_provider_uuid") == ctx.tree.root_uuid)
        ):
            self._adopted(name, found["uuid"], name == root.name)
            LOG.info("adopting existing provider %s (%s)", name, found["uuid"])
            raise Replan()
        where = (
            f"uuid {found['uuid']}, tree {found.get('root_provider_uuid')}"
            if found
            else f"uuid {body_of(change)['uuid']} is taken"
        )
        return [
            f"cannot create provider {name}: a provider with that name or "
            f"uuid already exists outside this host's tree ({where}); "
            "rename or delete it"
        ]

    def _update(self, ctx: SyncContext, change: Change, attempt: int) -> tuple[bool, list[str]]:
        result = self.client.send(change) or {}
        uuid = change.target
        self._held[uuid] = replace(
            self._held[uuid],
            name=body_of(change)["name"],
            parent_uuid=body_of(change)["parent_provider_uuid"],
            generation=result.get("generation", self._held[uuid].generation),
        )
        return True, []

    def _delete(self, ctx: SyncContext, change: Change, attempt: int) -> tuple[bool, list[str]]:
        """DELETE an owned child. 409 (allocations, or children): an error
        naming the provider; it stays owned and is retried next cycle."""
        uuid = change.target
        try:
            self.client.send(change)
        except PlacementError as exc:
            if getattr(exc, "status", None) != 409:
                raise
            return False, [
                f"cannot delete provider {change.provider}: {exc}; move or delete what uses it"
            ]
        self._held.pop(uuid, None)
        self._deleted(uuid)
        return True, []

    # -- inventories

    def _retrying(self):
        return tenacity.Retrying(
            stop=tenacity.stop_after_attempt(CONFLICT_ATTEMPTS),
            retry=tenacity.retry_if_exception_type(GenerationConflict),
            reraise=True,
        )

    def _reread_inventories(self, uuid: str) -> ProviderState:
        got = self.client.inventories(uuid)
        self._cache.mark_if_moved(uuid, got["resource_provider_generation"])
        state = replace(
            self._held[uuid],
            generation=got["resource_provider_generation"],
            inventories=got["inventories"],
        )
        self._held[uuid] = state
        return state

    def _put_inventories(
        self, ctx: SyncContext, change: Change, attempt: int
    ) -> tuple[bool, list[str]]:
        """PUT the whole inventory with the cached generation.

        409 concurrent_update: re-read this provider's inventories and retry
        (bounded). A class the PUT would remove while allocated (409
        inventory.inuse) keeps its current record and is reported as an
        error; a capacity cut below usage (which Placement takes and only
        logs) is written and noted in ``ctx.written_cuts``.
        """
        uuid = change.target
        wanted_all = body_of(change)["inventories"]
        errors: list[str] = []
        for try_ in self._retrying():
            with try_:
                state = self._held[uuid]
                if try_.retry_state.attempt_number > 1:
                    state = self._reread_inventories(uuid)
                if ctx.planned is not None and try_.retry_state.attempt_number == 1:
                    # Guarded and checked by the capacity gate before anything was sent.
                    wanted, errors = wanted_all, []
                    generation = ctx.pre.get(uuid, state.generation)
                else:
                    guarded = self._guard.guard(
                        change, state, wanted_all, closed=ctx.closed, usages_into=ctx.usages
                    )
                    wanted, errors, generation = (
                        guarded.inventories,
                        guarded.errors,
                        guarded.generation,
                    )
                    if errors and ctx.planned is not None:
                        # Usage grew since the check: holding one class while
                        # the others change was never checked. Next cycle.
                        return False, errors
                self._cache.mark_if_moved(uuid, generation)
                if inventories_equal(state.inventories, wanted):
                    return False, errors
                try:
                    result = self.client.put_inventories(
                        uuid, {"resource_provider_generation": generation, "inventories": wanted}
                    )
                except InventoryInUse:
                    return False, self._guard.in_use_errors(change, state, wanted_all)
        self._held[uuid] = replace(
            state,
            generation=result["resource_provider_generation"],
            inventories=result["inventories"],
        )
        # Written below usage (Placement took it, and only logs it): a cut
        # to report, not an error.
        ctx.written_cuts += cuts(
            change.provider or state.name,
            uuid,
            state.inventories,
            result["inventories"],
            ctx.usages.get(uuid),
        )
        return True, errors

    # -- traits

    def _put_traits(self, ctx: SyncContext, change: Change, attempt: int) -> tuple[bool, list[str]]:
        """GET the provider's traits, then PUT them with the agent's traits
        merged in; traits the agent has no opinion on are kept. 409
        concurrent_update: GET again and retry (bounded). A provider created
        in this cycle has no traits yet, so its GET is skipped."""
        uuid = change.target
        provider = ctx.tree.by_name(change.provider) if change.provider else None
        if provider is None:
            raise ValueError(f"{change.summary}: its provider is not in the desired tree")
        for try_ in self._retrying():
            with try_:
                state = self._held[uuid]
                if uuid not in ctx.created or try_.retry_state.attempt_number > 1:
                    got = self.client.traits(uuid)
                    self._cache.mark_if_moved(uuid, got["resource_provider_generation"])
                    state = replace(
                        state,
                        traits=frozenset(got["traits"]),
                        generation=got["resource_provider_generation"],
                    )
                    self._held[uuid] = state
                merged = merged_traits(state.traits, provider)
                if merged == state.traits:
                    return False, []
                result = self.client.put_traits(
                    uuid,
                    {"resource_provider_generation": state.generation, "traits": sorted(merged)},
                )
        self._held[uuid] = replace(
            state,
            generation=result["resource_provider_generation"],
            traits=frozenset(result["traits"]),
        )
        return True, []

    # -- aggregates

    def _put_aggregates(
        self, ctx: SyncContext, change: Change, attempt: int
    ) -> tuple[bool, list[str]]:
        """PUT the root's aggregates: what Placement holds, with the agent's
        added and only its own removed (:func:`node_agent.policy.aggregates.merged`),
        at the provider's generation. 409 concurrent_update (an operator or
        nova-api set aggregates meanwhile): GET them again, merge again and
        retry (bounded). Which ones are the agent's is recorded right after
        the write."""
        uuid = change.target
        provider = ctx.tree.by_name(change.provider) if change.provider else None
        if provider is None:
            raise ValueError(f"{change.summary}: its provider is not in the desired tree")
        ours = self._aggregates_ours(uuid)
        for try_ in self._retrying():
            with try_:
                state = self._held[uuid]
                if try_.retry_state.attempt_number > 1 or (
                    state.aggregates is None and uuid not in ctx.created
                ):
                    got = self.client.aggregates(uuid)
                    self._cache.mark_if_moved(uuid, got["resource_provider_generation"])
                    state = replace(
                        state,
                        aggregates=frozenset(got["aggregates"]),
                        generation=got["resource_provider_generation"],
                    )
                    self._held[uuid] = state
                before = state.aggregates or frozenset()
                new = aggs.merged(before, provider.aggregates, ours)
                if new == before:
                    return False, []
                result = self.client.put_aggregates(
                    uuid,
                    {"resource_provider_generation": state.generation, "aggregates": sorted(new)},
                )
        after = frozenset(result["aggregates"])
        self._held[uuid] = replace(
            state, generation=result["resource_provider_generation"], aggregates=after
        )
        self._aggregates_written(uuid, before, after)
        return True, []
