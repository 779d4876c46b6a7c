"""AMD SEV and Intel TDX children reach the real Placement as nova 34 lays
them out.

The session's real libvirtd answers everything (capabilities, versions,
guests) except the domain capabilities: its QEMU runs on a host without AMD
SEV, so the gateway's one domain-capabilities call is answered with
libvirt's own capture of an SEV host (``qemu_10.0.0-q35.x86_64+amdsev.xml``).
The kernel's half (``kvm_amd`` parameters, the misc cgroup's TDX keys) is a
sysfs tree in ``tmp_path``; TDX likewise with libvirt's capture of a TDX host.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from pathlib import Path

import os_traits as ot
import pytest

from node_agent.cycle.desired import compute_desired
from node_agent.cycle.reconcile import Reconciler
from node_agent.host.hypervisor import Hypervisor
from node_agent.placement.client import PlacementClient
from node_agent.placement.sync import TreeSyncer
from node_agent.state import StateStore
from tests.hostdata import HOSTDATA, sysfs_root_for
from tests.integration.placement_tree import tree_by_name
from tests.integration.reshape_driver import allocate, make_settings

pytestmark = pytest.mark.integration
LOG = logging.getLogger(__name__)
AMD_SEV_XML = (HOSTDATA / "domaincapsdata" / "qemu_10.0.0-q35.x86_64+amdsev.xml").read_text()
TDX_XML = (HOSTDATA / "domaincapsdata" / "qemu_10.1.0-q35.x86_64+inteltdx.xml").read_text()


class SevHost(Hypervisor):
    """The real libvirtd, with an SEV host's domain capabilities for x86_64."""

    def domain_capabilities_xml(self, emulator, arch, machine, virt_type):
        return AMD_SEV_XML if arch == "x86_64" else None


def _settings(libvirtd, tmp_path: Path, host: str, kvm_amd=("sev", "sev_es"), **kw):
    root = sysfs_root_for(HOSTDATA / "virhostcpudata" / "linux-test4", tmp_path)
    params = root / "module" / "kvm_amd" / "parameters"
    params.mkdir(parents=True)
    for name in ("sev", "sev_es", "sev_snp"):
        (params / name).write_text("Y\n" if name in kvm_amd else "N\n")
    base = make_settings(host, str(root), libvirtd.ro_uri, str(tmp_path / "state"), str(tmp_path))
    return dataclasses.replace(base, virt_type="qemu", **kw)


class TdxHost(Hypervisor):
    """The real libvirtd, with an Intel TDX host's domain capabilities for x86_64."""

    def domain_capabilities_xml(self, emulator, arch, machine, virt_type):
        return TDX_XML if arch == "x86_64" else None


def _cycle(client, settings, host=SevHost):
    store = StateStore(Path(settings.state_path))
    with host(settings.libvirt_uri) as hypervisor:
        desired = compute_desired(settings, hypervisor, store.load_or_empty(LOG))
    return Reconciler(client, TreeSyncer(client, store)).apply(desired).report


@pytest.fixture
def client(placement_server):
    return PlacementClient.for_endpoint(placement_server.url)


def test_sev_and_sev_snp_children_appear_with_libvirts_guest_counts(
    libvirtd, client, host_name, tmp_path
):
    # SEV-SNP on: nova reports SEV and SEV-SNP and ignores SEV-ES, whatever
    # the QEMU version (SEV-ES alone would need QEMU 8.0; this host's may be older).
    settings = _settings(
        libvirtd, tmp_path, host_name, ("sev", "sev_es", "sev_snp"), domain_capabilities=True
    )
    assert _cycle(client, settings).ok
    tree = tree_by_name(client, host_name)
    root = tree[host_name]
    assert set(tree) == {host_name, f"{host_name}_amd_sev", f"{host_name}_amd_sev_snp"}
    for name, model_trait, total in (
        (f"{host_name}_amd_sev", ot.HW_CPU_X86_AMD_SEV, 59),
        (f"{host_name}_amd_sev_snp", ot.HW_CPU_X86_AMD_SEV_SNP, 450),
    ):
        child = tree[name]
        assert child["parent"] == root["uuid"]
        inv = child["inventories"]["MEM_ENCRYPTION_CONTEXT"]
        assert (inv["total"], inv["max_unit"], inv["allocation_ratio"]) == (total, 1, 1.0)
        assert model_trait in child["traits"] and ot.OWNER_NOVA not in child["traits"]
    assert "MEM_ENCRYPTION_CONTEXT" not in root["inventories"]

    # An operator's older nova.conf limit lowers both totals on the next cycle.
    limited = dataclasses.replace(settings, num_memory_encrypted_guests=16)
    assert _cycle(client, limited).ok
    tree = tree_by_name(client, host_name)
    assert {
        tree[n]["inventories"]["MEM_ENCRYPTION_CONTEXT"]["total"]
        for n in (f"{host_name}_amd_sev", f"{host_name}_amd_sev_snp")
    } == {16}


