"""Operator provider files (nova provider.yaml schema 1.0): parse, validate, apply."""

from __future__ import annotations

import os_resource_classes as orc
import os_traits
import pytest

from node_agent.config.provider_files import load_provider_configs
from node_agent.errors import ConfigError
from node_agent.model.provider_tree import Inventory
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT
from node_agent.policy.partition import partition_cpus
from node_agent.policy.provider_config import (
    applied_traits,
    apply_provider_configs,
    parse_provider_config,
    unmatched,
)
from node_agent.tree.build import build_tree
from tests.snapshots import settings, snapshot

ROOT_FILE = """
meta:
  schema_version: '1.0'
providers:
  - identification:
      uuid: $COMPUTE_NODE
    inventories:
      additional:
        - CUSTOM_LICENSE_WINDOWS:
            total: 4
            reserved: 1
            max_unit: 2
            allocation_ratio: 1.5
    traits:
      additional:
        - CUSTOM_GOLD
        - CUSTOM_RACK_A1
  - identification:
      name: fixture_NUMA_1
    traits:
      additional:
        - CUSTOM_FAST_MEMORY
"""


def errors_of(text: str) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as err:
        parse_provider_config(text, "/etc/pc/a.yaml")
    return err.value.problems


def numa_tree(tmp_path, configs=(), previously_applied=None):
    host = snapshot("vircaps2xmldata/linux-resctrl/system", tmp_path)
    conf = settings(numa_in_placement=True)
    return build_tree(conf, host, partition_cpus(conf, host), configs, previously_applied)


def test_parses_root_and_named_entries():
    root, numa = parse_provider_config(ROOT_FILE, "a.yaml")
    assert root.compute_node and root.source == "a.yaml providers[0]"
    assert root.inventories == {
        "CUSTOM_LICENSE_WINDOWS": Inventory(total=4, reserved=1, max_unit=2, allocation_ratio=1.5)
    }
    assert root.traits == {"CUSTOM_GOLD", "CUSTOM_RACK_A1"}
    assert numa.name == "fixture_NUMA_1" and numa.traits == {"CUSTOM_FAST_MEMORY"}


