"""CPU feature traits: libvirt's x86 CPU feature names -> os-traits names.

The one table of the agent. Keys are the feature names libvirt uses in
``<feature name=...>`` (its cpu_map, so SSE3 is ``pni`` and CLMUL is
``pclmuldq``); values are os_traits constants, so a name os-traits does not
know fails at import rather than in Placement.

Every trait in the table is decided on every x86 host: present -> True,
absent -> False, so a trait the agent once set is removed when the CPU (or
its libvirt CPU model) no longer has the feature. Traits outside the table
are never touched.

Caveat: libvirt's capabilities ``<host><cpu>`` lists only the features on
top of the named model (as the cputestdata host-model files do). A feature
the model implies is therefore read as absent unless the hypervisor gateway
passes the expanded feature list (``baselineCPU`` with
``VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES``).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

import os_traits as ot

from node_agent.model.snapshot import HostCpuModel

X86_FEATURE_TRAITS: Mapping[str, str] = MappingProxyType(
    {
        "3dnow": ot.HW_CPU_X86_3DNOW,
        "abm": ot.HW_CPU_X86_ABM,
        "aes": ot.HW_CPU_X86_AESNI,
        "amd-no-ssb": ot.HW_CPU_X86_AMD_NO_SSB,
        "amd-ssbd": ot.HW_CPU_X86_AMD_SSBD,
        "amx-bf16": ot.HW_CPU_X86_AMXBF16,
        "amx-int8": ot.HW_CPU_X86_AMXINT8,
        "amx-tile": ot.HW_CPU_X86_AMXTILE,
        "avx": ot.HW_CPU_X86_AVX,
        "avx2": ot.HW_CPU_X86_AVX2,
        "avx512-vpopcntdq": ot.HW_CPU_X86_AVX512VPOPCNTDQ,
        "avx512bitalg": ot.HW_CPU_X86_AVX512BITALG,
        "avx512bw": ot.HW_CPU_X86_AVX512BW,
        "avx512cd": ot.HW_CPU_X86_AVX512CD,
        "avx512dq": ot.HW_CPU_X86_AVX512DQ,
        "avx512er": ot.HW_CPU_X86_AVX512ER,
        "avx512f": ot.HW_CPU_X86_AVX512F,
        "avx512ifma": ot.HW_CPU_X86_AVX512IFMA,
        "avx512pf": ot.HW_CPU_X86_AVX512PF,
        "avx512vbmi": ot.HW_CPU_X86_AVX512VBMI,
        "avx512vbmi2": ot.HW_CPU_X86_AVX512VBMI2,
        "avx512vl": ot.HW_CPU_X86_AVX512VL,
        "avx512vnni": ot.HW_CPU_X86_AVX512VNNI,
        "bmi1": ot.HW_CPU_X86_BMI,
        "bmi2": ot.HW_CPU_X86_BMI2,
        "f16c": ot.HW_CPU_X86_F16C,
        "fma": ot.HW_CPU_X86_FMA3,
        "fma4": ot.HW_CPU_X86_FMA4,
        # os-traits files the VAES/GFNI/VPCLMULQDQ extensions under AVX512.
        "gfni": ot.HW_CPU_X86_AVX512GFNI,
        "hle": ot.HW_CPU_X86_TSX,
        "ibpb": ot.HW_CPU_X86_AMD_IBPB,
        "md-clear": ot.HW_CPU_X86_INTEL_MD_CLEAR,
        "mmx": ot.HW_CPU_X86_MMX,
        "mpx": ot.HW_CPU_X86_MPX,
        "pcid": ot.HW_CPU_X86_INTEL_PCID,
        "pclmuldq": ot.HW_CPU_X86_CLMUL,
        "pdpe1gb": ot.HW_CPU_X86_PDPE1GB,
        "pni": ot.HW_CPU_X86_SSE3,
        "rtm": ot.HW_CPU_X86_TSX,
        # nova's table key for SSE3; libvirt itself says "pni".
        "sse3": ot.HW_CPU_X86_SSE3,
        "sgx": ot.HW_CPU_X86_SGX,
        "sha-ni": ot.HW_CPU_X86_SHA,
        "spec-ctrl": ot.HW_CPU_X86_INTEL_SPEC_CTRL,
        "sse": ot.HW_CPU_X86_SSE,
        "sse2": ot.HW_CPU_X86_SSE2,
        "sse4.1": ot.HW_CPU_X86_SSE41,
        "sse4.2": ot.HW_CPU_X86_SSE42,
        "sse4a": ot.HW_CPU_X86_SSE4A,
        "ssbd": ot.HW_CPU_X86_INTEL_SSBD,
        "ssse3": ot.HW_CPU_X86_SSSE3,
        "stibp": ot.HW_CPU_X86_STIBP,
        "svm": ot.HW_CPU_X86_SVM,
        "tbm": ot.HW_CPU_X86_TBM,
        "vaes": ot.HW_CPU_X86_AVX512VAES,
        "virt-ssbd": ot.HW_CPU_X86_AMD_VIRT_SSBD,
        "vmx": ot.HW_CPU_X86_VMX,
        "vpclmulqdq": ot.HW_CPU_X86_AVX512VPCLMULQDQ,
        "xop": ot.HW_CPU_X86_XOP,
    }
)

# nova also sets the vendor-specific traits next to the generic VMX/SVM
# ones (nova/virt/libvirt/utils.py CPU_TRAITS_MAPPING), and schedulers may
# ask for either.
X86_VENDOR_TRAITS: Mapping[str, str] = MappingProxyType(
    {
        "vmx": ot.HW_CPU_X86_INTEL_VMX,
        "svm": ot.HW_CPU_X86_AMD_SVM,
    }
)

# The CPU feature traits nova 34 decides (its libvirt driver's
# CPU_TRAITS_MAPPING in nova/virt/libvirt/utils.py; tests/conformance
# checks this set against nova's own table). The agent's table is wider
# (docs/design/nova-differences.yaml: cpu-trait-agent-only), and nova keys
# SSE3 by "sse3", a name libvirt never writes ("pni"), so nova leaves SSE3
# off every host (cpu-trait-sse3-pni).
NOVA_FEATURE_TRAITS = frozenset(
    {
        ot.HW_CPU_X86_3DNOW,
        ot.HW_CPU_X86_ABM,
        ot.HW_CPU_X86_AESNI,
        ot.HW_CPU_X86_AMXBF16,
        ot.HW_CPU_X86_AMXINT8,
        ot.HW_CPU_X86_AMXTILE,
        ot.HW_CPU_X86_AVX,
        ot.HW_CPU_X86_AVX2,
        ot.HW_CPU_X86_AVX512BW,
        ot.HW_CPU_X86_AVX512CD,
        ot.HW_CPU_X86_AVX512DQ,
        ot.HW_CPU_X86_AVX512ER,
        ot.HW_CPU_X86_AVX512F,
        ot.HW_CPU_X86_AVX512PF,
        ot.HW_CPU_X86_AVX512VL,
        ot.HW_CPU_X86_AVX512VNNI,
        ot.HW_CPU_X86_AVX512VBMI,
        ot.HW_CPU_X86_AVX512IFMA,
        ot.HW_CPU_X86_AVX512VBMI2,
        ot.HW_CPU_X86_AVX512BITALG,
        ot.HW_CPU_X86_AVX512VAES,
        ot.HW_CPU_X86_AVX512GFNI,
        ot.HW_CPU_X86_AVX512VPCLMULQDQ,
        ot.HW_CPU_X86_AVX512VPOPCNTDQ,
        ot.HW_CPU_X86_BMI,
        ot.HW_CPU_X86_BMI2,
        ot.HW_CPU_X86_CLMUL,
        ot.HW_CPU_X86_F16C,
        ot.HW_CPU_X86_FMA3,
        ot.HW_CPU_X86_FMA4,
        ot.HW_CPU_X86_MMX,
        ot.HW_CPU_X86_MPX,
        ot.HW_CPU_X86_SHA,
        ot.HW_CPU_X86_SSE,
        ot.HW_CPU_X86_SSE2,
        ot.HW_CPU_X86_SSE3,
        ot.HW_CPU_X86_SSE41,
        ot.HW_CPU_X86_SSE42,
        ot.HW_CPU_X86_SSE4A,
        ot.HW_CPU_X86_SSSE3,
        ot.HW_CPU_X86_SVM,
        ot.HW_CPU_X86_AMD_SVM,
        ot.HW_CPU_X86_TBM,
        ot.HW_CPU_X86_VMX,
        ot.HW_CPU_X86_INTEL_VMX,
        ot.HW_CPU_X86_XOP,
    }
)

# Traits of the agent's tables nova-compute does not set from what libvirt
# says: on a root nova-compute writes, they are not nova's to publish, so
# companion mode does not count them as drift.
NOT_DECIDED_BY_NOVA = (
    frozenset(X86_FEATURE_TRAITS.values()) | frozenset(X86_VENDOR_TRAITS.values())
) - NOVA_FEATURE_TRAITS | {ot.HW_CPU_X86_SSE3}

X86_ARCHES = frozenset({"x86_64", "i686", "i586", "i486", "i386", "amd64"})


def feature_traits(cpu: HostCpuModel) -> dict[str, bool]:
    """{trait: present?} for every trait of the table, on an x86 host whose
    CPU libvirt described. Empty (decide nothing) when the CPU is unknown
    (no libvirt) or not x86, so a failed read never removes traits."""
    if cpu.arch not in X86_ARCHES or (cpu.model is None and not cpu.features):
        return {}
    tables = (X86_FEATURE_TRAITS, X86_VENDOR_TRAITS)
    traits = {trait: False for table in tables for trait in table.values()}
    for feature in cpu.features:
        for table in tables:
            trait = table.get(feature)
            if trait is not None:
                traits[trait] = True
    return traits


# [libvirt] cpu_mode values, as nova names them.
CPU_MODES = ("host-model", "host-passthrough", "custom", "none")


def split_extra_flags(flags) -> tuple[frozenset[str], frozenset[str]]:
    """``[libvirt] cpu_model_extra_flags`` as (enabled, disabled) names:
    ``+flag`` or ``flag`` enables, ``-flag`` disables (nova's grammar);
    case does not matter."""
    enabled, disabled = set(), set()
    for flag in flags:
        name = flag.strip().lower()
        if name.startswith("-"):
            disabled.add(name.lstrip("-"))
        elif name:
            enabled.add(name.lstrip("+"))
    return frozenset(enabled), frozenset(disabled)


def guest_cpu_features(
    cpu_mode: str | None,
    host: HostCpuModel,
    models: tuple[tuple[str, frozenset[str]], ...],
    extra_flags=(),
) -> frozenset[str]:
    """The CPU features guests get, which the CPU traits follow (nova's
    ``_get_cpu_feature_traits``).

    * unset, ``host-model``, ``host-passthrough``: the host's features (nova
      defaults to host-model on QEMU/KVM), plus the enabled extra flags;
    * ``custom``: every feature of every configured model (``models``: each
      name with the features libvirt's cpu_map gives it), plus the flags;
    * ``none``: the features of the architecture's default model (``models``
      holds it), without the flags, which nova does not apply then.

    A disabled flag (``-pcid``) removes the feature: guests do not get it.
    nova reports the trait for it anyway; the agent does not overstate.
    """
    enabled, disabled = split_extra_flags(extra_flags)
    if cpu_mode == "none":
        return frozenset().union(*(features for _name, features in models))
    if cpu_mode == "custom":
        base = frozenset().union(*(features for _name, features in models))
    else:
        base = host.features
    return (base | enabled) - disabled


def guest_cpu_traits(
    cpu_mode: str | None,
    host: HostCpuModel,
    models: tuple[tuple[str, frozenset[str]], ...],
    extra_flags=(),
) -> dict[str, bool]:
    """:func:`feature_traits` of the guest CPU the settings describe."""
    if host.arch not in X86_ARCHES or (host.model is None and not host.features):
        return {}
    if cpu_mode in (None, "host-model", "host-passthrough") and not extra_flags:
        return feature_traits(host)
    features = guest_cpu_features(cpu_mode, host, models, extra_flags)
    return feature_traits(HostCpuModel(host.arch, host.model or "guest", host.vendor, features))
