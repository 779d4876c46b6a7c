"""The real CLI with an operator's nova.conf before the agent's own file."""

from __future__ import annotations

from tests.cli.runner import run_agent, write_config
from tests.hostdata import HOSTDATA

TEST6 = HOSTDATA / "virhostcpudata" / "linux-test6"


def _nova_conf(tmp_path, log_dir) -> str:
    path = tmp_path / "nova.conf"
    path.write_text(
        "[DEFAULT]\ndebug = true\nmy_ip = 10.0.0.7\nstate_path = /var/lib/nova\n"
        f"log_dir = {log_dir}\ncompute_driver = libvirt.LibvirtDriver\n"
        "use_neutron = true\n[libvirt]\nimages_type = rbd\n"
        "images_rbd_pool = vms\n"
    )
    return str(path)


def test_novas_log_dir_is_not_the_agents_and_the_debug_line_reaches_the_agents_log(tmp_path):
    # nova's log_dir does not exist here: an agent that took it as its own
    # could not open its log (exit 78), or would write into nova's.
    novas_log_dir = tmp_path / "var-log-nova"
    log_file = tmp_path / "agent.log"
    config = write_config(
        tmp_path, TEST6, extra=f"[DEFAULT]\nlog_file = {log_file}\ndebug = true\n"
    )
    result = run_agent(
        "--config-file",
        _nova_conf(tmp_path, novas_log_dir),
        "--config-file",
        str(config),
        "--once",
        "--dry-run",
    )
    assert result.code == 0, result.stderr
    assert not novas_log_dir.exists()
    logged = log_file.read_text()
    assert "nova options the agent does not use, ignored: " in logged
    assert "[DEFAULT] use_neutron (unknown to nova 34.0.0)" in logged


def test_images_type_rbd_is_named_in_the_warnings_with_what_is_reported(tmp_path):
    config = write_config(tmp_path, TEST6)
    result = dry_run_json(_nova_conf(tmp_path, tmp_path / "nova-log"), str(config))
    assert result.code == 0, result.stderr
    [warning] = [w for w in result.json()["warnings"] if "images_type" in w]
    assert warning.startswith("[libvirt] images_type = rbd: nova reports the Ceph pool's")
    assert f"filesystem holding instances_path '{tmp_path / 'instances'}'" in warning


def dry_run_json(*config_files: str):
    """``--once --dry-run --output json`` with these config files, in order."""
    files = [arg for path in config_files for arg in ("--config-file", path)]
    return run_agent(*files, "--once", "--dry-run", "--output", "json")


def _pci_nova_conf(tmp_path, *specs: str) -> str:
    path = tmp_path / "nova-pci.conf"
    path.write_text(
        "[pci]\nreport_in_placement = true\n" + "".join(f"device_spec = {s}\n" for s in specs)
    )
    return str(path)


def test_pci_in_placement_reports_children_from_novas_conf(tmp_path):
    from tests.unit.test_pci import add_device

    config = write_config(tmp_path, TEST6)
    add_device(tmp_path / "sysroot", "0000:af:00.0", vendor="0x10de", device="0x1eb8")
    nova_conf = _pci_nova_conf(tmp_path, '{"vendor_id": "10de", "traits": "gpu"}')
    result = dry_run_json(nova_conf, str(config))
    assert result.code == 0, result.stderr
    [child] = [p for p in result.json()["providers"] if p["parent"]]
    assert child["name"] == "fixture-host_0000:AF:00.0"
    assert list(child["inventories"]) == ["CUSTOM_PCI_10DE_1EB8"]
    assert "CUSTOM_GPU" in child["traits"] and "COMPUTE_MANAGED_PCI_DEVICE" in child["traits"]


def test_pci_in_placement_with_a_devname_spec_exits_78_naming_it(tmp_path):
    config = write_config(tmp_path, TEST6)
    nova_conf = _pci_nova_conf(tmp_path, '{"devname": "eth0"}')
    result = run_agent("--config-file", nova_conf, "--config-file", str(config), "--once")
    assert result.code == 78
    assert "[pci] device_spec with devname 'eth0'" in result.stderr
    assert "give the address instead" in result.stderr
