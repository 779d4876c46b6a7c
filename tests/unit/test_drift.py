"""Companion mode's drift (pure) and its read-only gateway: literal trees,
Placement records shaped as nova 34's libvirt driver writes them."""

from dataclasses import replace

import pytest

from node_agent.model.cpuset import parse_cpu_spec
from node_agent.model.provider_state import ProviderState
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
from node_agent.model.settings import Settings
from node_agent.placement.client import PlacementClient
from node_agent.placement.readonly import ReadOnlyPlacement, WriteRefused
from node_agent.policy import drift as D
from node_agent.tree.cpu_traits import NOT_DECIDED_BY_NOVA

ROOT = "11111111-1111-4111-8111-111111111111"

SETTINGS = Settings(
    host="compute-7",
    state_path="/nonexistent",
    sysfs_root="/nonexistent",
    libvirt_uri="",
    cpu_dedicated_set=parse_cpu_spec("2-7"),
    cpu_shared_set=parse_cpu_spec("0-1"),
    vcpu_pin_set=None,
    reserved_host_cpus=0,
    reserved_host_memory_mb=4096,
    reserved_host_disk_mb=0,
    cpu_allocation_ratio=4.0,
    ram_allocation_ratio=1.5,
    disk_allocation_ratio=1.0,
    instances_path="/var/lib/nova/instances",
    explicit_ratios=frozenset({"ram"}),
)


def nova_record(total, reserved=0, ratio=1.0):
    """An inventory record as nova-compute's libvirt driver writes it."""
    return {
        "total": total,
        "reserved": reserved,
        "min_unit": 1,
        "max_unit": total,
        "step_size": 1,
        "allocation_ratio": ratio,
    }


def desired(inventories=None, traits=None, children=()):
    root = Provider(
        "compute-7",
        uuid=ROOT,
        inventories=inventories
        or {
            "VCPU": Inventory(2, allocation_ratio=4.0, keep_placement_ratio=True),
            "PCPU": Inventory(6),
            "MEMORY_MB": Inventory(64000, reserved=4096, allocation_ratio=1.5),
        },
        traits=traits
        if traits is not None
        else {"COMPUTE_NODE": True, "HW_CPU_X86_AVX2": True, "COMPUTE_STATUS_DISABLED": False},
    )
    return ProviderTree((root,) + tuple(children))


def held(
    inventories,
    traits=("COMPUTE_NODE", "HW_CPU_X86_AVX2", "OWNER_NOVA", "COMPUTE_NET_VIF_MODEL_VIRTIO"),
):
    return {"compute-7": ProviderState(ROOT, "compute-7", 5, None, inventories, frozenset(traits))}


MATCHING = {
    "VCPU": nova_record(2, ratio=16.0),
    "PCPU": nova_record(6),
    "MEMORY_MB": nova_record(64000, 4096, 1.5),
}


def test_placement_matching_the_host_is_no_drift_whatever_ratio_nova_kept():
    # cpu_allocation_ratio is unset: Placement's 16.0 is kept, as nova keeps it.
    assert D.drift(desired(), held(MATCHING), SETTINGS) == ()


def test_an_explicit_ratio_that_differs_names_the_nova_option():
    placement = {**MATCHING, "MEMORY_MB": nova_record(64000, 4096, 1.0)}
    (diff,) = D.drift(desired(), held(placement), SETTINGS)
    assert (diff.subject, diff.placement, diff.host) == ("MEMORY_MB allocation_ratio", "1", "1.5")
    assert diff.explained_by.startswith("[DEFAULT] ram_allocation_ratio = 1.5")


def test_reserved_memory_drift_names_reserved_host_memory_mb_with_its_value():
    placement = {**MATCHING, "MEMORY_MB": nova_record(64000, 512, 1.5)}
    (diff,) = D.drift(desired(), held(placement), SETTINGS)
    assert diff.line() == (
        "compute-7: MEMORY_MB reserved: Placement 512, this host 4096 "
        "-- [DEFAULT] reserved_host_memory_mb = 4096"
    )
    assert diff.kind == "inventory"


def test_a_dedicated_set_nova_has_not_applied_yet_shows_as_pcpu_and_vcpu_drift():
    placement = {"VCPU": nova_record(8, ratio=16.0), "MEMORY_MB": nova_record(64000, 4096, 1.5)}
    found = {d.subject: d for d in D.drift(desired(), held(placement), SETTINGS)}
    assert set(found) == {"PCPU", "VCPU total"}
    assert (found["PCPU"].placement, found["PCPU"].host) == (D.ABSENT, "total 6")
    assert found["PCPU"].explained_by == "[compute] cpu_dedicated_set = '2-7'"
    assert found["VCPU total"].explained_by == "[compute] cpu_shared_set = '0-1'"
    # max_unit follows total on both sides: said once, by the total.
    assert "VCPU max_unit" not in found


def test_only_traits_the_agent_decides_about_count():
    # OWNER_NOVA and COMPUTE_NET_VIF_MODEL_VIRTIO are nova's, and so is the
    # disabled status of an operator-disabled service: no drift. A feature
    # the host has and Placement lacks is.
    traits = (
        "COMPUTE_NODE",
        "OWNER_NOVA",
        "COMPUTE_STATUS_DISABLED",
        "COMPUTE_NET_VIF_MODEL_VIRTIO",
    )
    (diff,) = D.drift(desired(), held(MATCHING, traits), SETTINGS)
    assert (diff.subject, diff.placement, diff.host, diff.kind) == (
        "trait HW_CPU_X86_AVX2",
        D.ABSENT,
        D.PRESENT,
        "trait",
    )
    assert diff.explained_by == "the host CPU as libvirt describes it (no option)"


