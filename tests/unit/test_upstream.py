"""The messaging upstream's wire format: what an agent sends and what the
applier accepts, built from real fixture hosts. Pure: no bus, no Placement."""

import copy
import dataclasses
import json
import re
import uuid

import pytest

from node_agent.cycle.desired import desired_from
from node_agent.model.cpuset import parse_cpu_spec, parse_cpulist
from node_agent.model.snapshot import Guest, GuestMdev, MdevTypeInfo, PciGpu
from node_agent.placement.reshape_rules import host_rule, rule_provider_names
from node_agent.policy.guest_cpu import classify
from node_agent.remote import signing, upstream, wire
from tests.snapshots import settings, snapshot

MASTER = b"m" * 32  # the applier's master secret in these tests
KEY = signing.host_key(MASTER, "node1")
KEYRING = signing.Keyring((signing.Master(MASTER),))

GPU1, GPU2 = "0000:81:00.0", "0000:82:00.0"
MDEV_TYPE = "nvidia-222"

PINNED = Guest(
    uuid="6695eb01-f6a4-8304-79aa-97f2502e193f",
    name="pinned",
    vcpus=2,
    running=True,
    memory_kb=2097152,
    vcpupin=((0, parse_cpulist("2")), (1, parse_cpulist("3"))),
    metadata=(("hw:cpu_policy", "dedicated"), ("nova:name", "web-1")),
    mdevs=(GuestMdev("b1ae8bf6-38b0-4c81-9d44-78ce3f520496", GPU1),),
)
# One of each case the nested rules decide on (linux-test4: node 0 = CPUs
# 0-7, node 1 = CPUs 8-15): on node 1 with an mdev on each GPU; floating
# with numatune only; spanning both nodes; an mdev whose parent is unknown.
OTHERS = (
    Guest(
        uuid="0f1c9a4e-5d0b-4c52-9f8e-4e1f1e0a0b01",
        name="node1",
        vcpus=2,
        running=True,
        memory_kb=1048576,
        vcpupin=((0, parse_cpulist("10")), (1, parse_cpulist("11"))),
        numa_nodes=frozenset({1}),
        mdevs=(
            GuestMdev("5a7e0a52-7a43-4f4b-a0a1-0d1b0b0f0e01", GPU1),
            GuestMdev("5a7e0a52-7a43-4f4b-a0a1-0d1b0b0f0e02", GPU2),
        ),
    ),
    Guest(
        uuid="0f1c9a4e-5d0b-4c52-9f8e-4e1f1e0a0b02",
        name="floating",
        vcpus=2,
        running=False,
        memory_kb=1048576,
        numa_nodes=frozenset({1}),
    ),
    Guest(
        uuid="0f1c9a4e-5d0b-4c52-9f8e-4e1f1e0a0b03",
        name="spanning",
        vcpus=2,
        running=True,
        memory_kb=1048576,
        vcpupin=((0, parse_cpulist("4")), (1, parse_cpulist("12"))),
        numa_nodes=frozenset({0, 1}),
    ),
    Guest(
        uuid="0f1c9a4e-5d0b-4c52-9f8e-4e1f1e0a0b04",
        name="orphan-mdev",
        vcpus=1,
        running=True,
        memory_kb=1048576,
        vcpupin=((0, parse_cpulist("5")),),
        mdevs=(GuestMdev("5a7e0a52-7a43-4f4b-a0a1-0d1b0b0f0e03", None),),
    ),
)


def gpu(address: str) -> PciGpu:
    return PciGpu(
        address=address,
        mdev_types=(MdevTypeInfo(MDEV_TYPE, available_instances=2, name="GRID T4-2B"),),
    )


@pytest.fixture
def desired(tmp_path):
    host = snapshot("virhostcpudata/linux-test4", tmp_path, guests=(PINNED,))
    return desired_from(
        settings(
            host="node1",
            cpu_dedicated_set=parse_cpu_spec("2-5"),
            cpu_shared_set=parse_cpu_spec("0-1,6-15"),
            numa_in_placement=True,
        ),
        host,
    )


@pytest.fixture
def nested(tmp_path):
    """NUMA children and GPU children, with every kind of guest."""
    host = snapshot(
        "virhostcpudata/linux-test4",
        tmp_path,
        guests=(PINNED, *OTHERS),
        gpus=(gpu(GPU1), gpu(GPU2)),
    )
    return desired_from(
        settings(
            host="node1",
            cpu_dedicated_set=parse_cpu_spec("2-5,10-13"),
            cpu_shared_set=parse_cpu_spec("0-1,6-9,14-15"),
            numa_in_placement=True,
            enabled_mdev_types=(MDEV_TYPE,),
        ),
        host,
    )


