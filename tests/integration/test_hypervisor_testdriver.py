"""Hypervisor + parsers against libvirt's real test driver (libvirt-python).

tests/data/libvirt/host.xml describes the guests and node devices; each
open re-reads that file, so nothing here changes state between tests.
"""

import re
from pathlib import Path

import pytest

from node_agent.errors import DiscoveryError
from node_agent.host.capabilities import parse_capabilities
from node_agent.host.domain import parse_domain
from node_agent.host.hypervisor import Hypervisor
from node_agent.host.nodedev import parse_node_device
from node_agent.model.cpuset import CpuSet
from node_agent.policy.guest_cpu import classify

pytestmark = pytest.mark.integration

HOST_XML = Path(__file__).resolve().parents[1] / "data" / "libvirt" / "host.xml"
URI = f"test://{HOST_XML}"


@pytest.fixture
def hypervisor():
    hv = Hypervisor(URI)
    yield hv
    hv.close()


@pytest.fixture
def guests(hypervisor):
    parsed = [parse_domain(xml, running) for xml, running in hypervisor.domain_xmls()]
    return {guest.name: guest for guest in parsed}


@pytest.fixture
def devices(hypervisor):
    parsed = [parse_node_device(xml) for xml in hypervisor.node_device_xmls()]
    return {dev.name: dev for dev in parsed}


def test_running_and_defined_guests_are_all_listed(guests):
    assert sorted(guests) == [f"instance-0000000{i}" for i in range(1, 7)]
    running = {name for name, guest in guests.items() if guest.running}
    assert running == {
        "instance-00000001",
        "instance-00000003",
        "instance-00000005",
        "instance-00000006",
    }


def test_pinned_and_unpinned_guests_are_told_apart(guests):
    pinned = {name for name, guest in guests.items() if classify(guest).dedicated}
    assert pinned == {"instance-00000001", "instance-00000002"}


def test_pins_to_cpus_above_seven_are_read_from_the_xml(guests):
    # vcpuPinInfo() would show CPUs >= 8 as unpinned on the test driver.
    assert guests["instance-00000001"].vcpupin == (
        (0, CpuSet({2})),
        (1, CpuSet({10})),
        (2, CpuSet({3})),
        (3, CpuSet({11})),
    )
    assert guests["instance-00000002"].pinned_cpus == CpuSet({4, 12})
    assert not guests["instance-00000002"].running


def test_nova_metadata_survives_the_round_trip(guests):
    meta = dict(guests["instance-00000001"].metadata)
    assert meta["nova:name"] == "pinned-running"
    assert meta["flavor:name"] == "m1.pinned"
    assert meta["hw:cpu_policy"] == "dedicated"


def test_hugepage_guest_with_numatune(guests):
    guest = guests["instance-00000005"]
    assert guest.hugepages
    assert guest.numa_nodes == frozenset({1})
    assert guest.vcpus == 2  # current='2' of 4
    assert not guests["instance-00000003"].hugepages


def test_memory_units_are_normalised(guests):
    assert guests["instance-00000002"].memory_kb == 2 * 1024 * 1024  # 2048 MiB
    assert guests["instance-00000004"].memory_kb == 1024 * 1024  # 1 GiB


def test_mdev_guest_uuid_matches_an_mdev_node_device(guests, devices):
    (mdev,) = guests["instance-00000006"].mdevs
    assert mdev.uuid == "4b20d080-1b54-4048-85b3-a6a62d165c01"
    owners = [d for d in devices.values() if d.mdev_uuid == mdev.uuid]
    assert [d.parent for d in owners] == ["pci_0000_81_00_0"]
    assert owners[0].mdev_type == "nvidia-222"


def test_gpu_reports_mdev_types_with_available_instances(devices):
    gpu = devices["pci_0000_81_00_0"]
    assert gpu.pci_address == "0000:81:00.0"
    assert gpu.numa_node == 1
    assert {(t.id, t.available_instances) for t in gpu.mdev_types} == {
        ("nvidia-222", 15),
        ("nvidia-223", 8),
    }


def test_sriov_pf_and_vf_are_linked(devices):
    pf = devices["pci_0000_02_00_0"]
    vf = devices["pci_0000_02_10_0"]
    assert pf.vf_max_count == 7
    assert pf.virt_functions == (vf.pci_address,)
    assert vf.phys_function == pf.pci_address


def test_node_devices_can_be_filtered_by_capability(hypervisor):
    pci = {parse_node_device(x).name for x in hypervisor.node_device_xmls("pci")}
    assert pci == {"pci_0000_02_00_0", "pci_0000_02_10_0", "pci_0000_81_00_0"}
    mdev_parents = [parse_node_device(x).name for x in hypervisor.node_device_xmls("mdev_types")]
    assert mdev_parents == ["pci_0000_81_00_0"]


