"""Parse libvirt's domain capabilities XML (``virsh domcapabilities``).

Pure: text in, a :class:`~node_agent.model.snapshot.DomainCaps` out. Only
what nova's static traits read: the architecture and machine type, the
disk buses, video models, TPM models and versions, and AMD SEV: whether it
is supported, how many SEV and SEV-ES guests, the launch-security types,
whether Intel TDX is supported, and whether the firmware loader offers UEFI secure boot.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Optional

from node_agent.errors import ParseError
from node_agent.host.libvirt_xml import load, optional_int, text_of
from node_agent.model.snapshot import DomainCaps


def parse_domain_capabilities(xml: str) -> DomainCaps:
    """Parse one ``virConnectGetDomainCapabilities`` answer; raises ParseError."""
    root = load(xml, "domainCapabilities", "domain capabilities XML")
    arch = text_of(root, "arch")
    if not arch:
        raise ParseError("domain capabilities XML: no <arch>")
    devices = root.find("devices")
    disk = devices.find("disk") if devices is not None else None
    video = devices.find("video") if devices is not None else None
    tpm = devices.find("tpm") if devices is not None else None
    sev = root.find("features/sev")
    versions = _values(tpm, "backendVersion")
    return DomainCaps(
        arch=arch,
        machine=text_of(root, "machine"),
        disk_buses=frozenset(_values(disk, "bus") or ()),
        video_models=frozenset(_values(video, "modelType") or ()),
        tpm_supported=_supported(tpm),
        tpm_models=_values(tpm, "model") or (),
        tpm_backend_models=_values(tpm, "backendModel") or (),
        tpm_versions=versions,
        sev_supported=_supported(sev),
        sev_max_guests=_count(sev, "maxGuests"),
        sev_max_es_guests=_count(sev, "maxESGuests"),
        launch_security=_launch_security(root.find("features/launchSecurity")),
        tdx_supported=_supported(root.find("features/tdx")),
        secure_boot="yes" in (_values(root.find("os/loader"), "secure") or ()),
    )


def _count(sev: Optional[ET.Element], tag: str) -> Optional[int]:
    if sev is None:
        return None
    value = optional_int(text_of(sev, tag), f"domain capabilities XML <sev><{tag}>")
    if value is not None and value < 0:
        raise ParseError(f"domain capabilities XML: <sev><{tag}> is {value}, below 0")
    return value


def _supported(element: Optional[ET.Element]) -> bool:
    return element is not None and element.get("supported") == "yes"


def _launch_security(element: Optional[ET.Element]) -> frozenset[str]:
    if not _supported(element):
        return frozenset()
    return frozenset(_values(element, "sectype") or ())


def _values(device: Optional[ET.Element], enum: str) -> Optional[tuple[str, ...]]:
    """The ``<value>``s of the device's ``<enum name=enum>``; None when the
    device or the enum is absent (libvirt before 8.6 has no backendVersion)."""
    if device is None:
        return None
    for element in device.findall("enum"):
        if element.get("name") == enum:
            return tuple(
                value.text.strip()
                for value in element.findall("value")
                if value.text and value.text.strip()
            )
    return None