def rebuilt(desired):
    message = json.loads(json.dumps(wire.full_message("node1", 7, wire.body_of(desired), KEY)))
    parsed = wire.parse_message(message)
    return wire.desired_from_body(parsed.body, parsed.host)


def test_full_message_round_trips_tree_and_reshape_inputs(desired):
    remote = rebuilt(desired)
    assert remote.tree == desired.tree
    assert len(remote.tree.providers) > 1  # NUMA children travel too
    (guest,) = remote.host.guests
    assert (guest.uuid, guest.name, guest.vcpus, guest.vcpupin, guest.mdevs) == (
        PINNED.uuid,
        PINNED.name,
        PINNED.vcpus,
        PINNED.vcpupin,
        PINNED.mdevs,
    )
    assert classify(guest).dedicated and guest.metadata == (("hw:cpu_policy", "dedicated"),)
    assert remote.partition.dedicated == desired.partition.dedicated
    assert [(n.id, n.cpus) for n in remote.host.nodes] == [
        (n.id, n.cpus) for n in desired.host.nodes
    ]
    assert all(remote.host.node_of(c) == desired.host.node_of(c) for c in range(17))


def _decisions(desired, host, dedicated):
    """Everything the rule chain decides for every guest and every class it
    could move off the root, with the same uuids on both sides."""
    uuids = {p.name: str(uuid.uuid5(uuid.NAMESPACE_DNS, p.name)) for p in desired.tree.providers}
    tree = desired.tree.with_uuids(uuids)
    rule = host_rule(tree, host, dedicated)
    root = uuids["node1"]
    places = {
        (g.uuid, rc): (rule(g.uuid, root, rc, n), rule.unplaced(g.uuid, root, rc, n))
        for g in desired.host.guests
        for rc, n in (
            ("VCPU", g.vcpus),
            ("PCPU", g.vcpus),
            ("MEMORY_MB", 1024),
            ("VGPU", len(g.mdevs)),
        )
    }
    moved = [g.uuid for g in desired.host.guests]
    return (
        rule_provider_names(tree, host),
        rule.sources,
        rule.targets,
        rule.classes,
        places,
        rule.refusals(moved, {g.uuid: g.name for g in desired.host.guests}),
    )


def test_applier_rebuilds_every_decision_of_the_nested_rules(nested):
    assert any("_pci_" in p.name for p in nested.tree.providers)
    assert any("_NUMA_" in p.name for p in nested.tree.providers)
    remote = rebuilt(nested)
    here = _decisions(nested, nested.host, nested.partition.dedicated)
    there = _decisions(nested, remote.host, remote.partition.dedicated)
    assert there == here
    # Guests alone (wire 1.0) decided otherwise: the new fields matter.
    guests_only = wire.RemoteHost(remote.host.guests)
    assert _decisions(nested, guests_only, remote.partition.dedicated) != here
    names, _sources, targets, _classes, places, _refusals = here
    assert len(names) == len(targets) == 5  # root, 2 NUMA, 2 GPU children
    node_moves = {(g, rc): out for (g, rc), (out, why) in places.items() if not why}
    refused = " ".join(" ".join(why) for _out, why in places.values())
    assert "spanning" in refused and "orphan-mdev" in refused  # decided, and the same
    assert len(node_moves) > 10


def test_digest_changes_with_the_tree_and_not_with_key_order(desired):
    body = wire.body_of(desired)
    shuffled = json.loads(json.dumps(body, sort_keys=False))
    assert wire.digest_of(shuffled) == wire.digest_of(body)
    changed = copy.deepcopy(body)
    changed["tree"][0]["inventories"]["DISK_GB"]["reserved"] += 1
    assert wire.digest_of(changed) != wire.digest_of(body)
    repinned = dataclasses.replace(
        desired,
        host=dataclasses.replace(desired.host, guests=(dataclasses.replace(PINNED, vcpupin=()),)),
    )
    assert wire.digest_of(wire.body_of(repinned)) != wire.digest_of(body)


def _digest_with(desired, **host_changes) -> str:
    host = dataclasses.replace(desired.host, **host_changes)
    return wire.digest_of(wire.body_of(dataclasses.replace(desired, host=host)))


