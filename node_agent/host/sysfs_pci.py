"""PCI devices the tree reports: vGPU-capable GPUs and SR-IOV PFs, from sysfs.

Reads, through the SysFS gateway, for each ``bus/pci/devices/<address>/``:

* ``mdev_supported_types/<type>/{available_instances,name,device_api}`` and
  ``mdev_supported_types/<type>/devices/`` (one entry per mdev already
  created with that type: the kernel's own index of them, see
  Documentation/driver-api/vfio-mediated-device.rst);
* ``sriov_totalvfs``, ``sriov_numvfs`` (SR-IOV PFs only);
* ``numa_node`` (-1 means no affinity), ``vendor``, ``device``, ``net/``.

A device without these files simply is not a GPU or a PF, and nothing
else of it is read (a host may have hundreds of VFs); a file that is there
but unreadable or malformed is a DiscoveryError.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from node_agent.errors import DiscoveryError
from node_agent.host.sysfs import SysFS
from node_agent.model.snapshot import (
    PCI_PF,
    PCI_STANDARD,
    PCI_VF,
    Guest,
    GuestMdev,
    MdevTypeInfo,
    PciDevice,
    PciGpu,
    SriovPf,
)

DEVICES = "bus/pci/devices"


def parse_int(text: str, where: str) -> int:
    try:
        return int(text.strip(), 0)
    except ValueError:
        raise DiscoveryError(f"{where}: '{text.strip()}' is not a number") from None


def parse_pci_id(text: Optional[str]) -> Optional[str]:
    """``0x10de\\n`` -> ``10de``."""
    if text is None:
        return None
    value = text.strip().lower()
    return value[2:] if value.startswith("0x") else value


def _read_int(sysfs: SysFS, relpath: str) -> Optional[int]:
    text = sysfs.read(relpath)
    return None if text is None else parse_int(text, sysfs.path(relpath))


def _read_text(sysfs: SysFS, relpath: str) -> Optional[str]:
    text = sysfs.read(relpath)
    return None if text is None else (text.strip() or None)


def _numa_node(sysfs: SysFS, base: str) -> Optional[int]:
    node = _read_int(sysfs, f"{base}/numa_node")
    return node if node is not None and node >= 0 else None


def _mdev_type(sysfs: SysFS, base: str, type_id: str) -> MdevTypeInfo:
    where = f"{base}/mdev_supported_types/{type_id}"
    available = _read_int(sysfs, f"{where}/available_instances")
    if available is None:
        raise DiscoveryError(f"{sysfs.path(where)} has no available_instances file")
    return MdevTypeInfo(
        id=type_id,
        available_instances=available,
        name=_read_text(sysfs, f"{where}/name"),
        device_api=_read_text(sysfs, f"{where}/device_api"),
        mdevs=tuple(sysfs.listdir(f"{where}/devices") or ()),
    )


def read_device(sysfs: SysFS, address: str) -> tuple[Optional[PciGpu], Optional[SriovPf]]:
    """The GPU and/or PF record of one device (None when it is neither)."""
    base = f"{DEVICES}/{address}"
    if not (sysfs.exists(f"{base}/mdev_supported_types") or sysfs.exists(f"{base}/sriov_totalvfs")):
        # Most devices (every VF of a PF with hundreds) are neither: two
        # lookups say so, without reading or listing anything of theirs.
        return None, None
    type_ids = sysfs.listdir(f"{base}/mdev_supported_types")
    total_vfs = _read_int(sysfs, f"{base}/sriov_totalvfs")
    if not type_ids and not total_vfs:
        return None, None
    numa = _numa_node(sysfs, base)
    vendor = parse_pci_id(sysfs.read(f"{base}/vendor"))
    product = parse_pci_id(sysfs.read(f"{base}/device"))
    gpu = pf = None
    if type_ids:
        gpu = PciGpu(
            address=address,
            numa_node=numa,
            vendor_id=vendor,
            product_id=product,
            mdev_types=tuple(_mdev_type(sysfs, base, t) for t in type_ids),
        )
    if total_vfs:
        pf = SriovPf(
            address=address,
            total_vfs=total_vfs,
            num_vfs=_read_int(sysfs, f"{base}/sriov_numvfs") or 0,
            numa_node=numa,
            vendor_id=vendor,
            product_id=product,
            netdevs=tuple(sysfs.listdir(f"{base}/net") or ()),
        )
    return gpu, pf


def read_pci(sysfs: SysFS) -> tuple[tuple[PciGpu, ...], tuple[SriovPf, ...]]:
    """Every GPU offering mdev types and every SR-IOV PF, by address."""
    gpus, pfs = [], []
    for address in sysfs.listdir(DEVICES) or ():
        gpu, pf = read_device(sysfs, address)
        if gpu:
            gpus.append(gpu)
        if pf:
            pfs.append(pf)
    return tuple(gpus), tuple(pfs)


def read_pci_function(sysfs: SysFS, address: str) -> Optional[PciDevice]:
    """One function as nova's libvirt driver types it: type-PF when it
    has ``sriov_totalvfs`` > 0 (libvirt's ``virt_functions``), type-VF when
    it has a ``physfn`` link, else type-PCI. None without vendor or device
    (not a PCI function)."""
    base = f"{DEVICES}/{address}"
    vendor = parse_pci_id(sysfs.read(f"{base}/vendor"))
    product = parse_pci_id(sysfs.read(f"{base}/device"))
    if not vendor or not product:
        return None
    parent = sysfs.link_name(f"{base}/physfn")
    if parent:
        dev_type = PCI_VF
    elif _read_int(sysfs, f"{base}/sriov_totalvfs"):
        dev_type = PCI_PF
    else:
        dev_type = PCI_STANDARD
    return PciDevice(
        address=address,
        vendor_id=vendor,
        product_id=product,
        dev_type=dev_type,
        parent_addr=parent,
        numa_node=_numa_node(sysfs, base),
    )


def read_pci_functions(sysfs: SysFS) -> tuple[PciDevice, ...]:
    """Every PCI function, by address (for ``[pci] report_in_placement``)."""
    found = (read_pci_function(sysfs, a) for a in sysfs.listdir(DEVICES) or ())
    return tuple(d for d in found if d is not None)


def mdev_parents(gpus: tuple[PciGpu, ...]) -> dict[str, str]:
    """mdev uuid -> address of the GPU it was created on."""
    return {uuid: gpu.address for gpu in gpus for t in gpu.mdev_types for uuid in t.mdevs}


def with_mdev_parents(guests: tuple[Guest, ...], gpus: tuple[PciGpu, ...]) -> tuple[Guest, ...]:
    """Guests whose mdevs name their parent GPU when sysfs knows it."""
    parents = mdev_parents(gpus)
    if not parents:
        return guests
    return tuple(
        replace(g, mdevs=tuple(GuestMdev(m.uuid, m.parent or parents.get(m.uuid)) for m in g.mdevs))
        if g.mdevs
        else g
        for g in guests
    )


ND_DEVICES = "bus/nd/devices"


def read_pmem_namespace_names(sysfs: SysFS) -> frozenset[str]:
    """The names of the host's NVDIMM namespaces: each ``namespaceX.Y``'s
    ``alt_name``, what ``ndctl list`` calls its name (nova reads ndctl). A
    namespace without a name cannot be configured, as in nova."""
    names = set()
    for entry in sysfs.listdir(ND_DEVICES) or ():
        if entry.startswith("namespace"):
            name = _read_text(sysfs, f"{ND_DEVICES}/{entry}/alt_name")
            if name:
                names.add(name)
    return frozenset(names)
