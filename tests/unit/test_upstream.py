"""The messaging upstream's wire format: what an agent sends and what the
applier accepts, built from real fixture hosts. Pure: no bus, no Placement."""

import copy
import dataclasses
import json
import re
import uuid

import pytest

from node_agent import upstream
from node_agent.cpuset import parse_cpu_spec, parse_cpulist
from node_agent.cycle import desired_from
from node_agent.reshape import host_rule, rule_provider_names
from node_agent.topology import Guest, GuestMdev, MdevTypeInfo, PciGpu
from tests.snapshots import settings, snapshot

GPU1, GPU2 = "0000:81:00.0", "0000:82:00.0"
MDEV_TYPE = "nvidia-222"

PINNED = Guest(uuid="6695eb01-f6a4-8304-79aa-97f2502e193f", name="pinned", vcpus=2,
               running=True, memory_kb=2097152,
               vcpupin=((0, parse_cpulist("2")), (1, parse_cpulist("3"))),
               metadata=(("hw:cpu_policy", "dedicated"), ("nova:name", "web-1")),
               mdevs=(GuestMdev("b1ae8bf6-38b0-4c81-9d44-78ce3f520496", GPU1),))
# One of each case the nested rules decide on (linux-test4: node 0 = CPUs
# 0-7, node 1 = CPUs 8-15): on node 1 with an mdev on each GPU; floating
# with numatune only; spanning both nodes; an mdev whose parent is unknown.
OTHERS = (
    Guest(uuid="0f1c9a4e-5d0b-4c52-9f8e-4e1f1e0a0b01", name="node1", vcpus=2, running=True,
          memory_kb=1048576, vcpupin=((0, parse_cpulist("10")), (1, parse_cpulist("11"))),
          numa_nodes=frozenset({1}),
          mdevs=(GuestMdev("5a7e0a52-7a43-4f4b-a0a1-0d1b0b0f0e01", GPU1),
                 GuestMdev("5a7e0a52-7a43-4f4b-a0a1-0d1b0b0f0e02", GPU2))),
    Guest(uuid="0f1c9a4e-5d0b-4c52-9f8e-4e1f1e0a0b02", name="floating", vcpus=2,
          running=False, memory_kb=1048576, numa_nodes=frozenset({1})),
    Guest(uuid="0f1c9a4e-5d0b-4c52-9f8e-4e1f1e0a0b03", name="spanning", vcpus=2,
          running=True, memory_kb=1048576,
          vcpupin=((0, parse_cpulist("4")), (1, parse_cpulist("12"))),
          numa_nodes=frozenset({0, 1})),
    Guest(uuid="0f1c9a4e-5d0b-4c52-9f8e-4e1f1e0a0b04", name="orphan-mdev", vcpus=1,
          running=True, memory_kb=1048576, vcpupin=((0, parse_cpulist("5")),),
          mdevs=(GuestMdev("5a7e0a52-7a43-4f4b-a0a1-0d1b0b0f0e03", None),)),
)


def gpu(address: str) -> PciGpu:
    return PciGpu(address=address, mdev_types=(
        MdevTypeInfo(MDEV_TYPE, available_instances=2, name="GRID T4-2B"),))


@pytest.fixture
def desired(tmp_path):
    host = snapshot("virhostcpudata/linux-test4", tmp_path, guests=(PINNED,))
    return desired_from(settings(host="node1", cpu_dedicated_set=parse_cpu_spec("2-5"),
                                 cpu_shared_set=parse_cpu_spec("0-1,6-15"),
                                 numa_in_placement=True), host)


@pytest.fixture
def nested(tmp_path):
    """NUMA children and GPU children, with every kind of guest."""
    host = snapshot("virhostcpudata/linux-test4", tmp_path, guests=(PINNED, *OTHERS),
                    gpus=(gpu(GPU1), gpu(GPU2)))
    return desired_from(settings(host="node1", cpu_dedicated_set=parse_cpu_spec("2-5,10-13"),
                                 cpu_shared_set=parse_cpu_spec("0-1,6-9,14-15"),
                                 numa_in_placement=True, enabled_mdev_types=(MDEV_TYPE,)),
                        host)