def _with_guest(desired, name, **changes):
    return tuple(
        dataclasses.replace(g, **changes) if g.name == name else g for g in desired.host.guests
    )


def test_digest_follows_every_input_of_the_nested_rules_and_nothing_else(nested):
    same = _digest_with(nested)
    nodes = nested.host.nodes
    moved_cpu = (
        dataclasses.replace(nodes[0], cpus=nodes[0].cpus - parse_cpulist("7")),
        dataclasses.replace(nodes[1], cpus=nodes[1].cpus | parse_cpulist("7")),
    )
    changes = {
        "node CPU map": dict(nodes=moved_cpu),
        "GPU gone": dict(gpus=(gpu(GPU1),)),
        "numatune": dict(guests=_with_guest(nested, "floating", numa_nodes=frozenset({0}))),
        "mdev parent": dict(
            guests=_with_guest(nested, "pinned", mdevs=(GuestMdev(PINNED.mdevs[0].uuid, GPU2),))
        ),
        "cpu policy": dict(guests=_with_guest(nested, "pinned", metadata=())),
        # Since 2.4: the floating guests' placement and the migration records read it.
        "memory": dict(guests=_with_guest(nested, "pinned", memory_kb=PINNED.memory_kb + 1024)),
    }
    for what, change in changes.items():
        assert _digest_with(nested, **change) != same, what
    unread = {
        "started": dict(guests=_with_guest(nested, "floating", running=True)),
        "renamed in nova": dict(
            guests=_with_guest(
                nested, "pinned", metadata=(("hw:cpu_policy", "dedicated"), ("nova:name", "web-2"))
            )
        ),
        # Below one MiB: the rules count MiB.
        "memory by a KiB": dict(
            guests=_with_guest(nested, "pinned", memory_kb=PINNED.memory_kb + 1023)
        ),
    }
    for what, change in unread.items():
        assert _digest_with(nested, **change) == same, what


def test_heartbeat_is_small_and_has_no_body(desired):
    digest = wire.digest_of(wire.body_of(desired))
    beat = wire.heartbeat("node1", 8, digest, KEY)
    assert len(json.dumps(beat)) < 256  # signed since 2.2
    assert wire.parse_message(beat).body is None


def _message(desired, mutate):
    body = copy.deepcopy(wire.body_of(desired))
    mutate(body)
    return wire.full_message("node1", 1, body, KEY)


@pytest.mark.parametrize(
    "mutate, words",
    [
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
        (lambda b: b.pop("reshape"), "body: 'reshape' is required"),
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
        (
            lambda b: b["reshape"]["guests"][0].pop("uuid"),
            "body.reshape.guests[0]: 'uuid' is required",
        ),
        (
            lambda b: b["reshape"]["guests"][1].update(uuid=b["reshape"]["guests"][0]["uuid"]),
            "a guest uuid appears twice",
        ),
        (
            lambda b: b["reshape"]["guests"][0]["mdevs"][0].update(parent="gpu0"),
            "mdevs[0].parent: is not a PCI address",
        ),
        (lambda b: b["reshape"]["guests"][0]["vcpupin"].append([0, "4"]), "vCPU 0 is pinned twice"),
        (
            lambda b: b["reshape"]["guests"][0]["vcpupin"][0].__setitem__(0, "0"),
            "vcpupin[0][0]: must be a non-negative integer",
        ),
        (lambda b: b["reshape"]["guests"][0].update(numa_nodes=[-1]), "node ids"),
        (
            lambda b: b["reshape"]["guests"][0].update(metadata=[["hw:cpu_policy"]]),
            "[key, value] string pairs",
        ),
    ],
)
def test_malformed_body_is_refused_with_where_and_why(nested, mutate, words):
    message = _message(nested, mutate)
    # The schema refuses in parse_message, a rule across fields in
    # desired_from_body: the applier calls both.
    with pytest.raises(wire.Malformed, match=re.escape(words)):  # noqa: PT012 - either call
        parsed = wire.parse_message(message)
        wire.desired_from_body(parsed.body, parsed.host)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"version": "1.0"}, "older than this applier understands: upgrade node-agent on"),
        ({"version": "3.0"}, "newer than this applier understands: upgrade node-agent-applier"),
        ({"version": "two"}, "not a wire version"),
        ({"version": None}, "not a wire version"),
        ({"host": "../etc"}, "not a host name"),
        ({"seq": -1}, "non-negative"),
        ({"seq": True}, "non-negative"),
        ({"digest": "0" * 64}, "does not match the body"),
    ],
)
def test_malformed_envelope_is_refused(desired, change, words):
    message = {**wire.full_message("node1", 1, wire.body_of(desired), KEY), **change}
    with pytest.raises(wire.Malformed, match=words):
        wire.parse_message(message)


