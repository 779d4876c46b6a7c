"""Maintenance mode, pure: nothing new can be scheduled on the host.

Two records say whether it is on, and either one is enough:

* the state file's ``maintenance`` key, as ``node-agent maintenance on|off``
  writes it: ``{"on": true, "reason", "since"}``, or ``{"on": false,
  "since"}`` while an ``off`` waits for the next cycle (a record without
  ``"on"`` is the older form of ``on``);
* Placement itself: nova's ``COMPUTE_STATUS_DISABLED`` trait on the root
  provider, which nova's scheduler already filters on
  (``compute_status_filter`` prefilter), plus ``reserved = total`` on every
  inventory. The trait survives a lost or corrupt state file, so losing the
  file cannot end maintenance: with no record in the file and the trait on
  the root, maintenance stays on, reason unknown.

Who else sets that trait: nova-compute, on the providers it manages, when
its compute service is disabled. A node-agent host has no nova-compute
managing its root (the agent does not share a root with nova), so on our
root the trait means either "the agent put it there" or "an operator set it
by hand to close the host". Both mean "closed"; when in doubt, publish less.
Only ``node-agent maintenance off`` removes it.

Every inventory the agent reports gets ``reserved = total`` (Placement
accepts reserved equal to total since microversion 1.26, and accepts it
above free capacity: raising ``reserved`` never touches an allocation).
Inventories stay, so no allocation is touched and leaving maintenance is the
same tree without this step. Operator-file inventories in the tree are
reserved too: the whole host is closed, not only the agent's classes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping, Optional

import os_traits

from node_agent.model.provider_tree import ProviderTree

TRAIT = os_traits.COMPUTE_STATUS_DISABLED
UNKNOWN_REASON = (
    "unknown: recorded only in Placement (COMPUTE_STATUS_DISABLED on the "
    "root), the state file has no record"
)


def record(on: bool, reason: Optional[str], since: str) -> dict:
    """The state file's record for ``node-agent maintenance on|off``."""
    if on:
        return {"on": True, "reason": reason or "", "since": since}
    return {"on": False, "since": since}


def requested(record: Optional[Mapping]) -> Optional[bool]:
    """What the state file's record asks for: True (on), False (an ``off``
    not yet applied), None (no record: Placement decides)."""
    if not record:
        return None
    return bool(record.get("on", True))


def is_on(record: Optional[Mapping]) -> bool:
    return requested(record) is True


def from_placement(
    record: Optional[Mapping], root_traits: Optional[Iterable[str]]
) -> Optional[Mapping]:
    """The record to act on, given the state file's ``record`` and the
    traits Placement holds on the root (None: not read or no root yet).

    Without a record, the trait on the root keeps maintenance on."""
    if requested(record) is None and root_traits is not None and TRAIT in root_traits:
        return {"on": True, "reason": None, "since": None, "source": "placement"}
    return record


def in_maintenance(tree: ProviderTree) -> ProviderTree:
    """Every inventory fully reserved; the root marked disabled."""
    providers = tuple(
        replace(
            p,
            inventories={rc: replace(inv, reserved=inv.total) for rc, inv in p.inventories.items()},
        )
        for p in tree.providers
    )
    return ProviderTree((_with_trait(providers[0], True),) + providers[1:])


def leaving_maintenance(tree: ProviderTree) -> ProviderTree:
    """The configured tree, with the disabled trait removed from the root."""
    return ProviderTree((_with_trait(tree.root, False),) + tree.providers[1:])


def _with_trait(provider, wanted: bool):
    return replace(provider, traits={**provider.traits, TRAIT: wanted})


def apply(tree: ProviderTree, record: Optional[Mapping]) -> tuple[ProviderTree, list[str]]:
    """The tree under ``record`` and the note a person should see."""
    wanted = requested(record)
    if wanted is None:
        return tree, []
    if not wanted:
        return leaving_maintenance(tree), [
            "maintenance off requested: this cycle restores the configured reservations "
            f"and removes {TRAIT} from the root"
        ]
    record = record or {}
    reason = record.get("reason") or (
        UNKNOWN_REASON if record.get("source") == "placement" else "no reason given"
    )
    return in_maintenance(tree), [
        f"maintenance is on ({reason}): every inventory is fully reserved and the root "
        f"has {TRAIT}; `node-agent maintenance off` ends it"
    ]


# ---------------------------------------------------------------- status


