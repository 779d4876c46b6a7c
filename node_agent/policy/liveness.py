"""A dead reporter's capacity, pure: when node-agent-applier closes a host
that stopped reporting, and what closing and reopening do to its root.

In messaging mode every agent message (a full tree or a heartbeat, once per
``[agent] report_interval``) reaches one applier process. A host whose last
message is older than ``[applier] dead_after`` seconds is *dead*: its agent
was killed, its machine is down or cut off, and nothing keeps its published
capacity honest. The applier then closes it the way nova closes a disabled
compute service: ``COMPUTE_STATUS_DISABLED`` on the root, which nova's
scheduler already filters out (its ``compute_status_filter`` prefilter sends
``root_required=!COMPUTE_STATUS_DISABLED``). Inventories, allocations and the
root's other traits are left as they are: the guests running there keep
their claims, and a host that reports again is reopened by removing that one
trait.

The trait has other writers (``node-agent maintenance on``, an operator, on
a shared root nova-compute), so the applier removes it only when the host's
record says the applier added it (:func:`closing`); a trait that was already
there is left alone, then and at reopening.

Time: a host counts from the later of its last message and the moment this
applier process began watching (``since``): an applier that was down for
longer than ``dead_after`` does not close every host the moment it starts;
the hosts have ``dead_after`` to reach it first.
"""

from __future__ import annotations

from typing import Iterable, Optional

from node_agent.policy.maintenance import TRAIT

# A host's "seen at" time is written to its shared record at most this many
# times per dead_after: a heartbeat answered "unchanged" otherwise writes
# nothing, and the mark only needs to be fresh to a fraction of dead_after.
SEEN_WRITES_PER_PERIOD = 4


def is_dead(now: float, seen_at: Optional[float], since: float, dead_after: float) -> bool:
    """No message from the host for ``dead_after`` seconds, counted from
    the later of ``seen_at`` (None: never recorded) and ``since``; never
    with ``dead_after`` 0 (off)."""
    if dead_after <= 0:
        return False
    return now - max(seen_at if seen_at is not None else since, since) >= dead_after


def seen_due(now: float, seen_at: Optional[float], dead_after: float) -> bool:
    """Whether a message must refresh the host's recorded ``seen_at``."""
    if seen_at is None:
        return True
    if dead_after <= 0:
        return False
    return now - seen_at >= dead_after / SEEN_WRITES_PER_PERIOD or now < seen_at


def closing(traits: Iterable[str]) -> Optional[list[str]]:
    """The root's traits once closed, or None when the trait is already
    there (someone else's close: the applier adds nothing and will remove
    nothing)."""
    held = set(traits)
    if TRAIT in held:
        return None
    return sorted(held | {TRAIT})


def reopening(traits: Iterable[str]) -> Optional[list[str]]:
    """The root's traits once reopened (only the applier's trait removed),
    or None when it is no longer there (removed by hand: nothing to do)."""
    held = set(traits)
    if TRAIT not in held:
        return None
    return sorted(held - {TRAIT})


def dead_after_problem(dead_after: float, lock_timeout: float) -> Optional[str]:
    """Why ``[applier] dead_after`` cannot be used with ``lock_timeout``, or
    None. A live host's message may wait ``lock_timeout`` for its host's
    lock and be answered busy without its "seen at" being written: a
    dead_after not above that would close hosts that are reporting."""
    if dead_after == 0:
        return None
    if dead_after < 0:
        return f"[applier] dead_after = {dead_after:g}: seconds, 0 (off) or more"
    if dead_after <= 2 * lock_timeout:
        return (
            f"[applier] dead_after = {dead_after:g} is not above twice [applier] "
            f"lock_timeout ({lock_timeout:g} s): a reporting host whose messages wait "
            "for its lock would be closed as dead; set it to several times the agents' "
            "[agent] report_interval and above 2 x lock_timeout, or 0 to never close "
            "a host"
        )
    return None