def test_reply_becomes_a_report_the_service_can_log():
    report = upstream.report_from_reply(
        {
            "status": "applied",
            "summary": "set VCPU total 8→16 on node1 (3 requests)",
            "errors": [],
            "applied": [
                {
                    "method": "PUT",
                    "path": "/resource_providers/x/inventories",
                    "summary": "set VCPU",
                    "provider": "node1",
                }
            ],
            "uuids": {"node1": "x"},
        },
        messages=1,
    )
    assert report.ok and report.applied[0].provider == "node1"
    assert "via applier; 1 message" in report.summary()
    unchanged = upstream.report_from_reply({"status": "unchanged"}, messages=1)
    assert unchanged.summary() == "no change (heartbeat; 1 message)"


class Tripwire(AssertionError):
    pass


def _no_placement():
    raise Tripwire("the applier wanted Placement")


@pytest.mark.parametrize(
    "cache, status",
    [
        ({"verified_at": 1000.0 - 299, "providers": []}, wire.UNCHANGED),
        ({"verified_at": 1000.0 - 300, "providers": []}, None),  # full verify due
        (None, None),  # taken mid-apply: read
    ],
)
def test_heartbeat_is_answered_from_the_shared_record_until_the_verify_is_due(
    tmp_path, desired, cache, status
):
    from node_agent.applier.applier import Applier
    from node_agent.state import StateStore

    body = wire.body_of(desired)
    digest = wire.digest_of(body)
    StateStore(tmp_path / "node1").save(
        {
            "applier": {
                "seq": 5,
                "digest": digest,
                "body": body,
                "ok": True,
                "by": "another process",
                "cache": cache,
            }
        }
    )
    # Another process, with nothing in memory and no way to reach Placement.
    applier = Applier(
        _no_placement, tmp_path, full_verify_interval=300, clock=lambda: 1000.0, keyring=KEYRING
    )
    reply = applier.handle(wire.heartbeat("node1", 6, digest, KEY))
    if status is None:
        assert reply["status"] == wire.ERROR and "Tripwire" in reply["error"]
    else:
        assert reply == {"status": status, "seq": 6, "requests": 0}


def test_guests_that_do_not_fit_are_refused_on_the_host_and_nothing_is_sent(tmp_path):
    host = snapshot("virhostcpudata/linux-test4", tmp_path, guests=(PINNED, OTHERS[1]))
    desired = desired_from(settings(host="node1", cpu_dedicated_set=parse_cpu_spec("3-15")), host)
    # No bus is needed: the refusal comes before any message.
    sender = object.__new__(upstream.MessagingUpstream)
    sender.host, sender.timeout, sender.seq, sender.acked = "node1", 1.0, 0, None
    sender.messages_sent = 0

    report = sender.send(desired)

    assert not report.ok and report.messages == 0 and sender.messages_sent == 0
    # The pinned guest outside the dedicated set is nova's warning, not a refusal.
    assert [r.split(" (")[0] for r in report.reshape["refused"]] == ["shared guest floating"]
    assert "cpu_shared_set is empty" in report.errors[0]


def test_keep_placement_ratio_crosses_the_wire_so_the_applier_keeps_operator_ratios():
    from node_agent.model.provider_tree import Inventory

    kept = Inventory(16, allocation_ratio=4.0, keep_placement_ratio=True)
    assert wire.inventory_from_wire(wire.inventory_to_wire(kept), "x") == kept
    assert "keep_placement_ratio" not in wire.inventory_to_wire(Inventory(16))


# ---------------------------------------------------------------- the published schema


def _full(nested) -> dict:
    return json.loads(json.dumps(wire.full_message("node1", 1, wire.body_of(nested), KEY)))


def _at(message: dict, path: tuple):
    for part in path:
        message = message[part]
    return message


def _path(where: tuple) -> str:
    """``body.tree[0].uuid``: how a refusal names the place."""
    text = ""
    for part in where:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text or "message"


def _older(message: dict) -> dict:
    """``message`` with the body a 2.3 agent sent (no 2.4 keys)."""
    from tests.unit.test_wire_2_4 import without_2_4

    return _redigest({**message, "body": without_2_4(message["body"])})


