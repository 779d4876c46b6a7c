"""``[pci] device_spec`` addresses, ids and devname: nova 34's
``Whitelist`` / ``PciDeviceSpec.match`` and the agent on the same spec
strings and the same devices (area ``pci_address``).

The specs are generated (seeded, ``NODE_AGENT_CONFORMANCE_SEED``): glob
addresses with every field left off, empty, at and past its maximum, in
upper case, with ``0x`` and other forms ``int(x, 16)`` takes, partial
wildcards and too many fields; regex addresses (nova's dict form) with
fields left off, anchors, classes, bad patterns, non-strings and misspelt
keys; ``vendor_id`` / ``product_id`` in the same variety; ``devname`` alone,
empty, or with an address; some values a JSON list of specs (nova's other
form), where the first spec matching a device is the one that counts. Each one is matched against one host's
functions: standalone devices, two PFs and their VFs (a spec naming a PF's
address matches its VFs too), domains other than 0000 and the highest
address there is. Both must refuse the same specs and, for the others,
match the same devices.
"""

from __future__ import annotations

import json
import os
import random

from node_agent.model.device_spec import parse_device_specs
from node_agent.model.snapshot import PCI_PF, PCI_STANDARD, PCI_VF, PciDevice, SriovPf
from node_agent.tree.pci import matching_spec
from node_agent.tree.pci_placement import spec_of
from tests.conformance.differences import UNCLASSIFIED, Observed, check

SEED = int(os.environ.get("NODE_AGENT_CONFORMANCE_SEED", "20260413"))
CASES = int(os.environ.get("NODE_AGENT_CONFORMANCE_PCI_SPECS", "4000"))

PF1, PF2 = "0000:81:00.0", "0000:82:00.0"
DEVICES = (
    PciDevice(PF1, "8086", "1528", PCI_PF),
    PciDevice("0000:81:00.1", "8086", "1515", PCI_VF, PF1),
    PciDevice("0000:81:00.7", "8086", "1515", PCI_VF, PF1),
    PciDevice("0000:81:01.0", "8086", "1515", PCI_VF, PF1),
    PciDevice(PF2, "15b3", "101d", PCI_PF),
    PciDevice("0000:82:10.3", "15b3", "101e", PCI_VF, PF2),
    PciDevice("0000:08:00.0", "8086", "1533"),
    PciDevice("0000:af:1f.7", "10de", "1eb8"),
    PciDevice("0001:81:00.0", "abcd", "0001"),
    PciDevice("ffff:ff:1f.7", "ffff", "ffff"),
    PciDevice("0000:00:00.0", "8086", "0000", PCI_STANDARD),
)
PFS = (PF1, PF2)
NETDEVS = {"ens1f0": PF1, "ens2f0": PF2, "ens1f0v0": "0000:81:00.1", "eno1": "0000:08:00.0"}

DOMAINS = ["0000", "0", "1", "0001", "ffff", "FFFF", "10000", "*", "", " 0000", "0x0", "+0"]
DOMAINS += ["-0", "-1", "0?", "*0", "g", "0000 ", "0_0"]
BUSES = ["81", "8", "0x81", "ff", "FF", "100", "*", "", "8*", "?1", "[8]", "AF", "af", " 81"]
BUSES += ["82", "08", "00", "0", "8 1"]
SLOTS = ["00", "0", "1f", "1F", "20", "*", "", "0_0", "01", "10", " 1", "0x1f", "ff"]
FUNCS = ["0", "7", "8", "*", "", "1 ", " ", "0.0", "-0", "3", "f", "0x7", "?"]
PATTERNS = [".*", "81", "8", "8[12]", "[0-3]", "0000", "00", "0", "(", "*", "AF", "af", ""]
PATTERNS += ["^81$", "8.", "0+", "[0-9a-f]{2}", "1f|00", "0001", "7", "1", "(?i)AF", "\\d"]
PATTERNS += [5, None]
IDS = ["8086", "8086 ", " 8086", "80861", "0x8086", "*", " *", "", "abcd", "ABCD", "15B3"]
IDS += ["86", "1528", "1515", "101d", "ffff", "10000", "-1", "xyz", 8086, None, "1eb8"]
DEVNAMES = ["ens1f0", "ens2f0", "ens1f0v0", "eno1", "ens9", "", 5, None, "ENS1F0"]


def _glob(rng: random.Random) -> str:
    d, b, s, f = (rng.choice(c) for c in (DOMAINS, BUSES, SLOTS, FUNCS))
    shapes = [
        f"{d}:{b}:{s}.{f}",
        f"{b}:{s}.{f}",
        f"{s}.{f}",
        f".{f}",
        f"{d}:{b}:{s}",
        f"{d}:{b}:{s}.",
        f":{b}:{s}.{f}",
        f"{d}:{b}:{s}:{s}.{f}",
        f" {d}:{b}:{s}.{f} ",
        rng.choice(["", "*", "*:*:*.*", "::.", ".", ":", "0000:81:00.0.0"]),
    ]
    weights = [8, 2, 2, 1, 1, 1, 1, 1, 1, 1]
    return rng.choices(shapes, weights)[0]


def _regex(rng: random.Random) -> dict:
    out = {
        name: rng.choice(PATTERNS)
        for name in ("domain", "bus", "slot", "function")
        if rng.random() < 0.7
    }
    if rng.random() < 0.05:
        out[rng.choice(["func", "device", "Bus"])] = rng.choice(PATTERNS)
    return out