def test_tdx_child_appears_with_the_kernels_keys_and_the_option_lowers_them(
    libvirtd, client, host_name, tmp_path, monkeypatch
):
    from node_agent.host import hypervisor_info

    # The process caches domain capabilities per URI; this host answers other ones.
    monkeypatch.setattr(hypervisor_info, "_DOMAIN_CAPS", {})
    settings = _settings(
        libvirtd,
        tmp_path,
        host_name,
        (),
        domain_capabilities=True,
        cpu_mode="host-passthrough",
    )
    cgroup = Path(settings.sysfs_root) / "fs" / "cgroup"
    cgroup.mkdir(parents=True)
    (cgroup / "misc.capacity").write_text("sev 0\nsev_es 0\ntdx 31\n")
    assert _cycle(client, settings, TdxHost).ok
    tree = tree_by_name(client, host_name)
    assert set(tree) == {host_name, f"{host_name}_intel_tdx"}
    child = tree[f"{host_name}_intel_tdx"]
    assert child["parent"] == tree[host_name]["uuid"]
    inv = child["inventories"]["MEM_ENCRYPTION_CONTEXT"]
    assert (inv["total"], inv["max_unit"], inv["allocation_ratio"]) == (31, 1, 1.0)
    assert ot.HW_CPU_X86_INTEL_TDX in child["traits"]

    assert _cycle(client, dataclasses.replace(settings, num_intel_tdx_guests=8), TdxHost).ok
    inv = tree_by_name(client, host_name)[f"{host_name}_intel_tdx"]["inventories"]
    assert inv["MEM_ENCRYPTION_CONTEXT"]["total"] == 8

    # Without host-passthrough nova reports no TDX, and neither does the agent.
    assert _cycle(client, dataclasses.replace(settings, cpu_mode=None), TdxHost).ok
    assert set(tree_by_name(client, host_name)) == {host_name}


def test_read_only_reports_no_sev_child_and_says_mem_encryption_context_once(
    libvirtd, client, host_name, tmp_path
):
    from node_agent.host import warn_once

    settings = _settings(libvirtd, tmp_path, host_name)  # domain_capabilities off
    assert _cycle(client, settings).ok
    assert set(tree_by_name(client, host_name)) == {host_name}
    said = [line for line in warn_once._LOGGED if "domain_capabilities is off" in line]
    assert said and "MEM_ENCRYPTION_CONTEXT" in said[0]


def test_mem_encryption_context_in_use_on_the_root_is_reshaped_to_the_sev_child(
    libvirtd, client, host_name, tmp_path
):
    """nova's layout before 2025.2: MEM_ENCRYPTION_CONTEXT on the root, held
    by a guest. One POST /reshaper moves the allocation to <host>_amd_sev
    and the inventory with it, as nova 34 does on its first start."""
    root_uuid = str(uuid.uuid4())
    client.post("/resource_providers", {"name": host_name, "uuid": root_uuid})
    client.put(
        f"/resource_providers/{root_uuid}/inventories",
        {
            "resource_provider_generation": 0,
            "inventories": {
                "MEM_ENCRYPTION_CONTEXT": {"total": 15, "max_unit": 1},
                "MEMORY_MB": {"total": 4096},
            },
        },
    )
    consumer = str(uuid.uuid4())
    allocate(client, consumer, {root_uuid: {"MEM_ENCRYPTION_CONTEXT": 1, "MEMORY_MB": 512}})

    settings = _settings(libvirtd, tmp_path, host_name, ("sev",), domain_capabilities=True)
    store = StateStore(Path(settings.state_path))
    with SevHost(settings.libvirt_uri) as hypervisor:
        desired = compute_desired(settings, hypervisor, store.load_or_empty(LOG))
    outcome = Reconciler(client, TreeSyncer(client, store)).apply(desired)
    assert outcome.report.ok, outcome.report.errors
    tree = tree_by_name(client, host_name)
    sev = tree[f"{host_name}_amd_sev"]
    assert "MEM_ENCRYPTION_CONTEXT" not in tree[host_name]["inventories"]
    assert sev["inventories"]["MEM_ENCRYPTION_CONTEXT"]["total"] == 59
    held = client.get(f"/allocations/{consumer}")["allocations"]
    assert held == {
        root_uuid: {"resources": {"MEMORY_MB": 512}, "generation": held[root_uuid]["generation"]},
        sev["uuid"]: {
            "resources": {"MEM_ENCRYPTION_CONTEXT": 1},
            "generation": held[sev["uuid"]]["generation"],
        },
    }


def test_sev_children_stay_as_placement_holds_them_when_domain_caps_are_not_read(
    libvirtd, client, host_name, tmp_path
):
    """A cycle that cannot decide the children (option turned off, polkit
    refusing) must not delete them: nothing says the host lost SEV."""
    settings = _settings(
        libvirtd, tmp_path, host_name, ("sev", "sev_es", "sev_snp"), domain_capabilities=True
    )
    assert _cycle(client, settings).ok
    before = tree_by_name(client, host_name)
    assert len(before) == 3

    off = dataclasses.replace(settings, domain_capabilities=False)
    report = _cycle(client, off)
    assert report.ok, report.errors
    assert not [c for c in report.applied if c.kind == "delete"]
    assert tree_by_name(client, host_name) == before
