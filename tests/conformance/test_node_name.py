"""The compute node's name (the root provider's) against nova 34's libvirt
driver: libvirt's getHostname, short or fully qualified as libvirt answers
(neutron bug 1853840), whatever nova's [DEFAULT] host says."""

from __future__ import annotations

from node_agent.policy.node_name import node_name
from tests.conformance.differences import UNCLASSIFIED, Observed, check

HOSTNAMES = ("compute1", "compute1.example.org")
HOSTS = ({}, {"host": "compute1"}, {"host": "compute1.example.org"}, {"host": "svc-7"})


def test_the_root_is_named_as_nova_compute_names_its_node(nova):
    cases = [{"options": o, "hostname": h} for h in HOSTNAMES for o in HOSTS]
    answers = nova.call("node_names", cases=cases)
    observed = Observed("node_name", cases=len(cases))
    for case, answer in zip(cases, answers):
        assert "value" in answer, f"{case}: nova refused: {answer}"
        theirs = answer["value"]["node"]
        ours = node_name(case["options"].get("host"), case["hostname"], "machine")
        if theirs != ours:
            set_host = "host" in case["options"]
            observed.add(
                "node-name-set-host" if set_host else UNCLASSIFIED + " name",
                f"{case}: nova {theirs!r}, agent {ours!r}",
            )
    check(observed)
