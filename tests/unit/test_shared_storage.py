"""Shared storage declared, not multiplied: the option, the sharing
provider's identity, the record written when hosts disagree, the tree, the
reshape rules and the capacity invariant (all pure)."""

from __future__ import annotations

import uuid

import pytest

from node_agent.cli import render
from node_agent.config.files import load_conf
from node_agent.config.settings import load_settings
from node_agent.cycle.desired import root_joined
from node_agent.errors import ConfigError
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.placement.reshape_rules import (
    disk_to_sharing_provider,
    local_disk_moved,
)
from node_agent.policy import shared_storage
from node_agent.policy.capacity import shared_disk_problems

AGG = "8c3a1c61-6b7e-4b52-9a35-1f0d1a0e2b44"
ROOT, SHARE, OTHER = (str(uuid.uuid4()) for _ in range(3))


def load(tmp_path, text: str):
    path = tmp_path / "na.conf"
    path.write_text("[DEFAULT]\nhost = cn1\n" + text)
    return load_settings(load_conf(["--config-file", str(path)]))


def test_shared_storage_aggregate_is_read_canonical(tmp_path):
    settings = load(tmp_path, f"[compute]\nshared_storage_aggregate = {AGG.upper()}\n")
    assert settings.shared_storage_aggregate == AGG


def test_shared_storage_is_off_by_default(tmp_path):
    assert load(tmp_path, "").shared_storage_aggregate is None


def test_a_shared_storage_aggregate_that_is_no_uuid_is_refused_naming_option_and_value(
    tmp_path,
):
    with pytest.raises(ConfigError) as refused:
        load(tmp_path, "[compute]\nshared_storage_aggregate = nfs-hosts\n")
    assert refused.value.exit_code == 78
    assert "[compute] shared_storage_aggregate: 'nfs-hosts' is not an aggregate UUID" in str(
        refused.value
    )


@pytest.mark.parametrize(
    "agent, why",
    [("mode = companion", "companion"), ("upstream = messaging", "applier")],
)
def test_shared_storage_is_refused_where_the_agent_does_not_write_the_tree(tmp_path, agent, why):
    with pytest.raises(ConfigError) as refused:
        load(tmp_path, f"[agent]\n{agent}\n[compute]\nshared_storage_aggregate = {AGG}\n")
    assert f"[compute] shared_storage_aggregate = {AGG}" in str(refused.value)
    assert why in str(refused.value)


def test_every_host_derives_the_same_sharing_provider_from_the_aggregate():
    assert shared_storage.provider_uuid(AGG) == shared_storage.provider_uuid(AGG.upper())
    assert shared_storage.provider_uuid(AGG) != AGG
    assert shared_storage.provider_uuid(AGG) != shared_storage.provider_uuid(str(uuid.uuid4()))
    provider = shared_storage.sharing_provider(AGG, Inventory(total=251))
    assert provider.uuid == shared_storage.provider_uuid(AGG)
    assert provider.parent is None
    assert provider.traits == {"MISC_SHARES_VIA_AGGREGATE": True}
    assert provider.aggregates == {AGG}


def record(total, reserved=0, ratio=1.0):
    return Inventory(total=total, reserved=reserved, allocation_ratio=ratio).as_placement()


@pytest.mark.parametrize(
    "measured, held, expected",
    [
        (record(251), None, record(251)),
        (record(251), record(251), record(251)),
        (record(260), record(251), {**record(251), "max_unit": 251}),  # never grows past
        (record(240), record(251), record(240)),  # shrinks to the smaller
        (record(251, 2), record(251, 5), record(251, 5)),  # larger reservation
        (record(251, 5, 1.5), record(251, 2, 1.0), record(251, 5, 1.0)),  # smaller ratio
    ],
)
def test_hosts_that_disagree_publish_the_smaller_filesystem(measured, held, expected):
    assert shared_storage.record_to_write(measured, held) == expected


def test_two_hosts_measuring_differently_converge_on_one_record():
    a, b = record(251, 1), record(250, 3)
    first = shared_storage.record_to_write(a, None)
    second = shared_storage.record_to_write(b, first)
    assert shared_storage.record_to_write(a, second) == second == record(250, 3)


def test_the_tree_of_a_shared_storage_host_has_no_disk_and_joins_the_aggregate(tmp_path):
    settings = load(tmp_path, f"[compute]\nshared_storage_aggregate = {AGG}\n")
    tree = ProviderTree(
        (Provider("cn1", inventories={"VCPU": Inventory(8), "DISK_GB": Inventory(251, 1)}),)
    )
    joined, shared = root_joined(settings, tree)
    assert set(joined.root.inventories) == {"VCPU"}
    assert joined.root.aggregates == {AGG}
    assert shared is not None and shared.inventories == {"DISK_GB": Inventory(251, 1)}


