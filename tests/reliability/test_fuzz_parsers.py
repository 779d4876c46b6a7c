"""Property-based fuzzing of every parser of host and operator text.

Contract under test: whatever text comes in, a parser either returns or
raises one of the project's own errors (``NodeAgentError`` subclasses);
the ``problems``-collecting option parsers never raise at all. Inputs are
arbitrary text plus real samples from ``tests/data/hostdata`` mutated by
truncation, character flips, element deletion and duplication.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from functools import lru_cache

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from node_agent.errors import NodeAgentError
from node_agent.host.capabilities import parse_capabilities, parse_cpu_model_xml
from node_agent.host.domain import parse_domain
from node_agent.host.meminfo import parse_node_meminfo
from node_agent.host.nodedev import parse_node_device
from node_agent.model.cpuset import parse_cpu_spec, parse_cpulist
from node_agent.model.device_spec import parse_device_specs
from node_agent.model.hugepages import parse_reserved_huge_pages
from node_agent.policy.provider_config import parse_provider_config
from tests.hostdata import HOSTDATA

# NODE_AGENT_FUZZ_EXAMPLES raises the count for a long hunt (make soak).
EXAMPLES = int(os.environ.get("NODE_AGENT_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# A nova-style guest: metadata, pinning, NUMA tuning, huge pages, an mdev.
NOVA_DOMAIN = """<domain type='kvm'>
  <name>instance-00000001</name>
  <uuid>6c1fbb1a-7ac3-4d62-9b0f-2f2e6e7f4b01</uuid>
  <metadata>
    <nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1">
      <nova:name>web-1</nova:name>
      <nova:flavor name="m1.pinned"><nova:memory>2048</nova:memory>
        <nova:vcpus>2</nova:vcpus></nova:flavor>
    </nova:instance>
    <na:cpu_policy xmlns:na="https://node-agent.example/xmlns/1.0">dedicated</na:cpu_policy>
  </metadata>
  <memory unit='KiB'>2097152</memory>
  <memoryBacking><hugepages/></memoryBacking>
  <vcpu placement='static' current='2'>4</vcpu>
  <cputune><vcpupin vcpu='0' cpuset='2'/><vcpupin vcpu='1' cpuset='3,^4'/></cputune>
  <numatune><memory mode='strict' nodeset='0'/><memnode cellid='0' nodeset='0-1'/></numatune>
  <devices>
    <hostdev mode='subsystem' type='mdev' model='vfio-pci'>
      <source><address uuid='c2177883-f1bb-47f0-914d-32a22e3a8804'/></source>
    </hostdev>
  </devices>
</domain>
"""

PROVIDER_YAML = """meta:
  schema_version: '1.0'
providers:
  - identification:
      uuid: $COMPUTE_NODE
    inventories:
      additional:
        - CUSTOM_LICENSE:
            total: 4
            reserved: 1
            max_unit: 2
            allocation_ratio: 1.5
    traits:
      additional:
        - CUSTOM_GOLD
  - identification:
      name: compute-1_NUMA_0
    traits:
      additional:
        - CUSTOM_FAST
"""


def _texts(pattern: str) -> tuple[str, ...]:
    return tuple(p.read_text(errors="replace") for p in sorted(HOSTDATA.glob(pattern)))


@lru_cache(maxsize=None)
def samples(kind: str) -> tuple[str, ...]:
    found = {
        "capabilities": _texts("vircaps2xmldata/*.xml") + _texts("capabilityschemadata/*.xml"),
        "cpu": _texts("cputestdata/x86_64-cpuid-*-host.xml")[:20],
        "nodedev": _texts("nodedevschemadata/*.xml"),
        "domain": _texts("examples/xml/test/testdom*.xml") + (NOVA_DOMAIN,),
        "meminfo": _texts("virhostcpudata/*/node/node*/meminfo")
        + _texts("vircaps2xmldata/*/system/node/node*/meminfo"),
    }[kind]
    assert found, f"no {kind} samples under {HOSTDATA}"
    return found


@st.composite
def mutated(draw, kind: str):
    """A real sample, damaged in one to three ways."""
    text = draw(st.sampled_from(samples(kind)))
    for _ in range(draw(st.integers(1, 3))):
        text = draw(st.sampled_from(_MUTATIONS))(draw, text)
    return text


def _truncate(draw, text: str) -> str:
    return text[: draw(st.integers(0, max(0, len(text))))]


def _flip(draw, text: str) -> str:
    if not text:
        return text
    at = draw(st.integers(0, len(text) - 1))
    char = draw(st.sampled_from("<>/='\"&;x0-9^,:\n\x00\ufffd") | st.characters())
    return text[:at] + char + text[at + 1 :]


def _splice(draw, text: str) -> str:
    """Copy a random slice somewhere else (duplicated or misplaced markup)."""
    if not text:
        return text
    a = draw(st.integers(0, len(text) - 1))
    b = draw(st.integers(a, min(len(text), a + 200)))
    at = draw(st.integers(0, len(text)))
    return text[:at] + text[a:b] + text[at:]


def _drop_element(draw, text: str) -> str:
    """Remove one element (with its subtree) from a document that parses."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return text
    parents = [(parent, child) for parent in root.iter() for child in parent]
    if not parents:
        return text
    parent, child = draw(st.sampled_from(parents))
    parent.remove(child)
    return ET.tostring(root, encoding="unicode")


