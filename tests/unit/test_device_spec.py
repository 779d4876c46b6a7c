"""``[pci] device_spec`` address forms as nova 34 reads them
(``nova/pci/devspec.py``); the conformance area ``pci_address`` compares
thousands more against nova itself."""

from __future__ import annotations

import re

import pytest

from node_agent.model.device_spec import parse_device_specs, parse_spec
from node_agent.model.snapshot import PCI_PF, PCI_VF, PciDevice
from node_agent.tree.pci_placement import spec_of

PF = PciDevice("0000:81:00.0", "8086", "1528", PCI_PF)
VF = PciDevice("0000:81:00.1", "8086", "1515", PCI_VF, PF.address)
OTHER_VF = PciDevice("0000:81:10.2", "8086", "1515", PCI_VF, PF.address)
GPU = PciDevice("0000:af:00.0", "10de", "1eb8")
DEVICES = (PF, VF, OTHER_VF, GPU)


def matched(text: str) -> list[str]:
    spec = parse_spec(text)
    return [d.address for d in DEVICES if spec_of(d, (spec,), frozenset({PF.address}))]


def test_novas_regex_example_matches_by_field():
    # nova's own example: any domain, bus 02, slot 01, functions 0-2.
    spec = parse_spec(
        '{"address": {"domain": ".*", "bus": "02", "slot": "01", "function": "[0-2]"}}'
    )
    assert spec.matches("0000:02:01.2") and spec.matches("0001:02:01.0")
    assert not spec.matches("0000:02:01.3") and not spec.matches("0000:03:01.0")


def test_regex_fields_left_off_match_anything_and_match_at_the_start():
    # re.match, as nova: "1" is a prefix of "10", and nothing anchors the end.
    assert matched('{"address": {"slot": "1"}}') == [OTHER_VF.address]
    assert matched('{"address": {"slot": "^1$"}}') == []
    assert matched('{"address": {"bus": "(81|af)", "function": "0"}}') == [PF.address, GPU.address]


def test_regex_is_case_sensitive_on_lower_case_addresses_as_nova():
    assert matched('{"address": {"bus": "AF"}}') == []
    assert matched('{"address": {"bus": "af"}}') == [GPU.address]


def test_regex_naming_one_pf_matches_its_vfs_too():
    text = '{"address": {"domain": "0000", "bus": "81", "slot": "00", "function": "0"}}'
    assert parse_spec(text).pf_address == PF.address
    assert matched(text) == [PF.address, VF.address, OTHER_VF.address]


@pytest.mark.parametrize(
    "address, wanted",
    [
        ("0x0:0X81:0:0.0", None),  # too many fields
        ("0x0:0x81:0.0", "0000:81:00.0"),  # int(x, 16) takes 0x, as nova
        ("AF:00.0", "*:af:00.0"),
        (" 0000 : 81 : 00 . 0 ", "0000:81:00.0"),
        ("0000:81:00", "0000:81:00.*"),
        ("::.", "*:*:*.*"),
        ("ffff:ff:1f.7", "ffff:ff:1f.7"),
    ],
)
def test_glob_fields_are_read_as_nova_reads_them(address, wanted):
    if wanted is None:
        with pytest.raises(ValueError, match=re.escape("more than domain:bus:slot.function")):
            parse_spec(f'{{"address": "{address}"}}')
    else:
        assert parse_spec(f'{{"address": "{address}"}}').address == wanted


@pytest.mark.parametrize(
    "address, problem",
    [
        ("*:8*:00.*", "bus '8*' is not a hex number or *"),
        ("*:81:?0.*", "slot '?0' is not a hex number or *"),
        ("10000:81:00.0", "domain '10000' is above FFFF"),
        ("0000:100:00.0", "bus '100' is above FF"),
        ("0000:81:20.0", "slot '20' is above 1F"),
        ("0000:81:00.8", "function '8' is above 7"),
        ("0000:81:00. ", "function '' is not a hex number or *"),
    ],
)
def test_glob_refusals_name_the_field_and_show_both_forms(address, problem):
    text = f'{{"address": "{address}"}}'
    problems: list[str] = []
    assert parse_device_specs([text], problems) == ()
    [message] = problems
    assert message.startswith(f"[pci] device_spec = '{text}' is invalid: address '{address}'")
    assert problem in message
    assert "'*:81:00.*'" in message and '{"bus": "8[12]"' in message


@pytest.mark.parametrize(
    "address, problem",
    [
        ('{"bus": "8[1"}', "bus '8[1' is not a regular expression"),
        ('{"bus": 81}', "bus must be a string"),
        ('{"bus": "81", "func": "1"}', "unknown key(s) func"),
        ("5", "neither a string (glob) nor an object"),
        ('["0000:81:00.0"]', "neither a string (glob) nor an object"),
    ],
)
def test_regex_and_other_refusals_say_what_is_wrong(address, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_spec(f'{{"address": {address}}}')


@pytest.mark.parametrize("empty", ['""', "null", "{}", "0", "false", "[]"])
def test_a_false_like_address_is_no_address_as_nova(empty):
    # nova: `address or '*:*:*.*'`.
    assert matched(f'{{"address": {empty}}}') == [d.address for d in DEVICES]


def test_ids_as_nova_reads_them():
    assert parse_spec('{"vendor_id": " 8086", "product_id": "0x1528"}').vendor_id == "8086"
    assert matched('{"vendor_id": "8086", "product_id": "0x1528"}') == [PF.address]
    assert parse_spec('{"vendor_id": "*", "product_id": "DE"}').product_id == "00de"
    assert parse_spec('{"vendor_id": "*"}').vendor_id is None
    # nova strips the vendor_id, not the product_id.
    with pytest.raises(ValueError, match=r"product_id ' \*' is not a hex number"):
        parse_spec('{"product_id": " *"}')
    with pytest.raises(ValueError, match="vendor_id must be a string"):
        parse_spec('{"vendor_id": 8086}')


def test_devname_rules_as_nova():
    assert parse_spec('{"devname": "", "address": "0000:81:00.0"}').devname is None
    with pytest.raises(ValueError, match="not both"):
        parse_spec('{"devname": "ens1", "address": {"bus": "81"}}')
    with pytest.raises(ValueError, match="devname must be a network interface name, not 5"):
        parse_spec('{"devname": 5}')
    spec = parse_spec('{"devname": "ens1", "address": ""}')
    assert spec.matches(PF.address, ("ens1",)) and not spec.matches(PF.address, ("ens2",))


def test_a_value_may_be_a_list_of_specs_as_in_nova():
    problems: list[str] = []
    text = '[{"vendor_id": "10de"}, {"address": {"bus": "81"}, "product_id": "1515"}]'
    specs = parse_device_specs([text, "[]"], problems)
    assert problems == [] and len(specs) == 2
    assert [spec_of(d, specs, frozenset()) for d in DEVICES] == [None, specs[1], specs[1], specs[0]]
    parse_device_specs(['[{"vendor_id": "10de"}, "x"]', '[{"vendor_id": 1}]'], problems)
    assert "item 1 of the list is not a JSON object" in problems[0]
    assert "item 0 of the list: vendor_id must be a string" in problems[1]
