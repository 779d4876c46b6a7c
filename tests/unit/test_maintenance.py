from __future__ import annotations

import pytest

from node_agent.placement.usage_guard import cuts, lowers
from node_agent.policy import maintenance as maint
from node_agent.policy.maintenance import TRAIT, in_maintenance
from node_agent.policy.partition import partition_cpus
from node_agent.tree.build import build_tree
from tests.snapshots import settings, snapshot


def _tree(tmp_path):
    host = snapshot("virhostcpudata/linux-test4", tmp_path)
    conf = settings(numa_in_placement=True)
    return build_tree(conf, host, partition_cpus(conf, host))


def test_maintenance_reserves_every_inventory_and_marks_only_the_root(tmp_path):
    tree = _tree(tmp_path)
    closed = in_maintenance(tree)
    assert closed.names() == tree.names()
    assert closed.root.traits == {**tree.root.traits, TRAIT: True}
    for before, after in zip(tree.providers[1:], closed.providers[1:]):
        assert after.traits == before.traits
    for before, after in zip(tree.providers, closed.providers):
        assert set(after.inventories) == set(before.inventories)
        for rc, inv in after.inventories.items():
            assert inv.reserved == inv.total == before.inventories[rc].total
            assert inv.allocation_ratio == before.inventories[rc].allocation_ratio
    assert any(inv.reserved < inv.total for p in tree.providers for inv in p.inventories.values())


ON = {"on": True, "reason": "disk swap", "since": "t"}
OLD_ON = {"reason": "disk swap", "since": "t"}  # before the "on" key existed
OFF = {"on": False, "since": "t"}


@pytest.mark.parametrize(
    "record, root_traits, on",
    [
        (None, None, False),  # no record, no root yet
        (None, ["COMPUTE_NODE"], False),
        (None, ["COMPUTE_NODE", TRAIT], True),  # state file lost: Placement keeps it on
        ({}, [TRAIT], True),
        (ON, [], True),  # the file asks, the trait follows
        (OLD_ON, None, True),
        (OFF, [TRAIT], False),  # an off not yet applied wins over the trait
    ],
)
def test_placement_trait_keeps_maintenance_on_without_a_state_record(record, root_traits, on):
    assert maint.is_on(maint.from_placement(record, root_traits)) is on


def test_leaving_maintenance_removes_the_trait_and_keeps_configured_reservations(tmp_path):
    tree = _tree(tmp_path)
    opened, notes = maint.apply(tree, OFF)
    assert opened.root.traits[TRAIT] is False
    assert [p.inventories for p in opened.providers] == [p.inventories for p in tree.providers]
    assert "off requested" in notes[0]
    unchanged, notes = maint.apply(tree, None)
    assert unchanged == tree and notes == []
    assert TRAIT not in unchanged.root.traits  # no opinion: a hand-set trait is kept


def test_maintenance_kept_by_placement_says_the_reason_is_unknown(tmp_path):
    closed, notes = maint.apply(_tree(tmp_path), maint.from_placement(None, [TRAIT]))
    assert closed.root.traits[TRAIT] is True
    assert "unknown" in notes[0]


def _inv(total, reserved=0, ratio=1.0):
    return {
        "total": total,
        "reserved": reserved,
        "allocation_ratio": ratio,
        "min_unit": 1,
        "max_unit": total,
        "step_size": 1,
    }


@pytest.mark.parametrize(
    "old, new, read",
    [
        (_inv(16), _inv(16, 16), False),  # maintenance closes: no usages read
        (_inv(16, 2), _inv(16, 16, 4.0), False),  # closed whatever the ratio
        (_inv(16, 4), _inv(16, 0), False),  # reserved lowered: a grow
        (_inv(16), _inv(16, 4), True),  # reserved raised: a cut, read
        (_inv(16), _inv(8, 0), True),  # total lowered: a cut, read
    ],
)
def test_closing_a_class_needs_no_usages_read_but_a_cut_does(old, new, read):
    assert lowers({"VCPU": old}, {"VCPU": new}) is read


def test_a_closed_record_is_not_reported_as_a_cut_below_usage():
    # Maintenance is reported as maintenance; a cut is what stays open.
    assert cuts("h", "u", {"VCPU": _inv(16)}, {"VCPU": _inv(16, 16)}, {"VCPU": 8}) == []
    [cut] = cuts("h", "u", {"VCPU": _inv(16)}, {"VCPU": _inv(16, 12)}, {"VCPU": 8})
    assert (cut.capacity, cut.used, cut.over) == (4, 8, 4)


def _status(record, placement, error=None):
    return maint.status("h", "/s/state.json", record, error, placement)


