"""What a real libvirtd writes (tests/data/realhost), read by the agent.

topology_differences checks libvirt's NUMA cells against the kernel's nodes;
real capabilities list each cell's ``<cpu>`` elements with socket, core and
siblings. A live domain carries what libvirt adds to the defined one.
"""

from pathlib import Path

from node_agent.host.capabilities import parse_capabilities
from node_agent.host.domain import parse_domain
from node_agent.host.libvirt_facts import topology_differences
from node_agent.host.sysfs_topology import SysfsTopology
from node_agent.model.cpuset import CpuSet
from node_agent.model.snapshot import NumaNode

REALHOST = Path(__file__).resolve().parents[1] / "data" / "realhost"


def sysfs_with_nodes(*cpus_per_node):
    nodes = tuple(NumaNode(i, CpuSet(cpus), None) for i, cpus in enumerate(cpus_per_node))
    present = CpuSet(c for node in nodes for c in node.cpus)
    return SysfsTopology(
        present=present, online=present, isolated=CpuSet(), cpus=(), nodes=nodes, memory_kb=None
    )


def real_cells():
    return parse_capabilities((REALHOST / "capabilities.xml").read_text()).cells


def test_real_host_cell_matching_its_sysfs_node_gives_no_warning():
    assert topology_differences(sysfs_with_nodes({0, 1}), real_cells()) == []


def test_real_host_cell_matching_a_host_without_node_directory_gives_no_warning():
    no_nodes = SysfsTopology(
        present=CpuSet({0, 1}),
        online=CpuSet({0, 1}),
        isolated=CpuSet(),
        cpus=(),
        nodes=(),
        memory_kb=None,
    )
    assert topology_differences(no_nodes, real_cells()) == []


def test_cells_that_split_cpus_differently_from_sysfs_are_reported_once():
    warnings = topology_differences(sysfs_with_nodes({0}, {1}), real_cells())
    assert len(warnings) == 1
    assert "NUMA cells [0]" in warnings[0] and "sysfs nodes [0, 1]" in warnings[0]


def test_live_pinned_guest_gives_its_pin_memory_and_nova_flavor():
    guest = parse_domain((REALHOST / "domain-pinned-live.xml").read_text(), running=True)
    assert (guest.uuid, guest.name, guest.vcpus) == (
        "11111111-2222-3333-4444-555555555501",
        "pinned-1",
        1,
    )
    assert dict(guest.vcpupin) == {0: CpuSet({1})}
    assert guest.memory_kb == 65536
    assert dict(guest.metadata)["flavor:name"] == "m1.pinned"
    assert guest.pinned_cpus == CpuSet({1})
