import pytest

from node_agent.errors import ParseError
from node_agent.host.meminfo import parse_node_meminfo
from tests.hostdata import HOSTDATA

NODE_TEXT = """\
Node 0 MemTotal:       16175540 kB
Node 0 MemFree:         1204032 kB
Node 0 Active(anon):     174208 kB
Node 0 HugePages_Total:  1024
Node 0 HugePages_Free:    768
"""


def test_node_lines_give_kb_values_and_unitless_counts():
    fields = parse_node_meminfo(NODE_TEXT)
    assert fields == {
        "MemTotal": 16175540,
        "MemFree": 1204032,
        "Active(anon)": 174208,
        "HugePages_Total": 1024,
        "HugePages_Free": 768,
    }


def test_proc_meminfo_lines_without_node_prefix_are_read():
    text = "MemTotal:       32817236 kB\nHugePages_Total:       0\nHugepagesize:       2048 kB\n"
    assert parse_node_meminfo(text) == {
        "MemTotal": 32817236,
        "HugePages_Total": 0,
        "Hugepagesize": 2048,
    }


def test_real_node_meminfo_from_an_opteron_host():
    text = (HOSTDATA / "virhostcpudata/linux-test7/node/node0/meminfo").read_text()
    fields = parse_node_meminfo(text)
    assert fields["MemTotal"] == 134215764
    assert (fields["HugePages_Total"], fields["HugePages_Free"]) == (8192, 4466)
    assert fields["AnonHugePages"] == 9218048


def test_blank_lines_are_ignored():
    assert parse_node_meminfo("\nNode 1 MemTotal: 5 kB\n\n") == {"MemTotal": 5}


@pytest.mark.parametrize("text", ["", "\n\n", "   "])
def test_empty_text_is_refused(text):
    with pytest.raises(ParseError, match="no meminfo fields"):
        parse_node_meminfo(text)


@pytest.mark.parametrize(
    "text, where",
    [
        ("Node 0 MemTotal:       16175540 kB\nNode 0 MemFr", "line 2"),
        ("Node 0 MemTotal:", "line 1"),
        ("Node 0 MemTotal:  12x34 kB", "line 1"),
        ("MemTotal -5 kB", "line 1"),
        ("Node 0 MemTotal:  -5 kB", "line 1"),
    ],
)
def test_truncated_or_garbled_lines_are_refused_with_their_line_number(text, where):
    with pytest.raises(ParseError, match=where):
        parse_node_meminfo(text)


def test_unit_other_than_kb_is_refused():
    with pytest.raises(ParseError, match="unit 'MB'"):
        parse_node_meminfo("MemTotal: 16 MB")


def test_repeated_field_is_refused():
    with pytest.raises(ParseError, match="MemTotal appears twice"):
        parse_node_meminfo("Node 0 MemTotal: 1 kB\nNode 0 MemTotal: 2 kB\n")


def test_lines_from_two_nodes_are_refused():
    with pytest.raises(ParseError, match="different nodes: 0, 1"):
        parse_node_meminfo("Node 0 MemTotal: 1 kB\nNode 1 MemFree: 2 kB\n")


def test_the_real_hosts_memory_is_libvirts_figure_but_never_above_the_kernels():
    """nova publishes virNodeGetInfo's memory; the agent does too (companion
    drift stays empty), except above the kernel's MemTotal, which no guest
    could use."""
    from types import SimpleNamespace

    import psutil

    from node_agent.host.discover import memory_mb

    kernel = psutil.virtual_memory().total // (1024 * 1024)
    topology = SimpleNamespace(memory_kb=None)
    assert memory_mb(topology, True, kernel - 1) == (kernel - 1, [])
    total, warnings = memory_mb(topology, True, kernel * 2)
    assert total == kernel and "reporting the kernel's figure" in warnings[0]