def test_errors_name_the_file_and_the_path_in_the_document():
    problems = errors_of("""
meta: {schema_version: '1.0'}
providers:
  - identification: {name: cn1}
    inventories:
      additional:
        - CUSTOM_OK: {total: 1}
        - CUSTOM_FOO: {total: -3}
        - VCPU: {total: 2}
    traits:
      additional: [HW_CPU_X86_AVX2, CUSTOM_fine]
  - identification: {uuid: not-a-uuid}
  - inventories: {}
""")
    assert problems == (
        "/etc/pc/a.yaml: providers[0].inventories.additional[1].CUSTOM_FOO.total: "
        "-3 must be a whole number >= 1",
        "/etc/pc/a.yaml: providers[0].inventories.additional[2].VCPU: resource class "
        "'VCPU' must be CUSTOM_ followed by A-Z, 0-9 and _ (standard ones are the "
        "agent's to report)",
        "/etc/pc/a.yaml: providers[0].traits.additional[0]: trait 'HW_CPU_X86_AVX2' "
        "must be CUSTOM_ followed by A-Z, 0-9 and _ (standard ones are the agent's to "
        "report)",
        "/etc/pc/a.yaml: providers[0].traits.additional[1]: trait 'CUSTOM_fine' must be "
        "CUSTOM_ followed by A-Z, 0-9 and _ (standard ones are the agent's to report)",
        "/etc/pc/a.yaml: providers[1].identification.uuid: 'not-a-uuid' is neither a "
        "uuid nor $COMPUTE_NODE",
        "/etc/pc/a.yaml: providers[2].identification: is required",
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("providers: []", "meta.schema_version: None is not a supported version"),
        ("meta: {schema_version: '2.0'}", "'2.0' is not a supported version"),
        ("meta: {schema_version: '1.0'}\nproviders: {}", "providers: must be a list"),
        ("meta: [", "not valid YAML"),
        ("meta: {schema_version: '1.0'}\nextra: 1", "unknown key(s) extra"),
        (
            "meta: {schema_version: '1.0'}\nproviders:\n  - identification: {name: a, uuid: "
            "$COMPUTE_NODE}",
            "providers[0].identification: give exactly one of name or uuid",
        ),
        (
            "meta: {schema_version: '1.0'}\nproviders:\n  - identification: {name: a}\n"
            "    inventories: {additional: [{CUSTOM_X: {reserved: 1}}]}",
            "providers[0].inventories.additional[0].CUSTOM_X.total: is required",
        ),
        (
            "meta: {schema_version: '1.0'}\nproviders:\n  - identification: {name: a}\n"
            "    inventories: {additional: [{CUSTOM_MEMORY_PAGE_2048: {total: 1}}]}",
            "CUSTOM_MEMORY_PAGE_2048 is a class the agent reports itself",
        ),
        (
            "meta: {schema_version: '1.0'}\nproviders:\n  - identification: {name: a}\n"
            "    inventories: {additional: [{CUSTOM_X: {total: 1, allocation_ratio: .nan}}]}",
            "CUSTOM_X.allocation_ratio: nan must be a number > 0",
        ),
        (
            "meta: {schema_version: '1.0'}\nproviders:\n  - identification: {name: a}\n"
            "    inventories: {additional: [{CUSTOM_X: {total: true}}]}",
            "CUSTOM_X.total: True must be a whole number >= 1",
        ),
        (
            "meta: {schema_version: '1.0'}\nproviders:\n  - identification: {name: a}\n"
            "    inventories: {additional: [{CUSTOM_X: {total: 2147483648}}]}",
            "CUSTOM_X.total: 2147483648 is above Placement's limit 2147483647",
        ),
        (
            "meta: {schema_version: '1.0'}\nproviders:\n  - identification: {name: a}\n"
            "    traits: null",
            "providers[0].traits: must be a mapping, not NoneType",
        ),
    ],
)
def test_invalid_documents_are_refused(text, expected):
    assert expected in "\n".join(errors_of(text))


def test_rules_between_values_are_listed_with_the_schemas_refusals_in_document_order():
    entries = "".join(f"  - identification: {{name: p{i}}}\n" for i in range(2, 10))
    problems = errors_of(
        "meta: {schema_version: '1.0'}\nproviders:\n"
        "  - identification: {name: p0}\n"
        "    inventories: {additional: [{CUSTOM_A: {total: 1, reserved: 2}},\n"
        "                               {CUSTOM_B: {total: 1, step_size: 0}}]}\n"
        "  - identification: {name: p1, uuid: $COMPUTE_NODE}\n"
        f"{entries}"
        "  - identification: {uuid: nope}\n"
    )
    assert problems == (
        "/etc/pc/a.yaml: providers[0].inventories.additional[0].CUSTOM_A.reserved: "
        "2 is above total 1",
        "/etc/pc/a.yaml: providers[0].inventories.additional[1].CUSTOM_B.step_size: "
        "0 must be a whole number >= 1",
        "/etc/pc/a.yaml: providers[1].identification: give exactly one of name or uuid",
        "/etc/pc/a.yaml: providers[10].identification.uuid: 'nope' is neither a uuid "
        "nor $COMPUTE_NODE",
    )


def test_a_uuid_without_its_hyphens_is_refused_as_nova_refuses_it():
    # nova's schema takes the 8-4-4-4-12 form only; Python's UUID() reads more.
    problems = errors_of(
        "meta: {schema_version: '1.0'}\nproviders:\n"
        "  - identification: {uuid: 9f4b3c1e8d1a4f7c9a4e2b3c4d5e6f70}\n"
        "    traits: {additional: [CUSTOM_A]}\n"
    )
    assert problems == (
        "/etc/pc/a.yaml: providers[0].identification.uuid: "
        "'9f4b3c1e8d1a4f7c9a4e2b3c4d5e6f70' is neither a uuid nor "
        "$COMPUTE_NODE",
    )


