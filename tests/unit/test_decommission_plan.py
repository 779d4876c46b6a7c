"""What decommission removes, or why not (node_agent.policy.decommission)."""

from node_agent.policy.child_owner import AGENT_CHILD_TRAIT, ListedChild
from node_agent.policy.decommission import plan

ROOT = ListedChild("r", "cn1", None)
NUMA = ListedChild("n0", "cn1_NUMA_0", "r", frozenset({AGENT_CHILD_TRAIT}))
VF = ListedChild("vf", "cn1_0000:81:00.0", "r")  # the state file lists it
SUB = ListedChild("s", "cn1_pci_0000_81_00_0", "n0", frozenset({AGENT_CHILD_TRAIT}))


def test_a_free_tree_is_deleted_children_first():
    decision = plan("cn1", "r", [ROOT, NUMA, VF], {}, owned={"vf"})
    assert decision.ok
    assert [u for u, _ in decision.deletes] == ["vf", "n0", "r"]


def test_deeper_agent_children_go_before_their_parents():
    decision = plan("cn1", "r", [ROOT, NUMA, SUB], {}, owned={"s"})
    assert [u for u, _ in decision.deletes] == ["s", "n0", "r"]


def test_allocations_anywhere_in_the_tree_refuse_and_name_consumer_and_provider():
    decision = plan("cn1", "r", [ROOT, NUMA], {"n0": {"c-1": {"PCPU": 2, "MEMORY_MB": 512}}})
    assert not decision.ok
    assert decision.blocking == (
        "consumer c-1 holds MEMORY_MB=512 PCPU=2 on cn1_NUMA_0; migrate or delete it first",
    )


def test_a_child_that_is_not_the_agents_refuses_naming_it():
    cyborg = ListedChild("f", "cn1_fpga", "r")
    decision = plan("cn1", "r", [ROOT, NUMA, cyborg], {})
    assert not decision.ok
    assert "cn1_fpga (f) is not this agent's" in decision.blocking[0]
