"""The CPU-set grammar: operator specs, kernel cpulists, canonical form."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node_agent.model.cpuset import (
    MAX_CPU_ID,
    CpuSet,
    CpuSetSyntaxError,
    parse_cpu_spec,
    parse_cpulist,
)

GOOD_SPECS = [
    ("0", {0}),
    ("7", {7}),
    ("0-3", {0, 1, 2, 3}),
    ("0,2,4", {0, 2, 4}),
    ("4,2,0", {0, 2, 4}),
    ("0-3,8", {0, 1, 2, 3, 8}),
    ("0-7,^3", {0, 1, 2, 4, 5, 6, 7}),
    ("^3,0-7", {0, 1, 2, 4, 5, 6, 7}),
    ("0-15,^4-7", {0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15}),
    ("0-3,^0,^3", {1, 2}),
    (" 0 - 3 , 8 ", {0, 1, 2, 3, 8}),
    ("\t1,\n2", {1, 2}),
    ("3-3", {3}),
    ("0-1,0-1", {0, 1}),
    ("0-3,^4", {0, 1, 2, 3}),
    ("65535", {65535}),
    ("010", {10}),
]

BAD_SPECS = [
    "",
    "   ",
    "a",
    "1,,2",
    ",1",
    "1,",
    "3-1",
    "1-",
    "-1",
    "1-2-3",
    "^",
    "^a",
    "1.5",
    "0x1",
    "65536",
    "0-65536",
    "1;2",
    "^^1",
    "1 2",
]


@pytest.mark.parametrize("text,expected", GOOD_SPECS)
def test_good_operator_spec_parses_to_expected_set(text, expected):
    assert parse_cpu_spec(text) == CpuSet(expected)


@pytest.mark.parametrize("text", BAD_SPECS)
def test_malformed_operator_spec_is_refused(text):
    with pytest.raises(CpuSetSyntaxError):
        parse_cpu_spec(text)


def test_spec_whose_exclusions_remove_everything_is_empty_not_an_error():
    assert parse_cpu_spec("0-3,^0-3") == CpuSet()


@pytest.mark.parametrize(
    "text,expected",
    [
        ("0-3\n", {0, 1, 2, 3}),
        ("", set()),
        ("\n", set()),
        ("0,2-3,16-17", {0, 2, 3, 16, 17}),
    ],
)
def test_kernel_cpulist_parses(text, expected):
    assert parse_cpulist(text) == CpuSet(expected)


@pytest.mark.parametrize("text", ["^1", "0-3,^2", "x", "3-1", "1,,2"])
def test_kernel_cpulist_has_no_exclusions_or_garbage(text):
    with pytest.raises(CpuSetSyntaxError):
        parse_cpulist(text)


@pytest.mark.parametrize(
    "ids,canonical",
    [
        ([], ""),
        ([0], "0"),
        ([0, 1], "0-1"),
        ([0, 1, 2, 3, 8], "0-3,8"),
        ([8, 3, 2, 1, 0], "0-3,8"),
        ([0, 2, 4], "0,2,4"),
        ([5, 6, 7, 9, 10], "5-7,9-10"),
    ],
)
def test_canonical_string_is_sorted_ranges(ids, canonical):
    assert str(CpuSet(ids)) == canonical


def test_set_operations_return_cpusets():
    a, b = CpuSet({0, 1, 2}), CpuSet({2, 3})
    assert a | b == CpuSet({0, 1, 2, 3})
    assert a & b == CpuSet({2})
    assert a - b == CpuSet({0, 1})
    assert CpuSet({1}).issubset(a)


def test_cpuset_is_immutable_and_hashable():
    cpus = CpuSet({1, 2})
    with pytest.raises(AttributeError):
        cpus._ids = frozenset()
    assert {cpus: 1}[CpuSet([2, 1])] == 1


def test_cpu_id_above_the_maximum_is_refused():
    with pytest.raises(CpuSetSyntaxError):
        CpuSet({MAX_CPU_ID + 1})


cpu_ids = st.sets(st.integers(min_value=0, max_value=512), max_size=64)


@given(cpu_ids)
def test_canonical_form_parses_back_to_the_same_set(ids):
    cpus = CpuSet(ids)
    assert parse_cpulist(str(cpus)) == cpus
    if ids:
        assert parse_cpu_spec(str(cpus)) == cpus


@given(cpu_ids, cpu_ids)
def test_exclusions_subtract_whatever_their_order(include, exclude):
    if not include:
        return
    spec = ",".join([str(i) for i in sorted(include)] + [f"^{e}" for e in sorted(exclude)])
    assert parse_cpu_spec(spec) == CpuSet(include - exclude)


@given(st.text(max_size=30))
def test_any_text_either_parses_or_raises_the_projects_error(text):
    for parser in (parse_cpu_spec, parse_cpulist):
        try:
            parser(text)
        except CpuSetSyntaxError:
            pass