def rebuilt(desired):
    message = json.loads(json.dumps(upstream.full_message("node1", 7, upstream.body_of(desired))))
    parsed = upstream.parse_message(message)
    return upstream.desired_from_body(parsed.body, parsed.host)


def test_full_message_round_trips_tree_and_reshape_inputs(desired):
    remote = rebuilt(desired)
    assert remote.tree == desired.tree
    assert len(remote.tree.providers) > 1  # NUMA children travel too
    guest, = remote.host.guests
    assert (guest.uuid, guest.name, guest.vcpus, guest.vcpupin, guest.mdevs) == \
        (PINNED.uuid, PINNED.name, PINNED.vcpus, PINNED.vcpupin, PINNED.mdevs)
    assert guest.pinned and guest.metadata == (("hw:cpu_policy", "dedicated"),)
    assert remote.partition.dedicated == desired.partition.dedicated
    assert [(n.id, n.cpus) for n in remote.host.nodes] == \
        [(n.id, n.cpus) for n in desired.host.nodes]
    assert all(remote.host.node_of(c) == desired.host.node_of(c) for c in range(17))


def _decisions(desired, host, dedicated):
    """Everything the rule chain decides for every guest and every class it
    could move off the root, with the same uuids on both sides."""
    uuids = {p.name: str(uuid.uuid5(uuid.NAMESPACE_DNS, p.name))
             for p in desired.tree.providers}
    tree = desired.tree.with_uuids(uuids)
    rule = host_rule(tree, host, dedicated)
    root = uuids["node1"]
    places = {(g.uuid, rc): (rule(g.uuid, root, rc, n), rule.unplaced(g.uuid, root, rc, n))
              for g in desired.host.guests
              for rc, n in (("VCPU", g.vcpus), ("PCPU", g.vcpus), ("MEMORY_MB", 1024),
                            ("VGPU", len(g.mdevs)))}
    moved = [g.uuid for g in desired.host.guests]
    return (rule_provider_names(tree, host), rule.sources, rule.targets, rule.classes,
            places, rule.refusals(moved, {g.uuid: g.name for g in desired.host.guests}))


def test_applier_rebuilds_every_decision_of_the_nested_rules(nested):
    assert any("_pci_" in p.name for p in nested.tree.providers)
    assert any("_NUMA_" in p.name for p in nested.tree.providers)
    remote = rebuilt(nested)
    here = _decisions(nested, nested.host, nested.partition.dedicated)
    there = _decisions(nested, remote.host, remote.partition.dedicated)
    assert there == here
    # Guests alone (wire 1.0) decided otherwise: the new fields matter.
    guests_only = upstream.RemoteHost(remote.host.guests)
    assert _decisions(nested, guests_only, remote.partition.dedicated) != here
    names, _sources, targets, _classes, places, _refusals = here
    assert len(names) == len(targets) == 5  # root, 2 NUMA, 2 GPU children
    node_moves = {(g, rc): out for (g, rc), (out, why) in places.items() if not why}
    refused = " ".join(" ".join(why) for _out, why in places.values())
    assert "spanning" in refused and "orphan-mdev" in refused  # decided, and the same
    assert len(node_moves) > 10


def test_digest_changes_with_the_tree_and_not_with_key_order(desired):
    body = upstream.body_of(desired)
    shuffled = json.loads(json.dumps(body, sort_keys=False))
    assert upstream.digest_of(shuffled) == upstream.digest_of(body)
    changed = copy.deepcopy(body)
    changed["tree"][0]["inventories"]["DISK_GB"]["reserved"] += 1
    assert upstream.digest_of(changed) != upstream.digest_of(body)
    repinned = dataclasses.replace(desired, host=dataclasses.replace(
        desired.host, guests=(dataclasses.replace(PINNED, vcpupin=()),)))
    assert upstream.digest_of(upstream.body_of(repinned)) != upstream.digest_of(body)


def _digest_with(desired, **host_changes) -> str:
    host = dataclasses.replace(desired.host, **host_changes)
    return upstream.digest_of(upstream.body_of(dataclasses.replace(desired, host=host)))