def test_test_driver_capabilities_parse_with_no_cells(hypervisor):
    # A file-based test driver has no NUMA cells; the host comes from sysfs.
    caps = parse_capabilities(hypervisor.capabilities_xml())
    assert caps.cells == ()


def test_closed_hypervisor_reopens_on_next_use(hypervisor):
    first = len(hypervisor.domain_xmls())
    hypervisor.close()
    assert len(hypervisor.domain_xmls()) == first


def test_unreadable_host_file_is_a_discovery_error_naming_the_uri():
    uri = "test:///nonexistent/file.xml"
    hv = Hypervisor(uri)
    with pytest.raises(DiscoveryError, match=re.escape("test:///nonexistent/file.xml")) as raised:
        hv.domain_xmls()
    assert "cannot connect" in str(raised.value)


def test_a_libvirt_message_that_is_not_utf8_is_a_discovery_error(tmp_path):
    # libvirt unescapes the URI's path and echoes its byte 0xff in its
    # message; libvirt-python then failed to build the libvirtError
    # (SystemError "returned a result with an exception set").
    uri = f"test://{tmp_path}/%FFhost.xml"
    with pytest.raises(DiscoveryError) as raised:
        Hypervisor(uri).domain_xmls()
    assert f"libvirt at {uri}: cannot connect: " in str(raised.value)
    assert f"{tmp_path}/\\xffhost.xml" in str(raised.value)
    assert "not UTF-8" in str(raised.value)


def test_empty_uri_is_refused():
    with pytest.raises(ValueError):
        Hypervisor("")


def _settings_for(tmp_path, uri):
    from tests.hostdata import HOSTDATA, sysfs_root_for
    from tests.snapshots import settings

    root = sysfs_root_for(HOSTDATA / "virhostcpudata" / "linux-test4", tmp_path)
    return settings(sysfs_root=str(root), libvirt_uri=uri, instances_path=str(tmp_path))


def test_service_connection_is_kept_across_cycles_and_dropped_after_a_failed_read(tmp_path):
    from node_agent.host.discover import discover

    xml = tmp_path / "host.xml"
    xml.write_text(HOST_XML.read_text())
    settings = _settings_for(tmp_path, f"test://{xml}")
    kept = Hypervisor(settings.libvirt_uri)
    first = discover(settings, kept)
    # The test driver reads its file when a connection opens: a guest removed
    # from the file shows only to a new connection.
    text = xml.read_text()
    start = text.index('<domain type="test"')
    xml.write_text(text[:start] + text[text.index("</domain>", start) + len("</domain>") :])
    assert len(discover(settings, kept).guests) == len(first.guests)
    assert len(discover(settings).guests) == len(first.guests) - 1
    kept.close()

    broken = Hypervisor(f"test://{tmp_path / 'missing.xml'}")
    with pytest.raises(DiscoveryError):
        discover(_settings_for(tmp_path / "b", broken.uri), broken)
    assert broken._conn is None  # the next cycle reconnects


def test_refused_domain_capabilities_leave_their_traits_alone_and_the_cycle_succeeds(
    tmp_path, caplog
):
    """libvirt's test driver has no domain capabilities: with the option on,
    the host is still read and reported, without the traits they decide."""
    import dataclasses
    import logging

    from node_agent.host.discover import discover
    from node_agent.tree.hypervisor_traits import TraitSettings, hypervisor_traits

    settings = dataclasses.replace(_settings_for(tmp_path, URI), domain_capabilities=True)
    with caplog.at_level(logging.WARNING, logger="node_agent.host.discover"):
        host = discover(settings)
    assert host.hypervisor is not None and host.hypervisor.domain_caps is None
    assert host.hypervisor.libvirt_version >= (9, 0, 0)
    traits = hypervisor_traits(host.hypervisor, TraitSettings(), host.cpu_model.arch)
    assert traits["COMPUTE_NET_VIRTIO_PACKED"]
    assert not any(t.startswith("COMPUTE_STORAGE_BUS_") for t in traits)
    assert any("refused domain capabilities" in r.getMessage() for r in caplog.records)


def test_read_only_says_once_which_traits_it_does_not_report(tmp_path, caplog, monkeypatch):
    import logging

    from node_agent.host import discover as discover_mod
    from node_agent.host import warn_once

    monkeypatch.setattr(warn_once, "_LOGGED", set())
    settings = _settings_for(tmp_path, URI)
    with caplog.at_level(logging.INFO, logger="node_agent.host.discover"):
        for _cycle in range(3):
            host = discover_mod.discover(settings)
    said = [r for r in caplog.records if "domain_capabilities is off" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert "COMPUTE_STORAGE_BUS_*" in said[0].getMessage()
    assert host.hypervisor is not None and host.hypervisor.domain_caps is None
