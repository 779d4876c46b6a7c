import pytest

from node_agent.tree.child_names import child_suffix, is_child_name
from node_agent.tree.mem_encryption import child_name
from node_agent.tree.numa import numa_provider_name
from node_agent.tree.pci import gpu_provider_name, sriov_provider_name
from node_agent.tree.pci_placement import provider_name as pci_placement_name


@pytest.mark.parametrize(
    "name",
    [
        numa_provider_name("hv", 0),
        numa_provider_name("hv", 12),
        gpu_provider_name("hv", "0000:81:00.0"),
        sriov_provider_name("hv", "0000:3b:00.1"),
        pci_placement_name("hv", "0000:af:00.1"),
        child_name("hv", "amd_sev"),
        child_name("hv", "amd_sev_es"),
        child_name("hv", "amd_sev_snp"),
    ],
)
def test_every_name_the_tree_gives_a_child_is_a_child_name(name):
    assert is_child_name("hv", name)


@pytest.mark.parametrize(
    "name",
    [
        "hv_2",
        "hv_b",
        "hv",
        "hv_",
        "hv_NUMA_",
        "hv_NUMA_0_x",
        "hvx_NUMA_0",
        "other_NUMA_0",
        "hv_0000:81:00.8",
        "hv_0000:Af:00.0",
    ],
)
def test_a_name_another_host_could_have_is_not_a_child_name(name):
    assert not is_child_name("hv", name)


@pytest.mark.parametrize(
    "name, suffix",
    [
        ("old-name_NUMA_0", "NUMA_0"),
        ("my_host_NUMA_12", "NUMA_12"),
        ("hv.example.org_pci_0000_81_00_1", "pci_0000_81_00_1"),
        ("hv_0000:81:00.0", "0000:81:00.0"),
        ("hv_amd_sev_es", "amd_sev_es"),
        ("hv_intel_tdx", "intel_tdx"),
        ("hv_2", None),
        ("hv_NUMA_0_x", None),
        ("NUMA_0", None),
    ],
)
def test_a_childs_suffix_is_found_whatever_host_name_precedes_it(name, suffix):
    assert child_suffix(name) == suffix
