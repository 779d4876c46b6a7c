"""Wire 2.4 end to end: through a real ``node-agent-applier`` on a real
RabbitMQ into the real Placement, a NUMA host gets the tree and the reshape
the direct mode gives it (floating guests placed by CPU and memory, the
flat fallback of a refused NUMA reshape), ``[placement] aggregates`` are
joined with the direct mode's rules, and a 2.3 agent's message is still
applied, the applier saying once what it lacks.

Each scenario runs twice on the fixture host linux-test4 (node 0 = CPUs
0-7, 65432 MiB; node 1 = CPUs 8-15, 65536 MiB): once with the direct
mode's cycle, once through the applier, each on its own root and guests;
their outcomes are compared by provider name."""

from __future__ import annotations

import re
import uuid

import pytest

from node_agent.cycle.desired import compute_desired
from node_agent.cycle.reconcile import ReshapeRefused
from node_agent.remote import signing, wire
from node_agent.state import AGGREGATES, StateStore
from tests.integration.reshape_driver import allocate
from tests.integration.test_aggregates import held, operator_adds
from tests.integration.test_applier import bus  # noqa: F401 (fixture)
from tests.integration.test_nested_reshape import NestedHost, guest, prefix
from tests.unit.test_wire_2_4 import without_2_4

pytestmark = pytest.mark.integration

A, B, OPERATOR = (str(uuid.uuid4()) for _ in range(3))


class Mode:
    """One host of a scenario, run by the direct mode (``sender`` None) or
    through the applier."""

    def __init__(self, tmp_path, url, name, guests, sender=None):
        self.host = NestedHost(tmp_path, url, name, guests)
        self.guests = guests
        self.sender = sender

    def cycle(self, **kw):
        """(refusal text or None, ok) of one cycle of the host's agent."""
        if self.sender is None:
            outcome, report, _ = self.host.cycle(**kw)
            refused = str(outcome) if isinstance(outcome, ReshapeRefused) else None
            return refused, report.ok
        reply = self.sender.send(compute_desired(self.host.settings(**kw)))
        assert reply.status == wire.APPLIED, reply
        refused = "\n".join((reply.reshape or {}).get("refused") or []) or None
        return refused, reply.ok or (refused is not None and reply.errors == [refused])

    def allocate_on_root(self) -> None:
        root = self.host.root
        for g in self.guests:
            allocate(
                self.host.scheduler,
                g["uuid"],
                {root: {"VCPU": g["vcpus"], "MEMORY_MB": g["memory"]}},
            )

    def seen(self) -> tuple[dict, dict]:
        """(provider suffix -> (parent suffix, inventories totals and reserved),
        guest number -> provider suffix -> resources), the host's name left out."""
        tree = self.host.tree()
        names = {uuid: name for name, (uuid, _parent) in tree.items()}

        def suffix(name):
            return name[len(self.host.name) :] or "root"

        found = self.host.scheduler
        providers = {
            suffix(name): (
                suffix(names[parent]) if parent else None,
                {
                    rc: (inv["total"], inv["reserved"])
                    for rc, inv in found.get(f"/resource_providers/{rp}/inventories")[
                        "inventories"
                    ].items()
                },
            )
            for name, (rp, parent) in tree.items()
        }
        allocations = {
            n: {suffix(names[rp]): res for rp, res in by_rp.items()}
            for n, by_rp in enumerate(self.host.allocations().values())
        }
        return providers, allocations


def both(bus, tmp_path, url, host_name, guests_of):
    """The scenario's two hosts: direct, then through the applier."""
    bus.start(1)
    direct = Mode(tmp_path / "direct", url, f"{host_name}-d", guests_of(prefix()))
    name = f"{host_name}-m"
    via = Mode(tmp_path / "via", url, name, guests_of(prefix()), bus.sender(name, timeout=60))
    return direct, via


# 4 vCPUs and 1 GiB on node 0, 1 vCPU and 30 GiB on node 1 (numatune):
# node 1 has more VCPU left, node 0 more memory. The floating guest (no pins,
# no numatune; 2 vCPUs, 40 GiB) fits node 0 only.
def memory_bound(p: str) -> list[dict]:
    return [
        guest(1, p, vcpus=4, nodes="0"),
        guest(2, p, vcpus=1, nodes="1", memory=30 * 1024),
        guest(3, p, memory=40 * 1024),
    ]


def test_a_floating_guest_through_the_applier_goes_where_its_memory_fits_as_in_direct_mode(
    bus,
    tmp_path,
    placement_server,
    host_name,
):
    direct, via = both(bus, tmp_path, placement_server.url, host_name, memory_bound)
    results = []
    for mode in (direct, via):
        assert mode.cycle(dedicated=None, shared=None) == (None, True)
        mode.allocate_on_root()
        assert mode.cycle(dedicated=None, shared=None, numa_in_placement=True) == (None, True)
        results.append(mode.seen())
    assert results[1] == results[0]
    _providers, allocations = results[1]
    assert allocations[2] == {"_NUMA_0": {"VCPU": 2, "MEMORY_MB": 40 * 1024}}
    assert allocations[1] == {"_NUMA_1": {"VCPU": 1, "MEMORY_MB": 30 * 1024}}