def _redigest(message: dict) -> dict:
    if "body" in message:
        message["digest"] = wire.digest_of(message["body"])
    return message


# Every key wire format 2.0 requires, at each level (the object's path, the key).
REQUIRED = (
    [((), k) for k in ("version", "host", "seq", "digest")]
    + [(("body",), "tree"), (("body",), "reshape")]
    + [(("body", "tree", 0), k) for k in ("name", "parent", "uuid", "inventories", "traits")]
    + [
        (("body", "tree", 0, "inventories", "DISK_GB"), k)
        for k in ("total", "reserved", "min_unit", "max_unit", "step_size", "allocation_ratio")
    ]
    + [(("body", "reshape"), k) for k in ("dedicated", "guests", "numa", "gpus")]
    + [
        (("body", "reshape", "guests", 0), k)
        for k in ("uuid", "name", "vcpus", "vcpupin", "numa_nodes", "mdevs", "metadata")
    ]
    + [(("body", "reshape", "guests", 0, "mdevs", 0), k) for k in ("uuid", "parent")]
    + [(("body", "reshape", "numa", 0), k) for k in ("id", "cpus")]
    + [(("body", "reshape", "gpus", 0), k) for k in ("address", "provider")]
)


@pytest.mark.parametrize(
    "where, key", REQUIRED, ids=[".".join(map(str, (*w, k))) for w, k in REQUIRED]
)
def test_each_required_field_missing_is_refused_naming_its_path(nested, where, key):
    message = _full(nested)
    del _at(message, where)[key]
    if where:
        _redigest(message)
    words = "not a wire version" if key == "version" else f"{_path(where)}: {key!r} is required"
    with pytest.raises(wire.Malformed, match=re.escape(words)):
        wire.parse_message(message)


@pytest.mark.parametrize(
    "where, value, words",
    [
        (("host",), 7, "host: is not a host name"),
        (("seq",), 1.0, "seq: must be a non-negative integer"),
        (("seq",), "1", "seq: must be a non-negative integer"),
        (("digest",), None, "digest: must be a sha256 in hex"),
        (("body",), [], "body: must be an object"),
        (("body", "tree"), {}, "body.tree: must be a list of 1 to 1000 providers"),
        (("body", "tree", 0), "node1", "body.tree[0]: must be an object"),
        (("body", "tree", 0, "name"), 1, "body.tree[0].name: name must be a string"),
        (("body", "tree", 0, "parent"), 0, "body.tree[0].parent: parent must be a name or null"),
        (("body", "tree", 0, "uuid"), 1, "body.tree[0].uuid: is not a uuid"),
        (("body", "tree", 0, "inventories"), [], "body.tree[0].inventories: must be an object"),
        (
            ("body", "tree", 0, "inventories", "DISK_GB", "total"),
            True,
            "inventories.DISK_GB.total: must be a non-negative integer",
        ),
        (
            ("body", "tree", 0, "inventories", "DISK_GB", "total"),
            16.0,
            "inventories.DISK_GB.total: must be a non-negative integer",
        ),
        (
            ("body", "tree", 0, "inventories", "DISK_GB", "max_unit"),
            "16",
            "inventories.DISK_GB.max_unit: must be null or a positive integer",
        ),
        (
            ("body", "tree", 0, "inventories", "DISK_GB", "allocation_ratio"),
            "16.0",
            "inventories.DISK_GB.allocation_ratio: must be a number above 0",
        ),
        (
            ("body", "tree", 0, "inventories", "DISK_GB"),
            16,
            "inventories.DISK_GB: must be an object",
        ),
        (
            ("body", "tree", 0, "traits"),
            ["HW_CPU_X86_AVX"],
            "body.tree[0].traits: must be an object",
        ),
        (("body", "reshape"), None, "body.reshape: must be an object"),
        (("body", "reshape", "dedicated"), [2, 3], "body.reshape.dedicated: must be a string"),
        (("body", "reshape", "guests"), {}, "body.reshape.guests: must be a list"),
        (("body", "reshape", "guests", 0, "name"), None, "guests[0].name: must be a non-empty"),
        (("body", "reshape", "guests", 0, "vcpus"), "2", "guests[0].vcpus: must be a non-negative"),
        (("body", "reshape", "guests", 0, "vcpupin"), "0:2", "guests[0].vcpupin: must be a list"),
        (("body", "reshape", "guests", 0, "vcpupin", 0, 1), 2, "vcpupin[0][1]: must be a string"),
        (("body", "reshape", "guests", 0, "numa_nodes"), 0, "guests[0].numa_nodes: must be a list"),
        (("body", "reshape", "guests", 0, "mdevs", 0), "uuid", "mdevs[0]: must be an object"),
        (
            ("body", "reshape", "guests", 0, "mdevs", 0, "parent"),
            81,
            "mdevs[0].parent: is not a PCI",
        ),
        (("body", "reshape", "guests", 0, "metadata", 0, 1), 1, "metadata[0][1]: must be a string"),
        (("body", "reshape", "numa", 0, "cpus"), [0, 1], "numa[0].cpus: must be a string"),
        (("body", "reshape", "gpus", 0, "provider"), None, "gpus[0].provider: must be a string"),
    ],
)
def test_wrong_type_is_refused_naming_its_path(nested, where, value, words):
    message = _full(nested)
    _at(message, where[:-1])[where[-1]] = value
    if where[0] == "body":
        _redigest(message)
    with pytest.raises(wire.Malformed, match=re.escape(words)):
        wire.parse_message(message)