def _blank_attribute(draw, text: str) -> str:
    """Empty or garble one attribute value of a document that parses."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return text
    owners = [(el, name) for el in root.iter() for name in el.attrib]
    if not owners:
        return text
    element, name = draw(st.sampled_from(owners))
    element.set(name, draw(st.sampled_from(["", "-1", "x", "0x", "99999999999", " 1 "])))
    return ET.tostring(root, encoding="unicode")


_MUTATIONS = (_truncate, _flip, _splice, _drop_element, _blank_attribute)

ANY_TEXT = st.text(max_size=400)


def only_own_errors(parse, text):
    try:
        parse(text)
    except NodeAgentError:
        pass


@FUZZ
@given(st.one_of(ANY_TEXT, st.from_regex(r"\A[0-9^, \-]{0,40}\Z")))
def test_cpu_spec_parser_raises_only_its_own_error(text):
    only_own_errors(parse_cpu_spec, text)


@FUZZ
@given(st.one_of(ANY_TEXT, st.from_regex(r"\A[0-9,\-\n]{0,40}\Z")))
def test_kernel_cpulist_parser_raises_only_its_own_error(text):
    only_own_errors(parse_cpulist, text)


@FUZZ
@given(st.one_of(ANY_TEXT, mutated("meminfo")))
def test_meminfo_parser_raises_only_parse_error(text):
    only_own_errors(parse_node_meminfo, text)


# Found by a long run: a lone surrogate made ElementTree raise UnicodeEncodeError.
LONE_SURROGATE = "\ud800<capabilities/>"


@FUZZ
@given(st.one_of(ANY_TEXT, mutated("capabilities")))
@example(LONE_SURROGATE)
def test_capabilities_parser_raises_only_parse_error(text):
    only_own_errors(parse_capabilities, text)


@FUZZ
@given(mutated("cpu"))
def test_host_cpu_model_parser_raises_only_parse_error(text):
    only_own_errors(parse_cpu_model_xml, text)


@FUZZ
@given(st.one_of(ANY_TEXT, mutated("domain")), st.booleans())
@example("<domain>\ud800</domain>", True)
def test_domain_parser_raises_only_parse_error(text, running):
    only_own_errors(lambda t: parse_domain(t, running), text)


@FUZZ
@given(st.one_of(ANY_TEXT, mutated("nodedev")))
@example("<device>\udfff")
def test_node_device_parser_raises_only_parse_error(text):
    only_own_errors(parse_node_device, text)


@st.composite
def mutated_yaml(draw):
    text = PROVIDER_YAML
    for _ in range(draw(st.integers(1, 3))):
        text = draw(st.sampled_from((_truncate, _flip, _splice)))(draw, text)
    return text


YAML_SCALARS = st.sampled_from(
    [
        "-1",
        "0",
        ".nan",
        ".inf",
        "99999999999999999999",
        "true",
        "~",
        "[]",
        "{}",
        "'x'",
        "1.5",
        "CUSTOM_X",
        "$COMPUTE_NODE",
        "&a [*a]",
        "!!binary aGk=",
        "2001-01-01",
    ]
)


@st.composite
def yaml_with_odd_value(draw):
    """The sample with one scalar replaced by an odd YAML value."""
    lines = PROVIDER_YAML.splitlines()
    candidates = [i for i, line in enumerate(lines) if ": " in line or "- " in line]
    i = draw(st.sampled_from(candidates))
    head, sep, _ = lines[i].rpartition(": " if ": " in lines[i] else "- ")
    lines[i] = head + sep + draw(YAML_SCALARS)
    return "\n".join(lines) + "\n"


@FUZZ
@given(st.one_of(ANY_TEXT, mutated_yaml(), yaml_with_odd_value()))
def test_provider_yaml_parser_raises_only_config_error(text):
    only_own_errors(lambda t: parse_provider_config(t, "fuzz.yaml"), text)


@FUZZ
@given(
    st.lists(
        st.one_of(
            ANY_TEXT,
            st.builds(
                lambda k, v: '{"%s": %s}' % (k, v),
                st.sampled_from(
                    [
                        "address",
                        "devname",
                        "vendor_id",
                        "product_id",
                        "physical_network",
                        "trusted",
                        "x",
                    ]
                ),
                st.sampled_from(
                    [
                        '"0000:81:00.0"',
                        '"*:81:00.*"',
                        "1",
                        "null",
                        "[]",
                        '""',
                        '"8086"',
                        "{}",
                        '"\\u0000"',
                        '{"bus": "8[1"}',
                        '{"func": "1"}',
                        '{"slot": 5}',
                        '{"function": "[0-2]"}',
                        '"*:8*:00.*"',
                        '"0000:81:20.0"',
                    ]
                ),
            ),
        ).flatmap(lambda v: st.sampled_from([v, f"[{v}]", f"[{v}, {v}]", f"[{v}, 1]"])),
        max_size=4,
    )
)
def test_device_spec_option_reports_problems_never_raises(values):
    for value in values:
        problems: list[str] = []
        specs = parse_device_specs([value], problems)
        # A value is refused with one problem, or gives its specs (a list: 0 or more).
        assert len(problems) <= 1 and not (problems and specs), (value, problems, specs)


@FUZZ
@given(
    st.lists(
        st.one_of(
            ANY_TEXT,
            st.builds(
                "node:{},size:{},count:{}".format,
                st.sampled_from(["0", "-1", "x", "", "99999999999999999999"]),
                st.sampled_from(["2048", "2M", "1G", "0", "1X", "", "-2M", "1 G"]),
                st.sampled_from(["1", "0", "-1", "", "1e3"]),
            ),
        ),
        max_size=4,
    )
)
def test_reserved_huge_pages_option_reports_problems_never_raises(values):
    problems: list[str] = []
    parse_reserved_huge_pages(values, problems)