def _with_guest(desired, name, **changes):
    return tuple(dataclasses.replace(g, **changes) if g.name == name else g
                 for g in desired.host.guests)


def test_digest_follows_every_input_of_the_nested_rules_and_nothing_else(nested):
    same = _digest_with(nested)
    nodes = nested.host.nodes
    moved_cpu = (dataclasses.replace(nodes[0], cpus=nodes[0].cpus - parse_cpulist("7")),
                 dataclasses.replace(nodes[1], cpus=nodes[1].cpus | parse_cpulist("7")))
    changes = {
        "node CPU map": dict(nodes=moved_cpu),
        "GPU gone": dict(gpus=(gpu(GPU1),)),
        "numatune": dict(guests=_with_guest(nested, "floating", numa_nodes=frozenset({0}))),
        "mdev parent": dict(guests=_with_guest(nested, "pinned", mdevs=(
            GuestMdev(PINNED.mdevs[0].uuid, GPU2),))),
        "cpu policy": dict(guests=_with_guest(nested, "pinned", metadata=())),
    }
    for what, change in changes.items():
        assert _digest_with(nested, **change) != same, what
    unread = {
        "started": dict(guests=_with_guest(nested, "floating", running=True)),
        "renamed in nova": dict(guests=_with_guest(nested, "pinned", metadata=(
            ("hw:cpu_policy", "dedicated"), ("nova:name", "web-2")))),
        "memory": dict(guests=_with_guest(nested, "pinned", memory_kb=1)),
    }
    for what, change in unread.items():
        assert _digest_with(nested, **change) == same, what


def test_heartbeat_is_small_and_has_no_body(desired):
    digest = upstream.digest_of(upstream.body_of(desired))
    beat = upstream.heartbeat("node1", 8, digest)
    assert len(json.dumps(beat)) < 200
    assert upstream.parse_message(beat).body is None


def _message(desired, mutate):
    body = copy.deepcopy(upstream.body_of(desired))
    mutate(body)
    return upstream.full_message("node1", 1, body)


@pytest.mark.parametrize("mutate, words", [
    (lambda b: b["tree"][0].update(name="node2"), "comes from host 'node1'"),
    (lambda b: b["tree"][1].update(name="node2_NUMA_0"), "not this host's"),
    (lambda b: b["tree"][1].update(parent="node2"), "not listed before it"),
    (lambda b: b["tree"][1].update(parent=None), "a second root"),
    (lambda b: b["tree"].append(dict(b["tree"][1])), "appears twice"),
    (lambda b: b["tree"][0]["inventories"]["DISK_GB"].update(total=-1), "non-negative"),
    (lambda b: b["tree"][0]["inventories"]["DISK_GB"].update(allocation_ratio=0), "above 0"),
    (lambda b: b["tree"][0]["traits"].update(HW_CPU_X86_AVX="yes"), "true (wanted)"),
    (lambda b: b["tree"][0].update(uuid="not-a-uuid"), "is not a uuid"),
    (lambda b: b["reshape"].update(dedicated="2-x"), "body.reshape.dedicated"),
    (lambda b: b.update(tree=[]), "1 to 1000 providers"),
    (lambda b: b.pop("reshape"), "body.reshape: must be an object"),
    # The nested rules' inputs.
    (lambda b: b["reshape"]["numa"][1].update(cpus="7-15"), "CPU 7 is in node 0 too"),
    (lambda b: b["reshape"]["numa"][1].update(id=0), "node 0 appears twice"),
    (lambda b: b["reshape"]["numa"][1].update(id="1"), "body.reshape.numa[1]"),
    (lambda b: b["reshape"]["numa"].pop(), "NUMA node 1 is not described"),
    (lambda b: b["reshape"].update(numa={}), "body.reshape.numa: must be a list"),
    (lambda b: b["reshape"]["gpus"][0].update(provider="node1_gpu_1"), "disagree on naming"),
    (lambda b: b["reshape"]["gpus"][0].update(address="81:00.0"), "not a PCI address"),
    (lambda b: b["reshape"]["gpus"].append(dict(b["reshape"]["gpus"][0])), "appears twice"),
    (lambda b: b["reshape"]["gpus"].pop(), "not described in body.reshape.gpus"),
    (lambda b: b["reshape"]["guests"][0].pop("uuid"), "uuid (the consumer) is required"),
    (lambda b: b["reshape"]["guests"][1].update(uuid=b["reshape"]["guests"][0]["uuid"]),
     "a guest uuid appears twice"),
    (lambda b: b["reshape"]["guests"][0]["mdevs"][0].update(parent="gpu0"),
     "mdevs[0].parent: 'gpu0' is not a PCI address"),
    (lambda b: b["reshape"]["guests"][0]["vcpupin"].append([0, "4"]), "vCPU 0 is pinned twice"),
    (lambda b: b["reshape"]["guests"][0]["vcpupin"][0].__setitem__(0, "0"),
     "must be [vcpu number, cpulist]"),
    (lambda b: b["reshape"]["guests"][0].update(numa_nodes=[-1]), "node ids"),
    (lambda b: b["reshape"]["guests"][0].update(metadata=[["hw:cpu_policy"]]),
     "[key, value] string pairs"),
])
def test_malformed_body_is_refused_with_where_and_why(nested, mutate, words):
    message = _message(nested, mutate)
    parsed = upstream.parse_message(message)
    with pytest.raises(upstream.Malformed, match=re.escape(words)):
        upstream.desired_from_body(parsed.body, parsed.host)


