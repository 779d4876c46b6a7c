"""Section 1: discovery, tree building and planning time, per host and by CPU count."""

from __future__ import annotations

import uuid as uuidlib
from pathlib import Path

from bench import common, synthetic_host
from node_agent.cycle.desired import desired_from
from node_agent.host.discover import discover
from node_agent.host.sysfs import SysFS
from node_agent.host.sysfs_pci import read_pci, read_pci_functions
from node_agent.host.sysfs_topology import read_topology
from node_agent.model.provider_state import ProviderState
from node_agent.model.provider_tree import ProviderTree
from node_agent.placement.planner import plan_changes, wanted_inventories
from tests.hostdata import HOSTDATA, sysfs_root_for

FIXTURES = (
    "virhostcpudata/linux-test3",
    "virhostcpudata/linux-test8",
    "virhostcpudata/linux-subcores1",
)
REPEATS = 25
PCI_ROW = "same synthetic, `[pci] report_in_placement` (2 PFs' 256 VFs as 2 PCI children)"


def with_uuids(tree: ProviderTree) -> ProviderTree:
    return tree.with_uuids(
        {p.name: str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, p.name)) for p in tree.providers}
    )


def in_sync_state(tree: ProviderTree) -> dict[str, ProviderState]:
    """What Placement holds when it already matches ``tree``."""
    parents = {p.name: p.uuid for p in tree.providers}
    return {
        p.uuid: ProviderState(
            p.uuid, p.name, 3, parents.get(p.parent), wanted_inventories(p), p.wanted_traits
        )
        for p in tree.providers
    }


def measure_host(label: str, settings, cpus: int) -> dict:
    discover_t, host = common.timed(lambda: discover(settings), REPEATS)
    build_t, desired = common.timed(lambda: desired_from(settings, host), REPEATS)
    tree = with_uuids(desired.tree)
    actual = in_sync_state(tree)
    owned = {p.uuid for p in tree.providers[1:]}
    steady_t, steady = common.timed(lambda: plan_changes(tree, actual, owned), REPEATS)
    first_t, first = common.timed(lambda: plan_changes(tree, {}, set()), REPEATS)
    cycle = [d + b + s for d, b, s in zip(discover_t, build_t, steady_t)]
    return {
        "host": label,
        "cpus": cpus,
        "providers": len(tree.providers),
        "discover": common.summary(discover_t),
        "build": common.summary(build_t),
        "plan_steady": common.summary(steady_t),
        "plan_first": common.summary(first_t),
        "steady_changes": len(steady),
        "first_changes": len(first),
        "cycle": common.summary(cycle),
    }


def _fixture_settings(tree: str, work: Path):
    work.mkdir(parents=True, exist_ok=True)
    root = sysfs_root_for(HOSTDATA / tree, work)
    return common.settings("fixture", str(root), str(work), str(work / "state"))


def synthetic_settings(
    root: Path, shape: synthetic_host.Shape, work: Path, host: str = "synthetic", **overrides
):
    values = dict(
        numa_in_placement=True,
        enabled_mdev_types=synthetic_host.enabled_mdev_types(shape),
        pci_device_specs=common.device_specs(synthetic_host.device_specs(shape)),
    )
    values.update(overrides)
    return common.settings(host, str(root), str(work), str(work / "state"), **values)


def _breakdown(root: Path) -> dict:
    sysfs = SysFS(str(root))
    topo_t, _ = common.timed(lambda: read_topology(sysfs), REPEATS)
    pci_t, _ = common.timed(lambda: read_pci(sysfs), REPEATS)
    functions_t, functions = common.timed(lambda: read_pci_functions(sysfs), REPEATS)
    return {
        "topology": common.summary(topo_t),
        "pci": common.summary(pci_t),
        "pci_functions": common.summary(functions_t),
        "functions": len(functions),
    }


def run(work: Path) -> dict:
    hosts = []
    for tree in FIXTURES:
        settings = _fixture_settings(tree, work / tree.replace("/", "_"))
        cpus = len(discover(settings).present)
        hosts.append(measure_host(tree.split("/")[-1], settings, cpus))
    scaling = []
    full_root = None
    for factor in (1, 2, 4):
        shape = synthetic_host.scaled(factor)
        root = synthetic_host.build(work / f"synthetic-{factor}x", shape)
        settings = synthetic_settings(root, shape, work / f"synthetic-{factor}x")
        scaling.append(
            {"factor": factor, **measure_host(f"synthetic {factor}x", settings, shape.cpus)}
        )
        full_root = root
    full = dict(scaling[-1], host="synthetic (2×96×SMT2, 8 NUMA, 16 GPU, 4×128 VF)")
    hosts.append(full)
    # The same host with [pci] report_in_placement: every PCI function is
    # read, and the VFs of two PFs become two PCI children.
    shape = synthetic_host.scaled(4)
    pci_settings = synthetic_settings(
        full_root,
        shape,
        work / "synthetic-4x-pci",
        pci_in_placement=True,
        pci_device_specs=common.device_specs(synthetic_host.pci_in_placement_specs(shape)),
    )
    pci = measure_host(PCI_ROW, pci_settings, shape.cpus)
    hosts.append(pci)
    return {
        "hosts": hosts,
        "scaling": scaling,
        "breakdown": _breakdown(full_root),
        "repeats": REPEATS,
    }
