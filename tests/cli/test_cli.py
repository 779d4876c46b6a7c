"""The real entry point in a subprocess: exit codes, messages, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cli.runner import run_agent, write_config
from tests.hostdata import HOSTDATA
from tests.machine_id import isolated_config

TEST6 = HOSTDATA / "virhostcpudata" / "linux-test6"  # 0-7 present, 5,7 offline
TEST3 = HOSTDATA / "virhostcpudata" / "linux-test3"  # 48 CPUs, 8 nodes
LIBVIRT_HOST = Path(__file__).resolve().parents[1] / "data" / "libvirt" / "host.xml"


def agent(config: Path, *args: str):
    return run_agent("--config-file", str(config), *args)


def assert_config_refusal(result, *fragments):
    assert result.code == 78, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr
    assert result.stdout == ""


def test_dry_run_text_shows_the_tree_and_writes_nothing(tmp_path):
    config = write_config(tmp_path, TEST6, host="compute-7")
    result = agent(config, "--once", "--dry-run")
    assert result.code == 0, result.stderr
    assert "compute-7  [not yet in Placement]" in result.stdout
    assert "VCPU       total       6" in result.stdout
    assert "Changes: Placement not consulted." in result.stdout
    assert not (tmp_path / "state").exists()


def test_dry_run_json_has_the_stable_keys(tmp_path):
    config = write_config(tmp_path, TEST6)
    report = agent(config, "--once", "--dry-run", "--output", "json").json()
    assert sorted(report) == [
        "capacity",
        "changes",
        "errors",
        "guests",
        "numa_stranded",
        "providers",
        "reshape",
        "shared_storage",
        "warnings",
    ]
    assert report["capacity"]["ok"] is True and report["shared_storage"] is None
    assert report["errors"] == []
    root = report["providers"][0]
    assert sorted(root) == ["inventories", "name", "parent", "traits", "uuid"]
    assert root["parent"] is None and root["uuid"] is None
    assert sorted(root["inventories"]["VCPU"]) == [
        "allocation_ratio",
        "max_unit",
        "min_unit",
        "reserved",
        "step_size",
        "total",
    ]
    assert report["changes"] is None and report["reshape"] is None


def test_dedicated_and_shared_sets_give_pcpu_and_vcpu(tmp_path):
    config = write_config(
        tmp_path, TEST6, extra="cpu_dedicated_set = 2-4,6\ncpu_shared_set = 0-1\n"
    )
    inventories = agent(config, "--once", "--dry-run", "--output", "json").json()["providers"][0][
        "inventories"
    ]
    assert inventories["PCPU"]["total"] == 4 and inventories["PCPU"]["allocation_ratio"] == 1.0
    assert inventories["VCPU"]["total"] == 2 and inventories["VCPU"]["allocation_ratio"] == 4.0


def test_only_dedicated_set_reports_no_vcpu(tmp_path):
    config = write_config(tmp_path, TEST6, extra="cpu_dedicated_set = 0-4\n")
    inventories = agent(config, "--once", "--dry-run", "--output", "json").json()["providers"][0][
        "inventories"
    ]
    assert "VCPU" not in inventories and inventories["PCPU"]["total"] == 5


def test_reserved_disk_is_rounded_up_to_whole_gib(tmp_path):
    config = write_config(tmp_path, TEST6, extra="reserved_host_disk_mb = 1025\n")
    disk = agent(config, "--once", "--dry-run", "--output", "json").json()["providers"][0][
        "inventories"
    ]["DISK_GB"]
    assert disk["reserved"] == 2


def test_malformed_cpu_spec_exits_78_naming_option_and_value(tmp_path):
    config = write_config(tmp_path, TEST6, extra="cpu_dedicated_set = 0-3,x\n")
    assert_config_refusal(
        agent(config, "--once", "--dry-run"), "[compute] cpu_dedicated_set = '0-3,x'", "'x'"
    )


def test_offline_cpu_in_dedicated_set_exits_78_with_the_fix(tmp_path):
    config = write_config(tmp_path, TEST6, extra="cpu_dedicated_set = 4-7\n")
    assert_config_refusal(
        agent(config, "--once", "--dry-run"),
        "names offline CPUs 5,7",
        "online: 0-4,6",
        "remove them",
    )


def test_all_problems_are_reported_in_one_run(tmp_path):
    config = write_config(
        tmp_path,
        TEST6,
        extra="cpu_dedicated_set = 0-3\ncpu_shared_set = 3-9\ncpu_allocation_ratio = -2\n",
    )
    result = agent(config, "--once", "--dry-run")
    assert_config_refusal(result, "cpu_allocation_ratio = -2.0 must be greater than 0")
    result = agent(
        write_config(
            tmp_path / "b", TEST6, extra="cpu_dedicated_set = 0-3\ncpu_shared_set = 3-9\n"
        ),
        "--once",
        "--dry-run",
    )
    assert_config_refusal(result, "3 problems", "overlap on CPUs 3", "8-9", "5,7")


def test_negative_reserved_memory_exits_78(tmp_path):
    config = write_config(tmp_path, TEST6, extra="reserved_host_memory_mb = -1\n")
    assert_config_refusal(agent(config, "--once", "--dry-run"), "[compute] reserved_host_memory_mb")


def test_reserved_memory_at_or_above_total_exits_78(tmp_path):
    config = write_config(tmp_path, TEST6, extra="reserved_host_memory_mb = 999999\n")
    assert_config_refusal(
        agent(config, "--once", "--dry-run"),
        "reserved_host_memory_mb = 999999 is not below the host's 8183 MiB",
    )


def test_unknown_option_exits_78_naming_it(tmp_path):
    config = write_config(tmp_path, TEST6, extra="cpu_dedicated_sets = 1\n")
    assert_config_refusal(
        agent(config, "--once", "--dry-run"), "unknown option [compute] cpu_dedicated_sets"
    )


def test_missing_config_file_exits_78(tmp_path):
    assert_config_refusal(
        agent(tmp_path / "nope.conf", "--once", "--dry-run"), str(tmp_path / "nope.conf")
    )


def test_unparsable_config_file_exits_78(tmp_path):
    config = tmp_path / "broken.conf"
    config.write_text("[compute\ncpu_shared_set = 1\n")
    assert_config_refusal(agent(config, "--once", "--dry-run"), "cannot be parsed")


def test_garbage_sysfs_file_is_a_clear_error_not_a_traceback(tmp_path):
    root = tmp_path / "sys" / "devices" / "system" / "cpu"
    root.mkdir(parents=True)
    (root / "present").write_text("0-3\n")
    (root / "online").write_text("zero-three\n")
    config = tmp_path / "c.conf"
    config.write_text(
        isolated_config(tmp_path)
        + f"[host]\nsysfs_root = {tmp_path / 'sys'}\n[libvirt]\nconnection_uri =\n"
        f"[compute]\ninstances_path = {tmp_path}\n"
        f"[agent]\nstate_path = {tmp_path / 'state'}\n"
    )
    result = agent(config, "--once", "--dry-run")
    assert result.code == 69, result.stderr
    assert "Traceback" not in result.stderr
    assert "devices/system/cpu/online" in result.stderr


def test_check_config_prints_the_partition_per_numa_node(tmp_path):
    config = write_config(
        tmp_path,
        TEST3,
        extra="cpu_dedicated_set = 0-23\n"
        "cpu_shared_set = 24-39\n"
        "[placement]\nauth_type = none\n"
        "endpoint_override = http://127.0.0.1:9\n",
    )
    result = agent(config, "--check-config")
    assert result.code == 0, result.stderr
    assert "NUMA node 0: dedicated [0,4,8,12,16,20]  shared []  unused []" in result.stdout
    assert "NUMA node 1: dedicated []  shared [24,28,32,36]  unused [40,44]" in result.stdout
    same = run_agent("check-config", "--config-file", str(config))
    assert same.stdout == result.stdout


def test_once_without_placement_configured_is_refused_clearly(tmp_path):
    result = agent(write_config(tmp_path, TEST6), "--once")
    assert result.code == 78
    assert "no Placement is configured" in result.stderr


def test_dry_run_reads_guests_through_libvirt_test_driver(tmp_path):
    config = write_config(tmp_path, TEST6)
    text = config.read_text().replace(
        "connection_uri =\n", f"connection_uri = test://{LIBVIRT_HOST}\n"
    )
    config.write_text(text)
    result = agent(config, "--once", "--dry-run", "--output", "json")
    assert result.code == 0, result.stderr
    assert not any("connection_uri is empty" in w for w in result.json()["warnings"])


def test_a_libvirt_error_that_is_not_utf8_exits_69_without_a_traceback(tmp_path):
    config = write_config(tmp_path, TEST6)
    uri = f"test://{tmp_path}/%FFhost.xml"  # libvirt echoes the unescaped byte 0xff
    config.write_text(config.read_text().replace("connection_uri =\n", f"connection_uri = {uri}\n"))
    # libxml2 prints its own warning with the raw byte, so stderr is not UTF-8.
    done = subprocess.run(
        [sys.executable, "-m", "node_agent.cli.main", "--config-file", str(config)]
        + ["--once", "--dry-run"],
        capture_output=True,
        timeout=60,
    )
    stderr = done.stderr.decode("utf-8", "backslashreplace")
    assert done.returncode == 69, stderr
    assert "Traceback" not in stderr and "SystemError" not in stderr
    assert f"libvirt at {uri}: cannot connect" in stderr


def test_provider_file_publishing_neutron_bandwidth_exits_78_naming_neutron(tmp_path):
    """NET_BW_*, NET_PACKET_RATE_* and CUSTOM_VNIC_TYPE_* are neutron's: a
    provider file claiming them is refused with the file, the field and who
    owns them, before anything is published."""
    config = write_config(tmp_path, TEST6)
    files = tmp_path / "provider_config"
    files.mkdir()
    (files / "sriov.yaml").write_text(
        "meta:\n  schema_version: '1.0'\nproviders:\n"
        "  - identification:\n      uuid: $COMPUTE_NODE\n"
        "    inventories:\n      additional:\n"
        "        - NET_BW_EGR_KILOBIT_PER_SEC:\n            total: 10000000\n"
        "        - NET_PACKET_RATE_KILOPACKET_PER_SEC:\n            total: 1000\n"
        "    traits:\n      additional:\n        - CUSTOM_VNIC_TYPE_DIRECT\n"
    )
    result = agent(config, "--once", "--dry-run")
    assert_config_refusal(
        result,
        f"{files / 'sriov.yaml'}: providers[0].inventories.additional[0]."
        "NET_BW_EGR_KILOBIT_PER_SEC: NET_BW_EGR_KILOBIT_PER_SEC belongs to neutron",
        "providers[0].inventories.additional[1].NET_PACKET_RATE_KILOPACKET_PER_SEC: "
        "NET_PACKET_RATE_KILOPACKET_PER_SEC belongs to neutron",
        "providers[0].traits.additional[0]: CUSTOM_VNIC_TYPE_DIRECT belongs to neutron",
    )
    assert "must be CUSTOM_" not in result.stderr


def test_check_config_and_dry_run_name_the_flavors_numa_children_strand(tmp_path):
    # linux-test3: 48 CPUs in 8 nodes of 6. Flat, VCPU:48 has a candidate;
    # with a child per node, VCPU:7 has none (Placement never splits VCPU).
    config = write_config(
        tmp_path,
        TEST3,
        extra="numa_in_placement = true\n"
        "[placement]\nauth_type = none\n"
        "endpoint_override = http://127.0.0.1:9\n",
    )
    stranded = (
        "floating: flavors with VCPU 7..48 or MEMORY_MB 65537..523766 find a candidate "
        "flat but none with NUMA children; the largest that still does: VCPU:6, MEMORY_MB:65536"
    )
    checked = agent(config, "--check-config")
    assert checked.code == 0, checked.stderr
    assert "[compute] numa_in_placement is on, for the host empty" in checked.stdout
    assert stranded in checked.stdout
    assert "hw:numa_nodes=2: flavors with VCPU 14..48" in checked.stdout
    as_json = agent(config, "--check-config", "--output", "json").json()
    shapes = {s["kind"]: s for s in as_json["numa_stranded"]["shapes"]}
    assert shapes["floating"]["stranded"]["VCPU"] == [7, 48]
    # Without [placement] the dry run plans against nothing and prints the tree.
    offline = write_config(tmp_path / "offline", TEST3, extra="numa_in_placement = true\n")
    dry = agent(offline, "--once", "--dry-run")
    assert dry.code == 0, dry.stderr
    assert "Flavors NUMA children strand" in dry.stdout and stranded in dry.stdout
