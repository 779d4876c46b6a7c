"""One cycle's pure pipeline, plus the discovery call that feeds it.

discover (shell) -> partition -> build: the desired tree and what a person
should be warned about.
"""

from __future__ import annotations

from dataclasses import dataclass

from node_agent.build import build_tree
from node_agent.discover import discover
from node_agent.partition import CpuPartition, partition_cpus
from node_agent.provider_tree import ProviderTree
from node_agent.settings import Settings
from node_agent.topology import HostSnapshot


@dataclass(frozen=True)
class Desired:
    host: HostSnapshot
    partition: CpuPartition
    tree: ProviderTree

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.host.warnings + self.partition.warnings


def desired_from(settings: Settings, host: HostSnapshot) -> Desired:
    """Pure: the tree this host should have under these settings."""
    partition = partition_cpus(settings, host)
    return Desired(host, partition, build_tree(settings, host, partition))


def compute_desired(settings: Settings, hypervisor_factory=None) -> Desired:
    return desired_from(settings, discover(settings, hypervisor_factory))