def test_later_minor_version_ignores_unknown_keys():
    (entry,) = parse_provider_config(
        "meta: {schema_version: '1.3'}\nproviders:\n  - identification: {name: a}\n"
        "    future: {x: 1}\n    traits: {additional: [CUSTOM_A]}\n",
        "a.yaml",
    )
    assert entry.traits == {"CUSTOM_A"}


def test_applied_to_root_and_named_child(tmp_path):
    tree = numa_tree(tmp_path, parse_provider_config(ROOT_FILE, "a.yaml"))
    assert tree.root.inventories["CUSTOM_LICENSE_WINDOWS"].total == 4
    assert tree.root.traits["CUSTOM_GOLD"] is True
    assert tree.root.traits[os_traits.COMPUTE_NODE] is True
    numa1 = tree.by_name("fixture_NUMA_1")
    assert numa1.traits == {
        os_traits.HW_NUMA_ROOT: True,
        AGENT_CHILD_TRAIT: True,
        "CUSTOM_FAST_MEMORY": True,
    }
    assert "CUSTOM_LICENSE_WINDOWS" not in numa1.inventories


def test_trait_dropped_from_the_file_is_set_false_when_previously_applied(tmp_path):
    configs = parse_provider_config(ROOT_FILE, "a.yaml")
    before = numa_tree(tmp_path / "a", configs)
    remembered = applied_traits(configs, before)
    assert remembered == {
        "fixture": {"CUSTOM_GOLD", "CUSTOM_RACK_A1"},
        "fixture_NUMA_1": {"CUSTOM_FAST_MEMORY"},
    }
    edited = parse_provider_config(ROOT_FILE.replace("        - CUSTOM_RACK_A1\n", ""), "a.yaml")
    after = numa_tree(tmp_path / "b", edited, remembered)
    assert after.root.traits["CUSTOM_RACK_A1"] is False
    assert after.root.traits["CUSTOM_GOLD"] is True
    # Traits nobody applied are still not decided about: they stay someone else's.
    assert "CUSTOM_SOMEONE_ELSES" not in after.root.traits


def test_all_files_gone_removes_everything_previously_applied(tmp_path):
    after = numa_tree(tmp_path, (), {"fixture_NUMA_1": {"CUSTOM_FAST_MEMORY"}})
    assert after.by_name("fixture_NUMA_1").traits["CUSTOM_FAST_MEMORY"] is False


def test_class_the_agent_reports_on_that_provider_is_refused(tmp_path):
    configs = parse_provider_config(
        "meta: {schema_version: '1.0'}\nproviders:\n  - identification: {uuid: "
        "$COMPUTE_NODE}\n    inventories: {additional: [{CUSTOM_BM: {total: 1}}]}\n",
        "a.yaml",
    )
    host = snapshot("virhostcpudata/linux-test4", tmp_path)
    conf = settings(node_resource_class="CUSTOM_BM")
    with pytest.raises(
        ConfigError, match="CUSTOM_BM on provider 'fixture' is a class the agent reports itself"
    ):
        build_tree(conf, host, partition_cpus(conf, host), configs)


def test_explicit_entry_replaces_compute_node_entry_for_the_root(tmp_path):
    configs = parse_provider_config(
        ROOT_FILE
        + """
  - identification:
      name: fixture
    traits:
      additional: [CUSTOM_SILVER]
""",
        "a.yaml",
    )
    tree = numa_tree(tmp_path, configs)
    assert "CUSTOM_GOLD" not in tree.root.traits
    assert tree.root.traits["CUSTOM_SILVER"] is True
    assert "CUSTOM_LICENSE_WINDOWS" not in tree.root.inventories


