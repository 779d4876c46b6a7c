"""CPU feature traits from real host CPU models, expanded by real libvirt.

The cputestdata files list only the features on top of the named model;
libvirt's baselineCPU (with its cpu_map) expands them, as the agent does on
a real host. The test driver runs the same expansion code.
"""

import os_traits as ot
import pytest

from node_agent.host.capabilities import parse_cpu_model_xml
from node_agent.host.hypervisor import Hypervisor
from node_agent.model.snapshot import HostCpuModel
from node_agent.tree.cpu_traits import feature_traits
from tests.hostdata import HOSTDATA

CPUS = HOSTDATA / "cputestdata"


def traits_of(filename: str) -> set[str]:
    xml = (CPUS / filename).read_text()
    listed = parse_cpu_model_xml(xml)
    hypervisor = Hypervisor("test:///default")
    try:
        expanded = parse_cpu_model_xml(hypervisor.expand_cpu_features(xml))
    finally:
        hypervisor.close()
    cpu = HostCpuModel("x86_64", listed.model, listed.vendor, listed.features | expanded.features)
    return {trait for trait, present in feature_traits(cpu).items() if present}


@pytest.mark.parametrize("filename", sorted(p.name for p in CPUS.glob("*.xml")))
def test_every_host_cpu_model_expands_to_at_least_sse2(filename):
    assert ot.HW_CPU_X86_SSE2 in traits_of(filename)


def test_skylake_server_has_avx512_and_the_features_its_model_implies():
    traits = traits_of("x86_64-cpuid-Xeon-Gold-6148-host.xml")
    assert {
        ot.HW_CPU_X86_AVX512F,
        ot.HW_CPU_X86_AVX512BW,
        ot.HW_CPU_X86_AVX2,
        ot.HW_CPU_X86_AESNI,
        ot.HW_CPU_X86_SSE42,
        ot.HW_CPU_X86_VMX,
    } <= traits
    assert ot.HW_CPU_X86_SVM not in traits


def test_epyc_rome_has_avx2_and_sha_but_no_avx512():
    traits = traits_of("x86_64-cpuid-EPYC-7502-32-Core-host.xml")
    assert {ot.HW_CPU_X86_AVX2, ot.HW_CPU_X86_SHA} <= traits
    assert ot.HW_CPU_X86_AVX512F not in traits


def test_bulldozer_opteron_has_fma4_and_xop_but_no_avx2():
    traits = traits_of("x86_64-cpuid-Opteron-6282-host.xml")
    assert {ot.HW_CPU_X86_FMA4, ot.HW_CPU_X86_XOP, ot.HW_CPU_X86_AVX} <= traits
    assert ot.HW_CPU_X86_AVX2 not in traits
