"""The messaging upstream's wire format: what an agent sends and what the
applier accepts, built from real fixture hosts. Pure: no bus, no Placement."""

import copy
import dataclasses
import json

import pytest

from node_agent import upstream
from node_agent.cpuset import parse_cpu_spec, parse_cpulist
from node_agent.cycle import desired_from
from node_agent.topology import Guest, GuestMdev
from tests.snapshots import settings, snapshot

PINNED = Guest(uuid="6695eb01-f6a4-8304-79aa-97f2502e193f", name="pinned", vcpus=2,
               running=True, memory_kb=2097152,
               vcpupin=((0, parse_cpulist("2")), (1, parse_cpulist("3"))),
               metadata=(("hw:cpu_policy", "dedicated"),),
               mdevs=(GuestMdev("b1ae8bf6-38b0-4c81-9d44-78ce3f520496", "0000:81:00.0"),))


@pytest.fixture
def desired(tmp_path):
    host = snapshot("virhostcpudata/linux-test4", tmp_path, guests=(PINNED,))
    return desired_from(settings(host="node1", cpu_dedicated_set=parse_cpu_spec("2-5"),
                                 cpu_shared_set=parse_cpu_spec("0-1,6-15"),
                                 numa_in_placement=True), host)


def test_full_message_round_trips_tree_and_reshape_inputs(desired):
    message = json.loads(json.dumps(upstream.full_message("node1", 7, upstream.body_of(desired))))
    parsed = upstream.parse_message(message)
    rebuilt = upstream.desired_from_body(parsed.body, parsed.host)
    assert (parsed.host, parsed.seq) == ("node1", 7)
    assert rebuilt.tree == desired.tree
    assert len(rebuilt.tree.providers) > 1  # NUMA children travel too
    assert rebuilt.host.guests == (PINNED,)
    assert rebuilt.host.guests[0].pinned
    assert rebuilt.partition.dedicated == desired.partition.dedicated


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
])
def test_malformed_tree_is_refused_with_where_and_why(desired, mutate, words):
    message = _message(desired, mutate)
    parsed = upstream.parse_message(message)
    with pytest.raises(upstream.Malformed, match=words.replace("(", r"\(").replace(")", r"\)")):
        upstream.desired_from_body(parsed.body, parsed.host)


@pytest.mark.parametrize("change, words", [
    ({"version": "2.0"}, "upgrade the applier"),
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
