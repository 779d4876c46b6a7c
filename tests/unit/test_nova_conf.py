"""nova.conf as it is: --config-file /etc/nova/nova.conf --config-file node-agent.conf."""

from __future__ import annotations

import logging

import pytest

from node_agent.config.files import load_conf
from node_agent.errors import ConfigError
from node_agent.config.settings import load_settings

# A nova.conf of a libvirt compute node, trimmed; every name is nova 34's.
NOVA_CONF = """
[DEFAULT]
host = compute-7
my_ip = 10.0.0.7
debug = false
state_path = /var/lib/nova
instances_path = /var/lib/nova/instances
reserved_host_memory_mb = 4096
reserved_host_disk_mb = 2049
cpu_allocation_ratio = 0.0
initial_cpu_allocation_ratio = 8.0
ram_allocation_ratio = 1.5
vcpu_pin_set = 2-7
reserved_huge_pages = node:0,size:2048,count:64
compute_driver = libvirt.LibvirtDriver
transport_url = rabbit://nova:secret@rabbit1:5672/

[api_database]
connection = mysql+pymysql://nova:secret@db/nova_api

[neutron]
auth_type = password
auth_url = http://keystone:5000/v3
username = neutron

[compute]
cpu_shared_set = 0-1
resource_provider_association_refresh = 300

[libvirt]
virt_type = kvm
cpu_mode = host-model
images_type = rbd

[mdev_nvidia-35]
device_addresses = 0000:84:00.0

[workarounds]
disable_fallback_pcpu_query = false

[placement]
auth_type = password
auth_url = http://keystone:5000/v3
username = nova
password = secret
project_name = service
user_domain_name = Default
project_domain_name = Default
"""


def load(tmp_path, agent_conf="", nova_conf=NOVA_CONF):
    nova = tmp_path / "nova.conf"
    nova.write_text(nova_conf)
    agent = tmp_path / "node-agent.conf"
    agent.write_text(agent_conf)
    return load_conf(["--config-file", str(nova), "--config-file", str(agent)])


def test_novas_legacy_default_options_mean_what_they_mean_in_nova(tmp_path):
    settings = load_settings(load(tmp_path))
    assert settings.host == "compute-7"
    assert settings.reserved_host_memory_mb == 4096
    assert settings.reserved_host_disk_mb == 2049
    assert str(settings.vcpu_pin_set) == "2-7"
    assert settings.instances_path == "/var/lib/nova/instances"
    assert [(r.node, r.size_kb, r.count) for r in settings.reserved_huge_pages] == \
        [(0, 2048, 64)]
    # 0.0 is unset in nova: the initial ratio applies to a new class only.
    assert settings.cpu_allocation_ratio == 8.0
    assert settings.keeps_placement_ratio("cpu")
    assert settings.ram_allocation_ratio == 1.5
    assert not settings.keeps_placement_ratio("ram")


def test_novas_own_sections_and_options_are_ignored_with_one_debug_line(tmp_path, caplog):
    with caplog.at_level(logging.DEBUG, logger="node_agent.config.files"):
        load(tmp_path)
    lines = [r.getMessage() for r in caplog.records if "nova options" in r.getMessage()]
    assert len(lines) == 1
    for name in ("[api_database]", "[neutron]", "[mdev_nvidia-35]", "[workarounds]",
                 "[DEFAULT] my_ip", "[compute] resource_provider_association_refresh",
                 "[libvirt] images_type"):
        assert name in lines[0]


def test_the_agents_state_file_never_goes_to_novas_state_path(tmp_path):
    assert load_settings(load(tmp_path)).state_path == "/var/lib/node-agent"
    chosen = load_settings(load(tmp_path, "[agent]\nstate_path = /srv/agent\n"))
    assert chosen.state_path == "/srv/agent"


def test_default_state_path_still_works_without_a_nova_conf(tmp_path):
    conf = load(tmp_path, "", nova_conf="[DEFAULT]\nstate_path = /srv/old\n")
    assert load_settings(conf).state_path == "/srv/old"


def test_the_agents_compute_section_wins_over_novas_default(tmp_path):
    settings = load_settings(load(tmp_path, "[compute]\nreserved_host_memory_mb = 1024\n"))
    assert settings.reserved_host_memory_mb == 1024


@pytest.mark.parametrize("agent_conf, named", [
    ("[compute]\ncpu_dedicated_sets = 4-7\n", "unknown option [compute] cpu_dedicated_sets"),
    ("[agent]\nreport_intervall = 10\n", "unknown option [agent] report_intervall"),
    ("[DEFAULT]\nreserved_host_memory = 10\n", "unknown option [DEFAULT] reserved_host_memory"),
    ("[libvirt]\nconection_uri = qemu:///system\n", "unknown option [libvirt] conection_uri"),
    ("[computer]\nx = 1\n", "unknown section [computer]"),
])
def test_a_typo_next_to_a_nova_conf_is_still_refused(tmp_path, agent_conf, named):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, agent_conf)
    assert any(named in p for p in err.value.problems), err.value.problems


def test_a_bad_value_in_novas_default_names_the_section(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_settings(load(tmp_path, nova_conf="[DEFAULT]\nreserved_host_memory_mb = lots\n"))
    assert any(p.startswith("[DEFAULT] reserved_host_memory_mb has an invalid value 'lots'")
               for p in err.value.problems), err.value.problems


def test_an_empty_cpu_set_option_is_unset_as_in_nova(tmp_path):
    conf = load(tmp_path, nova_conf="[compute]\ncpu_shared_set =\ncpu_dedicated_set =\n")
    settings = load_settings(conf)
    assert settings.cpu_shared_set is None and settings.cpu_dedicated_set is None
