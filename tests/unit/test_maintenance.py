from __future__ import annotations

from node_agent.build import build_tree
from node_agent.maintenance import in_maintenance
from node_agent.partition import partition_cpus
from tests.snapshots import settings, snapshot


def test_maintenance_reserves_every_inventory_and_keeps_the_rest(tmp_path):
    host = snapshot("virhostcpudata/linux-test4", tmp_path)
    conf = settings(numa_in_placement=True)
    tree = build_tree(conf, host, partition_cpus(conf, host))
    closed = in_maintenance(tree)
    assert closed.names() == tree.names()
    for before, after in zip(tree.providers, closed.providers):
        assert after.traits == before.traits
        assert set(after.inventories) == set(before.inventories)
        for rc, inv in after.inventories.items():
            assert inv.reserved == inv.total == before.inventories[rc].total
            assert inv.allocation_ratio == before.inventories[rc].allocation_ratio
    assert any(inv.reserved < inv.total for p in tree.providers
               for inv in p.inventories.values())