def _root(traits, **inventories):
    return {"root_uuid": "u", "traits": traits, "inventories": inventories}


@pytest.mark.parametrize(
    "record, placement, on, agree",
    [
        (ON, None, "on", None),  # not configured
        (ON, _root([TRAIT], VCPU=_inv(4, 4)), "on", True),
        (ON, _root([], VCPU=_inv(4, 0)), "on", False),  # not yet applied
        (ON, _root([TRAIT], VCPU=_inv(4, 4), PCPU=_inv(4, 0)), "on", False),
        (None, _root([TRAIT], VCPU=_inv(4, 4)), "on", True),  # state file lost
        (OFF, _root([TRAIT], VCPU=_inv(4, 4)), "off", False),  # off pending
        (None, _root([], VCPU=_inv(4, 0)), "off", True),
    ],
)
def test_status_compares_the_state_file_with_placement(record, placement, on, agree):
    report = _status(record, placement)
    assert (report["maintenance"], report["agree"]) == (on, agree)
    text = maint.status_text(report)
    assert f"maintenance is {on.upper()}" in text


def test_status_of_an_unreadable_state_file_names_the_error_and_trusts_placement():
    report = _status(None, _root([TRAIT], VCPU=_inv(4, 4)), error="state file x fails its sha256")
    assert report["maintenance"] == "on" and "unknown" in report["reason"]
    assert report["state_file"]["maintenance"] == "unreadable"
    assert "sha256" in maint.status_text(report)


KEPT = {"on": True, "reason": maint.UNKNOWN_REASON, "since": None, "source": "placement"}


@pytest.mark.parametrize(
    "record, service, on, says",
    [
        (None, KEPT, "on", "the applier kept the host closed"),  # state file lost
        (OFF, KEPT, "off", "the applier kept the host closed"),  # off pending wins
        (None, {"on": False}, "off", "running service: maintenance off"),
        (None, {"error": "no reply in 5s"}, "off", "did not answer (no reply in 5s)"),
    ],
)
def test_status_without_placement_takes_the_running_services_word(record, service, on, says):
    """``upstream = messaging``: Placement is not read here, the service
    hears from the applier what it applied."""
    report = maint.status("h", "/s", record, None, None, service)
    assert report["maintenance"] == on and report["agree"] is None
    assert says in maint.status_text(report)


def test_an_applied_off_is_forgotten_but_a_newer_record_is_kept(tmp_path):
    from node_agent.cycle.desired import forget_applied_off
    from node_agent.state import MAINTENANCE as MAINTENANCE_KEY
    from node_agent.state import StateStore

    store = StateStore(tmp_path)
    store.save({"root_uuid": "0b7e5f1c-3d2a-4e6f-8a9b-1c2d3e4f5a6b", MAINTENANCE_KEY: OFF})
    forget_applied_off(store, OFF)
    assert store.load() == {"root_uuid": "0b7e5f1c-3d2a-4e6f-8a9b-1c2d3e4f5a6b"}

    store.save({MAINTENANCE_KEY: ON})  # `maintenance on` ran during the cycle
    forget_applied_off(store, OFF)
    assert store.load() == {MAINTENANCE_KEY: ON}
    forget_applied_off(store, ON)  # an on record is never dropped
    assert store.load() == {MAINTENANCE_KEY: ON}


def _child(name, agent, **inventories):
    return {"name": name, "uuid": f"u-{name}", "agent": agent, "inventories": inventories}


def test_status_reads_the_agents_children_and_lists_open_classes_per_provider():
    placement = {
        **_root([TRAIT], DISK_GB=_inv(9, 9)),
        "children": [
            _child("h_NUMA_0", True, VCPU=_inv(8, 8), MEMORY_MB=_inv(4096, 4096)),
            _child("h_NUMA_1", True, VCPU=_inv(8, 0), MEMORY_MB=_inv(4096, 4096)),
            _child("h-widget", False, CUSTOM_WIDGET=_inv(2, 0)),
        ],
    }

    report = _status(ON, placement)

    assert report["agree"] is False  # the root is closed, a NUMA child is not
    assert report["placement"]["open_by_provider"] == {"h_NUMA_1": ["VCPU"]}
    text = maint.status_text(report)
    assert "child h_NUMA_1: fully reserved: MEMORY_MB; open: VCPU" in text
    assert "child h-widget (not the agent's: maintenance leaves it)" in text
    # A foreign child's open class is listed, not held against maintenance.
    placement["children"][1] = _child("h_NUMA_1", True, VCPU=_inv(8, 8), MEMORY_MB=_inv(4096, 4096))
    assert _status(ON, placement)["agree"] is True
