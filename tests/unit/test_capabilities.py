"""parse_capabilities / parse_cpu_model_xml over libvirt's real capabilities files."""

import pytest

from node_agent.errors import ParseError
from node_agent.host.capabilities import CapsCpu, parse_capabilities, parse_cpu_model_xml
from node_agent.model.cpuset import CpuSet
from tests.hostdata import HOSTDATA

CAPS = HOSTDATA / "capabilityschemadata"
VIRCAPS = HOSTDATA / "vircaps2xmldata"
CPUTEST = HOSTDATA / "cputestdata"


def caps(path):
    return parse_capabilities(path.read_text())


def test_kvm_host_has_two_interleaved_cells_of_eight_cpus():
    parsed = caps(CAPS / "caps-qemu-kvm.xml")
    assert [cell.id for cell in parsed.cells] == [0, 1]
    assert parsed.cells[0].cpu_ids == CpuSet(range(0, 16, 2))
    assert parsed.cells[1].cpu_ids == CpuSet(range(1, 16, 2))


def test_kvm_host_cell_memory_and_page_counts_are_read_in_kib():
    cell0, cell1 = caps(CAPS / "caps-qemu-kvm.xml").cells
    assert cell0.memory_kb == 16175540
    assert cell1.memory_kb == 16510060
    assert cell0.pages == ((4, 4043885), (2048, 0), (1048576, 0))


def test_kvm_host_supports_4k_2m_and_1g_pages():
    assert caps(CAPS / "caps-qemu-kvm.xml").page_sizes_kb == (4, 2048, 1048576)


def test_kvm_host_cpu_topology_ids_come_from_the_cpu_elements():
    cell1 = caps(CAPS / "caps-qemu-kvm.xml").cells[1]
    cpu9 = next(cpu for cpu in cell1.cpus if cpu.id == 9)
    assert cpu9 == CapsCpu(id=9, socket_id=1, die_id=0, core_id=4, siblings=CpuSet({9}))


def test_kvm_host_cpu_model_and_features():
    model = caps(CAPS / "caps-qemu-kvm.xml").cpu_model
    assert (model.arch, model.model, model.vendor) == ("x86_64", "Haswell-noTSX", "Intel")
    assert {"vmx", "pdpe1gb", "invtsc", "f16c"} <= model.features
    assert "svm" not in model.features


def test_old_format_cpus_have_no_topology_ids():
    cell0 = caps(CAPS / "caps-test3.xml").cells[0]
    assert len(cell0.cpus) == 12
    assert all(cpu.socket_id is None and cpu.siblings is None for cpu in cell0.cpus)
    assert cell0.memory_kb == 12572412


def test_cell_without_pages_has_memory_but_no_page_counts():
    cell1 = caps(CAPS / "caps-test3.xml").cells[1]
    assert cell1.memory_kb == 12582908
    assert cell1.pages == ()


def test_host_without_topology_has_no_cells():
    parsed = caps(CAPS / "caps-test2.xml")
    assert parsed.cells == ()
    assert parsed.cpu_model.model == "SandyBridge"


def test_cells_without_memory_report_none():
    parsed = caps(CAPS / "caps-test.xml")
    assert [cell.memory_kb for cell in parsed.cells] == [None, None]
    assert parsed.cpu_model.features == frozenset()  # <features><pae/> is not CPU features
    assert parsed.page_sizes_kb == ()


def test_cpu_less_memory_node_is_an_empty_cell():
    cell0, cell1 = caps(VIRCAPS / "vircaps-x86_64-hmat.xml").cells
    assert len(cell0.cpu_ids) == 24
    assert cell1.cpu_ids == CpuSet()


def test_smt_siblings_are_parsed_as_cpu_sets():
    (cell,) = caps(VIRCAPS / "vircaps-x86_64-caches.xml").cells
    siblings = {cpu.id: cpu.siblings for cpu in cell.cpus}
    assert siblings[0] == CpuSet({0, 4})
    assert siblings[7] == CpuSet({3, 7})


def test_dies_are_kept_per_cpu():
    (cell,) = caps(VIRCAPS / "vircaps-x86_64-basic-dies.xml").cells
    by_id = {cpu.id: cpu for cpu in cell.cpus}
    assert (by_id[5].socket_id, by_id[5].die_id, by_id[5].core_id) == (0, 2, 1)
    assert (by_id[8].socket_id, by_id[8].die_id, by_id[8].core_id) == (1, 1, 0)


@pytest.mark.parametrize(
    "path", sorted(CAPS.glob("*.xml")) + sorted(VIRCAPS.glob("*.xml")), ids=lambda p: p.name
)
def test_every_capabilities_fixture_parses_with_unique_cpu_ids(path):
    parsed = caps(path)
    ids = [cpu.id for cell in parsed.cells for cpu in cell.cpus]
    assert len(ids) == len(set(ids))


def test_host_model_file_gives_model_vendor_and_extra_features():
    model = parse_cpu_model_xml((CPUTEST / "x86_64-cpuid-EPYC-7502-32-Core-host.xml").read_text())
    assert (model.arch, model.model, model.vendor) == ("x86_64", "EPYC-Rome", "AMD")
    assert {"topoext", "ibrs", "amd-ssbd", "invtsc"} <= model.features
    assert len(model.features) == 33


@pytest.mark.parametrize("path", sorted(CPUTEST.glob("*-host.xml")), ids=lambda p: p.name)
def test_every_host_model_file_names_a_model_and_vendor(path):
    model = parse_cpu_model_xml(path.read_text())
    assert model.model and model.vendor in {"Intel", "AMD", "Hygon"}
    assert model.features


def test_disabled_features_are_absent_and_required_present():
    model = parse_cpu_model_xml(
        "<cpu><arch>x86_64</arch><model>Skylake-Server</model><vendor>Intel</vendor>"
        "<feature policy='require' name='vmx'/><feature policy='disable' name='hle'/>"
        "<feature name='ht'/><feature policy='forbid' name='rtm'/></cpu>"
    )
    assert model.features == frozenset({"vmx", "ht"})


@pytest.mark.parametrize(
    "xml, message",
    [
        ("<capabilities><host>", "malformed XML"),
        ("", "malformed XML"),
        ("<domain/>", "root element is <domain>"),
        (
            "<capabilities><host><topology><cells><cell id='x'/></cells></topology></host>"
            "</capabilities>",
            "'x' is not a number",
        ),
        (
            "<capabilities><host><cpu><pages unit='KiB' size='big'/></cpu></host></capabilities>",
            "'big' is not a number",
        ),
        (
            "<capabilities><host><cpu><pages unit='furlong' size='4'/></cpu></host></capabilities>",
            "unknown size unit 'furlong'",
        ),
        (
            "<capabilities><host><topology><cells><cell id='0'><cpus>"
            "<cpu id='0' siblings='0-'/></cpus></cell></cells></topology></host></capabilities>",
            "cell 0 cpu 0 siblings",
        ),
    ],
)
def test_bad_capabilities_raise_parse_error(xml, message):
    with pytest.raises(ParseError, match=message):
        parse_capabilities(xml)


def test_cpu_model_xml_with_wrong_root_is_refused():
    with pytest.raises(ParseError, match="expected <cpu>"):
        parse_cpu_model_xml("<capabilities/>")
