"""PCI devices as children of the root: nova's ``[pci] report_in_placement``. Pure.

nova 34's model (``nova/compute/pci_placement_translator.py``, driven by the
resource tracker), on the devices discovery read
(:class:`~node_agent.model.snapshot.PciDevice`) and ``[pci] device_spec``:

* a device counts when the first spec matching it (vendor, product,
  address; a spec naming one PF's address also matches that PF's VFs) has
  no ``physical_network``: physnet devices are neutron's SR-IOV ports;
* one child per standalone device or PF, ``<host>_<ADDRESS>`` (the address
  upper-cased, as nova writes it); the VFs of one PF are counted together on
  the child named after their PF;
* class: the spec's ``resource_class`` (upper-cased; a name neither
  standard nor ``CUSTOM_`` is normalised into ``CUSTOM_<NAME>``), else
  ``CUSTOM_PCI_<VENDOR>_<PRODUCT>``; total and max_unit = the devices;
* traits: ``COMPUTE_MANAGED_PCI_DEVICE``, the spec's ``traits`` (standard
  names kept, others normalised into ``CUSTOM_``), ``HW_PCI_LIVE_MIGRATABLE``
  with ``live_migratable``, ``HW_PCI_ONE_TIME_USE`` with ``one_time_use``;
  the agent's child mark stands where nova puts ``OWNER_NOVA`` (as on its
  GPU children);
* refused as nova refuses them (PlacementPciException and its kin): a PF
  and one of its VFs both matched, VFs of one PF given different classes or
  traits, ``one_time_use`` on a VF.

The VFs a PCI child counts are left out of the physnet SR-IOV children
(:func:`claimed_vfs`), so no VF is offered twice.

What depends on Placement's usage is :func:`at_usage`, applied by the syncer
once it has read the children: a child whose devices are gone (or no longer
matched) while allocated keeps its usage as total, never less and never more
(nova's ``_adjust_for_removals_and_held_devices``); a one-time-use child in
use is published fully reserved (reserved = total), and its reserved is
otherwise left as Placement holds it, since only an operator unreserves it;
traits the specs no longer give are removed, as nova replaces them.

A device a running guest passes through (``<hostdev type='pci'>``,
:attr:`~node_agent.model.snapshot.Guest.pci_devices`) is in use whether or
not Placement knows it: a guest started outside nova, or by a nova that did
not heal its PCI allocation. Each child's inventory carries who holds how
many of its devices (``Inventory.guest_held``, a VF on its PF's child), and
:func:`at_guest_holds`, applied by the syncer with the child's allocations,
reserves the devices no allocation of that guest covers, so the child is
never offered above what the host has free.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Optional

import os_resource_classes as orc
import os_traits

from node_agent.errors import ConfigError
from node_agent.model.device_spec import PciDeviceSpec
from node_agent.model.hugepages import PAGE_CLASS_PREFIX
from node_agent.model.provider_state import ProviderState
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.model.settings import Settings
from node_agent.model.snapshot import PCI_PF, PCI_VF, HostSnapshot, PciDevice
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT

# Classes the agent computes from the host itself (and its capacity
# invariant checks against the host): a PCI device published in one would
# be counted against the CPUs, memory, GPUs or VFs it is not.
HOST_CLASSES = frozenset(
    {
        orc.VCPU,
        orc.PCPU,
        orc.MEMORY_MB,
        orc.DISK_GB,
        orc.VGPU,
        orc.SRIOV_NET_VF,
        orc.MEM_ENCRYPTION_CONTEXT,
    }
)
HOST_CLASS_PREFIXES = (PAGE_CLASS_PREFIX, "CUSTOM_PMEM_NAMESPACE_")

MANAGED = os_traits.COMPUTE_MANAGED_PCI_DEVICE
ONE_TIME_USE = os_traits.HW_PCI_ONE_TIME_USE
LIVE_MIGRATABLE = os_traits.HW_PCI_LIVE_MIGRATABLE


def provider_name(host: str, address: str) -> str:
    """``0000:af:00.0`` -> ``<host>_0000:AF:00.0`` (nova's name)."""
    return f"{host}_{address.upper()}"


@functools.lru_cache(maxsize=256)
def spec_traits(text: Optional[str]) -> frozenset[str]:
    """nova's ``get_traits``: comma-separated names; standard traits kept,
    ``custom_x`` upper-cased, anything else normalised into ``CUSTOM_``."""
    if not text:
        return frozenset()
    standard, rest = os_traits.check_traits(text.split(","))
    custom = set()
    for name in rest:
        name = name.upper()
        custom.add(name if os_traits.is_custom(name) else os_traits.normalize_name(name))
    return frozenset(standard) | frozenset(custom)


def resource_class(requested: Optional[str], vendor_id: str, product_id: str) -> str:
    """nova's ``get_resource_class``."""
    if requested:
        rc = requested.upper()
        if rc not in orc.STANDARDS and not orc.is_custom(rc):
            rc = orc.normalize_name(rc)
        return rc
    return f"CUSTOM_PCI_{vendor_id}_{product_id}".upper()


def spec_problems(spec: PciDeviceSpec, neutron_classes, neutron_traits, why: str) -> list[str]:
    """What a spec asks the agent to publish that is not a PCI device's:
    a class the agent computes from the host, or neutron's classes and
    traits (``neutron_*`` prefixes, ``why`` says whose they are)."""
    problems = []
    rc = resource_class(spec.resource_class, "0000", "0000") if spec.resource_class else None
    if rc and (rc in HOST_CLASSES or rc.startswith(HOST_CLASS_PREFIXES)):
        problems.append(
            f"[pci] device_spec resource_class '{spec.resource_class}' is {rc}, which "
            "the agent reports from the host itself; a PCI device counted in it would "
            "be offered as that resource. Use a name of its own (e.g. PGPU or "
            "CUSTOM_<NAME>)."
        )
    if rc and rc.startswith(tuple(neutron_classes)):
        problems.append(f"[pci] device_spec resource_class {rc} {why}.")
    for trait in sorted(spec_traits(spec.traits)):
        if trait.startswith(tuple(neutron_traits)):
            problems.append(f"[pci] device_spec trait {trait} {why}.")
    return problems


@functools.lru_cache(maxsize=256)
def device_traits(spec: PciDeviceSpec) -> frozenset[str]:
    traits = set(spec_traits(spec.traits)) | {MANAGED}
    if spec.live_migratable:
        traits.add(LIVE_MIGRATABLE)
    return frozenset(traits)


def spec_of(
    dev: PciDevice, specs: Iterable[PciDeviceSpec], pfs: frozenset[str]
) -> Optional[PciDeviceSpec]:
    """The first spec matching ``dev`` (nova's ``Whitelist.get_devspec``).
    A spec naming exactly one PF's address matches its VFs too."""
    return _first_match(dev, _indexed(specs, pfs))


def _indexed(specs: Iterable[PciDeviceSpec], pfs: frozenset[str]) -> list:
    """(spec, names one PF) for the address-based specs (devname ones are
    refused with report_in_placement, in config/settings.py)."""
    return [(spec, spec.pf_address in pfs) for spec in specs if spec.devname is None]


def _first_match(dev: PciDevice, indexed: list) -> Optional[PciDeviceSpec]:
    for spec, names_pf in indexed:
        if spec.matches(dev.address, (), dev.vendor_id, dev.product_id):
            return spec
        if (
            names_pf
            and dev.parent_addr
            and spec.matches(dev.parent_addr, (), dev.vendor_id, dev.product_id)
        ):
            return spec
    return None


@dataclass
class _Child:
    """One child being assembled: a parent device, or VFs of one PF."""

    name: str
    parent: Optional[PciDevice] = None
    vfs: list = field(default_factory=list)
    rc: Optional[str] = None
    traits: Optional[frozenset] = None
    one_time_use: bool = False

    def devices(self) -> list:
        return [self.parent] if self.parent else self.vfs

    def addresses(self) -> str:
        return ",".join(d.address for d in self.devices())


def _add_parent(child: _Child, dev: PciDevice, spec: PciDeviceSpec) -> None:
    if child.parent or child.vfs:
        raise ConfigError(_dependent(dev, child))
    child.parent = dev
    child.rc = resource_class(spec.resource_class, dev.vendor_id, dev.product_id)
    child.one_time_use = spec.one_time_use
    child.traits = device_traits(spec) | ({ONE_TIME_USE} if spec.one_time_use else set())


def _add_vf(child: _Child, dev: PciDevice, spec: PciDeviceSpec) -> None:
    if child.parent:
        raise ConfigError(_dependent(dev, child))
    rc = resource_class(spec.resource_class, dev.vendor_id, dev.product_id)
    if child.rc and rc != child.rc:
        raise ConfigError(
            f"[pci] device_spec gives VFs of one PF different resource classes: "
            f"{rc} for {dev.address} and {child.rc} for {child.addresses()}; the VFs "
            f"of a PF share one provider ({child.name}) and one class. Give them one "
            "resource_class (nova refuses this too)."
        )
    traits = device_traits(spec)
    if child.traits is not None and traits != child.traits:
        raise ConfigError(
            f"[pci] device_spec gives VFs of one PF different traits: "
            f"{','.join(sorted(traits))} for {dev.address} and "
            f"{','.join(sorted(child.traits))} for {child.addresses()}; they share "
            f"one provider ({child.name}). Give them the same traits (nova refuses "
            "this too)."
        )
    if spec.one_time_use:
        raise ConfigError(
            f"[pci] device_spec sets one_time_use on VF {dev.address}: only "
            "standalone devices and PFs may be one-time-use (nova refuses this too)."
        )
    child.vfs.append(dev)
    child.rc, child.traits = rc, traits


def _dependent(dev: PciDevice, child: _Child) -> str:
    return (
        f"[pci] device_spec matches both {dev.address} and {child.addresses()}, a PF "
        "and its VF: report either the PF or its VFs in Placement, not both. "
        "Narrow the specs' address or product_id (nova refuses this too)."
    )


def _assemble(settings: Settings, host: HostSnapshot) -> dict[str, _Child]:
    if not settings.pci_in_placement or not settings.pci_device_specs:
        return {}
    devices = sorted(host.pci_devices, key=lambda d: d.address)
    pfs = frozenset(d.address for d in devices if d.dev_type == PCI_PF)
    indexed = _indexed(settings.pci_device_specs, pfs)
    children: dict[str, _Child] = {}
    for dev in devices:
        spec = _first_match(dev, indexed)
        if spec is None or spec.physical_network:
            continue
        if dev.dev_type == PCI_VF:
            name = provider_name(settings.host, dev.parent_addr or dev.address)
            _add_vf(children.setdefault(name, _Child(name)), dev, spec)
        else:
            name = provider_name(settings.host, dev.address)
            _add_parent(children.setdefault(name, _Child(name)), dev, spec)
    return children


def claimed_vfs(settings: Settings, host: HostSnapshot) -> dict[str, Optional[int]]:
    """PF address -> how many of its VFs the PCI children count, None when
    the PF itself is a PCI child (its VFs then serve no one else). The
    SR-IOV children (:mod:`node_agent.tree.pci`) leave these out, so no VF
    is offered twice."""
    return pci_tree(settings, host)[1]


def pci_children(settings: Settings, host: HostSnapshot) -> tuple[Provider, ...]:
    """The PCI children under ``settings.host``; () without report_in_placement.
    Raises ConfigError for the device specs nova refuses on this host."""
    return pci_tree(settings, host)[0]


def _guest_holds(children: Mapping[str, _Child], host: HostSnapshot) -> dict[str, dict[str, int]]:
    """Child name -> guest uuid -> how many of the child's devices that
    running guest passes through (a VF counts on its PF's child)."""
    child_of: dict[str, str] = {}
    for name, child in children.items():
        for dev in child.devices():
            child_of[dev.address] = name
    holds: dict[str, dict[str, int]] = {}
    for guest in host.guests:
        if not guest.running:
            continue
        for address in guest.pci_devices:
            if address in child_of:
                by_guest = holds.setdefault(child_of[address], {})
                by_guest[guest.uuid] = by_guest.get(guest.uuid, 0) + 1
    return holds


def guest_holds(settings: Settings, host: HostSnapshot) -> dict[str, dict[str, int]]:
    """PCI child name -> guest uuid -> how many of that child's devices the
    running guest passes through; only children that have such a guest."""
    return _guest_holds(_assemble(settings, host), host)


def pci_tree(
    settings: Settings, host: HostSnapshot
) -> tuple[tuple[Provider, ...], dict[str, Optional[int]]]:
    """:func:`pci_children` and :func:`claimed_vfs` from one pass."""
    children = _assemble(settings, host)
    holds = _guest_holds(children, host)
    claimed: dict[str, Optional[int]] = {}
    providers = []
    for name in sorted(children):
        child = children[name]
        if child.parent is not None:
            claimed[child.parent.address] = None
        elif child.vfs and child.vfs[0].parent_addr:
            claimed[child.vfs[0].parent_addr] = len(child.vfs)
        total = 1 if child.parent else len(child.vfs)
        traits = {t: True for t in child.traits or ()}
        traits.setdefault(ONE_TIME_USE, False)
        traits.setdefault(LIVE_MIGRATABLE, False)
        traits[AGENT_CHILD_TRAIT] = True
        providers.append(
            Provider(
                name=name,
                parent=settings.host,
                inventories={
                    str(child.rc): Inventory(
                        total=total,
                        max_unit=total,
                        guest_held=tuple(sorted(holds.get(name, {}).items())),
                    )
                },
                traits=traits,
            )
        )
    return tuple(providers), claimed


def unmatched_specs(settings: Settings, host: HostSnapshot) -> list[str]:
    """Warnings for the device specs without physical_network that match no
    PCI function on this host under report_in_placement: usually a typo in
    an address or id, and the tree simply lacks that child."""
    if not settings.pci_in_placement:
        return []
    devices = host.pci_devices
    pfs = frozenset(d.address for d in devices if d.dev_type == PCI_PF)
    warnings = []
    for spec, names_pf in _indexed(settings.pci_device_specs, pfs):
        if spec.physical_network or any(_first_match(d, [(spec, names_pf)]) for d in devices):
            continue
        shown = {
            k: v
            for k, v in (
                ("address", spec.address_text()),
                ("vendor_id", spec.vendor_id),
                ("product_id", spec.product_id),
            )
            if v
        }
        warnings.append(
            f"[pci] device_spec {shown} matches no PCI device on this host "
            f"({len(devices)} functions read); with report_in_placement it reports "
            "nothing. Check the address and ids (lspci -nn -D)."
        )
    return warnings


# -- what Placement's usage changes (applied by the syncer)


def is_pci_child(state: ProviderState, root_uuid: str) -> bool:
    """A PCI child this agent made: under its root, with nova's PCI trait
    and the agent's mark."""
    return (
        state.parent_uuid == root_uuid
        and MANAGED in state.traits
        and AGENT_CHILD_TRAIT in state.traits
    )


def needs_usage(tree: ProviderTree, held: ProviderState) -> bool:
    """Whether :func:`at_usage` must know ``held``'s usage: the child is
    gone from the tree or loses capacity, or it is one-time-use and not
    yet fully reserved."""
    wanted = tree.by_name(held.name)
    if wanted is None:
        return True
    for rc, record in held.inventories.items():
        if rc not in wanted.inventories or wanted.inventories[rc].total < record["total"]:
            return True
    if ONE_TIME_USE in wanted.wanted_traits:
        for rc, inv in wanted.inventories.items():
            now = held.inventories.get(rc) or {}
            if now.get("reserved", 0) < inv.total:
                return True
    return False


def at_usage(
    tree: ProviderTree,
    held: Iterable[ProviderState],
    usages: Mapping[str, Mapping[str, int]],
) -> ProviderTree:
    """``tree`` with its PCI children as Placement's usage requires.

    ``held``: the PCI children Placement holds (:func:`is_pci_child`);
    ``usages``: provider name -> class -> used, for those
    :func:`needs_usage` named (a child absent from it is taken as unused
    only where its usage is not needed). A child gone from ``tree`` but
    allocated comes back with total = max_unit = its usage and the traits
    Placement holds; a child below its usage is raised to it; a one-time-use
    child in use is fully reserved, and otherwise keeps the reserved
    Placement holds (never above its total); a child the tree closes
    (maintenance) stays closed. Traits Placement holds on a child that the
    tree no longer gives it are removed, as nova replaces them."""
    providers = list(tree.providers)
    index = {p.name: i for i, p in enumerate(providers)}
    for state in held:
        used = {rc: n for rc, n in usages.get(state.name, {}).items() if n > 0}
        if state.name not in index:
            if used:
                providers.append(
                    Provider(
                        name=state.name,
                        parent=tree.root.name,
                        inventories={
                            rc: Inventory(
                                total=n,
                                max_unit=n,
                                reserved=n if ONE_TIME_USE in state.traits else 0,
                            )
                            for rc, n in used.items()
                        },
                        traits={t: True for t in state.traits},
                    )
                )
            continue
        wanted = providers[index[state.name]]
        one_time = ONE_TIME_USE in wanted.wanted_traits
        inventories = {}
        for rc, inv in wanted.inventories.items():
            n = used.get(rc, 0)
            closed = inv.total > 0 and inv.reserved >= inv.total  # maintenance
            if n > inv.total:
                inv = replace(inv, total=n, max_unit=n)
            reserved = inv.total if closed else inv.reserved
            if one_time:
                record = state.inventories.get(rc) or {}
                kept = min(record.get("reserved", 0), inv.total)
                reserved = max(reserved, inv.total if n else kept)
            inventories[rc] = replace(inv, reserved=reserved)
        # nova replaces a PCI child's traits (update_traits): one the specs
        # no longer give goes.
        traits = dict(wanted.traits)
        for trait in state.traits - set(traits):
            traits[trait] = False
        providers[index[state.name]] = replace(wanted, inventories=inventories, traits=traits)
    return ProviderTree(tuple(providers))


# -- what guests hold on the host (applied by the syncer)


def held_by_guests(tree: ProviderTree) -> list[str]:
    """The providers of ``tree`` some of whose units running guests hold
    (:attr:`Inventory.guest_held`): :func:`at_guest_holds` needs their
    allocations. Empty when no guest holds a PCI device: nothing to read."""
    return [p.name for p in tree.providers if any(i.guest_held for i in p.inventories.values())]


def allocated_by_consumer(body: Mapping) -> dict[str, dict[str, int]]:
    """``GET /resource_providers/{uuid}/allocations`` as consumer -> class -> amount."""
    return {
        consumer: dict((alloc or {}).get("resources") or {})
        for consumer, alloc in (body.get("allocations") or {}).items()
    }


def held_without_allocation(
    held: Iterable[tuple[str, int]], rc: str, allocations: Mapping[str, Mapping[str, int]]
) -> int:
    """How many of the units guests hold (consumer, units) no allocation of
    ``rc`` to that consumer covers."""
    return sum(max(0, n - allocations.get(consumer, {}).get(rc, 0)) for consumer, n in held)


def holds_without_allocation(
    tree: ProviderTree, allocations: Mapping[str, Mapping[str, Mapping[str, int]]]
) -> tuple[tuple[str, str, str, int], ...]:
    """(provider, class, consumer, units) of every unit a running guest
    holds that no allocation of that consumer covers (``allocations`` as
    :func:`at_guest_holds` takes them): what the operator is told."""
    found = []
    for p in tree.providers:
        for rc, inv in sorted(p.inventories.items()):
            for consumer, n in inv.guest_held:
                missing = held_without_allocation([(consumer, n)], rc, allocations.get(p.name, {}))
                if missing:
                    found.append((p.name, rc, consumer, missing))
    return tuple(found)


def holds_message(holds: Iterable[tuple[str, str, str, int]]) -> str:
    """One line for :func:`holds_without_allocation`'s rows."""
    parts = [f"{name} {rc}: {n} by guest {consumer}" for name, rc, consumer, n in holds]
    return (
        "PCI devices running guests pass through without a Placement allocation are "
        "published reserved, so no second guest is placed on them: " + "; ".join(parts)
    )


def at_guest_holds(
    tree: ProviderTree, allocations: Mapping[str, Mapping[str, Mapping[str, int]]]
) -> ProviderTree:
    """``tree`` with the units guests hold without an allocation reserved.

    ``allocations``: provider name -> consumer -> class -> amount, as
    Placement holds them (a provider absent from it, e.g. one not created
    yet, has none). Each class's reserved becomes the larger of what the
    other rules gave and the units held without allocation, never above
    its total: a device a guest passes through outside Placement is never
    offered to a second guest."""
    providers = []
    for p in tree.providers:
        inventories = dict(p.inventories)
        for rc, inv in p.inventories.items():
            if not inv.guest_held:
                continue
            unallocated = held_without_allocation(inv.guest_held, rc, allocations.get(p.name, {}))
            reserved = min(inv.total, max(inv.reserved, unallocated))
            if reserved != inv.reserved:
                inventories[rc] = replace(inv, reserved=reserved)
        providers.append(replace(p, inventories=inventories) if inventories != p.inventories else p)
    return ProviderTree(tuple(providers))
