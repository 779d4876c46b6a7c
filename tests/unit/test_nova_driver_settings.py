"""nova.conf settings the whole-driver conformance found the agent ignoring:
pure rules, with literal values (the conformance area runs them against
nova itself)."""

from __future__ import annotations

import dataclasses

from node_agent.config.files import unbuilt_nova_settings
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


def test_unbuilt_nova_settings_warn_by_name():
    found = unbuilt_nova_settings(
        ["[libvirt] pmem_namespaces", "[mdev_nvidia-11]", "[libvirt] images_type"]
    )
    assert len(found) == 2
    assert "CUSTOM_PMEM_NAMESPACE" in found[0]
    assert "[mdev_nvidia-11]" in found[1]
