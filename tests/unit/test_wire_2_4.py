"""Wire 2.4: each guest's memory, the root's inventories without NUMA
children and the root's aggregates, so the applier runs the direct mode's
NUMA rules and aggregates. Real fixture hosts, pure: no bus, no Placement."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import re
import uuid

import pytest

from node_agent.cycle.desired import desired_from
from node_agent.model.cpuset import parse_cpu_spec
from node_agent.model.provider_tree import ProviderTree
from node_agent.model.snapshot import Guest
from node_agent.placement.reshape_rules import host_rule
from node_agent.remote import signing, wire
from tests.snapshots import settings, snapshot

KEY = signing.host_key(b"m" * 32, "node1")
AGGREGATE = "2b4c8a3e-5f1d-4e0a-9c6b-7d8e9f0a1b2c"
MIB = 1024


def without_2_4(body: dict) -> dict:
    """``body`` as a 2.3 agent sent it: no guest memory, no tree without
    NUMA children, no aggregates."""
    old = copy.deepcopy(body)
    old.pop("without_numa", None)
    for guest in old["reshape"]["guests"]:
        guest.pop("memory_mb", None)
    for provider in old["tree"]:
        provider.pop("aggregates", None)
    return old


def message_of(body: dict, version: str = wire.WIRE_VERSION, seq: int = 1) -> dict:
    """A signed message of ``version`` carrying ``body``."""
    envelope = {"version": version, "host": "node1", "seq": seq, "digest": wire.digest_of(body)}
    return json.loads(json.dumps(signing.sign(envelope, KEY) | {"body": body}))


def floating(n: int, vcpus: int, memory_mb: int, **kw) -> Guest:
    return Guest(
        uuid=f"0f1c9a4e-5d0b-4c52-9f8e-4e1f1e0a0c{n:02d}",
        name=f"guest-{n}",
        vcpus=vcpus,
        running=True,
        memory_kb=memory_mb * MIB,
        **kw,
    )


# linux-test4: node 0 = CPUs 0-7 (65432 MiB), node 1 = CPUs 8-15 (65536 MiB).
# Guests on a node by their numatune: 4 vCPUs and 1 GiB on node 0, 1 vCPU
# and 30 GiB on node 1. Node 1 has more VCPU left, node 0 more memory: the
# floating guest (2 vCPUs, 40 GiB) fits node 0 only.
ON_NODE_0 = floating(1, 4, 1024, numa_nodes=frozenset({0}))
ON_NODE_1 = floating(2, 1, 30 * 1024, numa_nodes=frozenset({1}))
WIDE = floating(3, 2, 40 * 1024)
# No node can hold it, nor both together: 140 GiB.
HUGE = floating(4, 2, 140 * 1024)


def nested_host(tmp_path, guests, **kw):
    host = snapshot("virhostcpudata/linux-test4", tmp_path, guests=guests)
    return desired_from(settings(host="node1", numa_in_placement=True, **kw), host)


def rebuilt(body: dict, version: str = wire.WIRE_VERSION) -> wire.RemoteDesired:
    parsed = wire.parse_message(message_of(body, version))
    return wire.desired_from_body(parsed.body, parsed.host)


def placed(desired, host) -> dict:
    """guest name -> where the chain puts its VCPU and MEMORY_MB, and why not."""
    uuids = {p.name: str(uuid.uuid5(uuid.NAMESPACE_DNS, p.name)) for p in desired.tree.providers}
    names = {u: n for n, u in uuids.items()}
    rule = host_rule(desired.tree.with_uuids(uuids), host, desired.partition.dedicated)
    root = uuids["node1"]
    found = {}
    for guest in desired.host.guests:
        for rc, amount in (("VCPU", guest.vcpus), ("MEMORY_MB", guest.memory_kb // MIB)):
            places = [(names[rp], c, n) for rp, c, n in rule(guest.uuid, root, rc, amount)]
            found[guest.name, rc] = (places, rule.unplaced(guest.uuid, root, rc, amount))
    return found


def test_guest_memory_crosses_the_wire_in_mib(tmp_path):
    desired = nested_host(tmp_path, (ON_NODE_0, ON_NODE_1, WIDE))
    body = wire.body_of(desired)
    assert [g["memory_mb"] for g in body["reshape"]["guests"]] == [1024, 30 * 1024, 40 * 1024]
    remote = rebuilt(body)
    assert [g.memory_kb for g in remote.host.guests] == [g.memory_kb for g in desired.host.guests]
    assert remote.lacks == ()


def test_a_floating_guest_goes_where_its_memory_fits_as_in_the_direct_mode(tmp_path):
    desired = nested_host(tmp_path, (ON_NODE_0, ON_NODE_1, WIDE))
    here = placed(desired, desired.host)
    assert here["guest-3", "MEMORY_MB"][0] == [("node1_NUMA_0", "MEMORY_MB", 40 * 1024)]
    assert here["guest-3", "VCPU"][0] == [("node1_NUMA_0", "VCPU", 2)]
    body = wire.body_of(desired)
    assert placed(desired, rebuilt(body).host) == here
    # A 2.3 body (no memory): by CPU only, onto node 1, which lacks the memory.
    old = placed(desired, rebuilt(without_2_4(body), "2.3").host)
    assert old["guest-3", "VCPU"][0] == [("node1_NUMA_1", "VCPU", 2)]


def test_a_guest_no_node_can_hold_is_refused_naming_it_and_its_size(tmp_path):
    desired = nested_host(tmp_path, (ON_NODE_0, HUGE))
    here = placed(desired, desired.host)
    (why,) = here["guest-4", "MEMORY_MB"][1]
    assert f"guest guest-4 ({HUGE.uuid})" in why and "2 vCPUs and 143360 MiB" in why
    body = wire.body_of(desired)
    assert placed(desired, rebuilt(body).host) == here
    # 2.3: no memory, so the applier placed it by its CPUs and refused nothing.
    assert placed(desired, rebuilt(without_2_4(body), "2.3").host)["guest-4", "MEMORY_MB"][1] == []


def test_the_tree_without_numa_children_is_the_agents_own(tmp_path):
    """The applier's flat tree (wire.flat_of) has the providers, parents and
    inventories of the agent's Desired.without_numa; the GPUs under the
    NUMA children come back under the root."""
    from tests.unit.test_upstream import GPU1, GPU2, MDEV_TYPE, gpu

    host = snapshot(
        "virhostcpudata/linux-test4",
        tmp_path,
        guests=(ON_NODE_0, WIDE),
        gpus=(
            dataclasses.replace(gpu(GPU1), numa_node=0),
            dataclasses.replace(gpu(GPU2), numa_node=1),
        ),
    )
    desired = desired_from(
        settings(
            host="node1",
            numa_in_placement=True,
            enabled_mdev_types=(MDEV_TYPE,),
            cpu_dedicated_set=parse_cpu_spec("2-5,10-13"),
            cpu_shared_set=parse_cpu_spec("0-1,6-9,14-15"),
            placement_aggregates=(AGGREGATE,),
        ),
        host,
    )
    assert {p.parent for p in desired.tree.providers if "_pci_" in p.name} == {
        "node1_NUMA_0",
        "node1_NUMA_1",
    }
    remote = rebuilt(wire.body_of(desired))
    assert remote.without_numa is not None

    def shape(tree: ProviderTree):
        return [(p.name, p.parent, p.inventories, p.aggregates) for p in tree.providers]

    assert shape(remote.without_numa) == shape(desired.without_numa)
    assert remote.without_numa.root.traits == remote.tree.root.traits


def test_no_tree_without_numa_children_with_the_option_off(tmp_path):
    host = snapshot("virhostcpudata/linux-test4", tmp_path, guests=(WIDE,))
    desired = desired_from(settings(host="node1"), host)
    body = wire.body_of(desired)
    assert "without_numa" not in body
    remote = rebuilt(body)
    assert remote.without_numa is None and remote.lacks == ()


def test_aggregates_cross_the_wire_on_the_root_only(tmp_path):
    desired = nested_host(tmp_path, (), placement_aggregates=(AGGREGATE,))
    body = wire.body_of(desired)
    assert body["tree"][0]["aggregates"] == [AGGREGATE]
    assert all("aggregates" not in p for p in body["tree"][1:])
    assert rebuilt(body).tree.root.aggregates == frozenset({AGGREGATE})
    upper = copy.deepcopy(body)
    upper["tree"][0]["aggregates"] = [AGGREGATE.upper()]
    assert rebuilt(upper).tree.root.aggregates == frozenset({AGGREGATE})  # canonical
    on_child = copy.deepcopy(body)
    on_child["tree"][1]["aggregates"] = [AGGREGATE]
    with pytest.raises(wire.Malformed, match=r"body.tree\[1\] \(node1_NUMA_0\): only the root"):
        rebuilt(on_child)


@pytest.mark.parametrize(
    "mutate, words",
    [
        (
            lambda b: b["tree"][0].update(aggregates=["rack-12"]),
            "body.tree[0].aggregates[0]: is not a uuid",
        ),
        (
            lambda b: b["tree"][0].update(aggregates=[AGGREGATE, AGGREGATE]),
            "body.tree[0].aggregates: must be a list of distinct aggregate uuids",
        ),
        (
            lambda b: b["reshape"]["guests"][0].update(memory_mb=-1),
            "body.reshape.guests[0].memory_mb: must be a non-negative integer",
        ),
        (
            lambda b: b["reshape"]["guests"][0].pop("memory_mb"),
            "body.reshape.guests[0]: 'memory_mb' is required",
        ),
        (
            lambda b: b.update(without_numa={"VCPU": {}}),
            "body.without_numa: 'inventories' is required",
        ),
        (
            lambda b: b["without_numa"]["inventories"]["VCPU"].update(total="16"),
            "body.without_numa.inventories.VCPU.total: must be a non-negative integer",
        ),
    ],
)
def test_malformed_2_4_keys_are_refused_naming_their_path(tmp_path, mutate, words):
    body = wire.body_of(nested_host(tmp_path, (WIDE,), placement_aggregates=(AGGREGATE,)))
    mutate(body)
    with pytest.raises(wire.Malformed, match=re.escape(words)):
        wire.parse_message(message_of(body))


def test_a_2_3_message_is_read_as_before_and_says_what_it_lacks(tmp_path):
    desired = nested_host(tmp_path, (ON_NODE_0, WIDE))
    old = without_2_4(wire.body_of(desired))
    parsed = wire.parse_message(message_of(old, "2.3"))
    assert parsed.version == "2.3"
    remote = wire.desired_from_body(parsed.body, parsed.host)
    assert remote.tree == desired.tree and remote.without_numa is None
    assert [g.memory_kb for g in remote.host.guests] == [0, 0]
    assert remote.lacks == (wire.LACKS_MEMORY, wire.LACKS_FLAT)
    # A host without NUMA children misses only the guests' memory.
    flat = desired_from(settings(host="node1"), desired.host)
    assert rebuilt(without_2_4(wire.body_of(flat)), "2.3").lacks == (wire.LACKS_MEMORY,)
    empty = snapshot("virhostcpudata/linux-test4", tmp_path / "empty")
    assert (
        rebuilt(without_2_4(wire.body_of(desired_from(settings(host="node1"), empty))), "2.3").lacks
        == ()
    )


@pytest.mark.parametrize(
    "key, mutate",
    [
        ("memory_mb", lambda b: b["reshape"]["guests"][0].update(memory_mb=1024)),
        ("without_numa", lambda b: b.update(without_numa={"inventories": {}})),
        ("aggregates", lambda b: b["tree"][0].update(aggregates=[AGGREGATE])),
    ],
)
def test_a_2_3_message_carrying_a_2_4_key_is_refused(tmp_path, key, mutate):
    old = without_2_4(wire.body_of(nested_host(tmp_path, (WIDE,))))
    mutate(old)
    with pytest.raises(wire.Malformed, match=f"unknown key '{key}' \\(not in this wire version\\)"):
        wire.parse_message(message_of(old, "2.3"))


def test_a_newer_minor_with_keys_this_side_does_not_know_is_read(tmp_path):
    body = wire.body_of(nested_host(tmp_path, (WIDE,)))
    body["reshape"]["guests"][0]["hugepages_mb"] = 0
    major, minor = wire.WIRE_VERSION.split(".")
    parsed = wire.parse_message(message_of(body, f"{major}.{int(minor) + 1}"))
    assert (
        wire.desired_from_body(parsed.body, parsed.host).host.guests[0].memory_kb == 40 * 1024 * MIB
    )


def test_the_digest_changes_with_aggregates_and_the_flat_root_only_when_set(tmp_path):
    plain = nested_host(tmp_path / "a", (WIDE,))
    joined = nested_host(tmp_path / "b", (WIDE,), placement_aggregates=(AGGREGATE,))
    more = nested_host(tmp_path / "c", (WIDE,), reserved_host_memory_mb=2048)
    digest = wire.digest_of(wire.body_of(plain))
    assert wire.digest_of(wire.body_of(joined)) != digest
    assert wire.digest_of(wire.body_of(more)) != digest
    # The same host again: the same digest (a heartbeat, no apply).
    assert wire.digest_of(wire.body_of(nested_host(tmp_path / "d", (WIDE,)))) == digest
    off = desired_from(settings(host="node1"), plain.host)
    assert "aggregates" not in wire.body_of(off)["tree"][0]


def test_the_applier_says_once_per_host_what_a_2_3_body_lacks(tmp_path, caplog):
    """Two 2.3 messages of one host, NUMA children on: one WARNING naming
    what the body lacks; the tree is applied all the same (here up to the
    Placement client, which this test has none of: its Tripwire)."""
    from node_agent.applier.applier import Applier
    from tests.unit.test_upstream import KEYRING, _no_placement

    desired = nested_host(tmp_path, (ON_NODE_0, WIDE))
    old = without_2_4(wire.body_of(desired))
    applier = Applier(_no_placement, tmp_path / "applier", keyring=KEYRING)
    caplog.set_level(logging.WARNING)
    for seq in (1, 2):
        reply = applier.handle(message_of(old, "2.3", seq))
        assert reply["status"] == wire.ERROR and "Tripwire" in reply["error"], reply
    lines = [r.getMessage() for r in caplog.records if "sends wire format 2.3" in r.getMessage()]
    assert len(lines) == 1, lines
    assert wire.LACKS_MEMORY in lines[0] and wire.LACKS_FLAT in lines[0]
    assert applier.lacking == {"node1": 2}
    applier.handle(message_of(wire.body_of(desired), seq=3))
    assert applier.lacking == {"node1": 2}  # a 2.4 body lacks nothing


def _load(tmp_path, text: str):
    from node_agent.config.files import load_conf
    from node_agent.config.settings import load_settings

    path = tmp_path / "na.conf"
    path.write_text("[DEFAULT]\nhost = cn1\n" + text)
    return load_settings(load_conf(["--config-file", str(path)]))


def test_aggregates_are_taken_with_upstream_messaging_and_still_refused_in_companion_mode(
    tmp_path,
):
    from node_agent.errors import ConfigError

    section = f"[placement]\naggregates = {AGGREGATE.upper()}\n"
    taken = _load(tmp_path, "[agent]\nupstream = messaging\n" + section)
    assert taken.placement_aggregates == (AGGREGATE,)
    with pytest.raises(ConfigError, match="mode = companion never writes the root"):
        _load(tmp_path, "[agent]\nmode = companion\n" + section)