@pytest.mark.parametrize("change, words", [
    ({"version": "1.0"}, "older than this applier understands: upgrade node-agent on"),
    ({"version": "3.0"}, "newer than this applier understands: upgrade node-agent-applier"),
    ({"version": "two"}, "not a wire version"),
    ({"version": None}, "not a wire version"),
    ({"host": "../etc"}, "not a host name"),
    ({"seq": -1}, "non-negative"),
    ({"seq": True}, "non-negative"),
    ({"digest": "0" * 64}, "does not match the body"),
])
def test_malformed_envelope_is_refused(desired, change, words):
    message = {**upstream.full_message("node1", 1, upstream.body_of(desired)), **change}
    with pytest.raises(upstream.Malformed, match=words):
        upstream.parse_message(message)


def test_reply_becomes_a_report_the_service_can_log():
    report = upstream.report_from_reply({
        "status": "applied", "summary": "set VCPU total 8→16 on node1 (3 requests)",
        "errors": [], "applied": [{"method": "PUT", "path": "/resource_providers/x/inventories",
                                   "summary": "set VCPU", "provider": "node1"}],
        "uuids": {"node1": "x"}}, messages=1)
    assert report.ok and report.applied[0].provider == "node1"
    assert "via applier; 1 message" in report.summary()
    unchanged = upstream.report_from_reply({"status": "unchanged"}, messages=1)
    assert unchanged.summary() == "no change (heartbeat; 1 message)"


class Tripwire(AssertionError):
    pass


def _no_placement():
    raise Tripwire("the applier wanted Placement")


@pytest.mark.parametrize("cache, status", [
    ({"verified_at": 1000.0 - 299, "providers": []}, upstream.UNCHANGED),
    ({"verified_at": 1000.0 - 300, "providers": []}, None),   # full verify due
    (None, None),                                            # taken mid-apply: read
])
def test_heartbeat_is_answered_from_the_shared_record_until_the_verify_is_due(
        tmp_path, desired, cache, status):
    from node_agent.applier import Applier
    from node_agent.state import StateStore

    body = upstream.body_of(desired)
    digest = upstream.digest_of(body)
    StateStore(tmp_path / "node1").save({"applier": {
        "seq": 5, "digest": digest, "body": body, "ok": True, "by": "another process",
        "cache": cache}})
    # Another process, with nothing in memory and no way to reach Placement.
    applier = Applier(_no_placement, tmp_path, full_verify_interval=300, clock=lambda: 1000.0)
    reply = applier.handle(upstream.heartbeat("node1", 6, digest))
    if status is None:
        assert reply["status"] == upstream.ERROR and "Tripwire" in reply["error"]
    else:
        assert reply == {"status": status, "seq": 6, "requests": 0}
