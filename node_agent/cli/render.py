"""What ``--dry-run`` and ``--once`` print: the tree, the changes, the
capacity verdict, errors and warnings.

The JSON form has stable keys because operators script against it:
``providers``, ``changes`` (planned by ``--dry-run``, applied by ``--once``;
null when Placement was not consulted), ``reshape`` (null when there is
none), ``capacity`` (the invariant's verdict, :mod:`node_agent.policy.capacity`:
``ok``, ``violations``, and when Placement was consulted what is ``kept``
as Placement holds it, ``closed`` (fully reserved) and the consumers
``blocking`` the change), ``errors`` (what could not be applied, and why)
and ``warnings``; ``guests``: each guest of the host as nova counts it
(``name``, ``uuid``, ``policy``, the ``rule`` that decided, ``VCPU``,
``PCPU``, ``dedicated_vcpus``, ``emulator_isolate``). ``below_usage``
(when Placement was consulted) lists the capacity cuts written
(``--once``) or planned (``--dry-run``) below what is allocated:
``provider``, ``uuid``, ``class``, ``used``, ``capacity``,
``old_capacity``, ``over`` and the ``holders`` (``consumer``, ``guest``,
``amount``); each is also a warning. They are not errors: Placement holds
the new capacity and refuses new claims until usage falls. ``audit`` (the allocation audit,
:meth:`node_agent.policy.audit.AuditResult.as_dict`) is there when
``--dry-run`` consulted Placement, and only then, so the output of a run
without Placement is as it was. In companion mode (``[agent] mode =
companion``) ``changes`` is always empty (nothing is ever written) and
``companion`` holds the provider found by name (``root_uuid``, ``owner``,
``found``), ``drift`` (``provider``, ``subject``, ``placement``, ``host``,
``explained_by``) and ``next_restart`` (``reshape``, ``blocking``,
``lines``): :meth:`node_agent.cycle.companion.CompanionReport.as_dict`.
``shared_storage`` (null unless ``[compute] shared_storage_aggregate`` is
set or this host's DISK_GB is to move back from a sharing provider):
``aggregate``, the sharing ``provider`` and its ``uuid``, its ``disk_gb``,
``moved`` (this host's DISK_GB is where the option says and offered once)
and ``moved_from`` (the sharing providers it leaves this cycle).
"""

from __future__ import annotations

import json
from typing import Iterable, Mapping, Optional, Sequence

from node_agent.model.provider_tree import ProviderTree
from node_agent.model.snapshot import Guest
from node_agent.policy.guest_cpu import classify


def tree_as_dict(tree: ProviderTree) -> list[dict]:
    return [
        {
            "name": p.name,
            "uuid": p.uuid,
            "parent": p.parent,
            "inventories": {rc: inv.as_placement() for rc, inv in sorted(p.inventories.items())},
            "traits": sorted(p.wanted_traits),
        }
        for p in tree.providers
    ]


def change_as_dict(change) -> dict:
    return {"method": change.method, "path": change.path, "summary": change.summary}


def report_dict(
    tree: ProviderTree,
    warnings: Sequence[str],
    changes: Optional[Sequence] = None,
    reshape: Optional[dict] = None,
    capacity: Optional[dict] = None,
    errors: Sequence[str] = (),
    below_usage: Optional[Sequence] = None,
) -> dict:
    """``below_usage``: the capacity cuts published (``--once``) or planned
    (``--dry-run``) below usage (:class:`node_agent.placement.usage_guard.Cut`);
    the key is there only when Placement was consulted."""
    cuts = list(below_usage or ())
    report = {
        "providers": tree_as_dict(tree),
        "changes": None if changes is None else [change_as_dict(c) for c in changes],
        "reshape": reshape,
        "capacity": capacity,
        "errors": list(errors),
        "warnings": list(warnings) + [f"capacity cut below usage: {c}" for c in cuts],
    }
    if below_usage is not None:
        report["below_usage"] = [c.as_dict() for c in cuts]
    return report


def with_guests(report: dict, guests: Iterable[Guest]) -> dict:
    """``report`` with each guest of the host as nova counts it, and the
    rule that decided (:mod:`node_agent.policy.guest_cpu`)."""
    found = []
    for guest in sorted(guests, key=lambda g: (g.name, g.uuid)):
        cpu = classify(guest)
        found.append(
            {
                "name": guest.name,
                "uuid": guest.uuid,
                "policy": cpu.policy,
                "rule": cpu.rule,
                "VCPU": cpu.vcpu,
                "PCPU": cpu.pcpu,
                "dedicated_vcpus": sorted(cpu.dedicated_vcpus),
                "emulator_isolate": cpu.emulator_isolate,
            }
        )
    return {**report, "guests": found}