def test_cpu_traits_nova_does_not_decide_are_no_drift_on_its_root_only():
    # The agent's table maps more features than nova's and reads libvirt's
    # "pni" as SSE3; nova-compute, the writer here, never sets those traits.
    traits = {
        "COMPUTE_NODE": True,
        "HW_CPU_X86_AVX2": True,
        "HW_CPU_X86_SSE3": True,
        "HW_CPU_X86_STIBP": True,
        "HW_CPU_X86_INTEL_MD_CLEAR": True,
    }
    tree = desired(traits=traits)
    assert D.drift(tree, held(MATCHING), SETTINGS, NOT_DECIDED_BY_NOVA) == ()
    assert [d.subject for d in D.drift(tree, held(MATCHING), SETTINGS)] == [
        "trait HW_CPU_X86_INTEL_MD_CLEAR",
        "trait HW_CPU_X86_SSE3",
        "trait HW_CPU_X86_STIBP",
    ]
    # A trait nova does decide still counts.
    missing_avx2 = held(MATCHING, traits=("COMPUTE_NODE", "OWNER_NOVA"))
    assert [d.subject for d in D.drift(tree, missing_avx2, SETTINGS, NOT_DECIDED_BY_NOVA)] == [
        "trait HW_CPU_X86_AVX2"
    ]


def test_a_child_nova_does_not_report_is_one_difference_naming_the_option():
    numa = Provider("compute-7_NUMA_0", parent="compute-7", inventories={"PCPU": Inventory(3)})
    (diff,) = D.drift(desired(children=[numa]), held(MATCHING), SETTINGS)
    assert (diff.provider, diff.subject, diff.kind) == ("compute-7_NUMA_0", "provider", "provider")
    assert "numa_in_placement" in diff.explained_by


def test_novas_gpu_child_is_compared_without_the_agents_child_mark():
    gpu = Provider(
        "compute-7_pci_0000_84_00_0",
        parent="compute-7",
        inventories={"VGPU": Inventory(16)},
        traits={"CUSTOM_NODE_AGENT_CHILD": True},
    )
    nova_gpu = ProviderState(
        "g", "compute-7_pci_0000_84_00_0", 2, ROOT, {"VGPU": nova_record(8)}, frozenset()
    )
    (diff,) = D.drift(
        desired(children=[gpu]), {**held(MATCHING), nova_gpu.name: nova_gpu}, SETTINGS
    )
    assert (diff.subject, diff.placement, diff.host) == ("VGPU total", "8", "16")
    assert diff.explained_by == "[devices] enabled_mdev_types"


def test_the_signature_changes_with_the_values_not_with_the_order():
    placement = {**MATCHING, "MEMORY_MB": nova_record(64000, 512, 1.0)}
    first = D.drift(desired(), held(placement), SETTINGS)
    assert len(first) == 2
    assert D.signature(first) == D.signature(tuple(reversed(first)))
    moved = {**MATCHING, "MEMORY_MB": nova_record(64000, 1024, 1.0)}
    assert D.signature(D.drift(desired(), held(moved), SETTINGS)) != D.signature(first)


@pytest.mark.parametrize(
    "traits, owner",
    [
        ({"OWNER_NOVA", "COMPUTE_NODE"}, "nova-compute"),
        ({"OWNER_CYBORG"}, "cyborg"),
        ({"OWNER_SOMEONE"}, "OWNER_SOMEONE"),
        ({"COMPUTE_NODE"}, None),
    ],
)
def test_owner_is_read_from_the_owner_trait(traits, owner):
    assert D.owner_of(traits) == owner


@pytest.mark.parametrize(
    "trait, named",
    [
        ("COMPUTE_NET_VIF_MODEL_IGB", "[libvirt] virt_type"),
        ("COMPUTE_SECURITY_TPM_2_0", "[libvirt] swtpm_enabled"),
        ("HW_CPU_X86_AVX512F", "the host CPU as libvirt describes it"),
        ("CUSTOM_GOLD", "provider_config_location"),
        ("COMPUTE_MANAGED_PCI_DEVICE", "[pci] report_in_placement"),
        ("HW_PCI_ONE_TIME_USE", "one_time_use"),
    ],
)
def test_each_kind_of_trait_names_what_decides_it(trait, named):
    assert named in D.explain_trait(trait)


def test_pci_device_child_and_class_name_report_in_placement():
    assert "report_in_placement" in D.explain_provider("hv_0000:AF:00.0", "hv")
    assert "report_in_placement" in D.explain_inventory("CUSTOM_PCI_10DE_1EB8", "total", None)


def test_vcpu_total_without_any_cpu_set_is_explained_by_the_online_cpus():
    legacy = replace(SETTINGS, cpu_dedicated_set=None, cpu_shared_set=None)
    assert D.explain_inventory("VCPU", "total", legacy).startswith("every online CPU")
    assert (
        D.explain_inventory("PCPU", "total", legacy)
        == "[compute] cpu_dedicated_set is unset: no PCPU"
    )


@pytest.mark.parametrize(
    "write",
    [
        lambda ro: ro.put("/resource_providers/x/inventories", {}),
        lambda ro: ro.post("/resource_providers", {"name": "compute-7"}),
        lambda ro: ro.delete("/resource_providers/x"),
    ],
)
def test_the_read_only_gateway_refuses_every_write_before_sending_it(write):
    # Port 9 (discard) on loopback: a request that left would fail differently.
    client = PlacementClient.for_endpoint("http://127.0.0.1:9", retries=0)
    gateway = ReadOnlyPlacement(client)
    with pytest.raises(WriteRefused, match="companion mode never writes"):
        write(gateway)
    assert client.stats.total == 0
    # No attribute leads back to the client's write methods.
    assert not any(hasattr(gateway, name) for name in ("_client", "adapter", "_request"))
