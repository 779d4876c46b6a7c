"""The name of this compute node: its root provider's name and the agent's
identity towards the applier.

nova 34 names its compute node and root provider by libvirt's hostname
(``LibvirtDriver.get_available_nodes`` -> ``Host.get_hostname()`` ->
``virConnectGetHostname``: the machine's hostname, fully qualified by the
resolver when it has no dot), never by its ``[DEFAULT] host``, which names
the nova-compute service only. neutron's agents look their parent provider
up by that name (short name vs FQDN: neutron bug 1853840). The agent
follows nova but lets a ``[DEFAULT] host`` set in a file win: that name is
also the one the applier knows the host by.
"""

from __future__ import annotations

from typing import Optional


def node_name(configured: Optional[str], libvirt_hostname: Optional[str], machine: str) -> str:
    """``configured``: ``[DEFAULT] host`` as a file sets it (None: unset);
    ``libvirt_hostname``: libvirt's answer (None: the agent reads no
    libvirt); ``machine``: the machine's hostname."""
    if configured is not None:
        return configured.strip()
    return libvirt_hostname if libvirt_hostname is not None else machine
