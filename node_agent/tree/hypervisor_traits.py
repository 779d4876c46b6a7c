"""Static hypervisor traits, with nova 34's names and meanings.

What nova's libvirt driver calls its static traits besides the CPU ones
(``LibvirtDriver.static_traits``): storage buses, video, VIF, vIOMMU and
sound models, TPM, packed virtqueues, and the architectures the host can
emulate (``COMPUTE_ARCH_*``). The tables below name what each nova function
iterates over; the conformance suite (``tests/conformance``) runs nova's own
functions on the same domain capabilities and compares.

Pure: the shell reads libvirt (:class:`~node_agent.model.snapshot.HypervisorInfo`)
and passes it in. The traits that need domain capabilities are left out of
the answer (neither set nor removed) when they were not read: the read-only
connection is refused them (``[libvirt] domain_capabilities``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import os_traits

from node_agent.model.snapshot import DomainCaps, HypervisorInfo

Version = tuple[int, int, int]

# nova/virt/libvirt/blockinfo.py SUPPORTED_DEVICE_BUSES, every virt type's.
STORAGE_BUSES = ("fdc", "ide", "lxc", "sata", "scsi", "uml", "usb", "virtio", "xen")
# nova/objects/fields.py VideoModel.ALL.
VIDEO_MODELS = ("bochs", "cirrus", "gop", "none", "qxl", "vga", "virtio", "vmvga", "xen")
# nova/virt/libvirt/vif.py SUPPORTED_VIF_MODELS: the models of the virt types
# the agent serves; the others' (parallels) are a subset of these.
VIF_MODELS = {
    "kvm": (
        "virtio",
        "ne2k_pci",
        "pcnet",
        "rtl8139",
        "e1000",
        "e1000e",
        "spapr-vlan",
        "vmxnet3",
        "igb",
    ),
    "qemu": (
        "virtio",
        "ne2k_pci",
        "pcnet",
        "rtl8139",
        "e1000",
        "e1000e",
        "lan9118",
        "spapr-vlan",
        "vmxnet3",
        "igb",
    ),
}
# nova/virt/libvirt/driver.py: the minimum versions nova checks.
IGB_MIN = ((9, 3, 0), (8, 0, 0))  # libvirt, QEMU
VIRTIO_SOUND_MIN = ((10, 4, 0), (8, 2, 0))  # libvirt, QEMU
VIOMMU_VIRTIO_MIN_LIBVIRT: Version = (8, 3, 0)
SOUND_MODELS = ("sb16", "es1370", "pcspk", "ac97", "ich6", "ich9", "usb")
TPM_SECRET_SECURITY = ("user", "host", "deployment")

# Named once for the log line that says what is not reported without them.
NEEDS_DOMAIN_CAPS = (
    "COMPUTE_STORAGE_BUS_*",
    "COMPUTE_GRAPHICS_MODEL_*",
    "COMPUTE_ARCH_*",
    "COMPUTE_VIOMMU_MODEL_INTEL/SMMUV3",
    "COMPUTE_SECURITY_TPM_* (with swtpm_enabled)",
    "MEM_ENCRYPTION_CONTEXT (the <host>_amd_sev* children)",
)


@dataclass(frozen=True)
class TraitSettings:
    """The options the static traits follow (nova's ``[libvirt]`` names)."""

    virt_type: str = "kvm"
    swtpm_enabled: bool = False
    supported_tpm_secret_security: tuple[str, ...] = TPM_SECRET_SECURITY


def _trait(prefix: str, name: str) -> Optional[str]:
    """os-traits' name for a model, or None when os-traits has none (nova
    drops those too, after ``os_traits.check_traits``)."""
    trait = prefix + name.replace("-", "_").upper()
    return trait if hasattr(os_traits, trait) else None


def _models(prefix: str, names, supported) -> dict[str, bool]:
    traits = {}
    for name in names:
        trait = _trait(prefix, name)
        if trait:
            traits[trait] = name in supported
    return traits


def _at_least(version: Optional[Version], minimum: Version) -> bool:
    return version is not None and version >= minimum


def hypervisor_traits(
    info: Optional[HypervisorInfo], settings: TraitSettings, host_arch: Optional[str]
) -> dict[str, bool]:
    """{trait: present?} for the static traits; empty without libvirt."""
    if info is None:
        return {}
    traits: dict[str, bool] = {os_traits.COMPUTE_NET_VIRTIO_PACKED: True}
    traits.update(_vif_traits(info, settings.virt_type))
    traits.update(_sound_traits(info))
    traits[os_traits.COMPUTE_VIOMMU_MODEL_AUTO] = True
    traits[os_traits.COMPUTE_VIOMMU_MODEL_VIRTIO] = _at_least(
        info.libvirt_version, VIOMMU_VIRTIO_MIN_LIBVIRT
    )
    if not settings.swtpm_enabled:
        traits.update(
            dict.fromkeys(
                (
                    os_traits.COMPUTE_SECURITY_TPM_2_0,
                    os_traits.COMPUTE_SECURITY_TPM_1_2,
                    os_traits.COMPUTE_SECURITY_TPM_TIS,
                    os_traits.COMPUTE_SECURITY_TPM_CRB,
                ),
                False,
            )
        )
    caps = info.domain_caps
    if caps is None:
        return traits
    archs = {cap.arch for cap in caps}
    traits[os_traits.COMPUTE_VIOMMU_MODEL_INTEL] = "x86_64" in archs
    traits[os_traits.COMPUTE_VIOMMU_MODEL_SMMUV3] = "aarch64" in archs
    traits.update(
        _models(
            "COMPUTE_STORAGE_BUS_", STORAGE_BUSES, {bus for cap in caps for bus in cap.disk_buses}
        )
    )
    traits.update(
        _models(
            "COMPUTE_GRAPHICS_MODEL_",
            VIDEO_MODELS,
            {model for cap in caps for model in cap.video_models},
        )
    )
    for arch in sorted(archs):
        trait = _trait("COMPUTE_ARCH_", arch)
        if trait:
            traits[trait] = True
    if settings.swtpm_enabled:
        traits.update(_tpm_traits(caps, host_arch, settings))
    return traits


def _vif_traits(info: HypervisorInfo, virt_type: str) -> dict[str, bool]:
    every = {model for models in VIF_MODELS.values() for model in models}
    supported = set(VIF_MODELS.get(virt_type, ()))
    if not (
        _at_least(info.libvirt_version, IGB_MIN[0]) and _at_least(info.qemu_version, IGB_MIN[1])
    ):
        supported.discard("igb")
    return _models("COMPUTE_NET_VIF_MODEL_", sorted(every), supported)


def _sound_traits(info: HypervisorInfo) -> dict[str, bool]:
    traits = {_trait("COMPUTE_SOUND_MODEL_", model) or model: True for model in SOUND_MODELS}
    traits[os_traits.COMPUTE_SOUND_MODEL_VIRTIO] = _at_least(
        info.libvirt_version, VIRTIO_SOUND_MIN[0]
    ) and _at_least(info.qemu_version, VIRTIO_SOUND_MIN[1])
    return traits


def _tpm_traits(
    caps: tuple[DomainCaps, ...], host_arch: Optional[str], settings: TraitSettings
) -> dict[str, bool]:
    """nova reads the TPM of the host architecture's first machine type (vTPM
    support does not depend on the machine). A TPM libvirt says is not
    supported is reported absent, versions and all."""
    native = next((cap for cap in caps if cap.arch == host_arch), None)
    supported = native is not None and native.tpm_supported
    models = native.tpm_models if supported and native else ()
    versions = native.tpm_versions if supported and native else ()
    if versions is None:
        # libvirt before 8.6 lists no versions; nova then assumes both.
        versions = ("1.2", "2.0")
    traits = {
        os_traits.COMPUTE_SECURITY_TPM_TIS: "tpm-tis" in models,
        os_traits.COMPUTE_SECURITY_TPM_CRB: "tpm-crb" in models,
        os_traits.COMPUTE_SECURITY_TPM_2_0: "2.0" in versions,
        os_traits.COMPUTE_SECURITY_TPM_1_2: "1.2" in versions,
    }
    for policy in settings.supported_tpm_secret_security:
        trait = _trait("COMPUTE_SECURITY_TPM_SECRET_SECURITY_", policy)
        if trait:
            traits[trait] = True
    return traits