def test_a_refused_numa_reshape_through_the_applier_writes_the_tree_flat_as_in_direct_mode(
    bus,
    tmp_path,
    placement_server,
    host_name,
):
    def guests_of(p):  # guest 2 is pinned to a CPU of each node: refused
        return [guest(1, p, pins=(2, 3), nodes="0"), guest(2, p, pins=(4, 12))]

    direct, via = both(bus, tmp_path, placement_server.url, host_name, guests_of)
    results = []
    for mode in (direct, via):
        assert mode.cycle(dedicated=None, shared=None) == (None, True)
        mode.allocate_on_root()
        # One change: a dedicated set (the pinned guests' VCPU becomes PCPU)
        # and NUMA children, which guest 2 refuses.
        refused, ok = mode.cycle(numa_in_placement=True)
        assert ok and refused is not None
        assert f"({mode.guests[1]['uuid']}) spans NUMA nodes 0-1" in refused
        assert "written as with [compute] numa_in_placement off" in refused
        results.append(mode.seen())
    assert results[1] == results[0]
    providers, allocations = results[1]
    assert list(providers) == ["root"] and providers["root"][1]["PCPU"] == (8, 0)
    assert allocations == {n: {"root": {"PCPU": 2, "MEMORY_MB": 1024}} for n in (0, 1)}


def test_aggregates_through_the_applier_are_added_and_only_ours_removed(
    bus,
    tmp_path,
    placement_server,
    placement,
    host_name,
):
    bus.start(1)
    host = NestedHost(tmp_path, placement_server.url, host_name, [])
    sender = bus.sender(host_name, timeout=60)

    def joins(*aggregates) -> set:
        report = sender.send(compute_desired(host.settings(placement_aggregates=aggregates)))
        assert report.ok, report.errors
        return held(placement, host.root)

    assert joins(A, B) == {A, B}
    operator_adds(placement, host.root, OPERATOR)
    assert joins(A) == {A, OPERATOR}  # ours removed, the operator's kept
    assert StateStore(bus.state / host_name).load()[AGGREGATES]["ours"] == [A]
    # The applier's record of the host is lost: it cannot tell ours from an
    # operator's any more.
    for file in (bus.state / host_name).iterdir():
        file.unlink()
    assert joins() == {A, OPERATOR}  # nothing removed
    assert joins(B) == {A, B, OPERATOR}  # added
    assert joins() == {A, OPERATOR}  # the one it added since, removed


def test_a_2_3_message_is_still_applied_and_the_applier_says_once_what_it_lacks(
    bus,
    tmp_path,
    placement_server,
    host_name,
):
    (applier,) = bus.start(1)
    host = NestedHost(tmp_path, placement_server.url, host_name, memory_bound(prefix()))
    sender = bus.sender(host_name, timeout=60)

    def send_2_3(seq: int, **kw) -> dict:
        body = without_2_4(wire.body_of(compute_desired(host.settings(**kw))))
        envelope = {"version": "2.3", "host": host_name, "seq": seq, "digest": wire.digest_of(body)}
        message = signing.sign(envelope, sender.key) | {"body": body}
        return sender._client.call({}, "apply", message=message)

    reply = send_2_3(1, dedicated=None, shared=None)
    assert reply["status"] == wire.APPLIED and reply["ok"], reply
    root = host.root
    for g in host.guests:
        allocate(host.scheduler, g["uuid"], {root: {"VCPU": g["vcpus"], "MEMORY_MB": 1024}})
    for seq in (2, 3):
        reply = send_2_3(seq, dedicated=None, shared=None, numa_in_placement=True)
        assert reply["status"] == wire.APPLIED and reply["ok"], reply
    # Applied by the 2.3 rules: NUMA children, the floating guest placed by
    # its CPUs alone (node 1 has more VCPU left), its memory unknown.
    tree = host.tree()
    assert len(tree) == 3
    node1 = tree[f"{host_name}_NUMA_1"][0]
    assert host.allocations()[host.guests[2]["uuid"]] == {node1: {"VCPU": 2, "MEMORY_MB": 1024}}
    # The flat message lacked the guests' memory, the nested ones the flat
    # tree too: each said once.
    warned = re.findall(
        rf"{re.escape(host_name)} sends wire format 2\.3, without (.*); applied", applier.log()
    )
    assert warned == [wire.LACKS_MEMORY, wire.LACKS_FLAT], applier.log()