def test_foreign_provider_entries_are_listed_as_unmatched(tmp_path):
    configs = parse_provider_config(ROOT_FILE.replace("fixture_NUMA_1", "other_host"), "a.yaml")
    tree = numa_tree(tmp_path, configs)
    assert [c.name for c in unmatched(tree, configs)] == ["other_host"]


def test_uuid_entry_applies_once_the_tree_knows_uuids(tmp_path):
    uuid = "9f4b3c1e-8d1a-4f7c-9a4e-2b3c4d5e6f70"
    configs = parse_provider_config(
        f"meta: {{schema_version: '1.0'}}\nproviders:\n  - identification: {{uuid: '{uuid}'}}\n"
        "    traits: {additional: [CUSTOM_X]}\n",
        "a.yaml",
    )
    tree = numa_tree(tmp_path, ()).with_uuids({"fixture_NUMA_0": uuid})
    applied = apply_provider_configs(tree, configs, {})
    assert applied.by_name("fixture_NUMA_0").traits["CUSTOM_X"] is True


def test_compute_node_sentinel_under_name_applies_to_the_root_as_in_novas_example(tmp_path):
    # nova's own example_provider.yaml identifies the root by name: $COMPUTE_NODE.
    configs = parse_provider_config(
        ROOT_FILE.replace("uuid: $COMPUTE_NODE", "name: '$COMPUTE_NODE'"), "a.yaml"
    )
    tree = numa_tree(tmp_path, configs)
    assert tree.root.traits["CUSTOM_GOLD"] is True
    assert "CUSTOM_LICENSE_WINDOWS" in tree.root.inventories


def test_root_named_by_name_and_by_uuid_is_refused_naming_both_entries(tmp_path):
    uuid = "9f4b3c1e-8d1a-4f7c-9a4e-2b3c4d5e6f70"
    configs = parse_provider_config(
        "meta: {schema_version: '1.0'}\nproviders:\n"
        "  - identification: {name: fixture}\n    traits: {additional: [CUSTOM_A]}\n"
        f"  - identification: {{uuid: '{uuid}'}}\n    traits: {{additional: [CUSTOM_B]}}\n",
        "a.yaml",
    )
    tree = numa_tree(tmp_path, ()).with_uuids({"fixture": uuid})
    with pytest.raises(ConfigError) as err:
        apply_provider_configs(tree, configs, {})
    message = str(err.value)
    assert "a.yaml providers[0]" in message and "a.yaml providers[1]" in message
    assert "Merge the two entries" in message


@pytest.mark.parametrize(
    "entry, what",
    [
        ("traits: {additional: [CUSTOM_%s]}" % ("T" * 249), "trait"),
        ("inventories: {additional: [{CUSTOM_%s: {total: 1}}]}" % ("R" * 249), "resource class"),
    ],
)
def test_names_over_255_characters_are_refused_when_the_file_is_read(entry, what):
    problems = errors_of(
        "meta: {schema_version: '1.0'}\nproviders:\n"
        f"  - identification: {{name: p}}\n    {entry}\n"
    )
    assert any(
        f"{what} CUSTOM_" in p and "256 characters long" in p and "at most 255" in p
        for p in problems
    ), problems


def test_a_255_character_trait_is_accepted():
    (config,) = parse_provider_config(
        "meta: {schema_version: '1.0'}\nproviders:\n  - identification: {name: p}\n"
        f"    traits: {{additional: [CUSTOM_{'T' * 248}]}}\n",
        "a.yaml",
    )
    assert len(next(iter(config.traits))) == 255


def test_provider_name_over_200_characters_is_refused():
    problems = errors_of(
        "meta: {schema_version: '1.0'}\nproviders:\n"
        f"  - identification: {{name: {'p' * 201}}}\n"
        "    traits: {additional: [CUSTOM_A]}\n"
    )
    assert any("201 characters long" in p for p in problems), problems


