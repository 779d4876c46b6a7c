"""Options of the nested providers: parsing and the messages of bad values."""

from __future__ import annotations

import pytest

from node_agent.config.files import load_conf
from node_agent.config.settings import load_settings
from node_agent.errors import ConfigError
from node_agent.model.device_spec import PciDeviceSpec, parse_spec, physnet_trait
from node_agent.model.hugepages import ReservedPages, parse_reservation, parse_size_kb


def load(tmp_path, text: str):
    path = tmp_path / "na.conf"
    path.write_text("[DEFAULT]\nhost = cn1\n" + text)
    return load_settings(load_conf(["--config-file", str(path)]))


@pytest.mark.parametrize(
    "text, kb",
    [("2048", 2048), ("2M", 2048), ("2MB", 2048), ("1G", 1048576), ("1GiB", 1048576), ("64k", 64)],
)
def test_page_sizes_accept_kib_or_units(text, kb):
    assert parse_size_kb(text) == kb


def test_reservation_in_nova_format():
    assert parse_reservation("node:1,size:1G,count:2") == ReservedPages(1, 1048576, 2)
    assert parse_reservation("size:2048, count:64, node:0") == ReservedPages(0, 2048, 64)


@pytest.mark.parametrize(
    "text",
    [
        "node:0,size:2048",
        "node:x,size:2048,count:1",
        "node:0,size:2T,count:1",
        "node:0,size:2048,count:1,foo:2",
        "node:0,node:1,size:2048,count:1",
    ],
)
def test_bad_reservations_are_refused(text):
    with pytest.raises(ValueError):
        parse_reservation(text)


def test_nested_options_load_into_settings(tmp_path):
    settings = load(
        tmp_path,
        """
[compute]
numa_in_placement = true
reserved_huge_pages = node:0,size:2M,count:64
reserved_huge_pages = node:1,size:1G,count:1
provider_config_location = /tmp/pc
[devices]
enabled_mdev_types = nvidia-222, nvidia-223
[pci]
device_spec = {"address": "0000:3b:00.0", "physical_network": "physnet1"}
report_sriov_numvfs = true
[node]
resource_class = CUSTOM_BAREMETAL_GOLD
""",
    )
    assert settings.numa_in_placement is True
    assert settings.reserved_huge_pages == (
        ReservedPages(0, 2048, 64),
        ReservedPages(1, 1048576, 1),
    )
    assert settings.provider_config_location == "/tmp/pc"
    assert settings.enabled_mdev_types == ("nvidia-222", "nvidia-223")
    assert settings.pci_device_specs == (PciDeviceSpec("physnet1", address="0000:3b:00.0"),)
    assert settings.report_sriov_numvfs is True
    assert settings.node_resource_class == "CUSTOM_BAREMETAL_GOLD"


def test_defaults_leave_the_tree_flat(tmp_path):
    settings = load(tmp_path, "")
    assert settings.numa_in_placement is False
    assert settings.reserved_huge_pages == ()
    assert settings.enabled_mdev_types == ()
    assert settings.pci_device_specs == ()
    assert settings.node_resource_class is None
    assert settings.provider_config_location == "/etc/node-agent/provider_config/"


def test_bad_values_are_all_reported_with_option_value_and_fix(tmp_path):
    with pytest.raises(ConfigError) as err:
        load(
            tmp_path,
            """
[compute]
reserved_huge_pages = node:0,size:2048
[pci]
device_spec = {"address": "0000:3b:00.0", "devname": "eth0", "physical_network": "p"}
device_spec = not json
[node]
resource_class = baremetal.gold
""",
        )
    problems = err.value.problems
    assert len(problems) == 4
    assert problems[0].startswith(
        "[compute] reserved_huge_pages = 'node:0,size:2048' "
        "is invalid: count missing. Write node:0,size:2048,count:64"
    )
    assert '[pci] device_spec = \'{"address"' in problems[1]
    assert "either address or devname" in problems[1]
    assert "not JSON" in problems[2]
    assert problems[3] == (
        "[node] resource_class = 'baremetal.gold' is not a custom "
        "resource class (CUSTOM_ followed by A-Z, 0-9 and _). "
        "Write it as 'CUSTOM_BAREMETAL_GOLD'."
    )


def test_resource_class_over_255_characters_is_refused_at_config_time(tmp_path):
    name = "CUSTOM_" + "G" * 249
    with pytest.raises(ConfigError) as err:
        load(tmp_path, f"[node]\nresource_class = {name}\n")
    assert list(err.value.problems) == [
        f"[node] resource_class = '{name[:40]}...' is 256 characters long; "
        "Placement takes at most 255. Shorten it."
    ]


