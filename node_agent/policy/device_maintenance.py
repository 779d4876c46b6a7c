"""Maintenance of one child provider (a GPU, a PF, a NUMA node), pure.

``node-agent maintenance on --provider NAME`` takes one of the agent's
children out of service while its siblings and the root stay open: every
inventory of that child gets ``reserved = total`` (no new claim fits;
existing allocations stay), and the child carries
``COMPUTE_STATUS_DISABLED``, the mark host-wide maintenance puts on the root
(:mod:`node_agent.policy.maintenance`). nova's ``compute_status_filter``
looks at the root only, so on a child the trait closes nothing by itself:
the reservation does. The trait is the record Placement keeps, as for the
host: a lost state file cannot reopen the device.

Two records, either enough, as for the host:

* the state file's ``device_maintenance`` key: provider name ->
  ``{"on": true, "reason", "since"}``, or ``{"on": false, "since"}`` while
  an ``off`` waits for the next cycle;
* the trait on the child in Placement: with no record in the file, the
  child stays closed, reason unknown. Only ``maintenance off --provider``
  removes it.

The desired tree carries the decision itself, so whoever applies the tree
(this host, or node-agent-applier from the wire) reads the same thing: the
child's ``traits[COMPUTE_STATUS_DISABLED]`` is True (on), False (an ``off``
to apply) or absent (no record: Placement's trait decides,
:func:`held_by_placement`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping, Optional

from node_agent.errors import UnknownProvider
from node_agent.model.provider_tree import Provider, ProviderTree
from node_agent.policy import maintenance as maint

TRAIT = maint.TRAIT
UNKNOWN_REASON = (
    f"unknown: recorded only in Placement ({TRAIT} on the provider), the state file has no record"
)


def closed(provider: Provider) -> Provider:
    """Every inventory of ``provider`` fully reserved, the trait wanted."""
    return replace(
        provider,
        inventories={
            rc: replace(inv, reserved=inv.total) for rc, inv in provider.inventories.items()
        },
        traits={**provider.traits, TRAIT: True},
    )


def _reopened(provider: Provider) -> Provider:
    return replace(provider, traits={**provider.traits, TRAIT: False})


def check_name(tree: ProviderTree, name: str) -> None:
    """Raise :class:`UnknownProvider` unless ``name`` is one of the tree's
    children, naming those there are."""
    children = [p.name for p in tree.providers[1:]]
    if name in children:
        return
    there = ", ".join(children) if children else "none (this host's tree is its root alone)"
    what = (
        "the root: use `node-agent maintenance on` without --provider for the whole host"
        if name == tree.root.name
        else "not a provider of this host"
    )
    raise UnknownProvider(
        f"maintenance --provider {name}: {what}. The host's child providers are: {there}."
    )


def apply(
    tree: ProviderTree, records: Optional[Mapping[str, Mapping]]
) -> tuple[ProviderTree, list[str]]:
    """The tree under the state file's ``records`` and the notes a person
    should see; a record naming no child of the tree is noted and left."""
    notes: list[str] = []
    providers = list(tree.providers)
    for name, record in sorted((records or {}).items()):
        wanted = maint.requested(record)
        index = next((i for i, p in enumerate(providers) if p.name == name), None)
        if index is None or index == 0:
            notes.append(
                f"device maintenance is recorded for {name}, which is not a child "
                "provider of this host now; `node-agent maintenance off --provider "
                f"{name}` drops the record"
            )
            continue
        if wanted:
            providers[index] = closed(providers[index])
            notes.append(
                f"device maintenance is on for {name} ({record.get('reason') or 'no reason given'}): "
                f"its inventories are fully reserved; `node-agent maintenance off "
                f"--provider {name}` ends it"
            )
        elif wanted is False:
            providers[index] = _reopened(providers[index])
            notes.append(
                f"device maintenance off requested for {name}: this cycle restores its "
                f"reservations and removes {TRAIT} from it"
            )
    return ProviderTree(tuple(providers)), notes


def held_by_placement(
    tree: ProviderTree, traits_by_name: Mapping[str, Iterable[str]]
) -> tuple[ProviderTree, list[str]]:
    """The children with no record (no opinion on the trait in ``tree``)
    that carry the trait in Placement (``traits_by_name``), closed."""
    notes: list[str] = []
    providers = list(tree.providers)
    for i, provider in enumerate(providers[1:], start=1):
        if TRAIT in provider.traits or TRAIT not in traits_by_name.get(provider.name, ()):
            continue
        providers[i] = closed(provider)
        notes.append(
            f"device maintenance is on for {provider.name} ({UNKNOWN_REASON}); "
            f"`node-agent maintenance off --provider {provider.name}` ends it"
        )
    return ProviderTree(tuple(providers)), notes


def in_maintenance(tree: ProviderTree) -> list[str]:
    """The children the tree keeps in maintenance, by name."""
    return sorted(p.name for p in tree.providers[1:] if p.traits.get(TRAIT) is True)


def status(
    tree: Optional[ProviderTree], records: Optional[Mapping[str, Mapping]]
) -> dict[str, dict]:
    """Provider name -> ``{"on", "reason", "since", "source"}`` of every
    child in maintenance (the last cycle's ``tree``) or with a record."""
    out: dict[str, dict] = {}
    for name in in_maintenance(tree) if tree is not None else []:
        record = (records or {}).get(name)
        recorded = maint.is_on(record)
        out[name] = {
            "on": True,
            "reason": (record or {}).get("reason") or None if recorded else UNKNOWN_REASON,
            "since": (record or {}).get("since") if recorded else None,
            "source": "state file" if recorded else "placement",
        }
    for name, record in (records or {}).items():
        if name not in out:
            on = maint.is_on(record)
            out[name] = {
                "on": on,
                "reason": record.get("reason") or None,
                "since": record.get("since"),
                "source": "state file",
                **({} if on else {"off_pending": True}),
            }
    return out


def placement_status(
    records: Optional[Mapping[str, Mapping]], children: Optional[Iterable[Mapping]]
) -> dict[str, dict]:
    """``maintenance status``'s devices: provider name -> ``{"on", "reason",
    "since", "source", "trait", "closed_in_placement"}`` for every child
    with a record or the trait in Placement. ``children``: Placement's
    (``{"name", "traits", "fully_reserved", "open"}`` each), None when
    Placement is not consulted (the Placement fields are then None)."""
    seen = {c["name"]: c for c in children or ()}
    names = set(records or {}) | {n for n, c in seen.items() if TRAIT in (c.get("traits") or ())}
    out = {}
    for name in sorted(names):
        record = (records or {}).get(name)
        child = seen.get(name)
        trait = None if children is None else bool(child and TRAIT in child.get("traits", ()))
        wanted = maint.requested(record)
        on = wanted if wanted is not None else bool(trait)
        out[name] = {
            "on": on,
            "reason": (record or {}).get("reason") or (UNKNOWN_REASON if record is None else None),
            "since": (record or {}).get("since"),
            "source": "state file" if record is not None else "placement",
            "off_pending": wanted is False,
            "trait": trait,
            "closed_in_placement": None
            if children is None
            else bool(child and child["fully_reserved"] and not child["open"]),
        }
    return out


def status_lines(devices: Mapping[str, Mapping]) -> list[str]:
    lines = []
    for name, d in devices.items():
        said = "ON" if d["on"] else "OFF"
        if d["off_pending"]:
            said = "OFF requested, not yet applied by a cycle"
        line = f"  device {name}: maintenance {said}" + (
            f" (reason: {d['reason']})" if d["on"] and d["reason"] else ""
        )
        if d["closed_in_placement"] is not None:
            line += (
                f"; Placement: {TRAIT} {'set' if d['trait'] else 'not set'}, "
                f"{'fully reserved' if d['closed_in_placement'] else 'open'}"
            )
        lines.append(line)
    return lines
