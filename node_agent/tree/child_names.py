"""The names the agent gives its root's children, as one check. Pure.

Every child is ``<host>_<suffix>`` with one of five suffixes: a NUMA node
(``NUMA_<n>``, :mod:`node_agent.tree.numa`), a GPU
(``pci_<domain>_<bus>_<slot>_<function>``) or an SR-IOV PF (its PCI address,
``<domain>:<bus>:<slot>.<function>``, :mod:`node_agent.tree.pci`), a PCI
device in Placement (its address upper-cased, as nova names it,
:mod:`node_agent.tree.pci_placement`), or a memory-encryption model
(:mod:`node_agent.tree.mem_encryption`).

The prefix alone does not keep hosts apart: host ``hv``'s child ``hv_2``
would be host ``hv_2``'s root name, and while it exists that host could not
register. The applier therefore takes from a host only children with one
of the suffixes above: fixed words and PCI addresses, which no other host's
name ends with unless it is named like one of this host's children.
"""

from __future__ import annotations

import re

from node_agent.tree.mem_encryption import MODEL_TRAITS

_SUFFIX = re.compile(
    r"NUMA_\d+"
    r"|pci_[0-9a-f]{4}_[0-9a-f]{2}_[0-9a-f]{2}_[0-7]"
    r"|[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"
    r"|[0-9A-F]{4}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]"
    r"|" + "|".join(re.escape(m) for m in MODEL_TRAITS)
)

KINDS = (
    "<host>_NUMA_<n>, <host>_pci_<dddd>_<bb>_<ss>_<f>, <host>_<dddd>:<bb>:<ss>.<f> "
    "(hex digits all lower or all upper case), <host>_amd_sev[_es|_snp] or <host>_intel_tdx"
)


_ANY_HOST = re.compile(r"_(" + _SUFFIX.pattern + r")$")


def child_suffix(name: str) -> str | None:
    """The suffix of a name the agent gives a child, whatever the host's
    name before it (``NUMA_0`` of ``old-name_NUMA_0``); None for others."""
    found = _ANY_HOST.search(name)
    return found.group(1) if found else None


def is_child_name(host: str, name: str) -> bool:
    """True when ``name`` is one the agent gives a child of ``host``."""
    prefix = host + "_"
    return name.startswith(prefix) and _SUFFIX.fullmatch(name[len(prefix) :]) is not None
