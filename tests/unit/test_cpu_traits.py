"""CPU feature traits from libvirt host-model CPUs (cputestdata)."""

from __future__ import annotations

import os_traits
import pytest

from node_agent.host.capabilities import parse_cpu_model_xml
from node_agent.model.snapshot import HostCpuModel
from node_agent.tree.build import root_traits
from node_agent.tree.cpu_traits import X86_FEATURE_TRAITS, X86_VENDOR_TRAITS, feature_traits
from tests.hostdata import HOSTDATA

CPUTESTDATA = sorted((HOSTDATA / "cputestdata").glob("x86_64-cpuid-*-host.xml"))


def cpu(name: str) -> HostCpuModel:
    return parse_cpu_model_xml((HOSTDATA / "cputestdata" / name).read_text())


def test_every_mapped_trait_is_a_known_os_trait():
    known = set(os_traits.get_traits())
    assert set(X86_FEATURE_TRAITS.values()) <= known


def test_cputestdata_is_present():
    assert len(CPUTESTDATA) == 8


@pytest.mark.parametrize("path", CPUTESTDATA, ids=lambda p: p.stem)
def test_listed_features_in_the_table_are_true_and_all_other_table_traits_false(path):
    model = parse_cpu_model_xml(path.read_text())
    traits = feature_traits(model)
    tables = (X86_FEATURE_TRAITS, X86_VENDOR_TRAITS)
    expected_true = {table[f] for f in model.features for table in tables if f in table}
    assert {t for t, on in traits.items() if on} == expected_true
    assert set(traits) == set(X86_FEATURE_TRAITS.values()) | set(X86_VENDOR_TRAITS.values())


def test_xeon_gold_6148_extras_give_vmx_only():
    traits = feature_traits(cpu("x86_64-cpuid-Xeon-Gold-6148-host.xml"))
    assert {t for t, on in traits.items() if on} == {
        os_traits.HW_CPU_X86_VMX,
        os_traits.HW_CPU_X86_INTEL_VMX,
    }
    # AVX512F is implied by the Skylake-Server model, not listed as an extra.
    assert traits[os_traits.HW_CPU_X86_AVX512F] is False
    assert traits[os_traits.HW_CPU_X86_SVM] is False


def test_opteron_6282_extras_map_to_no_trait():
    traits = feature_traits(cpu("x86_64-cpuid-Opteron-6282-host.xml"))
    assert traits and not any(traits.values())


@pytest.mark.parametrize(
    "name, expected",
    [
        ("x86_64-cpuid-EPYC-7502-32-Core-host.xml", {os_traits.HW_CPU_X86_AMD_SSBD}),
        (
            "x86_64-cpuid-Ice-Lake-Server-host.xml",
            {
                os_traits.HW_CPU_X86_VMX,
                os_traits.HW_CPU_X86_SGX,
                os_traits.HW_CPU_X86_AVX512IFMA,
                os_traits.HW_CPU_X86_SHA,
                os_traits.HW_CPU_X86_STIBP,
            },
        ),
        (
            "x86_64-cpuid-Xeon-E5-2650-v4-host.xml",
            {
                os_traits.HW_CPU_X86_VMX,
                os_traits.HW_CPU_X86_F16C,
                os_traits.HW_CPU_X86_PDPE1GB,
                os_traits.HW_CPU_X86_ABM,
            },
        ),
        (
            "x86_64-cpuid-Cooperlake-host.xml",
            {
                os_traits.HW_CPU_X86_VMX,
                os_traits.HW_CPU_X86_MPX,
                os_traits.HW_CPU_X86_INTEL_MD_CLEAR,
            },
        ),
        (
            "x86_64-cpuid-Xeon-Platinum-8268-host.xml",
            {
                os_traits.HW_CPU_X86_VMX,
                os_traits.HW_CPU_X86_INTEL_MD_CLEAR,
                os_traits.HW_CPU_X86_STIBP,
            },
        ),
    ],
)
def test_cpu_model_extras_map_to_these_traits(name, expected):
    if os_traits.HW_CPU_X86_VMX in expected:  # nova sets both, see below
        expected = expected | {os_traits.HW_CPU_X86_INTEL_VMX}
    assert {t for t, v in feature_traits(cpu(name)).items() if v} == expected


@pytest.mark.parametrize(
    "feature, traits",
    [
        ("vmx", {os_traits.HW_CPU_X86_VMX, os_traits.HW_CPU_X86_INTEL_VMX}),
        ("svm", {os_traits.HW_CPU_X86_SVM, os_traits.HW_CPU_X86_AMD_SVM}),
    ],
)
def test_vmx_and_svm_also_set_the_vendor_trait_as_nova_does(feature, traits):
    decided = feature_traits(HostCpuModel(arch="x86_64", model="m", features=frozenset({feature})))
    assert {t for t, on in decided.items() if on} == traits


def test_vendor_traits_are_removed_when_the_feature_is_gone():
    decided = feature_traits(HostCpuModel(arch="x86_64", model="m", features=frozenset()))
    assert decided[os_traits.HW_CPU_X86_INTEL_VMX] is False
    assert decided[os_traits.HW_CPU_X86_AMD_SVM] is False


def test_sse_family_uses_libvirt_names():
    traits = feature_traits(
        HostCpuModel(arch="x86_64", model="qemu64", features=frozenset({"pni", "sse4.2", "aes"}))
    )
    on = {t for t, v in traits.items() if v}
    assert on == {os_traits.HW_CPU_X86_SSE3, os_traits.HW_CPU_X86_SSE42, os_traits.HW_CPU_X86_AESNI}


def test_unknown_cpu_decides_no_feature_trait():
    assert feature_traits(HostCpuModel(arch="x86_64")) == {}
    assert feature_traits(HostCpuModel()) == {}


def test_non_x86_cpu_decides_no_feature_trait():
    assert (
        feature_traits(HostCpuModel(arch="aarch64", model="host", features=frozenset({"aes"})))
        == {}
    )


def test_root_traits_carry_features_next_to_compute_node_and_arch(tmp_path):
    from tests.snapshots import snapshot

    host = snapshot(
        "virhostcpudata/linux-test6",
        tmp_path,
        cpu_model=cpu("x86_64-cpuid-Xeon-Gold-6148-host.xml"),
    )
    traits = root_traits(host)
    assert traits[os_traits.COMPUTE_NODE] is True
    assert traits[os_traits.HW_ARCH_X86_64] is True
    assert traits[os_traits.HW_CPU_HYPERTHREADING] is True
    assert traits[os_traits.HW_CPU_X86_VMX] is True
    assert traits[os_traits.HW_CPU_X86_AVX2] is False
