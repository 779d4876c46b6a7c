"""Capability traits on the root, with nova 34's names and meanings.

What nova-compute adds to the root besides the driver's static traits: the
libvirt driver's ``capabilities`` dict (``LibvirtDriver.__init__``, then
``_update_host_specific_capabilities`` at ``init_host``) turned into traits
by ``ComputeDriver.capabilities_as_traits`` (``CAPABILITY_TRAITS_MAP``,
``[compute] image_type_exclude_list``), which the resource tracker's
``_get_traits`` adds when True and removes when False. nova's scheduler and
API require several of them (image types, accelerators, secure boot,
ports with tags...), so a root without them takes fewer guests than nova's.

Pure: the shell passes the hypervisor facts in. Without libvirt the answer
is empty (the agent is then no libvirt compute node, and claiming its
abilities would overstate the host). A trait that needs the domain
capabilities is left out of the answer when they were not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import os_traits

from node_agent.model.snapshot import HypervisorInfo

Version = tuple[int, int, int]

# nova/virt/libvirt/driver.py: MIN_LIBVIRT_VERSION/MIN_QEMU_VERSION (what
# Host.supports_virtio_fs checks), MIN_LIBVIRT_MAXPHYSADDR,
# MIN_LIBVIRT_STATELESS_FIRMWARE; Host.supports_remote_managed_ports.
VIRTIO_FS_MIN: tuple[Version, Version] = ((8, 0, 0), (6, 2, 0))  # libvirt, QEMU
MAXPHYSADDR_MIN_LIBVIRT: Version = (8, 7, 0)
STATELESS_FIRMWARE_MIN_LIBVIRT: Version = (8, 6, 0)

# The capabilities nova's libvirt driver always claims (True) or always
# denies (False); the image formats are subject to image_type_exclude_list.
_ALWAYS = {
    os_traits.COMPUTE_NET_ATTACH_INTERFACE: True,
    os_traits.COMPUTE_DEVICE_TAGGING: True,
    os_traits.COMPUTE_NET_ATTACH_INTERFACE_WITH_TAG: True,
    os_traits.COMPUTE_VOLUME_ATTACH_WITH_TAG: True,
    os_traits.COMPUTE_VOLUME_EXTEND: True,
    os_traits.COMPUTE_VOLUME_MULTI_ATTACH: True,
    os_traits.COMPUTE_TRUSTED_CERTS: True,
    os_traits.COMPUTE_ACCELERATORS: True,
    os_traits.COMPUTE_RESCUE_BFV: True,
    os_traits.COMPUTE_SOCKET_PCI_NUMA_AFFINITY: True,
    os_traits.COMPUTE_SAME_HOST_COLD_MIGRATE: False,
    os_traits.COMPUTE_REMOTE_MANAGED_PORTS: False,
    # No image backend of nova 34 has SUPPORTS_LUKS.
    os_traits.COMPUTE_EPHEMERAL_ENCRYPTION: False,
    os_traits.COMPUTE_EPHEMERAL_ENCRYPTION_LUKS: False,
}
_ALWAYS_IMAGE_TYPES = ("aki", "ari", "ami", "raw", "iso")


@dataclass(frozen=True)
class CapabilitySettings:
    """The options the capability traits follow (nova's names)."""

    virt_type: str = "kvm"  # [libvirt] virt_type
    images_type: str = "default"  # [libvirt] images_type
    force_raw_images: bool = True  # [DEFAULT] force_raw_images
    image_type_exclude_list: tuple[str, ...] = ()  # [compute]
    file_backed_memory: int = 0  # [libvirt] file_backed_memory (MiB)


def _at_least(version: Optional[Version], minimum: Version) -> bool:
    return version is not None and version >= minimum


def _image_types(settings: CapabilitySettings) -> dict[str, bool]:
    # nova: LVM and RBD need raw images unless nova converts every image
    # to raw itself (force_raw_images), so qcow2 is then not offered.
    requires_raw = settings.images_type in ("rbd", "lvm") and not settings.force_raw_images
    supported = dict.fromkeys(_ALWAYS_IMAGE_TYPES, True)
    supported["qcow2"] = not requires_raw
    supported["ploop"] = settings.virt_type == "parallels"
    excluded = set(settings.image_type_exclude_list)
    return {
        getattr(os_traits, "COMPUTE_IMAGE_TYPE_" + kind.upper()): ok and kind not in excluded
        for kind, ok in supported.items()
    }


def capability_traits(
    info: Optional[HypervisorInfo], settings: CapabilitySettings, host_arch: Optional[str]
) -> dict[str, bool]:
    """{trait: present?} for nova's capability traits; empty without libvirt.

    ``COMPUTE_REMOTE_MANAGED_PORTS`` is always False: nova adds it only for
    remote-managed PCI devices present on the host (its PCI tracker's
    pools), which the agent does not track, so it never claims them.
    ``COMPUTE_STATUS_DISABLED`` is the maintenance switch's
    (:mod:`node_agent.policy.maintenance`)."""
    if info is None:
        return {}
    traits = dict(_ALWAYS)
    traits.update(_image_types(settings))
    traits[os_traits.COMPUTE_STORAGE_VIRTIO_FS] = _at_least(
        info.libvirt_version, VIRTIO_FS_MIN[0]
    ) and _at_least(info.qemu_version, VIRTIO_FS_MIN[1])
    traits[os_traits.COMPUTE_MEM_BACKING_FILE] = settings.file_backed_memory > 0
    # nova checks the connection is QEMU's (has_min_version(hv_type=QEMU)).
    address_space = info.hv_type == "QEMU" and _at_least(
        info.libvirt_version, MAXPHYSADDR_MIN_LIBVIRT
    )
    traits[os_traits.COMPUTE_ADDRESS_SPACE_PASSTHROUGH] = address_space
    traits[os_traits.COMPUTE_ADDRESS_SPACE_EMULATED] = address_space
    traits[os_traits.COMPUTE_SECURITY_STATELESS_FIRMWARE] = _at_least(
        info.libvirt_version, STATELESS_FIRMWARE_MIN_LIBVIRT
    )
    if info.domain_caps is not None:
        # Host.supports_secure_boot: any machine type of the host's own
        # architecture whose firmware loader offers secure boot.
        traits[os_traits.COMPUTE_SECURITY_UEFI_SECURE_BOOT] = any(
            cap.secure_boot for cap in info.domain_caps if cap.arch == host_arch
        )
    return traits
