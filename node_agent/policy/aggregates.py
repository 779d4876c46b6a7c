"""Host-side aggregates, additive only (pure).

``[placement] aggregates`` names aggregates the root joins. Placement keeps
a provider's aggregates as one set, written whole (``PUT
/resource_providers/{uuid}/aggregates`` with the provider's generation), and
others write that set too: an operator (``openstack resource provider
aggregate set``), nova-api mirroring a host aggregate. So the agent merges:
it adds what it wants and removes only what it added itself, recorded in the
state file (``ours``) at each write.

``ours`` is None when the state file has no record for this root (a first
run, or a lost file). The agent then cannot tell an aggregate it added
before from one an operator set: it adds, never removes, and an aggregate
already on the root is not taken as its own (:func:`unknown_owner` names
them for a warning). Removing such an aggregate from the option leaves it on
the root; an operator removes it by hand.
"""

from __future__ import annotations

from typing import AbstractSet, Iterable, Optional


def merged(
    current: AbstractSet[str], wanted: AbstractSet[str], ours: Optional[AbstractSet[str]]
) -> frozenset[str]:
    """What the provider's aggregates should be: ``current`` plus
    ``wanted``, less the ones the agent added and no longer wants."""
    dropped = frozenset(ours or ()) - frozenset(wanted)
    return (frozenset(current) - dropped) | frozenset(wanted)


def owned_after(
    ours: Optional[AbstractSet[str]], before: AbstractSet[str], after: AbstractSet[str]
) -> frozenset[str]:
    """The agent's aggregates once the provider holds ``after`` (it held
    ``before``): the ones it had and still there, and the ones it added. One
    that was there before without a record stays someone else's."""
    return (frozenset(ours or ()) & frozenset(after)) | (frozenset(after) - frozenset(before))


def unknown_owner(
    ours: Optional[AbstractSet[str]], current: AbstractSet[str], wanted: Iterable[str]
) -> list[str]:
    """Wanted aggregates already on the provider with no record of who set
    them (``ours`` None): the agent never removes these."""
    if ours is not None:
        return []
    return sorted(frozenset(wanted) & frozenset(current))


def describe(before: AbstractSet[str], after: AbstractSet[str]) -> str:
    """``+uuid -uuid`` of a change."""
    return " ".join(
        [f"+{a}" for a in sorted(set(after) - set(before))]
        + [f"-{a}" for a in sorted(set(before) - set(after))]
    )


def unknown_owner_warning(root: str, names: Iterable[str]) -> str:
    return (
        f"aggregate(s) {', '.join(names)} already on provider {root}, and the state file "
        "has no record that node-agent added them (a first run, or a lost state file): "
        "they count as the operator's, and node-agent will never remove them, even "
        "when [placement] aggregates no longer lists them; remove them by hand "
        "(`openstack resource provider aggregate set`) if they must go"
    )