def status(
    host: str,
    state_path: str,
    record: Optional[Mapping],
    state_error: Optional[str],
    placement: Optional[Mapping],
    service: Optional[Mapping] = None,
) -> dict:
    """``node-agent maintenance status`` as data.

    ``placement`` is None when Placement is not configured, else
    ``{"root_uuid": uuid or None, "traits": [...], "inventories": {rc: record},
    "children": [{"name", "uuid", "agent": bool, "inventories"}]}``: every
    other provider of the root's tree, ``agent`` telling whether it is one
    the agent reports (:mod:`node_agent.policy.child_owner`). Maintenance holds
    only when every class of the root and of the agent's children is
    closed; a foreign child's open classes are listed, not held against it
    (the agent does not report them, so no cycle would close them).

    ``service``: the running service's ``maintenance`` answer (its control
    RPC's ``get_status``), asked when Placement is not configured here
    (``upstream = messaging``); ``{"error": text}`` when none answered.
    Without a record in the state file, a service that says the applier
    kept the host closed from Placement's trait makes maintenance on.
    """
    wanted = requested(record)
    state = {
        "path": state_path,
        "maintenance": (
            "unreadable"
            if state_error
            else "none"
            if wanted is None
            else "on"
            if wanted
            else "off requested"
        ),
        "reason": (record or {}).get("reason") or None,
        "since": (record or {}).get("since"),
        "error": state_error,
    }
    seen = None
    if placement is not None:
        closed, open_ = _closed_and_open(placement.get("inventories") or {})
        children = [
            {
                "name": c["name"],
                "uuid": c["uuid"],
                "agent": bool(c["agent"]),
                "traits": sorted(c.get("traits") or ()),
                **dict(zip(("fully_reserved", "open"), _closed_and_open(c["inventories"]))),
            }
            for c in placement.get("children") or ()
        ]
        trait = TRAIT in (placement.get("traits") or ())
        seen = {
            "root_uuid": placement.get("root_uuid"),
            "maintenance": "on" if trait else "off",
            "trait": trait,
            "fully_reserved": closed,
            "open": open_,
            "children": children,
            # provider name -> its open classes, the root and the agent's children
            "open_by_provider": {
                name: classes
                for name, classes in [(host, open_)]
                + [(c["name"], c["open"]) for c in children if c["agent"]]
                if classes
            },
        }
    kept = (
        seen["trait"]
        if seen
        else bool(service and service.get("on") and service.get("source") == "placement")
    )
    effective = from_placement(record, [TRAIT] if kept else None)
    on = is_on(effective)
    # On: the trait and every class closed. Off (or an off not yet applied):
    # no trait.
    agree = (
        None
        if seen is None
        else ((seen["trait"] and not seen["open_by_provider"]) if on else not seen["trait"])
    )
    reason = (effective or {}).get("reason") or (
        UNKNOWN_REASON if (effective or {}).get("source") == "placement" else None
    )
    return {
        "host": host,
        "maintenance": "on" if on else "off",
        "reason": reason if on else None,
        "state_file": state,
        "placement": seen,
        "agree": agree,
        "service": None if service is None else dict(service),
    }


def _closed_and_open(inventories: Mapping[str, Mapping]) -> tuple[list[str], list[str]]:
    closed = sorted(rc for rc, inv in inventories.items() if inv["reserved"] >= inv["total"])
    return closed, sorted(set(inventories) - set(closed))


def status_text(report: Mapping) -> str:
    lines = [
        f"maintenance is {report['maintenance'].upper()} for {report['host']}"
        + (f" (reason: {report['reason']})" if report["reason"] else "")
    ]
    state = report["state_file"]
    said = state["maintenance"]
    if state["error"]:
        said = f"unreadable: {state['error']}"
    elif said == "none":
        said = "no maintenance record"
    elif said == "on":
        said = f"on since {state['since']}" + (
            f", reason: {state['reason']}" if state["reason"] else ""
        )
    else:
        said = f"off requested at {state['since']}, not yet applied by a cycle"
    lines.append(f"  state file {state['path']}: {said}")
    seen = report["placement"]
    if seen is None:
        lines.append("  Placement: not configured, not consulted")
    elif seen["root_uuid"] is None:
        lines.append("  Placement: no root provider for this host yet")
    else:
        closed = ", ".join(seen["fully_reserved"]) or "none"
        open_ = ", ".join(seen["open"]) or "none"
        lines.append(
            f"  Placement root {seen['root_uuid']}: {TRAIT} "
            f"{'set' if seen['trait'] else 'not set'}; fully reserved: {closed}; "
            f"open: {open_}"
        )
        for child in seen.get("children", ()):
            whose = "" if child["agent"] else " (not the agent's: maintenance leaves it)"
            lines.append(
                f"  child {child['name']}{whose}: fully reserved: "
                f"{', '.join(child['fully_reserved']) or 'none'}; "
                f"open: {', '.join(child['open']) or 'none'}"
            )
    service = report.get("service")
    if service is not None:
        if service.get("error"):
            said = f"did not answer ({service['error']})"
        elif not service.get("on"):
            said = "maintenance off"
        elif service.get("source") == "placement":
            said = (
                f"maintenance on: the applier kept the host closed because the root "
                f"carries {TRAIT} and this host's state file has no record"
            )
        else:
            said = "maintenance on" + (f" ({service['reason']})" if service.get("reason") else "")
        lines.append(f"  running service: {said}")
    if report["agree"] is None:
        lines.append("  agree: unknown (Placement not consulted)")
    elif report["agree"]:
        lines.append("  agree: yes")
    else:
        lines.append(
            "  agree: NO -- the next cycle (`node-agent --once`, or the service) "
            "makes Placement follow the maintenance state above"
        )
    return "\n".join(lines) + "\n"