def test_short_pci_address_matches_any_domain_as_nova():
    # nova's PciAddressGlobSpec: a field left off is any, not 0000.
    spec = parse_spec('{"address": "3B:00.0", "physical_network": "p"}')
    assert spec.address == "*:3b:00.0"
    assert spec.matches("0000:3b:00.0") and spec.matches("0001:3b:00.0")


def test_address_with_function_left_off_matches_every_function_as_nova():
    spec = parse_spec('{"address": "0000:81:00."}')
    assert spec.matches("0000:81:00.3") and not spec.matches("0000:81:01.0")


@pytest.mark.parametrize(
    "text, problem",
    [
        ('["a"]', "not a JSON object"),
        ('{"address": "0000:3b:00.0", "colour": "red"}', "unknown key(s) colour"),
        ('{"vendor_id": "80861", "physical_network": "p"}', "vendor_id '80861' is above FFFF"),
        ('{"resource_class": "", "physical_network": "p"}', "non-empty string"),
        (
            '{"address": "0000:3b:00.0", "physical_network": "%s"}' % ("p" * 241),
            "longer than Placement's 255 characters",
        ),
    ],
)
def test_bad_device_specs_say_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_spec(text)


def test_physnet_trait_is_normalised():
    assert physnet_trait("physnet1") == "CUSTOM_PHYSNET_PHYSNET1"
    assert physnet_trait("data-net.2") == "CUSTOM_PHYSNET_DATA_NET_2"


def test_report_in_placement_refuses_devname_specs_as_nova(tmp_path):
    # nova's test_devname_based_dev_spec_rejected
    with pytest.raises(ConfigError) as err:
        load(
            tmp_path,
            '[pci]\nreport_in_placement = true\ndevice_spec = {"devname": "eth0"}\n',
        )
    assert "devname 'eth0'" in str(err.value) and "report_in_placement" in str(err.value)


def test_one_time_use_without_report_in_placement_is_refused_as_nova(tmp_path):
    with pytest.raises(ConfigError, match="one_time_use = true needs"):
        load(tmp_path, '[pci]\ndevice_spec = {"address": "0000:81:00.0", "one_time_use": "true"}\n')


def test_report_in_placement_reads_nova_tags(tmp_path):
    got = load(
        tmp_path,
        "[pci]\nreport_in_placement = true\n"
        'device_spec = {"address": "0000:81:00.0", "resource_class": "crypto", '
        '"traits": "a,b", "one_time_use": "yes", "live_migratable": true}\n',
    )
    [spec] = got.pci_device_specs
    assert got.pci_in_placement
    assert (spec.resource_class, spec.traits, spec.one_time_use, spec.live_migratable) == (
        "crypto",
        "a,b",
        True,
        True,
    )


def test_one_time_use_that_is_not_a_boolean_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="'one_time_use' must be true or false"):
        load(
            tmp_path,
            "[pci]\nreport_in_placement = true\n"
            'device_spec = {"address": "0000:81:00.0", "one_time_use": "maybe"}\n',
        )


@pytest.mark.parametrize(
    "rc", ["VCPU", "memory_mb", "VGPU", "SRIOV_NET_VF", "CUSTOM_MEMORY_PAGE_2048"]
)
def test_pci_resource_class_the_agent_reports_from_the_host_is_refused(tmp_path, rc):
    with pytest.raises(ConfigError, match="reports from the host itself"):
        load(
            tmp_path,
            "[pci]\nreport_in_placement = true\n"
            f'device_spec = {{"address": "0000:81:00.0", "resource_class": "{rc}"}}\n',
        )


def test_pci_spec_with_neutrons_class_or_trait_is_refused_naming_neutron(tmp_path):
    with pytest.raises(ConfigError) as err:
        load(
            tmp_path,
            "[pci]\nreport_in_placement = true\n"
            'device_spec = {"address": "0000:81:00.0", "resource_class": '
            '"NET_BW_EGR_KILOBIT_PER_SEC", "traits": "CUSTOM_VNIC_TYPE_DIRECT"}\n',
        )
    problems = err.value.problems
    assert any("NET_BW_EGR_KILOBIT_PER_SEC belongs to neutron" in p for p in problems)
    assert any("CUSTOM_VNIC_TYPE_DIRECT belongs to neutron" in p for p in problems)