def test_unknown_key_is_refused_in_a_known_minor_and_ignored_from_a_newer_minor(nested):
    """A minor adds optional keys only: a 2.1 message with a key 2.1 lacks
    is the sender's bug; a 2.9 message may carry keys this 2.1 reader does
    not know yet."""
    for where in ((), ("body",), ("body", "tree", 0), ("body", "reshape", "guests", 0)):
        message = _full(nested)
        _at(message, where)["hugepages"] = {"2M": 4}
        _redigest(message)
        with pytest.raises(
            wire.Malformed,
            match=re.escape(f"{_path(where)}: unknown key 'hugepages' (not in this wire version)"),
        ):
            wire.parse_message(message)
        message["version"] = "2.9"
        parsed = wire.parse_message(message)
        remote = wire.desired_from_body(parsed.body, parsed.host)
        assert remote.tree == nested.tree


def test_future_major_is_refused_by_its_version_before_its_shape_is_read(desired):
    """A 3.0 message may look nothing like 2.0: the reason is the version
    and which side to upgrade, not a schema path."""
    message = {"version": "3.0", "host": "node1", "sequence": 1, "state": {"tree": "v3"}}
    with pytest.raises(wire.Malformed) as refused:
        wire.parse_message(message)
    assert str(refused.value) == (
        "version: wire format '3.0' is newer than this applier understands: upgrade "
        "node-agent-applier (this applier reads 2.x)"
    )


def test_applier_refusal_names_the_path_counts_it_and_echoes_no_value(tmp_path, desired, caplog):
    from node_agent.applier.applier import Applier

    secret = "rabbit://nova:s3cr3t@broker:5672/"
    message = wire.full_message("node1", 1, wire.body_of(desired), KEY)
    message["body"]["reshape"]["guests"][0]["vcpus"] = secret
    message = _redigest(message)
    message["signature"] = signing.signature(message, KEY)  # the host's own bug
    applier = Applier(_no_placement, tmp_path, keyring=KEYRING)

    reply = applier.handle(message)
    reply_to_bad_envelope = applier.handle({**message, "host": secret})

    assert reply == {
        "status": wire.REFUSED,
        "error": "message refused: body.reshape.guests[0].vcpus: must be a non-negative integer",
    }
    assert reply_to_bad_envelope["status"] == wire.REFUSED
    assert "host: is not a host name" in reply_to_bad_envelope["error"]
    assert "s3cr3t" not in json.dumps([reply, reply_to_bad_envelope])
    assert "s3cr3t" not in caplog.text
    assert "refused a message from node1 (format; 1 refused so far)" in caplog.text
    assert "refused a message from a sender with no valid host name" in caplog.text
    assert applier.refused == {"format": 2}


def test_agent_bug_is_caught_before_sending_and_nothing_is_sent(tmp_path):
    """A message the applier would refuse never leaves the host: the agent
    checks it against the same schema (a guest with no name breaks it)."""
    nameless = dataclasses.replace(OTHERS[1], name="")
    host = snapshot("virhostcpudata/linux-test4", tmp_path, guests=(PINNED, nameless))
    desired = desired_from(
        settings(
            host="node1",
            cpu_dedicated_set=parse_cpu_spec("2-5"),
            cpu_shared_set=parse_cpu_spec("0-1,6-15"),
        ),
        host,
    )
    sender = object.__new__(upstream.MessagingUpstream)
    sender.host, sender.timeout, sender.seq, sender.acked = "node1", 1.0, 0, None
    sender.messages_sent, sender.clock, sender.key = 0, lambda: 1.0, KEY
    sender._client = None  # no bus: any attempt to send fails the test

    report = sender.send(desired)

    assert report.status == wire.REFUSED and report.messages == 0
    assert sender.messages_sent == 0 and sender.acked is None
    assert report.errors == [
        f"wire format {wire.WIRE_VERSION}: body.reshape.guests[1].name: must be a non-empty string"
    ]
    assert "nothing sent" in report.summary()


