"""Maintenance mode, pure: nothing new can be scheduled on the host.

Every inventory the agent reports gets ``reserved = total`` (Placement
accepts reserved equal to total since microversion 1.26). Inventories stay,
so no allocation is touched and leaving maintenance is the same tree
without this step. Operator-file inventories in the tree are reserved too:
the whole host is closed, not only the agent's classes.
"""

from __future__ import annotations

from dataclasses import replace

from node_agent.provider_tree import ProviderTree


def in_maintenance(tree: ProviderTree) -> ProviderTree:
    return ProviderTree(tuple(
        replace(p, inventories={rc: replace(inv, reserved=inv.total)
                                for rc, inv in p.inventories.items()})
        for p in tree.providers))
