"""policy/guest_cpu.classify on domains nova 34's libvirt driver wrote.

The files are captured in tests/data/nova_guests (see its README: nova's
own driver and fitting wrote them; the expected numbers are nova's, from
cases.json). tests/conformance/test_nova_guests.py runs the whole corpus;
these name the behaviours one by one.
"""

import json
from pathlib import Path

from node_agent.host.domain import parse_domain
from node_agent.model.cpuset import CpuSet
from node_agent.policy.guest_cpu import (
    BY_EXTRA_SPECS,
    BY_IMAGE,
    BY_NO_PINS,
    BY_PINNING,
    DEDICATED,
    MIXED,
    SHARED,
    classify,
)

CORPUS = Path(__file__).resolve().parents[1] / "data" / "nova_guests"
CASES = json.loads((CORPUS / "cases.json").read_text())["cases"]


def guest(name, variant=""):
    suffix = f".{variant}.xml" if variant else ".xml"
    return parse_domain((CORPUS / "xml" / f"{name}{suffix}").read_text(), True)


def nova(name):
    return CASES[name]["nova"]


def test_floating_numa_guest_is_shared_though_every_vcpu_is_pinned():
    name = "two-nodes-smt--shared-numa2"
    pinned = guest(name)
    # nova pins each floating vCPU to its cell's shared CPUs.
    assert dict(pinned.vcpupin) == {
        0: CpuSet({0, 1}),
        1: CpuSet({0, 1}),
        2: CpuSet({6, 7}),
        3: CpuSet({6, 7}),
    }
    found = classify(pinned)
    assert (found.policy, found.vcpu, found.pcpu) == (SHARED, 4, 0)
    assert found.rule == BY_EXTRA_SPECS
    assert nova(name)["resources"]["VCPU"] == 4


def test_mixed_guest_splits_at_the_dedicated_mask():
    name = "one-node--mixed-mask-exclude"  # hw:cpu_dedicated_mask=^0-1 of 4
    found = classify(guest(name))
    assert found.policy == MIXED
    assert found.dedicated_vcpus == frozenset({2, 3})
    assert (found.vcpu, found.pcpu) == (2, 2)
    assert found.dedicated_cpus == CpuSet(nova(name)["dedicated_host_cpus"])


def test_mixed_guest_by_realtime_mask_with_realtime_on():
    # 'on' is true to nova (bool_from_string): vCPUs 1-3 are realtime, dedicated.
    found = classify(guest("one-node--mixed-realtime-on"))
    assert (found.policy, sorted(found.dedicated_vcpus)) == (MIXED, [1, 2, 3])
    assert (found.vcpu, found.pcpu) == (1, 3)


def test_emulator_isolate_adds_one_pcpu():
    name = "one-node--dedicated-emulator-isolate"
    found = classify(guest(name))
    assert found.emulator_isolate
    assert (found.policy, found.vcpu, found.pcpu) == (DEDICATED, 0, 3)
    assert nova(name)["resources"]["PCPU"] == 3
    shared = classify(guest("one-node--dedicated-emulator-share"))
    assert (shared.emulator_isolate, shared.pcpu) == (False, 2)


def test_resources_vcpu_override_counts_what_nova_claims_not_the_vcpus():
    name = "one-node--resources-vcpu"  # 4 vCPUs, resources:VCPU=2
    found = classify(guest(name))
    assert guest(name).vcpus == 4
    assert (found.policy, found.vcpu, found.pcpu) == (SHARED, 2, 0)
    assert nova(name)["resources"]["VCPU"] == 2


def test_numbered_group_pcpu_makes_the_guest_dedicated():
    found = classify(guest("one-node--resources-suffixed-pcpu"))  # resources1:PCPU=2
    assert (found.policy, found.vcpu, found.pcpu) == (DEDICATED, 0, 2)
    split = classify(guest("one-node--resources-split-pcpu"))  # 1 + 1 PCPU
    assert (split.policy, split.pcpu) == (DEDICATED, 2)


def test_image_policy_decides_when_the_flavor_has_none():
    found = classify(guest("one-node--image-dedicated"))
    assert (found.policy, found.rule, found.pcpu) == (DEDICATED, BY_IMAGE, 2)


def test_pre_extra_specs_guest_is_read_by_its_pinning_shape():
    for name, policy, vcpu, pcpu in [
        ("two-nodes-smt--shared-numa2", SHARED, 4, 0),
        ("two-nodes-smt--dedicated-numa2", DEDICATED, 0, 4),
        ("two-nodes-smt--mixed-mask", MIXED, 2, 2),
        ("one-node--dedicated-emulator-isolate", DEDICATED, 0, 3),
    ]:
        found = classify(guest(name, "pre-extra-specs"))
        assert (found.policy, found.vcpu, found.pcpu, found.rule) == (
            policy,
            vcpu,
            pcpu,
            BY_PINNING,
        ), name
    unpinned = classify(guest("one-node--no-policy", "pre-extra-specs"))
    assert (unpinned.policy, unpinned.rule) == (SHARED, BY_NO_PINS)


def test_shape_cannot_tell_a_floating_vcpu_on_a_one_cpu_shared_set():
    # nova: mixed, vCPU 0 floating on the shared set {0}; alone there, it
    # looks dedicated. The documented fallback: the shape's reading.
    name = "one-shared-cpu--mixed-one-floating"
    assert nova(name)["policy"] == MIXED
    assert classify(guest(name)).policy == MIXED
    fallback = classify(guest(name, "pre-extra-specs"))
    assert (fallback.policy, fallback.pcpu) == (DEDICATED, 3)
    assert CASES[name]["shape"]["fallback"]["policy"] == DEDICATED
