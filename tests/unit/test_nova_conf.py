"""nova.conf as it is: --config-file /etc/nova/nova.conf --config-file node-agent.conf."""

from __future__ import annotations

import logging

import pytest

from node_agent.config.files import load_conf, log_ignored
from node_agent.config.settings import load_settings
from node_agent.errors import ConfigError

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
    assert [(r.node, r.size_kb, r.count) for r in settings.reserved_huge_pages] == [(0, 2048, 64)]
    # 0.0 is unset in nova: the initial ratio applies to a new class only.
    assert settings.cpu_allocation_ratio == 8.0
    assert settings.keeps_placement_ratio("cpu")
    assert settings.ram_allocation_ratio == 1.5
    assert not settings.keeps_placement_ratio("ram")


def test_novas_own_sections_and_options_are_ignored_with_one_debug_line(tmp_path, caplog):
    conf = load(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="node_agent.config.files"):
        log_ignored(conf)
    lines = [r.getMessage() for r in caplog.records if "nova options" in r.getMessage()]
    assert len(lines) == 1
    for name in (
        "[api_database]",
        "[neutron]",
        "[mdev_nvidia-35]",
        "[workarounds]",
        "[DEFAULT] my_ip",
        "[compute] resource_provider_association_refresh",
    ):
        assert name in lines[0]


def test_the_agents_state_file_never_goes_to_novas_state_path(tmp_path):
    assert load_settings(load(tmp_path)).state_path == "/var/lib/node-agent"
    chosen = load_settings(load(tmp_path, "[agent]\nstate_path = /srv/agent\n"))
    assert chosen.state_path == "/srv/agent"


def test_a_nova_conf_of_shared_options_only_never_holds_the_agents_state(tmp_path):
    # Not one name only nova has: no heuristic can tell it is nova's file.
    conf = load(
        tmp_path,
        "",
        nova_conf="[DEFAULT]\nstate_path = /srv/nova\nreserved_host_memory_mb = 1024\n",
    )
    assert load_settings(conf).state_path == "/var/lib/node-agent"


def test_the_agents_state_path_set_to_novas_directory_is_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_settings(load(tmp_path, "[agent]\nstate_path = /var/lib/nova/\n"))
    assert any(
        "[agent] state_path = /var/lib/nova/ is nova's [DEFAULT] state_path" in p
        for p in err.value.problems
    ), err.value.problems


def test_an_older_agents_state_under_default_state_path_is_not_left_behind(tmp_path):
    # An older agent read its directory from [DEFAULT] state_path: its state
    # (maintenance among it) must not be dropped without a word.
    old = tmp_path / "old-state"
    old.mkdir()
    (old / "state.json").write_text("{}")
    with pytest.raises(ConfigError) as err:
        load_settings(load(tmp_path, f"[DEFAULT]\nstate_path = {old}\n", nova_conf=""))
    assert any(
        f"[DEFAULT] state_path = {old} holds node-agent's state.json" in p
        and "Rename the option to [agent] state_path" in p
        for p in err.value.problems
    )
    kept = load_settings(load(tmp_path, f"[agent]\nstate_path = {old}\n", nova_conf=""))
    assert kept.state_path == str(old)


@pytest.mark.parametrize(
    "nova_default, expected",
    [
        ("state_path = /srv/nova\n", "/srv/nova/instances"),
        ("state_path = /srv/nova\ninstances_path = /data/guests\n", "/data/guests"),
        ("state_path = /srv/nova\ninstances_path = $state_path/vms\n", "/srv/nova/vms"),
        ("", "/var/lib/nova/instances"),
    ],
)
def test_instances_path_defaults_under_novas_state_path_as_in_nova(
    tmp_path, nova_default, expected
):
    conf = load(tmp_path, nova_conf=f"[DEFAULT]\nmy_ip = 10.0.0.7\n{nova_default}")
    assert load_settings(conf).instances_path == expected


def test_images_type_of_nova_is_read(tmp_path):
    assert load_settings(load(tmp_path)).images_type == "rbd"


STALE = {
    "[DEFAULT] use_neutron": "use_neutron = true",
    "[DEFAULT] firewall_driver": "firewall_driver = nova.virt.firewall.NoopFirewallDriver",
    "[libvirt] use_usb_tablet": "use_usb_tablet = false",
}


def _stale_nova_conf() -> str:
    text = NOVA_CONF.replace(
        "[DEFAULT]\n",
        "[DEFAULT]\n"
        + STALE["[DEFAULT] use_neutron"]
        + "\n"
        + STALE["[DEFAULT] firewall_driver"]
        + "\n",
    )
    text = text.replace("[libvirt]\n", "[libvirt]\n" + STALE["[libvirt] use_usb_tablet"] + "\n")
    return text + "[xenserver]\nconnection_url = http://xen\n"


def test_a_stale_nova_conf_is_read_as_nova_reads_it(tmp_path, caplog):
    """nova 34 ignores options it no longer has; so does the agent, in nova's file."""
    conf = load(tmp_path, nova_conf=_stale_nova_conf())
    assert load_settings(conf).reserved_host_memory_mb == 4096
    with caplog.at_level(logging.DEBUG, logger="node_agent.config.files"):
        log_ignored(conf)
    [line] = [r.getMessage() for r in caplog.records if "nova options" in r.getMessage()]
    for name in list(STALE) + ["[xenserver]"]:
        assert name in line