def test_disk_moves_from_the_root_to_the_sharing_provider_and_nothing_else_does():
    rule = disk_to_sharing_provider(ROOT, SHARE)
    assert rule("c", ROOT, "DISK_GB", 10) == [(SHARE, "DISK_GB", 10)]
    assert rule("c", ROOT, "VCPU", 2) == [(ROOT, "VCPU", 2)]
    assert (rule.sources, rule.targets) == ({ROOT}, {SHARE})


def test_the_way_back_moves_only_this_hosts_consumers():
    rule = local_disk_moved(SHARE, ROOT, {"mine"})
    assert rule("mine", SHARE, "DISK_GB", 10) == [(ROOT, "DISK_GB", 10)]
    assert rule("theirs", SHARE, "DISK_GB", 10) == [(SHARE, "DISK_GB", 10)]
    assert (rule.sources, rule.targets) == ({SHARE}, {ROOT})


def test_changing_the_aggregate_moves_only_this_hosts_consumers_between_sharing_providers():
    rule = local_disk_moved(SHARE, OTHER, {"mine"})
    assert rule("mine", SHARE, "DISK_GB", 10) == [(OTHER, "DISK_GB", 10)]
    assert rule("theirs", SHARE, "DISK_GB", 10) == [(SHARE, "DISK_GB", 10)]
    assert rule("mine", SHARE, "VCPU", 1) == [(SHARE, "VCPU", 1)]
    assert (rule.sources, rule.targets) == ({SHARE}, {OTHER})


OTHER_AGG = "0d6a3c9e-52b1-4f0e-8b7d-93c2a4e61f08"


@pytest.mark.parametrize(
    "root_aggregates, wanted, expected",
    [
        ([], None, {}),
        ([AGG], None, {shared_storage.provider_uuid(AGG): AGG}),
        ([AGG], shared_storage.provider_uuid(AGG), {}),  # the one the option names
        (
            [AGG, OTHER_AGG.upper(), "not-a-uuid"],
            shared_storage.provider_uuid(AGG),
            {shared_storage.provider_uuid(OTHER_AGG): OTHER_AGG},
        ),
    ],
)
def test_former_sharing_providers_are_named_by_the_roots_aggregates(
    root_aggregates, wanted, expected
):
    assert shared_storage.former_providers(root_aggregates, wanted) == expected


def test_no_shared_storage_report_without_the_option_and_nothing_to_move_back():
    assert shared_storage.report(None, None, True) is None


def test_the_shared_storage_report_names_the_provider_and_where_the_disk_is():
    former = {shared_storage.provider_uuid(OTHER_AGG): OTHER_AGG}
    report = shared_storage.report(AGG, 251, True, former)
    assert report is not None
    assert (report["aggregate"], report["provider"], report["uuid"]) == (
        AGG,
        f"shared_storage_{AGG}",
        shared_storage.provider_uuid(AGG),
    )
    assert (report["disk_gb"], report["moved"]) == (251, True)
    assert [f["aggregate"] for f in report["moved_from"]] == [OTHER_AGG]
    text = render.as_text(
        render.with_shared_storage(render.report_dict(ProviderTree((Provider("cn1"),)), []), report)
    )
    assert (
        f"sharing provider shared_storage_{AGG} [{shared_storage.provider_uuid(AGG)}], DISK_GB 251"
        in text
    )
    assert f"moved from shared_storage_{OTHER_AGG}" in text
    back = shared_storage.report(None, None, False, {shared_storage.provider_uuid(AGG): AGG})
    assert back is not None and back["aggregate"] is None and not back["moved"]
    assert back["lines"][-1].startswith("this host's DISK_GB is not on the root yet")


@pytest.mark.parametrize(
    "tree_classes, shared, filesystem, problems",
    [
        ({"VCPU", "MEMORY_MB"}, 251, 251, 0),
        ({"VCPU", "DISK_GB"}, 251, 251, 1),  # counted twice
        ({"VCPU"}, 252, 251, 1),  # more than the filesystem
        ({"DISK_GB"}, 300, 251, 2),
    ],
)
def test_the_capacity_invariant_counts_the_shared_filesystem_once(
    tree_classes, shared, filesystem, problems
):
    assert len(shared_disk_problems(tree_classes, shared, filesystem)) == problems