def test_saved_messages_can_be_checked_from_the_command_line(tmp_path, nested, capsys):
    from node_agent.remote.schema.__main__ import main

    good = _full(nested)
    bad = json.loads(json.dumps(good))
    bad["body"]["reshape"]["numa"][0]["cpus"] = 7
    files = {
        "good": good,
        "beat": wire.heartbeat("node1", 2, good["digest"], KEY),
        "bad": _redigest(bad),
    }
    for name, message in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(message))
    (tmp_path / "torn.json").write_text('{"version": "2.0", ')

    assert main([str(tmp_path / "good.json"), str(tmp_path / "beat.json")]) == 0
    assert main([str(tmp_path / "good.json"), str(tmp_path / "bad.json")]) == 1
    assert main([str(tmp_path / "bad.json"), str(tmp_path / "torn.json")]) == 2
    out = capsys.readouterr()
    assert f"good.json: valid wire format {wire.WIRE_VERSION} full message" in out.out
    assert f"beat.json: valid wire format {wire.WIRE_VERSION} heartbeat" in out.out
    assert "bad.json: refused: body.reshape.numa[0].cpus: must be a string" in out.out
    assert "torn.json: cannot read a JSON message" in out.err


# ---------------------------------------------------------------- 2.1: the host's limits


def test_limits_travel_in_the_body_and_come_back_as_the_agent_computed_them(nested):
    """Wire 2.1: the applier's limits_of reads what the agent's did."""
    from node_agent.policy.capacity import limits_of

    message = _full(nested)
    assert message["version"] == wire.WIRE_VERSION
    assert message["body"]["limits"]["cpus"] == 16
    parsed = wire.parse_message(message)
    remote = wire.desired_from_body(parsed.body, parsed.host)
    assert limits_of(remote) == limits_of(nested) is not None
    # and back again: the applier's record re-encodes to the same body
    assert wire.body_of(remote)["limits"] == message["body"]["limits"]


