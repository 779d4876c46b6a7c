"""Static hypervisor traits and guest-CPU traits: the pure decisions, on
libvirt's captured domain capabilities (tests/data/hostdata/domaincapsdata)."""

import os_traits as ot
import pytest
from oslo_config import cfg

from node_agent.config.options import register_opts
from node_agent.config.settings import load_settings
from node_agent.errors import ConfigError
from node_agent.host.domain_capabilities import parse_domain_capabilities
from node_agent.model.snapshot import HostCpuModel, HypervisorInfo
from node_agent.tree.cpu_traits import guest_cpu_traits
from node_agent.tree.hypervisor_traits import TraitSettings, hypervisor_traits
from tests.hostdata import HOSTDATA

DOMCAPS = HOSTDATA / "domaincapsdata"


def caps(name):
    return parse_domain_capabilities((DOMCAPS / name).read_text())


def test_sev_host_domain_capabilities_parse_with_sev_and_tpm_2():
    amd = caps("qemu_10.0.0-q35.x86_64+amdsev.xml")
    assert amd.sev_supported and amd.tpm_supported and amd.tpm_versions == ("2.0",)
    assert {"virtio", "sata", "scsi"} <= amd.disk_buses and "ide" not in amd.disk_buses


def test_s390x_domain_capabilities_have_no_tpm():
    s390 = caps("qemu_10.0.0.s390x.xml")
    assert not s390.tpm_supported and s390.tpm_versions is None


def test_without_domain_capabilities_their_traits_are_left_alone():
    info = HypervisorInfo((9, 0, 0), (7, 2, 0), None)
    traits = hypervisor_traits(info, TraitSettings(), "x86_64")
    assert traits[ot.COMPUTE_NET_VIRTIO_PACKED] and traits[ot.COMPUTE_NET_VIF_MODEL_VIRTIO]
    assert not any(
        t.startswith(("COMPUTE_STORAGE_BUS_", "COMPUTE_GRAPHICS_MODEL_", "COMPUTE_ARCH_"))
        for t in traits
    )
    assert ot.COMPUTE_VIOMMU_MODEL_INTEL not in traits
    # swtpm off decides TPM absent whatever libvirt could say
    assert traits[ot.COMPUTE_SECURITY_TPM_2_0] is False


def test_domain_capabilities_give_buses_graphics_arch_and_tpm_with_swtpm():
    info = HypervisorInfo((9, 0, 0), (7, 2, 0), (caps("qemu_7.2.0-tcg.x86_64.xml"),))
    traits = hypervisor_traits(info, TraitSettings(swtpm_enabled=True), "x86_64")
    assert traits[ot.COMPUTE_STORAGE_BUS_IDE] and not traits[ot.COMPUTE_STORAGE_BUS_XEN]
    assert traits[ot.COMPUTE_GRAPHICS_MODEL_QXL] and not traits[ot.COMPUTE_GRAPHICS_MODEL_GOP]
    assert traits[ot.COMPUTE_ARCH_X86_64] and traits[ot.COMPUTE_VIOMMU_MODEL_INTEL]
    assert traits[ot.COMPUTE_SECURITY_TPM_2_0] and not traits[ot.COMPUTE_SECURITY_TPM_1_2]
    assert not traits[ot.COMPUTE_NET_VIF_MODEL_IGB]  # needs libvirt 9.3 and QEMU 8.0


def test_no_libvirt_decides_no_static_trait():
    assert hypervisor_traits(None, TraitSettings(), "x86_64") == {}


HOST = HostCpuModel(
    "x86_64", "Skylake-Server", "Intel", frozenset({"avx2", "avx512f", "sse4.2", "pcid"})
)


def test_custom_mode_traits_follow_the_configured_model_not_the_host():
    nehalem = ("Nehalem", frozenset({"sse4.2", "sse4.1"}))
    traits = guest_cpu_traits("custom", HOST, (nehalem,), ("+avx",))
    assert traits[ot.HW_CPU_X86_SSE42] and traits[ot.HW_CPU_X86_AVX]
    assert not traits[ot.HW_CPU_X86_AVX2] and not traits[ot.HW_CPU_X86_AVX512F]


def test_a_disabled_extra_flag_removes_its_trait():
    traits = guest_cpu_traits("host-model", HOST, (), ("-avx512f",))
    assert traits[ot.HW_CPU_X86_AVX2] and not traits[ot.HW_CPU_X86_AVX512F]


@pytest.mark.parametrize(
    "options, words",
    [
        ({"cpu_mode": "custom"}, "needs [libvirt] cpu_models"),
        ({"cpu_mode": "host-model", "cpu_models": ["Haswell"]}, "only used with"),
        ({"cpu_models": ["Haswell"]}, "cpu_mode is unset"),
        ({"cpu_mode": "hostmodel"}, "[libvirt] cpu_mode has an invalid value"),
        ({"virt_type": "lxc"}, "[libvirt] virt_type has an invalid value"),
    ],
)
def test_guest_cpu_settings_nova_refuses_are_refused(tmp_path, options, words):
    lines = [f"{name} = {','.join(v) if isinstance(v, list) else v}" for name, v in options.items()]
    path = tmp_path / "node-agent.conf"
    path.write_text("[DEFAULT]\nhost = fixture\n[libvirt]\n" + "\n".join(lines) + "\n")
    conf = cfg.ConfigOpts()
    register_opts(conf)
    conf(["--config-file", str(path)], project="node-agent", default_config_files=[])
    with pytest.raises(ConfigError) as refused:
        load_settings(conf)
    assert words in str(refused.value)


def test_capabilities_guests_name_each_arch_its_domain_types_and_machine_aliases():
    from node_agent.host.capabilities import parse_capabilities

    xml = (HOSTDATA / "capabilityschemadata" / "caps-qemu-kvm.xml").read_text()
    x86 = next(g for g in parse_capabilities(xml).guests if g.arch == "x86_64")
    assert x86.domain("kvm").type == "kvm" and x86.domain("kvm").aliases == ("pc",)
    assert x86.domain("kvm").emulator == "/usr/bin/qemu-system-x86_64"
    # no <domain type='hvf'>: the arch's own (default) domain
    assert x86.domain("hvf") is x86.default and x86.default.type == "qemu"
