"""One cycle's pure pipeline, plus the reads that feed it.

discover (shell) -> partition -> build (+ operator files, maintenance):
the desired tree, what to remember for next cycle, and what a person should
be warned about.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from node_agent.build import build_tree
from node_agent.discover import discover
from node_agent.maintenance import in_maintenance
from node_agent.partition import CpuPartition, partition_cpus
from node_agent.provider_config import (ProviderConfig, applied_traits,
                                        apply_provider_configs, load_provider_configs,
                                        unmatched)
from node_agent.provider_tree import ProviderTree
from node_agent.settings import Settings
from node_agent.topology import HostSnapshot

# Keys of the state file this module reads (the syncer owns the others).
APPLIED_KEY = "provider_config_applied"
MAINTENANCE_KEY = "maintenance"
PROVIDERS_KEY = "providers"  # written by the syncer: name -> uuid


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

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.host.warnings + self.partition.warnings + self.notes


def desired_from(settings: Settings, host: HostSnapshot,
                 configs: Sequence[ProviderConfig] = (),
                 previously_applied: Optional[Mapping[str, Sequence[str]]] = None,
                 maintenance: Optional[Mapping] = None,
                 known_uuids: Optional[Mapping[str, str]] = None) -> Desired:
    """Pure: the tree this host should have under these settings.

    ``known_uuids`` (provider name -> uuid, from the state file) lets
    operator files identify providers by uuid.
    """
    partition = partition_cpus(settings, host)
    previous = {name: set(traits) for name, traits in (previously_applied or {}).items()}
    tree = build_tree(settings, host, partition).with_uuids(known_uuids or {})
    tree = apply_provider_configs(tree, configs, previous)
    notes = [f"provider file entry {c.source} names a provider that is not on this "
             f"host: {c.identity}" for c in unmatched(tree, configs)]
    if maintenance:
        tree = in_maintenance(tree)
        notes.append(f"maintenance is on ({maintenance.get('reason') or 'no reason given'}): "
                     "every inventory is fully reserved; `node-agent maintenance off` ends it")
    applied = {name: sorted(traits) for name, traits in applied_traits(configs, tree).items()}
    return Desired(host, partition, tree, applied, maintenance, tuple(notes))


def compute_desired(settings: Settings, hypervisor=None,
                    state: Optional[Mapping] = None) -> Desired:
    """Read the host and the operator files; ``state`` is the agent's state file."""
    state = state or {}
    return desired_from(settings, discover(settings, hypervisor),
                        load_provider_configs(settings.provider_config_location),
                        state.get(APPLIED_KEY), state.get(MAINTENANCE_KEY),
                        state.get(PROVIDERS_KEY))