def test_a_change_of_the_hosts_facts_changes_the_digest(nested):
    """The limits are part of the body: a heartbeat of the old digest would
    let the applier keep checking against facts that are gone."""
    import dataclasses

    # A DIMM fewer: the same tree (it was built before), less memory.
    fewer = dataclasses.replace(
        nested,
        host=dataclasses.replace(
            nested.host,
            memory_mb=nested.host.memory_mb // 2,
            nodes=tuple(
                dataclasses.replace(n, memory_kb=(n.memory_kb or 0) // 2) for n in nested.host.nodes
            ),
        ),
    )
    before, after = wire.body_of(nested), wire.body_of(fewer)
    assert before["tree"] == after["tree"] and before["reshape"] == after["reshape"]
    assert before["limits"] != after["limits"]
    assert wire.digest_of(before) != wire.digest_of(after)


def test_a_2_0_message_without_limits_is_still_accepted_and_checks_nothing(nested):
    from node_agent.policy.capacity import limits_of

    message = _older(_full(nested))
    del message["body"]["limits"], message["signature"]
    message["version"] = "2.0"
    _redigest(message)
    parsed = wire.parse_message(message)
    remote = wire.desired_from_body(parsed.body, parsed.host)
    assert remote.tree == nested.tree and limits_of(remote) is None


def test_a_2_0_message_carrying_limits_is_refused_they_came_with_2_1(nested):
    message = _older(_full(nested))
    del message["signature"]
    message["version"] = "2.0"
    with pytest.raises(
        wire.Malformed, match=re.escape("body: unknown key 'limits' (not in this wire version)")
    ):
        wire.parse_message(message)


@pytest.mark.parametrize(
    "where, value, words",
    [
        (("cpus",), -1, "body.limits.cpus: must be a non-negative integer"),
        (("cpus",), 16.0, "body.limits.cpus: must be a non-negative integer"),
        (("memory_mb",), True, "body.limits.memory_mb: must be a non-negative integer"),
        (("online_cpus",), "16", "body.limits.online_cpus: must be null or a non-negative"),
        (("hugepages",), {"2M": 4}, "is not a huge-page class"),
        (
            ("hugepages",),
            {"CUSTOM_MEMORY_PAGE_2048": -4},
            "body.limits.hugepages.CUSTOM_MEMORY_PAGE_2048: must be a non-negative integer",
        ),
        (("vgpus",), None, "body.limits.vgpus: must be a non-negative integer"),
        ((), "16 CPUs", "body.limits: must be an object"),
    ],
)
def test_malformed_limits_are_refused_naming_their_path(nested, where, value, words):
    message = _full(nested)
    if where:
        message["body"]["limits"][where[0]] = value
    else:
        message["body"]["limits"] = value
    _redigest(message)
    with pytest.raises(wire.Malformed, match=re.escape(words)):
        wire.parse_message(message)


@pytest.mark.parametrize(
    "key", ["cpus", "memory_mb", "disk_gb", "hugepages", "vgpus", "vfs", "online_cpus"]
)
def test_limits_missing_a_key_are_refused(nested, key):
    message = _full(nested)
    del message["body"]["limits"][key]
    _redigest(message)
    with pytest.raises(wire.Malformed, match=re.escape(f"body.limits: {key!r} is required")):
        wire.parse_message(message)


# ---------------------------------------------------------------- 2.3: SEV keys in the limits


def _sev_desired(nested, max_guests=59, max_es_guests=450):
    """``nested`` on a host whose firmware has SEV keys for that many guests."""
    import dataclasses

    from node_agent.model.snapshot import DomainCaps, HypervisorInfo

    caps = DomainCaps(
        arch="x86_64",
        sev_supported=True,
        sev_max_guests=max_guests,
        sev_max_es_guests=max_es_guests,
    )
    return dataclasses.replace(
        nested,
        host=dataclasses.replace(
            nested.host, hypervisor=HypervisorInfo((10, 0, 0), (10, 0, 0), (caps,))
        ),
    )


def test_sev_keys_travel_in_the_limits_and_the_applier_checks_them(nested):
    """Wire 2.3: without mem_encryption the applier could not hold
    MEM_ENCRYPTION_CONTEXT to the firmware's keys (59 + 450 here)."""
    from node_agent.policy import capacity as cap

    sev = _sev_desired(nested)
    message = _full(sev)
    assert message["version"] == wire.WIRE_VERSION
    assert message["body"]["limits"]["mem_encryption"] == 509
    parsed = wire.parse_message(message)
    limits = cap.limits_of(wire.desired_from_body(parsed.body, parsed.host))
    assert limits.mem_encryption == 509 == cap.limits_of(sev).mem_encryption
    over = [
        cap.Published(
            "node1_amd_sev_es",
            False,
            {"MEM_ENCRYPTION_CONTEXT": {"total": 510, "reserved": 0, "allocation_ratio": 1.0}},
        )
    ]
    assert not cap.check(over, limits).ok


def test_unknown_sev_keys_travel_as_null_and_are_not_checked(nested):
    from node_agent.policy import capacity as cap

    message = _full(_sev_desired(nested, None, None))  # libvirt before 8.0
    assert message["body"]["limits"]["mem_encryption"] is None
    parsed = wire.parse_message(message)
    assert cap.limits_of(wire.desired_from_body(parsed.body, parsed.host)).mem_encryption is None


def test_a_2_2_message_without_sev_keys_is_accepted_and_one_with_them_refused(nested):
    message = _older(_full(_sev_desired(nested)))
    message["version"] = "2.2"
    with pytest.raises(
        wire.Malformed,
        match=re.escape("body.limits: unknown key 'mem_encryption' (not in this wire version)"),
    ):
        wire.parse_message(_redigest(message))
    del message["body"]["limits"]["mem_encryption"]
    parsed = wire.parse_message(_redigest(message))
    assert wire.desired_from_body(parsed.body, parsed.host).limits.mem_encryption is None


@pytest.mark.parametrize("value", [-1, 1.5, "59", True])
def test_malformed_sev_keys_are_refused_naming_their_path(nested, value):
    message = _full(nested)
    message["body"]["limits"]["mem_encryption"] = value
    with pytest.raises(wire.Malformed, match=re.escape("body.limits.mem_encryption: must be")):
        wire.parse_message(_redigest(message))