def as_json(report: dict) -> str:
    return json.dumps(report, indent=2, sort_keys=True)


def _inventory_line(rc: str, inv: dict, width: int) -> str:
    ratio = inv["allocation_ratio"]
    return (
        f"{rc:<{width}}  total {inv['total']:>7}  reserved {inv['reserved']:>5}"
        f"  ratio {float(ratio)}  units {inv['min_unit']}-{inv['max_unit']}/{inv['step_size']}"
    )


def _provider_lines(provider: dict, depth: int) -> list[str]:
    pad = "  " * depth
    uuid = provider["uuid"] or "not yet in Placement"
    lines = [f"{pad}{provider['name']}  [{uuid}]"]
    inventories = provider["inventories"]
    width = max((len(rc) for rc in inventories), default=0)
    for rc, inv in inventories.items():
        lines.append(f"{pad}  {_inventory_line(rc, inv, width)}")
    if not inventories:
        lines.append(f"{pad}  (no inventory)")
    if provider["traits"]:
        lines.append(f"{pad}  traits: {', '.join(provider['traits'])}")
    return lines


def with_audit(report: dict, audit: Optional[dict]) -> dict:
    return report if audit is None else {**report, "audit": audit}


def with_stranded(report: dict, stranded: Optional[Mapping]) -> dict:
    """``report`` with what NUMA children strand (:mod:`node_agent.policy.stranded`);
    null on a host without NUMA nodes."""
    return {**report, "numa_stranded": stranded}


def with_shared_storage(report: dict, shared: Optional[Mapping]) -> dict:
    """``report`` with shared storage (:func:`node_agent.policy.shared_storage.report`:
    ``aggregate``, ``provider``, ``uuid``, ``disk_gb``, ``moved``,
    ``moved_from``); null without ``[compute] shared_storage_aggregate`` and
    nothing to move back."""
    return {**report, "shared_storage": shared}


def shared_storage_lines(shared: Optional[Mapping]) -> list[str]:
    if not shared:
        return []
    return ["", "Shared storage:"] + [f"  {line}" for line in shared["lines"]]


def stranded_lines(stranded: Optional[Mapping]) -> list[str]:
    if not stranded:
        return []
    return ["", "Flavors NUMA children strand (Placement never splits a class):"] + [
        f"  {line}" for line in stranded["lines"]
    ]


def with_companion(report: dict, companion) -> dict:
    """``report`` with the companion check (a ``CompanionReport``) and its audit."""
    return with_audit({**report, "companion": companion.as_dict()}, companion.audit)


def companion_lines(companion: dict) -> list[str]:
    """The ``Companion mode`` section: the provider, drift, next restart."""
    lines = ["Companion mode (read-only: nothing is written to Placement):"]
    if not companion["found"]:
        return lines + [
            f"  Placement has no provider named {companion['host']}; "
            "companion mode never creates one."
        ]
    owner = companion["owner"] or "unknown (no OWNER_* trait)"
    lines.append(f"  provider {companion['host']} [{companion['root_uuid']}], owned by {owner}")
    drift = companion["drift"]
    if drift:
        lines.append(f"  Drift ({len(drift)} differences between Placement and this host):")
        lines += [
            f"    - {d['provider']}: {d['subject']}: Placement {d['placement']}, "
            f"this host {d['host']} -- {d['explained_by']}"
            for d in drift
        ]
    else:
        lines.append("  Drift: none, Placement holds what node-agent would publish.")
    restart = companion["next_restart"]
    if restart:
        lines.append("  At nova-compute's next restart with this configuration:")
        lines += [f"    {line}" for line in restart["lines"]]
    return lines


def audit_lines(audit: dict) -> list[str]:
    """The ``Audit`` section: alarms first, then in-flight and pending cases."""
    findings = audit["findings"]
    head = f"Allocation audit ({audit['consumers']} consumers on {audit['providers']} providers): "
    if not findings:
        return [head + "every allocation matches a local guest of its size."]
    lines = [head + f"{audit['alarms']} alarm(s)."]
    for state, title in (
        ("alarm", "ALARM"),
        ("in_flight", "in flight (not an alarm)"),
        ("pending", "pending"),
    ):
        for f in (f for f in findings if f["state"] == state):
            who = (
                f"guest {f['guest']} ({f['consumer']})"
                if f["guest"]
                else f"consumer {f['consumer']}"
            )
            extra = [f"type {f['consumer_type']}"] if f["consumer_type"] else []
            if f["orphaned_for_s"]:
                extra.append(f"orphaned for {int(f['orphaned_for_s'])} s")
            tail = f" [{', '.join(extra)}]" if extra else ""
            lines.append(f"  {title}: {f['kind']} {who}: {f['detail']}{tail}")
    return lines


