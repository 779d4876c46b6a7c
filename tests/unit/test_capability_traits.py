"""nova's capability traits on the root (tree/capability_traits.py): the pure
decisions, and what the drift of a companion makes of a root nova-compute
wrote. tests/conformance/test_traits_conformance.py compares them with
nova's own driver and resource tracker."""

import os_traits as ot

from node_agent.host.domain_capabilities import parse_domain_capabilities
from node_agent.model.provider_state import ProviderState
from node_agent.model.provider_tree import Provider
from node_agent.model.snapshot import HypervisorInfo
from node_agent.policy.drift import trait_differences
from node_agent.tree.build import root_traits
from node_agent.tree.capability_traits import CapabilitySettings, capability_traits
from tests.hostdata import HOSTDATA
from tests.snapshots import settings, snapshot

Q35 = (HOSTDATA / "domaincapsdata" / "qemu_8.2.0-q35.x86_64.xml").read_text()


def info(libvirt=(9, 0, 0), qemu=(8, 2, 0), caps=(Q35,), hv_type="QEMU"):
    domain_caps = None if caps is None else tuple(parse_domain_capabilities(x) for x in caps)
    return HypervisorInfo(libvirt, qemu, domain_caps, hv_type=hv_type)


def test_secure_boot_is_parsed_from_the_firmware_loader():
    assert parse_domain_capabilities(Q35).secure_boot
    without = Q35.replace("<value>yes</value>\n        <value>no</value>", "<value>no</value>")
    assert not parse_domain_capabilities(without).secure_boot


def test_a_libvirt_host_gets_nova_s_capability_traits():
    traits = capability_traits(info(), CapabilitySettings(), "x86_64")
    present = {t for t, v in traits.items() if v}
    assert {
        ot.COMPUTE_ACCELERATORS,
        ot.COMPUTE_SOCKET_PCI_NUMA_AFFINITY,
        ot.COMPUTE_IMAGE_TYPE_QCOW2,
        ot.COMPUTE_IMAGE_TYPE_RAW,
        ot.COMPUTE_SECURITY_UEFI_SECURE_BOOT,
        ot.COMPUTE_SECURITY_STATELESS_FIRMWARE,
        ot.COMPUTE_STORAGE_VIRTIO_FS,
        ot.COMPUTE_ADDRESS_SPACE_PASSTHROUGH,
        ot.COMPUTE_VOLUME_MULTI_ATTACH,
    } <= present
    assert traits[ot.COMPUTE_EPHEMERAL_ENCRYPTION] is False
    assert traits[ot.COMPUTE_MEM_BACKING_FILE] is False
    assert traits[ot.COMPUTE_REMOTE_MANAGED_PORTS] is False


def test_without_libvirt_no_capability_is_claimed():
    assert capability_traits(None, CapabilitySettings(), "x86_64") == {}


def test_secure_boot_is_left_alone_without_domain_capabilities():
    traits = capability_traits(info(caps=None), CapabilitySettings(), "x86_64")
    assert ot.COMPUTE_SECURITY_UEFI_SECURE_BOOT not in traits
    assert traits[ot.COMPUTE_ACCELERATORS]


def test_old_libvirt_and_other_drivers_lose_the_version_gated_traits():
    traits = capability_traits(info(libvirt=(8, 6, 0)), CapabilitySettings(), "x86_64")
    assert traits[ot.COMPUTE_SECURITY_STATELESS_FIRMWARE]
    assert not traits[ot.COMPUTE_ADDRESS_SPACE_EMULATED]
    traits = capability_traits(info(hv_type="Test"), CapabilitySettings(), "x86_64")
    assert not traits[ot.COMPUTE_ADDRESS_SPACE_PASSTHROUGH]


def test_raw_only_backends_and_the_exclude_list_remove_image_types():
    rbd = CapabilitySettings(images_type="rbd", force_raw_images=False)
    assert capability_traits(info(), rbd, "x86_64")[ot.COMPUTE_IMAGE_TYPE_QCOW2] is False
    forced = CapabilitySettings(images_type="rbd", force_raw_images=True)
    assert capability_traits(info(), forced, "x86_64")[ot.COMPUTE_IMAGE_TYPE_QCOW2] is True
    excluded = CapabilitySettings(image_type_exclude_list=("iso",))
    assert capability_traits(info(), excluded, "x86_64")[ot.COMPUTE_IMAGE_TYPE_ISO] is False


def test_file_backed_memory_reports_mem_backing_file():
    fbm = CapabilitySettings(file_backed_memory=1024)
    assert capability_traits(info(), fbm, "x86_64")[ot.COMPUTE_MEM_BACKING_FILE] is True


def test_companion_sees_no_drift_on_the_capability_traits_nova_compute_wrote():
    """nova-compute's root: its capability traits, COMPUTE_NODE, OWNER_NOVA,
    the disabled status and image formats of other drivers it never touches."""
    ours = capability_traits(info(), CapabilitySettings(), "x86_64")
    nova_root = {t for t, v in ours.items() if v} | {
        ot.COMPUTE_NODE,
        ot.OWNER_NOVA,
        ot.COMPUTE_STATUS_DISABLED,
        ot.COMPUTE_IMAGE_TYPE_VMDK,
    }
    held = ProviderState("u", "cn1", 3, None, {}, frozenset(nova_root))
    desired = Provider(name="cn1", traits=dict(ours, **{ot.COMPUTE_NODE: True}))
    assert trait_differences(desired, held) == []


def test_the_root_gets_them_from_the_configured_options(tmp_path):
    host = snapshot("virhostcpudata/linux-test6", tmp_path, hypervisor=info())
    traits = root_traits(host, settings(image_type_exclude_list=("qcow2",)))
    assert traits[ot.COMPUTE_ACCELERATORS] and traits[ot.COMPUTE_SECURITY_UEFI_SECURE_BOOT]
    assert traits[ot.COMPUTE_IMAGE_TYPE_QCOW2] is False
    assert traits[ot.COMPUTE_NODE]