def test_directory_is_read_in_name_order_and_duplicates_refused(tmp_path):
    assert load_provider_configs(str(tmp_path / "missing")) == ()
    (tmp_path / "b.yaml").write_text(ROOT_FILE)
    (tmp_path / "a.yaml").write_text(
        "meta: {schema_version: '1.0'}\nproviders:\n  - identification: {name: x}\n"
        "    traits: {additional: [CUSTOM_A]}\n"
    )
    (tmp_path / "ignored.txt").write_text("not yaml: [")
    configs = load_provider_configs(str(tmp_path))
    assert [c.source.split("/")[-1] for c in configs] == [
        "a.yaml providers[0]",
        "b.yaml providers[0]",
        "b.yaml providers[1]",
    ]
    (tmp_path / "c.yaml").write_text(
        "meta: {schema_version: '1.0'}\nproviders:\n  - identification: {name: x}\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"c\.yaml providers\[0\]: identification x is "
        r"already used by .*a\.yaml providers\[0\]",
    ):
        load_provider_configs(str(tmp_path))


def test_whole_node_mode_reports_one_unit_and_nothing_else(tmp_path):
    host = snapshot("virhostcpudata/linux-test3", tmp_path)
    conf = settings(
        node_resource_class="CUSTOM_BAREMETAL_GOLD",
        numa_in_placement=True,
        enabled_mdev_types=("nvidia-222",),
    )
    tree = build_tree(conf, host, partition_cpus(conf, host))
    assert tree.names() == ["fixture"]
    assert {rc: inv.as_placement() for rc, inv in tree.root.inventories.items()} == {
        "CUSTOM_BAREMETAL_GOLD": {
            "total": 1,
            "reserved": 0,
            "min_unit": 1,
            "max_unit": 1,
            "step_size": 1,
            "allocation_ratio": 1.0,
        }
    }
    assert orc.VCPU not in tree.root.inventories


def test_only_traits_a_file_added_are_remembered_as_the_files():
    from node_agent.policy.provider_config import file_added_traits

    listed = {"cn1": ["CUSTOM_BY_HAND", "CUSTOM_NEW", "CUSTOM_OLD"], "cn1_NUMA_0": ["CUSTOM_X"]}
    previous = {"cn1": ["CUSTOM_OLD"]}
    before = {"cn1": {"CUSTOM_BY_HAND", "CUSTOM_OLD"}}  # the NUMA child is new
    assert file_added_traits(listed, previous, before) == {
        "cn1": ["CUSTOM_NEW", "CUSTOM_OLD"],
        "cn1_NUMA_0": ["CUSTOM_X"],
    }


@pytest.mark.parametrize(
    "section, name, field",
    [
        (
            "inventories",
            "NET_BW_IGR_KILOBIT_PER_SEC:\n            total: 1",
            "NET_BW_IGR_KILOBIT_PER_SEC",
        ),
        (
            "inventories",
            "NET_PACKET_RATE_EGR_KILOPACKET_PER_SEC:\n            total: 1",
            "NET_PACKET_RATE_EGR_KILOPACKET_PER_SEC",
        ),
        ("traits", "CUSTOM_VNIC_TYPE_MACVTAP", None),
    ],
)
def test_neutron_classes_and_traits_are_refused_naming_neutron(section, name, field):
    text = (
        "meta:\n  schema_version: '1.0'\nproviders:\n"
        "  - identification:\n      name: cn1\n"
        f"    {section}:\n      additional:\n        - {name}\n"
    )
    with pytest.raises(ConfigError) as err:
        parse_provider_config(text, "f.yaml")
    [problem] = err.value.problems
    where = f"providers[0].{section}.additional[0]" + (f".{field}" if field else "")
    assert problem.startswith(f"f.yaml: {where}: ") and "belongs to neutron" in problem