def _address(rng: random.Random):
    roll = rng.random()
    if roll < 0.05:
        # nova's examples, and the PFs named exactly (their VFs match too).
        return rng.choice(
            [
                {"domain": ".*", "bus": "02", "slot": "01", "function": "[0-2]"},
                {"domain": "0000", "bus": "81", "slot": "00", "function": "0"},
                {"domain": "0000", "bus": "82", "slot": "00", "function": "0"},
                "0000:81:00.0",
                "*:0a:00.*",
            ]
        )
    if roll < 0.5:
        return _glob(rng)
    if roll < 0.93:
        return _regex(rng)
    return rng.choice([None, {}, [], 0, False, 5, True, ["0000:81:00.0"], 1.5])


def _object(rng: random.Random, devname: bool = True) -> dict:
    spec: dict = {}
    if rng.random() < 0.85:
        spec["address"] = _address(rng)
    if devname and rng.random() < 0.15:
        spec["devname"] = rng.choice(DEVNAMES)
    for key in ("vendor_id", "product_id"):
        if rng.random() < 0.25:
            spec[key] = rng.choice(IDS)
    # A physnet spec is what the devname path (SR-IOV PFs) reads.
    if "devname" in spec or rng.random() < 0.2:
        spec["physical_network"] = "physnet1"
    return spec


def generated_specs(seed: int, count: int) -> list[str]:
    """Option values: mostly one object, some a list of them (nova's
    other form), a few a list holding something else."""
    rng = random.Random(seed)
    specs = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.9:
            value = _object(rng)
        elif roll < 0.98:
            value = [_object(rng, devname=False) for _ in range(rng.randint(0, 3))]
        else:
            value = [_object(rng, devname=False), rng.choice(["x", 1, None, [], True])]
        specs.append(json.dumps(value))
    return specs


def _nova_case(spec: str) -> dict:
    devices = _devices(spec)
    return {
        "spec": spec,
        "devices": [
            {
                "address": d.address,
                "vendor_id": d.vendor_id,
                "product_id": d.product_id,
                "parent_addr": d.parent_addr,
            }
            for d in devices
        ],
        "pfs": list(PFS),
        "netdevs": NETDEVS,
    }


def _devices(spec: str) -> tuple[PciDevice, ...]:
    """The devices compared: all of them, or the PFs for a devname spec
    (the agent reads devname for SR-IOV PFs only; with report_in_placement
    nova and the agent refuse it)."""
    value = json.loads(spec)
    named = isinstance(value, dict) and bool(value.get("devname"))
    return tuple(d for d in DEVICES if d.dev_type == PCI_PF) if named else DEVICES


def agent_answer(spec_text: str):
    """("refused", problem) or ("value", [index of the first spec matching
    each device, or None]) on the code paths the trees use:
    PCI-in-Placement's ``spec_of`` and, for devname specs, the SR-IOV PFs'
    ``matching_spec``."""
    problems: list[str] = []
    specs = parse_device_specs([spec_text], problems)
    if problems:
        return "refused", problems[0]
    pfs = frozenset(PFS)
    matched = []
    for dev in _devices(spec_text):
        if any(spec.devname is not None for spec in specs):
            netdevs = tuple(n for n, a in NETDEVS.items() if a == dev.address)
            pf = SriovPf(dev.address, 8, 8, None, dev.vendor_id, dev.product_id, netdevs)
            found = matching_spec(pf, specs)
        else:
            found = spec_of(dev, specs, pfs)
        matched.append(next((n for n, s in enumerate(specs) if s is found), None))
    return "value", matched


def _refusal_id(problem: str) -> str:
    """The agent refuses, nova accepts: which listed difference it is."""
    if "has unknown key(s)" in problem and "address" in problem:
        return "pci-address-regex-unknown-key"
    if "devname must be a network interface name" in problem:
        return "pci-devname-not-a-string"
    return UNCLASSIFIED + " agent refuses what nova accepts"


def test_device_spec_addresses_match_what_nova_matches(nova):
    assert CASES >= 1000, f"NODE_AGENT_CONFORMANCE_PCI_SPECS = {CASES}: too few to say much"
    specs = generated_specs(SEED, CASES)
    theirs = nova.call("pci_device_specs", cases=[_nova_case(s) for s in specs])
    observed = Observed("pci_address", cases=len(specs))
    kinds = {"refused": 0, "value": 0, "some matched": 0, "some not matched": 0}
    for spec, nova_answer in zip(specs, theirs):
        kind, ours = agent_answer(spec)
        kinds[kind] += 1
        if kind == "value":
            kinds["some matched"] += any(n is not None for n in ours)
            kinds["some not matched"] += None in ours
        example = f"{spec}: nova {nova_answer}, agent {kind} {ours}"
        if "refused" in nova_answer:
            if kind == "value":
                observed.add(UNCLASSIFIED + " agent accepts what nova refuses", example)
        elif kind == "refused":
            observed.add(_refusal_id(ours), example)
        elif ours != nova_answer["value"]:
            observed.add(UNCLASSIFIED + " matches other devices", example)
    # The generator must exercise both outcomes, and devices both matched
    # and not matched.
    assert min(kinds.values()) > CASES // 10, kinds
    check(observed)
