"""Write the PCI passthrough hostdevs nova 34's libvirt driver puts in a guest.

Run under nova's virtualenv, never the agent's::

    PYTHONPATH= .venv-nova/bin/python tests/data/nova_hostdevs/generate.py [OUTDIR]

Each device is a ``nova.objects.PciDevice`` (its address as nova's PCI
tracker keeps it) turned into ``<hostdev>`` by the driver's own
``LibvirtDriver._get_guest_pci_device`` (``virt_type = kvm``); the domain
around them is nova's ``LibvirtConfigGuest``. Writes ``pci-passthrough.xml``
into OUTDIR (default: this directory). Deterministic: fixed uuid and names.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)

import nova.conf  # noqa: E402
from nova import objects  # noqa: E402
from nova.virt.libvirt import config as vconfig  # noqa: E402
from nova.virt.libvirt import driver as libvirt_driver  # noqa: E402

CONF = nova.conf.CONF
HERE = Path(__file__).resolve().parent
UUID = "5d9f4c0e-8a61-4f3b-9c2e-7b1a0d3e6f48"
# A standalone device (a GPU), a VF of 0000:3b:00.0 (managed='no', as
# [pci] device_spec managed=no asks), and a device in PCI domain 1.
DEVICES = (
    ("0000:81:00.0", {}),
    ("0000:3b:02.1", {"managed": "false"}),
    ("0001:0a:1f.7", {}),
)


def guest_xml() -> str:
    CONF.set_override("virt_type", "kvm", group="libvirt")
    objects.register_all()
    # _get_guest_pci_device reads only CONF and _set_managed_mode: no
    # connection to libvirt is needed, so the driver is not started.
    driver = object.__new__(libvirt_driver.LibvirtDriver)
    guest = vconfig.LibvirtConfigGuest()
    guest.virt_type = "kvm"
    guest.name = "instance-0000002a"
    guest.uuid = UUID
    guest.memory = 1024 * 1024
    guest.vcpus = 2
    guest.os_type = "hvm"
    for address, extra_info in DEVICES:
        device = objects.PciDevice(address=address, extra_info=extra_info)
        guest.add_device(driver._get_guest_pci_device(device))
    return guest.to_xml()


def main(argv: list[str]) -> None:
    out = Path(argv[1]) if len(argv) > 1 else HERE
    out.mkdir(parents=True, exist_ok=True)
    (out / "pci-passthrough.xml").write_text(guest_xml())


if __name__ == "__main__":
    main(sys.argv)
