"""One cycle's pure pipeline, plus the reads that feed it.

discover (shell) -> partition -> build (+ operator files, maintenance):
the desired tree, what to remember for next cycle, and what a person should
be warned about.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence

from node_agent.config.provider_files import load_provider_configs, load_provider_files
from node_agent.errors import ConfigError
from node_agent.host.discover import discover
from node_agent.model.provider_tree import Provider, ProviderTree
from node_agent.model.settings import Settings
from node_agent.model.snapshot import HostSnapshot
from node_agent.policy import device_maintenance as devmaint
from node_agent.policy import guest_fit, stranded
from node_agent.policy import maintenance as maint
from node_agent.policy.partition import CpuPartition, partition_cpus
from node_agent.policy.provider_config import (
    ProviderConfig,
    applied_inventories,
    applied_traits,
    apply_provider_configs,
    file_added_traits,
    held_inventories,
    unmatched,
)
from node_agent.state import (
    APPLIED,
    DEVICE_MAINTENANCE,
    FILE_INVENTORIES,
    MAINTENANCE,
    PROVIDERS,
)
from node_agent.tree.build import build_tree, mem_encryption
from node_agent.tree.pci import unmatched_device_options
from node_agent.tree.pci_placement import unmatched_specs

LOG = logging.getLogger(__name__)

# Keys of the state file this module reads (the syncer owns the others).


@dataclass(frozen=True)
class Desired:
    host: HostSnapshot
    partition: CpuPartition
    tree: ProviderTree
    # Operator-file traits applied this cycle, by provider: remember them so
    # a trait removed from a file is removed from its provider next cycle.
    applied: Mapping[str, Sequence[str]] = field(default_factory=dict)
    maintenance: Optional[Mapping] = None
    notes: tuple[str, ...] = ()
    # Problems of operator provider files refused this cycle (the others
    # and the rest of the tree are still reported).
    refused_files: tuple[str, ...] = ()
    # The state file's per-device records (maintenance --provider).
    device_maintenance: Optional[Mapping] = None
    # What NUMA children strand (policy/stranded.py: report), on a host with
    # NUMA nodes; None otherwise.
    stranded: Optional[Mapping] = None
    # With numa_in_placement on: the same tree without NUMA children (the
    # operator's files and aggregates applied, not maintenance), which a
    # cycle whose NUMA reshape is refused writes instead, so the refusal
    # holds back no other change. None otherwise.
    without_numa: Optional[ProviderTree] = None
    # [compute] shared_storage_aggregate: the sharing provider holding the
    # filesystem's DISK_GB (policy/shared_storage.py); None otherwise.
    shared: Optional[Provider] = None
    # Operator-file inventories applied this cycle, provider -> class ->
    # record (held ones included): kept while a file is refused.
    applied_inventories: Mapping[str, Mapping[str, Mapping]] = field(default_factory=dict)

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.host.warnings + self.partition.warnings + self.notes


def desired_from(
    settings: Settings,
    host: HostSnapshot,
    configs: Sequence[ProviderConfig] = (),
    previously_applied: Optional[Mapping[str, Sequence[str]]] = None,
    maintenance: Optional[Mapping] = None,
    known_uuids: Optional[Mapping[str, str]] = None,
    refused_files: Sequence[str] = (),
    device_maintenance: Optional[Mapping] = None,
    previous_inventories: Optional[Mapping[str, Mapping[str, Mapping]]] = None,
) -> Desired:
    """Pure: the tree this host should have under these settings.

    ``known_uuids`` (provider name -> uuid, from the state file) lets
    operator files identify providers by uuid. With ``refused_files`` (a
    provider file could not be used) no trait a file added before is
    removed, and the inventories the files gave at the last cycle
    (``previous_inventories``) are kept, for the same reason.
    """
    partition = partition_cpus(settings, host)
    previous = {name: set(traits) for name, traits in (previously_applied or {}).items()}
    tree = build_tree(settings, host, partition).with_uuids(known_uuids or {})
    tree = apply_provider_configs(tree, configs, {} if refused_files else previous)
    inventories = applied_inventories(configs, tree)
    if refused_files:
        tree = held_inventories(tree, previous_inventories or {})
        for name, records in (previous_inventories or {}).items():
            kept = {rc: dict(record) for rc, record in records.items()}
            inventories[name] = {**kept, **inventories.get(name, {})}
    tree, shared = root_joined(settings, tree)
    notes = [
        f"provider file entry {c.source} names a provider that is not on this host: {c.identity}"
        for c in unmatched(tree, configs)
    ]
    notes += unmatched_device_options(settings, host)
    notes += unmatched_specs(settings, host)
    notes += guest_fit.warnings(
        host.guests, partition.dedicated, getattr(partition, "shared", None)
    )
    offered = mem_encryption(settings, host)
    notes += offered.warnings if offered else ()
    tree, maintenance_notes = maint.apply(tree, maintenance)
    notes += maintenance_notes
    tree, device_notes = devmaint.apply(tree, device_maintenance)
    notes += device_notes
    now = applied_traits(configs, tree)
    if refused_files:
        notes += [
            f"provider file refused, the other files and the rest of the tree are "
            f"reported: {problem}"
            for problem in refused_files
        ]
        for name, traits in previous.items():  # still remembered: not removed
            now.setdefault(name, set()).update(traits)
    applied = {name: sorted(traits) for name, traits in now.items()}
    return Desired(
        host,
        partition,
        tree,
        applied,
        maintenance,
        tuple(notes),
        tuple(refused_files),
        device_maintenance,
        numa_stranded(settings, host, partition),
        _without_numa(settings, host, partition, configs, known_uuids or {}),
        shared,
        inventories,
    )


def _without_numa(
    settings: Settings,
    host: HostSnapshot,
    partition: CpuPartition,
    configs: Sequence[ProviderConfig],
    known_uuids: Mapping[str, str],
) -> Optional[ProviderTree]:
    if not settings.numa_in_placement or not host.nodes or settings.node_resource_class:
        return None
    flat = build_tree(replace(settings, numa_in_placement=False), host, partition)
    # No trait is removed from it: the next cycle with NUMA is the reference.
    flat = apply_provider_configs(flat.with_uuids(known_uuids), configs, {})
    return root_joined(settings, flat)[0]


def root_joined(settings: Settings, tree: ProviderTree) -> tuple[ProviderTree, Optional[Provider]]:
    """The root with the aggregates it joins; with shared storage
    (:mod:`node_agent.policy.shared_storage`) without its DISK_GB, which
    the sharing provider returned with it holds."""
    aggregates = frozenset(settings.placement_aggregates)
    shared = None
    inventories = tree.root.inventories
    if settings.shared_storage_aggregate:
        # Loaded with the option only (it loads uuid): start-up cost,
        # tests/cli/test_start_cost.py.
        from node_agent.policy import shared_storage

        aggregate = settings.shared_storage_aggregate
        aggregates |= {aggregate}
        disk = inventories.get(shared_storage.DISK_GB)
        if disk is not None:
            shared = shared_storage.sharing_provider(aggregate, disk)
        inventories = {rc: i for rc, i in inventories.items() if rc != shared_storage.DISK_GB}
    if not aggregates and shared is None:
        return tree, None
    root = replace(tree.root, aggregates=aggregates, inventories=inventories)
    return ProviderTree((root,) + tree.providers[1:]), shared


def numa_stranded(
    settings: Settings,
    host: HostSnapshot,
    partition: CpuPartition,
    usage: Optional[stranded.Usage] = None,
) -> Optional[dict]:
    """Pure: what NUMA children strand on this host (:mod:`node_agent.policy.stranded`),
    the host's trees built both ways; when ``numa_in_placement`` is off,
    what turning it on would strand. ``usage``: what Placement holds on the
    NUMA tree's providers, by name (only with the option on: off, nobody
    knows which node a guest would use). None on a host without NUMA nodes, in
    whole-node mode, or when the NUMA tree cannot be built (its error is the
    tree's own when the option is on)."""
    if settings.node_resource_class or not host.nodes:
        return None
    try:
        numa = build_tree(replace(settings, numa_in_placement=True), host, partition)
        flat = build_tree(replace(settings, numa_in_placement=False), host, partition)
    except ConfigError:
        return None
    return stranded.report(
        stranded.stranded_shapes(numa, flat, usage), settings.numa_in_placement, bool(usage)
    )


def file_traits_to_remember(
    desired: Desired,
    previous: Optional[Mapping],
    before: Mapping[str, frozenset],
    clean: bool = True,
) -> dict[str, list[str]]:
    """Pure: the operator-file traits to remember after a sync
    (:func:`node_agent.policy.provider_config.file_added_traits`); ``before``
    is what Placement held before it (provider name -> traits). After a sync
    that was not ``clean`` the previous record stays too: a removal that did
    not happen is tried again, and a trait a file added this cycle is not
    taken for the operator's next cycle."""
    now = file_added_traits(desired.applied, previous or {}, before)
    if clean:
        return now
    merged = {name: set(traits) for name, traits in (previous or {}).items()}
    for name, traits in now.items():
        merged.setdefault(name, set()).update(traits)
    return {name: sorted(traits) for name, traits in merged.items() if traits}


def with_placement_maintenance(desired: Desired, root_traits) -> Desired:
    """Pure: ``desired`` kept in maintenance when the state file has no
    record but Placement's root carries the disabled trait
    (:func:`node_agent.policy.maintenance.from_placement`); else unchanged."""
    record = maint.from_placement(desired.maintenance, root_traits)
    if record is desired.maintenance:
        return desired
    tree, notes = maint.apply(desired.tree, record)
    return replace(desired, tree=tree, maintenance=record, notes=desired.notes + tuple(notes))


def with_placement_device_maintenance(desired, traits_by_name: Mapping) -> Any:
    """Pure: ``desired`` with the children that carry the disabled trait in
    Placement and have no record kept closed
    (:func:`node_agent.policy.device_maintenance.held_by_placement`)."""
    tree, notes = devmaint.held_by_placement(desired.tree, traits_by_name)
    if not notes:
        return desired
    return replace(desired, tree=tree, notes=tuple(desired.notes) + tuple(notes))


def forget_applied_device_offs(store, records: Optional[Mapping]) -> None:
    """After a cycle that applied ``records`` cleanly: the ``off`` records
    are done, so drop them (each unless changed since)."""
    done = {n: r for n, r in (records or {}).items() if maint.requested(r) is False}
    if not done:
        return

    def drop_if_unchanged(state: dict) -> None:
        kept = dict(state.get(DEVICE_MAINTENANCE) or {})
        for name, record in done.items():
            if kept.get(name) == record:
                del kept[name]
        if kept:
            state[DEVICE_MAINTENANCE] = kept
        else:
            state.pop(DEVICE_MAINTENANCE, None)

    store.update(drop_if_unchanged)


def forget_applied_off(store, record: Optional[Mapping]) -> None:
    """After a cycle that applied ``record`` cleanly: an ``off`` record is
    done, so drop it (unless the file has changed since), and from then on
    the root's disabled trait alone means maintenance again."""
    if maint.requested(record) is not False:
        return

    def drop_if_unchanged(state: dict) -> None:
        if state.get(MAINTENANCE) == record:
            del state[MAINTENANCE]

    store.update(drop_if_unchanged)


def compute_desired(
    settings: Settings,
    hypervisor=None,
    state: Optional[Mapping] = None,
    lenient_files: bool = False,
) -> Desired:
    """Read the host and the operator files; ``state`` is the agent's state file.

    A bad provider file raises ConfigError, or with ``lenient_files`` (the
    service, ``--once``) is left out and listed in ``refused_files``.
    """
    state = state or {}
    if lenient_files:
        configs, refused = load_provider_files(settings.provider_config_location)
    else:
        configs, refused = load_provider_configs(settings.provider_config_location), ()
    return desired_from(
        settings,
        discover(settings, hypervisor),
        configs,
        state.get(APPLIED),
        state.get(MAINTENANCE),
        state.get(PROVIDERS),
        refused,
        state.get(DEVICE_MAINTENANCE),
        state.get(FILE_INVENTORIES),
    )


def with_owner_mark(desired: Desired, settings: Settings) -> Desired:
    """``desired`` with this machine's owner mark on the root: what the agent
    sends to the central applier, which judges the root's owner by it
    (:mod:`node_agent.policy.root_owner`)."""
    # Here, not at the top: the owner mark's HMAC loads OpenSSL (about 1 MiB),
    # which a dry-run without Placement never needs.
    from node_agent.host.machine_id import identity
    from node_agent.policy.root_owner import marked

    return replace(desired, tree=marked(desired.tree, identity(settings)))
