"""What ``--dry-run`` prints: the desired tree, the planned changes, warnings.

The JSON form has stable keys because operators script against it:
``providers``, ``changes`` (null when Placement was not consulted),
``reshape`` (null when there is none) and ``warnings``.
"""

from __future__ import annotations

import json
from typing import Optional, Sequence

from node_agent.provider_tree import ProviderTree


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


def report_dict(tree: ProviderTree, warnings: Sequence[str],
                changes: Optional[Sequence] = None, reshape: Optional[dict] = None) -> dict:
    return {
        "providers": tree_as_dict(tree),
        "changes": None if changes is None else [change_as_dict(c) for c in changes],
        "reshape": reshape,
        "warnings": list(warnings),
    }


def as_json(report: dict) -> str:
    return json.dumps(report, indent=2, sort_keys=True)


def _inventory_line(rc: str, inv: dict, width: int) -> str:
    ratio = inv["allocation_ratio"]
    return (f"{rc:<{width}}  total {inv['total']:>7}  reserved {inv['reserved']:>5}"
            f"  ratio {float(ratio)}  units {inv['min_unit']}-{inv['max_unit']}/{inv['step_size']}")


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
    if report["changes"] is None:
        lines.append("Changes: Placement not consulted.")
    elif not report["changes"]:
        lines.append("Changes: none, Placement already matches this host.")
    else:
        lines.append(f"Changes ({len(report['changes'])} requests, in order):")
        for n, change in enumerate(report["changes"], 1):
            lines.append(f"  {n}. {change['method']} {change['path']}  -- {change['summary']}")
    if report["reshape"]:
        lines += ["", "Reshape:"] + [f"  {line}" for line in report["reshape"].get("lines", [])]
    if report["warnings"]:
        lines += ["", "Warnings:"] + [f"  - {w}" for w in report["warnings"]]
    return "\n".join(lines) + "\n"
