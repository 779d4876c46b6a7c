"""Wire 2.5 end to end: through a real ``node-agent-applier`` on a real
RabbitMQ into the real Placement, a PCI device a running guest passes
through without an allocation is reserved on its child, as in the direct
mode (tests/integration/test_pci_placement.py), and the reservation goes
with the guest or once the guest's allocation exists."""

from __future__ import annotations

import pytest

from node_agent.cycle.desired import compute_desired
from tests.integration.placement_tree import tree_by_name
from tests.integration.reshape_driver import allocate
from tests.integration.test_applier import bus  # noqa: F401 (fixture)
from tests.integration.test_pci_placement import (
    GPU,
    GPU_RC,
    PF,
    VF_RC,
    holding_guest,
    reserved_of,
)

pytestmark = pytest.mark.integration


def test_device_a_guest_holds_without_allocation_is_reserved_through_the_applier(
    bus,
    tmp_path,
    placement,
    host_name,
):
    bus.start(1)
    sender = bus.sender(host_name, timeout=60)
    guest, with_guest, without = holding_guest(tmp_path, host_name)
    gpu, vfs = f"{host_name}_{GPU.upper()}", f"{host_name}_{PF.upper()}"

    def cycle(settings) -> tuple[int, int]:
        report = sender.send(compute_desired(settings))
        assert report.ok, report.errors
        return reserved_of(placement, host_name)

    assert cycle(with_guest) == (1, 1)
    assert cycle(without) == (0, 0)
    tree = tree_by_name(placement, host_name)
    allocate(
        placement, guest["uuid"], {tree[gpu]["uuid"]: {GPU_RC: 1}, tree[vfs]["uuid"]: {VF_RC: 1}}
    )
    assert cycle(with_guest) == (0, 0)
    placement.delete(f"/allocations/{guest['uuid']}")
    assert cycle(with_guest) == (1, 1)