def as_text(report: dict) -> str:
    providers = report["providers"]
    depth_of: dict[str, int] = {}
    lines = ["Provider tree:"]
    for provider in providers:
        parent = provider["parent"]
        depth = 1 if parent is None else depth_of.get(parent, 1) + 1
        depth_of[provider["name"]] = depth
        lines += _provider_lines(provider, depth)
    lines.append("")
    errors = report.get("errors") or []
    if report.get("companion"):
        lines += companion_lines(report["companion"])
    elif report["changes"] is None:
        lines.append("Changes: Placement not consulted.")
    elif not report["changes"] and not errors and (report.get("capacity") or {}).get("ok", True):
        lines.append("Changes: none, Placement already matches this host.")
    elif not report["changes"]:
        lines.append(
            "Changes: none that can be sent; Placement does not match this host "
            "(see Capacity and Errors)."
        )
    else:
        lines.append(f"Changes ({len(report['changes'])} requests, in order):")
        for n, change in enumerate(report["changes"], 1):
            lines.append(f"  {n}. {change['method']} {change['path']}  -- {change['summary']}")
    if report.get("guests"):
        lines += ["", "Guests, as nova counts them:"] + [
            f"  {g['name']} ({g['uuid']}): {g['policy']} by {g['rule']}: "
            f"VCPU {g['VCPU']}, PCPU {g['PCPU']}"
            for g in report["guests"]
        ]
    if report["reshape"]:
        lines += ["", "Reshape:"] + [f"  {line}" for line in report["reshape"].get("lines", [])]
    lines += _capacity_lines(report.get("capacity"))
    lines += shared_storage_lines(report.get("shared_storage"))
    lines += stranded_lines(report.get("numa_stranded"))
    lines += _below_usage_lines(report.get("below_usage"))
    if report.get("audit"):
        lines += [""] + audit_lines(report["audit"])
    if errors:
        lines += ["", "Errors (not applied, retried next cycle):"] + [f"  - {e}" for e in errors]
    if report["warnings"]:
        lines += ["", "Warnings:"] + [f"  - {w}" for w in report["warnings"]]
    return "\n".join(lines) + "\n"


def _below_usage_lines(cuts: Optional[Sequence[dict]]) -> list[str]:
    """Capacity cuts written below usage: published, not errors; Placement
    refuses new claims of the class until usage falls."""
    if not cuts:
        return []
    lines = [
        "",
        "Capacity cuts below usage (Placement takes them, as from nova; no new "
        "claim of the class fits until usage falls under the new capacity):",
    ]
    for c in cuts:
        lines.append(
            f"  - {c['class']} on {c['provider']}: capacity {c['capacity']} "
            f"(was {c['old_capacity']}), {c['used']} in use, {c['over']} over"
        )
        for h in c["holders"]:
            who = (
                f"guest {h['guest']} ({h['consumer']})"
                if h.get("guest")
                else f"consumer {h['consumer']} (not a guest of this host)"
            )
            lines.append(f"      held by {who}: {h['amount']}")
    return lines


def _capacity_lines(capacity: Optional[dict]) -> list[str]:
    if not capacity:
        return []
    if capacity["ok"]:
        return ["", "Capacity: the tree stays within what the host has."]
    lines = ["", "Capacity: the planned tree would overstate the host; it is not sent whole:"]
    lines += [
        f"  - {v['resource']}: {v['published']} units published on "
        f"{', '.join(v['where'])}, the host has {v['host_has']}"
        if v["host_has"] is not None
        else f"  - {v['resource']} offered on the root and its children ({', '.join(v['where'])})"
        for v in capacity["violations"]
    ]
    if capacity.get("kept"):
        lines.append(f"  Kept as Placement holds them: {', '.join(capacity['kept'])}")
    if capacity.get("closed"):
        lines.append(f"  Published fully reserved: {', '.join(capacity['closed'])}")
    for b in capacity.get("blocking") or []:
        who = (
            f"guest {b['guest']} ({b['consumer']})"
            if b.get("guest")
            else f"consumer {b['consumer']} (not a guest of this host)"
        )
        held = " ".join(f"{rc}={n}" for rc, n in sorted(b["resources"].items()))
        lines.append(f"  Blocked by {who}: {held} on {b['provider']}")
    return lines
