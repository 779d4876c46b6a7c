"""nova.conf settings the whole-driver conformance found the agent ignoring:
pure rules, with literal values (the conformance area runs them against
nova itself)."""

from __future__ import annotations

import dataclasses

from node_agent.config.settings import _file_backed_memory_problems
from node_agent.tree.build import arch_trait, disk_reserved_gb
from tests.snapshots import settings


def test_arch_trait_follows_nova_s_upper_cased_libvirt_arch():
    assert arch_trait("x86_64") == "HW_ARCH_X86_64"
    assert arch_trait("aarch64") == "HW_ARCH_AARCH64"
    assert arch_trait("armv7l") is None  # os-traits has no HW_ARCH_ARMV7L


def test_image_cache_adds_its_own_rounded_gib_to_disk_reserved():
    plain = settings(reserved_host_disk_mb=512)
    with_cache = dataclasses.replace(plain, reserve_disk_for_image_cache=True)
    assert disk_reserved_gb(plain, 1024 * 1024) == 1
    assert disk_reserved_gb(with_cache, 1024 * 1024) == 2
    assert disk_reserved_gb(with_cache, 0) == 1


def test_file_backed_memory_needs_nova_s_settings():
    assert _file_backed_memory_problems(0, "lxc", None, 512) == []
    assert _file_backed_memory_problems(1024, "kvm", 1.0, 0) == []
    problems = _file_backed_memory_problems(1024, "kvm", None, 512)
    assert len(problems) == 2
    assert "ram_allocation_ratio" in problems[0]
    assert "reserved_host_memory_mb" in problems[1]


def test_file_backed_memory_is_the_memory_limit_of_the_capacity_check(tmp_path):
    from node_agent.policy.capacity import host_limits
    from node_agent.policy.partition import partition_cpus
    from tests.snapshots import snapshot

    host = snapshot("virhostcpudata/linux-test4", tmp_path, file_backed_memory_mb=1048576)
    assert host_limits(host, partition_cpus(settings(), host)).memory_mb == 1048576


def test_pmem_namespaces_become_one_class_per_label(tmp_path):
    import pytest

    from node_agent.errors import ConfigError
    from node_agent.tree.build import pmem_inventories
    from tests.snapshots import snapshot

    conf = settings(pmem_namespaces=(("128G", ("ns0", "ns1")), ("small", ("ns2",))))
    host = snapshot(
        "virhostcpudata/linux-test4", tmp_path, pmem_namespaces=frozenset({"ns0", "ns1", "ns2"})
    )
    inventories = pmem_inventories(conf, host)
    assert {rc: inv.total for rc, inv in inventories.items()} == {
        "CUSTOM_PMEM_NAMESPACE_128G": 2,
        "CUSTOM_PMEM_NAMESPACE_SMALL": 1,
    }
    lacking = dataclasses.replace(host, pmem_namespaces=frozenset({"ns0"}))
    with pytest.raises(ConfigError, match="ns1, ns2"):
        pmem_inventories(conf, lacking)


def _load(tmp_path, text):
    from node_agent.config.files import load_conf
    from node_agent.config.settings import load_settings

    path = tmp_path / "nova.conf"
    path.write_text(text)
    return load_settings(load_conf(["--config-file", str(path)]))


def test_mdev_sections_of_enabled_types_are_read(tmp_path):
    from node_agent.model.settings import MdevTypeSettings

    values = _load(
        tmp_path,
        "[devices]\nenabled_mdev_types = nvidia-11,nvidia-12\n"
        "[mdev_nvidia-11]\ndevice_addresses = 0000:84:00.0\nmdev_class = CUSTOM_A\n"
        "[mdev_nvidia-12]\nmax_instances = 4\n",
    )
    assert values.mdev_types == (
        MdevTypeSettings("nvidia-11", ("0000:84:00.0",), None, "CUSTOM_A"),
        MdevTypeSettings("nvidia-12", (), 4, "VGPU"),
    )


def test_an_older_vgpu_section_gives_device_addresses_as_in_nova(tmp_path):
    """nova registers device_addresses with deprecated_group vgpu_<type>:
    a nova.conf from before the rename still assigns its GPUs."""
    values = _load(
        tmp_path,
        "[devices]\nenabled_mdev_types = nvidia-11,nvidia-12\n"
        "[vgpu_nvidia-11]\ndevice_addresses = 0000:84:00.0\n"
        "[mdev_nvidia-12]\ndevice_addresses = 0000:85:00.0\n",
    )
    assert [(t.name, t.device_addresses) for t in values.mdev_types] == [
        ("nvidia-11", ("0000:84:00.0",)),
        ("nvidia-12", ("0000:85:00.0",)),
    ]


def test_a_gpu_given_two_types_is_refused(tmp_path):
    import pytest

    from node_agent.errors import ConfigError

    with pytest.raises(ConfigError, match="already given type nvidia-11"):
        _load(
            tmp_path,
            "[devices]\nenabled_mdev_types = nvidia-11,nvidia-12\n"
            "[mdev_nvidia-11]\ndevice_addresses = 0000:84:00.0\n"
            "[mdev_nvidia-12]\ndevice_addresses = 0000:84:00.0\n",
        )
