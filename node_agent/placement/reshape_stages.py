"""One reshape's POSTs in stages: how many consumers the next POST
carries, what went through, what was refused, when the host is too busy,
and the tuning constants behind those answers. Used by
:func:`node_agent.placement.reshaper.ensure_reshaped`.

On a busy host one POST of many consumers may never get through: Placement
checks the providers' generations again after processing the whole body
(0.5-1.8 s for 150 consumers measured on the embedded Placement on two
busy cores), and any write meanwhile refuses it. After such a refusal the
plan goes in stages (:func:`node_agent.placement.reshape_engine.stage`),
each atomic for its consumers, sized from the time the last POST took.
Every stage costs one more view read and one POST.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Optional

from node_agent.placement.reshape_engine import Reshape, stage
from node_agent.placement.reshape_reads import Reads, read_inventories

LOG = logging.getLogger(__name__)

# A 409 means the scheduler (or someone) wrote meanwhile. The first attempt
# reads everything; a retry reads the providers' view (their generations)
# and then only the consumers it shows changed, so its window is a few
# round trips whatever the number of consumers. Placement's own window is
# the time it takes to process the body (measured on the embedded one:
# 0.5-1.8 s for 150 consumers), so a refusal there makes the next POST
# smaller (Stages.size). A host that refused this many POSTs of one
# reshape, and most of them or writes faster than its POSTs (Stages.busy),
# is busier than a reshape can get through (HostBusy); the POSTs that went
# through stay.
ATTEMPTS = 16
# Other writes to the host more often than this: the scheduler is filling it
# right now. A staged reshape keeps the classes it moves closed while it runs,
# so it waits for a calmer cycle rather than stage on at whatever pace a fast
# Placement allows (issue 19: one write per 0.3 s completes; per 0.05 s is
# too busy, on a quiet machine as on a loaded one).
BUSY_WRITE_INTERVAL = 0.1


@dataclass
class Stages:
    """One reshape's POSTs: how many consumers the next carries, what went
    through, what was refused, and the figures a HostBusy message gives."""

    limit: Optional[int] = None  # consumers per POST; None: all of them
    posts: int = 0
    refusals: int = 0
    through: int = 0  # POSTs that went through
    moves: list = field(default_factory=list)
    last: Optional[Reshape] = None  # the last POST that went through
    refused_last: Optional[Reshape] = None
    current: Optional[dict] = None  # uuid -> inventories, once staging
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
        return self.refusals > 2 * self.through or (
            interval is not None and (self.fastest * 3 > interval or interval < BUSY_WRITE_INTERVAL)
        )

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
            self.current.update({u: e["inventories"] for u, e in sent.body["inventories"].items()})
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


def stage_of(client, plan: Reshape, reads: Reads, run: Stages) -> Reshape:
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
    staged = stage(plan, reads.view, run.current, moved[: run.limit])
    if staged is None:
        LOG.debug("reshape: this plan cannot be sent in stages; sending it whole")
        return plan
    return staged


def busy_text(run: Stages, plan: Reshape, seconds: float, exc: Exception) -> str:
    moved = len({m.consumer for m in run.moves})
    left = len(plan.moved_consumers)
    consumers, took = run.last_post
    interval = run.interval
    pace = (
        f"; other writes came about every {interval:.2f} s and the quickest POST "
        f"that went through took {run.fastest:.2f} s from its read to its answer"
        if interval is not None and run.fastest < float("inf")
        else ""
    )
    done = (
        f"{moved} consumers were moved, each whole, by the {run.through} that went "
        "through; until the rest are, the classes being moved are published closed "
        "at what is allocated"
        if moved
        else "nothing was moved and the inventory it would move is kept as Placement holds it"
    )
    return (
        f"reshape not done, this host is too busy: {run.refusals} POST /reshaper "
        f"refused in {seconds:.1f} s because allocations on the host changed "
        f"while they were read or processed (the last one carried {consumers} "
        f"consumers and was answered in {took:.2f} s{pace}; last: {exc}). "
        f"{done}; {left} consumers still to move. The next cycle tries again. To "
        "let it through now, stop scheduling to this host for a moment (openstack "
        "compute service set --disable, or node-agent maintenance on) and run "
        "node-agent --once."
    )