@pytest.mark.parametrize(
    "agent_conf",
    [
        "[DEFAULT]\nuse_neutron = true\n",
        # The agent's own file even with a name only nova has in it.
        "[agent]\nreport_interval = 10\n[DEFAULT]\nmy_ip = 10.0.0.7\nuse_neutron = true\n",
    ],
)
def test_a_name_nova_34_lacks_in_the_agents_own_file_is_still_refused(tmp_path, agent_conf):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, agent_conf, nova_conf=_stale_nova_conf())
    assert [p for p in err.value.problems if "unknown option [DEFAULT] use_neutron" in p] and all(
        str(tmp_path / "node-agent.conf") in p for p in err.value.problems
    )


def test_novas_logging_options_are_novas(tmp_path):
    nova_conf = NOVA_CONF.replace(
        "debug = false", "debug = true\nlog_dir = /var/log/nova\nuse_journal = true"
    )
    conf = load(tmp_path, nova_conf=nova_conf)
    assert (conf.debug, conf.log_dir, conf.use_journal) == (False, None, False)


@pytest.mark.parametrize("agent_first", [False, True])
def test_the_agents_own_logging_options_apply_whatever_the_file_order(tmp_path, agent_first):
    nova = tmp_path / "nova.conf"
    nova.write_text(
        NOVA_CONF.replace("debug = false", "debug = false\nlog_file = /var/log/nova/n.log")
    )
    agent = tmp_path / "node-agent.conf"
    agent.write_text(
        "[DEFAULT]\ndebug = true\nlog_file = /var/log/node-agent/a.log\n"
        "[agent]\nreport_interval = 10\n"
    )
    files = [agent, nova] if agent_first else [nova, agent]
    conf = load_conf([arg for path in files for arg in ("--config-file", str(path))])
    assert (conf.debug, conf.log_file) == (True, "/var/log/node-agent/a.log")


def test_the_agents_compute_section_wins_over_novas_default(tmp_path):
    settings = load_settings(load(tmp_path, "[compute]\nreserved_host_memory_mb = 1024\n"))
    assert settings.reserved_host_memory_mb == 1024


@pytest.mark.parametrize(
    "agent_conf, named",
    [
        ("[compute]\ncpu_dedicated_sets = 4-7\n", "unknown option [compute] cpu_dedicated_sets"),
        ("[agent]\nreport_intervall = 10\n", "unknown option [agent] report_intervall"),
        ("[DEFAULT]\nreserved_host_memory = 10\n", "unknown option [DEFAULT] reserved_host_memory"),
        ("[libvirt]\nconection_uri = qemu:///system\n", "unknown option [libvirt] conection_uri"),
        ("[computer]\nx = 1\n", "unknown section [computer]"),
    ],
)
def test_a_typo_next_to_a_nova_conf_is_still_refused(tmp_path, agent_conf, named):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, agent_conf)
    assert any(named in p for p in err.value.problems), err.value.problems


def test_a_bad_value_in_novas_default_names_the_section(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_settings(load(tmp_path, nova_conf="[DEFAULT]\nreserved_host_memory_mb = lots\n"))
    assert any(
        p.startswith("[DEFAULT] reserved_host_memory_mb has an invalid value 'lots'")
        for p in err.value.problems
    ), err.value.problems


def test_an_empty_cpu_set_option_is_unset_as_in_nova(tmp_path):
    conf = load(tmp_path, nova_conf="[compute]\ncpu_shared_set =\ncpu_dedicated_set =\n")
    settings = load_settings(conf)
    assert settings.cpu_shared_set is None and settings.cpu_dedicated_set is None


def test_the_agents_file_with_a_transport_url_and_no_agent_section_is_its_own(tmp_path):
    # transport_url is nova's and the agent's (oslo.messaging): not a sign of
    # nova's file, so a typo next to it is still refused.
    agent = tmp_path / "node-agent.conf"
    agent.write_text(
        "[DEFAULT]\ntransport_url = rabbit://a:b@rabbit1:5672/\n"
        "debug = true\n[compute]\ncpu_dedicated_sets = 4-7\n"
    )
    with pytest.raises(ConfigError) as err:
        load_conf(["--config-file", str(agent)])
    assert any("unknown option [compute] cpu_dedicated_sets" in p for p in err.value.problems)


@pytest.mark.parametrize("agent_section", ["", "[agent]\nstate_path = /var/lib/node-agent\n"])
def test_an_upgraded_file_with_the_earlier_default_state_path_is_told_to_delete_it(
    tmp_path, agent_section
):
    # The earlier sample set [DEFAULT] state_path = /var/lib/node-agent (then
    # the agent's own option): the advice must not name that same directory.
    with pytest.raises(ConfigError) as err:
        load_settings(
            load(
                tmp_path,
                "[DEFAULT]\nstate_path = /var/lib/node-agent\n" + agent_section,
                nova_conf="",
            )
        )
    (problem,) = err.value.problems
    assert "Delete the [DEFAULT] state_path line" in problem
    assert "for example /var/lib/node-agent" not in problem
