"""Drift: where Placement's record of this host differs from what node-agent
would publish, each difference with the option (nova's name for it) or
the host fact that explains it. Companion mode reports it; it never acts
on it.

Pure: the desired tree, the providers Placement holds (found by name, so
the root may be nova-compute's) and the settings go in; differences come
out. The comparison is the sync planner's own (the same field equality,
the same ratio rule: an allocation ratio that is only the
``initial_*_allocation_ratio`` keeps whatever Placement holds, as nova
does), so a companion's drift is exactly what the agent would write.

Only what node-agent has an opinion on counts: a trait it does not decide
about (nor ``COMPUTE_STATUS_DISABLED``, the compute service's own status,
nor the agent's mark on its children),
or a child provider it would not report, is someone else's and is no drift.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

from node_agent.model.provider_state import INVENTORY_FIELDS, ProviderState, inventory_equal
from node_agent.model.provider_tree import Provider, ProviderTree, placement_inventories
from node_agent.model.settings import Settings
from node_agent.policy.child_owner import AGENT_CHILD_TRAIT

KINDS = ("inventory", "trait", "provider")
ABSENT = "absent"
PRESENT = "present"

# The compute service's disabled status: nova-compute sets it when an operator
# disables the service; companion mode has no maintenance of its own, so it
# has no opinion on it. The agent's mark on its children means nothing on
# children nova-compute writes (its GPU children have the agent's names).
NOT_COMPARED = frozenset({"COMPUTE_STATUS_DISABLED", AGENT_CHILD_TRAIT})

# The memory-encryption children (tree/mem_encryption.py).
_SEV = (
    "libvirt's SEV guest counts (domain capabilities), the kvm_amd kernel "
    "parameters and [libvirt] num_memory_encrypted_guests"
)
_TDX = (
    "libvirt's TDX support (domain capabilities), [libvirt] cpu_mode, the "
    "kernel's misc cgroup and [libvirt] num_intel_tdx_guests"
)

# OWNER_* traits (os-traits) -> who writes the provider.
_OWNERS = {"OWNER_NOVA": "nova-compute", "OWNER_CYBORG": "cyborg"}


@dataclass(frozen=True)
class Difference:
    provider: str
    subject: str  # "VCPU total", "trait HW_CPU_X86_AVX2", "provider"
    placement: str  # as Placement holds it
    host: str  # as node-agent would publish it
    explained_by: str  # the option, with its value, or the host fact

    @property
    def kind(self) -> str:
        """``provider``, ``trait`` or ``inventory``."""
        if self.subject == "provider":
            return "provider"
        return "trait" if self.subject.startswith("trait ") else "inventory"

    def as_dict(self) -> dict:
        return {
            "provider": self.provider,
            "subject": self.subject,
            "kind": self.kind,
            "placement": self.placement,
            "host": self.host,
            "explained_by": self.explained_by,
        }

    def line(self) -> str:
        return (
            f"{self.provider}: {self.subject}: Placement {self.placement}, "
            f"this host {self.host} -- {self.explained_by}"
        )


_PCI_IN_PLACEMENT = (
    "[pci] report_in_placement and the device_spec matching the device "
    "(resource_class, traits, live_migratable, one_time_use)"
)
_PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


def owner_of(traits) -> Optional[str]:
    """Who owns a provider, by its ``OWNER_*`` trait (None: no such trait)."""
    for trait in sorted(traits):
        if trait.startswith("OWNER_"):
            return _OWNERS.get(trait, trait)
    return None


def _cpus(value) -> str:
    return f"'{value}'"


def _ratio(kind: str, settings: Settings) -> str:
    value = getattr(settings, f"{kind}_allocation_ratio")
    if settings.keeps_placement_ratio(kind):
        return (
            f"[DEFAULT] initial_{kind}_allocation_ratio = {value:g} applies to a "
            f"new class only; [DEFAULT] {kind}_allocation_ratio is unset, so "
            "Placement's ratio is kept"
        )
    return f"[DEFAULT] {kind}_allocation_ratio = {value:g} (set, so nova writes it at every update)"


def _vcpu_total(settings: Settings) -> str:
    if settings.cpu_shared_set is not None:
        return f"[compute] cpu_shared_set = {_cpus(settings.cpu_shared_set)}"
    if settings.vcpu_pin_set is not None:
        return f"[DEFAULT] vcpu_pin_set = {_cpus(settings.vcpu_pin_set)}"
    if settings.cpu_dedicated_set is not None:
        return (
            "[compute] cpu_shared_set is unset and cpu_dedicated_set = "
            f"{_cpus(settings.cpu_dedicated_set)}: no CPU is left for VCPU"
        )
    return "every online CPU (neither [compute] cpu_shared_set nor [DEFAULT] vcpu_pin_set is set)"


def explain_inventory(rc: str, field: str, settings: Settings) -> str:
    """The option (nova's spelling, with its value) or host fact behind
    ``field`` of class ``rc``."""
    kind = {"VCPU": "cpu", "MEMORY_MB": "ram", "DISK_GB": "disk"}.get(rc)
    if field == "allocation_ratio" and kind:
        return _ratio(kind, settings)
    if rc == "VCPU":
        if field == "reserved":
            return f"[DEFAULT] reserved_host_cpus = {settings.reserved_host_cpus}"
        return _vcpu_total(settings)
    if rc == "PCPU":
        if settings.cpu_dedicated_set is None:
            return "[compute] cpu_dedicated_set is unset: no PCPU"
        return f"[compute] cpu_dedicated_set = {_cpus(settings.cpu_dedicated_set)}"
    if rc == "MEMORY_MB":
        if field == "reserved":
            return f"[DEFAULT] reserved_host_memory_mb = {settings.reserved_host_memory_mb}"
        return (
            "the host's memory (no option; huge pages reserved by "
            "[DEFAULT] reserved_huge_pages are reported apart)"
        )
    if rc == "DISK_GB":
        if field == "reserved":
            return (
                f"[DEFAULT] reserved_host_disk_mb = {settings.reserved_host_disk_mb}"
                " (rounded up to whole GiB)"
            )
        return (
            "the size of the filesystem holding [DEFAULT] instances_path = "
            f"'{settings.instances_path}'"
        )
    if rc == "VGPU":
        return "[devices] enabled_mdev_types"
    if rc == "MEM_ENCRYPTION_CONTEXT":
        return _SEV
    if rc.startswith("MEMORY_PAGE_"):
        return "the host's huge pages and [DEFAULT] reserved_huge_pages"
    if rc.startswith("SRIOV_") or rc.startswith("PCI_"):
        return "[pci] device_spec"
    if rc.startswith("CUSTOM_PCI_"):
        return _PCI_IN_PLACEMENT
    if rc.startswith("CUSTOM_"):
        return "an operator provider file ([compute] provider_config_location)"
    return "the host as node-agent discovers it (no nova option)"


def explain_trait(trait: str) -> str:
    if trait == "COMPUTE_MANAGED_PCI_DEVICE" or trait.startswith("HW_PCI_"):
        return _PCI_IN_PLACEMENT
    if trait == "COMPUTE_NODE":
        return "every compute node's root carries it"
    if trait == "HW_CPU_HYPERTHREADING":
        return "the host's SMT siblings (no option)"
    if trait.startswith("HW_CPU_X86_AMD_SEV"):
        return _SEV
    if trait.startswith("HW_CPU_") or trait.startswith("HW_ARCH_"):
        return "the host CPU as libvirt describes it (no option)"
    if trait.startswith("COMPUTE_SECURITY_TPM_"):
        return "[libvirt] swtpm_enabled and the hypervisor's TPM support"
    if trait.startswith(
        (
            "COMPUTE_STORAGE_BUS_",
            "COMPUTE_GRAPHICS_MODEL_",
            "COMPUTE_NET_VIF_MODEL_",
            "COMPUTE_ARCH_",
            "COMPUTE_VIOMMU_",
            "COMPUTE_SOUND_MODEL_",
            "COMPUTE_NET_VIRTIO_",
        )
    ):
        return (
            "[libvirt] virt_type and what the hypervisor offers (its version, "
            "its domain capabilities)"
        )
    if trait.startswith("COMPUTE_IMAGE_TYPE_"):
        return (
            "[libvirt] images_type and virt_type, [DEFAULT] force_raw_images, "
            "[compute] image_type_exclude_list"
        )
    if trait == "COMPUTE_MEM_BACKING_FILE":
        return "[libvirt] file_backed_memory"
    if trait.startswith(
        (
            "COMPUTE_SECURITY_UEFI_",
            "COMPUTE_SECURITY_STATELESS_",
            "COMPUTE_ADDRESS_SPACE_",
            "COMPUTE_STORAGE_VIRTIO_FS",
        )
    ):
        return "the hypervisor's version and domain capabilities (nova's capability traits)"
    if trait.startswith("CUSTOM_"):
        return "an operator provider file ([compute] provider_config_location)"
    return "the host as node-agent discovers it (no nova option)"


def explain_provider(name: str, root: str) -> str:
    if name.startswith(f"{root}_NUMA_"):
        return "node-agent's [compute] numa_in_placement (nova-compute reports no NUMA providers)"
    if name.startswith(f"{root}_amd_sev"):
        return _SEV
    if name == f"{root}_intel_tdx":
        return _TDX
    if name.startswith(f"{root}_pci_"):
        return "[devices] enabled_mdev_types or [pci] device_spec"
    if _PCI_ADDRESS.fullmatch(name[len(root) + 1 :]) and name.startswith(f"{root}_"):
        return "[pci] device_spec (a physnet PF's VFs, or a device with report_in_placement)"
    return "an operator provider file ([compute] provider_config_location)"


def _shown(record: Mapping, field: str) -> str:
    value = record.get(field)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _follows_total(old: Mapping, new: Mapping) -> bool:
    return old.get("max_unit") == old.get("total") and new.get("max_unit") == new.get("total")


def inventory_differences(
    provider: Provider, held: ProviderState, settings: Settings
) -> list[Difference]:
    wanted = placement_inventories(provider.inventories, held.inventories)
    out = []
    for rc in sorted(set(wanted) | set(held.inventories)):
        old, new = held.inventories.get(rc), wanted.get(rc)
        if old is None or new is None:
            out.append(
                Difference(
                    provider.name,
                    rc,
                    ABSENT if old is None else f"total {old['total']}",
                    ABSENT if new is None else f"total {new['total']}",
                    explain_inventory(rc, "total", settings),
                )
            )
            continue
        for field in INVENTORY_FIELDS:
            if inventory_equal({**old, field: new[field]}, old):
                continue
            if field == "max_unit" and _follows_total(old, new):
                continue  # said by the total's own difference
            out.append(
                Difference(
                    provider.name,
                    f"{rc} {field}",
                    _shown(old, field),
                    _shown(new, field),
                    explain_inventory(rc, field, settings),
                )
            )
    return out


def trait_differences(
    provider: Provider, held: ProviderState, owner_ignores: frozenset[str] = frozenset()
) -> list[Difference]:
    out = []
    for trait, wanted in sorted(provider.traits.items()):
        if trait in NOT_COMPARED or trait in owner_ignores:
            continue
        if wanted != (trait in held.traits):
            out.append(
                Difference(
                    provider.name,
                    f"trait {trait}",
                    PRESENT if trait in held.traits else ABSENT,
                    PRESENT if wanted else ABSENT,
                    explain_trait(trait),
                )
            )
    return out


def drift(
    desired: ProviderTree,
    held: Mapping[str, ProviderState],
    settings: Settings,
    owner_ignores: frozenset[str] = frozenset(),
) -> tuple[Difference, ...]:
    """Every difference, provider by provider in the tree's order.
    ``held``: provider name -> what Placement holds for it (the root's
    tree, found by the root's name). A provider of ``desired`` Placement
    does not have is one difference; its contents are not listed.
    ``owner_ignores``: traits the provider's writer never sets from the
    host (the CPU feature traits nova's table lacks, on nova's root): not
    compared."""
    out: list[Difference] = []
    for provider in desired.providers:
        state = held.get(provider.name)
        if state is None:
            out.append(
                Difference(
                    provider.name,
                    "provider",
                    ABSENT,
                    f"{len(provider.inventories)} resource classes",
                    explain_provider(provider.name, desired.root.name),
                )
            )
            continue
        out += inventory_differences(provider, state, settings)
        out += trait_differences(provider, state, owner_ignores)
    return tuple(out)


def signature(differences) -> list[list[str]]:
    """What a notification is sent on: the set of differences, values included."""
    return sorted([d.provider, d.subject, d.placement, d.host] for d in differences)
