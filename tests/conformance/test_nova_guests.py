"""The agent counts the guests nova 34's libvirt driver writes as nova does.

The corpus (``tests/data/nova_guests``, see its README) is the domain XML
nova's own driver wrote for flavors and images on fake hosts, with nova's
own answer: the CPU policy of the instance topology nova fitted, its
dedicated vCPUs, and the VCPU/PCPU its scheduler asks Placement for. The
agent parses each domain with ``parse_domain`` and classifies it with
``classify``; nova's answer wins.

Each guest is read twice: as nova 34 wrote it (the flavor's extra specs and
the image's properties in ``<nova:instance>``), and as an older nova wrote
it (only the pins), where the pinning shape decides. Where nova's shape is
ambiguous (a floating vCPU or a shared emulator pin on a shared set of one
host CPU, a ``resources:*`` override nothing in the domain records), the
corpus says why and what the shape reading gives, and that is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
from tests.conformance.bridge import NOVA_VENV, nova_python
from tests.conformance.differences import UNCLASSIFIED, Observed, check
from tests.real_parts import skip_or_fail

CORPUS = Path(__file__).resolve().parents[1] / "data" / "nova_guests"
GENERATOR = CORPUS / "generate.py"
DOCUMENT = json.loads((CORPUS / "cases.json").read_text())
CASES = DOCUMENT["cases"]
NAMES = sorted(CASES)
AMBIGUOUS = [n for n in NAMES if CASES[n]["shape"]["ambiguous"]]


def _classified(name: str, variant: str = ""):
    suffix = f".{variant}.xml" if variant else ".xml"
    return classify(parse_domain((CORPUS / "xml" / f"{name}{suffix}").read_text(), True))


@pytest.mark.parametrize("name", NAMES)
def test_guest_nova_wrote_is_counted_as_nova_counts_it(name):
    nova = CASES[name]["nova"]
    found = _classified(name)
    assert (found.policy, found.vcpu, found.pcpu, sorted(found.dedicated_vcpus)) == (
        nova["policy"],
        nova["resources"]["VCPU"],
        nova["resources"]["PCPU"],
        nova["dedicated_vcpus"],
    ), found.describe()
    assert found.emulator_isolate == (nova["emulator_threads_policy"] == "isolate")
    assert found.dedicated_cpus == CpuSet(nova["dedicated_host_cpus"])
    expected_rule = (
        BY_IMAGE
        if (
            "hw:cpu_policy" not in CASES[name]["flavor"]["extra_specs"]
            and "hw_cpu_policy" in CASES[name]["image_properties"]
        )
        else BY_EXTRA_SPECS
    )
    assert found.rule == expected_rule


@pytest.mark.parametrize("name", NAMES)
def test_guest_an_older_nova_wrote_is_read_by_its_pinning_shape(name):
    case = CASES[name]
    nova, shape = case["nova"], case["shape"]
    found = _classified(name, "pre-extra-specs")
    assert found.rule in (BY_PINNING, BY_NO_PINS)
    got = {
        "policy": found.policy,
        "vcpu": found.vcpu,
        "pcpu": found.pcpu,
        "dedicated_vcpus": sorted(found.dedicated_vcpus),
        "emulator_isolate": found.emulator_isolate,
    }
    if shape["ambiguous"]:
        # nova's pins cannot tell this one apart: the documented fallback
        # (the shape reading the corpus records with its reason) holds.
        assert got == shape["fallback"], shape["ambiguous"]
    else:
        assert got == {
            "policy": nova["policy"],
            "vcpu": nova["resources"]["VCPU"],
            "pcpu": nova["resources"]["PCPU"],
            "dedicated_vcpus": nova["dedicated_vcpus"],
            "emulator_isolate": nova["emulator_threads_policy"] == "isolate",
        }


def test_corpus_spans_the_hosts_policies_and_ambiguities_it_claims():
    hosts = {case["host"] for case in CASES.values()}
    assert {"one-node", "two-nodes-smt", "one-shared-cpu"} <= hosts
    for host in hosts:
        policies = {c["nova"]["policy"] for c in CASES.values() if c["host"] == host}
        assert policies == {DEDICATED, SHARED, MIXED}, host
    assert DOCUMENT["nova_version"].startswith("34.")
    # Each kind of ambiguity is in the corpus, every one with its reason.
    reasons = " ".join(CASES[n]["shape"]["ambiguous"] for n in AMBIGUOUS)
    for kind in ("floating vCPU", "emulator threads ('share')", "resources:*"):
        assert kind in reasons


def test_committed_corpus_is_what_nova_writes_today(tmp_path):
    python = nova_python()
    if python is None:
        skip_or_fail(
            f"nova's virtualenv {NOVA_VENV} is not built: the nova guest "
            "corpus cannot be checked against nova (make nova-venv)"
        )
    run = subprocess.run(
        [str(python), str(GENERATOR), str(tmp_path)],
        env={**os.environ, "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    fresh = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()}
    committed = {p.relative_to(CORPUS) for p in (CORPUS / "xml").glob("*.xml")}
    committed.add(Path("cases.json"))
    assert fresh == committed
    stale = sorted(
        str(p) for p in fresh if (tmp_path / p).read_bytes() != (CORPUS / p).read_bytes()
    )
    assert not stale, (
        f"the committed corpus differs from what nova writes now: {stale}; "
        f"regenerate it with `make nova-guests` ({sys.executable} ran "
        "this test)"
    )


def test_pinning_shape_differs_from_nova_only_where_the_table_says_why():
    """The differences table (docs/design/nova-differences.yaml) lists what
    the shape reading of an older nova's domains cannot tell; any other
    difference fails."""
    observed = Observed("guest_shape", cases=len(NAMES))
    for name in NAMES:
        nova = CASES[name]["nova"]
        found = _classified(name, "pre-extra-specs")
        if (found.policy, found.vcpu, found.pcpu) == (
            nova["policy"],
            nova["resources"]["VCPU"],
            nova["resources"]["PCPU"],
        ):
            continue
        reason = CASES[name]["shape"]["ambiguous"] or ""
        if "resources:*" in reason:
            observed.add("guest-shape-resources-override", name)
        elif "one host CPU" in reason:
            observed.add("guest-shape-one-cpu-set", name)
        else:
            observed.add(UNCLASSIFIED, name)
    check(observed)
