"""Who may write a root provider (node_agent.policy.root_owner), on literal traits."""

import pytest

from node_agent.errors import ConfigError
from node_agent.model.provider_tree import Provider, ProviderTree
from node_agent.policy import root_owner as ro

ID_A = "4c4c4544004a5a10805ab7c04f4e4d32"
ID_B = "0123456789abcdef0123456789abcdef"
MINE = ro.mark_for(ID_A)
OTHER = ro.mark_for(ID_B)


def test_mark_is_a_custom_trait_in_the_owner_namespace_and_hides_the_machine_id():
    assert MINE.startswith("CUSTOM_OWNER_NODE_AGENT_")
    assert len(MINE) <= 255 and MINE == MINE.upper()
    assert ID_A.upper() not in MINE
    assert MINE != OTHER and MINE == ro.mark_for(ID_A)


@pytest.mark.parametrize(
    "traits, owner, may_write, decided",
    [
        (None, ro.ABSENT, True, {MINE: True}),
        ({"COMPUTE_NODE"}, ro.UNMARKED, True, {MINE: True}),
        ({"COMPUTE_NODE", MINE}, ro.MINE, True, {MINE: True}),
        ({"COMPUTE_NODE", "OWNER_NOVA"}, ro.OWNED_BY_NOVA, False, {}),
        ({"OWNER_NOVA", MINE}, ro.OWNED_BY_NOVA, False, {}),
        ({OTHER}, ro.OTHER_MACHINE, False, {}),
        ({OTHER, MINE}, ro.OTHER_MACHINE, False, {}),
    ],
)
def test_judge_without_take_over(traits, owner, may_write, decided):
    verdict = ro.judge(traits, ro.Identity(MINE))
    assert (verdict.owner, verdict.may_write, dict(verdict.traits)) == (owner, may_write, decided)


def test_take_over_replaces_another_machines_mark_and_keeps_owner_nova():
    verdict = ro.judge({OTHER, "OWNER_NOVA"}, ro.Identity(MINE, take_over=True))
    assert verdict.may_write
    assert dict(verdict.traits) == {MINE: True, OTHER: False}  # OWNER_NOVA not decided


def test_a_writer_without_a_mark_adopts_only_unmarked_roots():
    anonymous = ro.Identity(None, take_over=True)
    assert ro.judge({"COMPUTE_NODE"}, anonymous).may_write
    assert not ro.judge({OTHER}, anonymous).may_write
    assert not ro.judge({"OWNER_NOVA"}, anonymous).may_write


def test_refusals_name_the_owner_and_the_fixes():
    nova = ro.refusal(ro.judge({"OWNER_NOVA"}, ro.Identity(MINE)), "cn1", "u-1")
    assert "OWNER_NOVA" in nova and "mode = companion" in nova and "take_over_provider" in nova
    other = ro.refusal(ro.judge({OTHER}, ro.Identity(MINE)), "cn1", "u-1")
    assert OTHER in other and "host = cn1" in other and "take_over_provider" in other


def test_claimed_tree_carries_the_mark_on_the_root_only():
    tree = ProviderTree(
        (Provider("cn1", traits={"COMPUTE_NODE": True}), Provider("cn1_NUMA_0", parent="cn1"))
    )
    out = ro.claimed(tree, ro.judge({OTHER}, ro.Identity(MINE, take_over=True)))
    assert dict(out.root.traits) == {"COMPUTE_NODE": True, MINE: True, OTHER: False}
    assert out.providers[1] == tree.providers[1]
    assert ro.identity_of_tree(out) == ro.Identity(MINE)
    assert ro.identity_of_tree(tree) == ro.Identity(None)


@pytest.mark.parametrize("text", ["", "not-an-id\n", ID_A.upper(), ID_A + "00"])
def test_a_file_without_a_machine_id_is_a_config_error_naming_it(text):
    with pytest.raises(ConfigError, match="machine_id_path = /x/machine-id"):
        ro.parse_machine_id(text, "/x/machine-id")


def test_machine_id_file_with_newline_is_read():
    assert ro.parse_machine_id(ID_A + "\n", "f") == ID_A


def test_an_unmarked_root_the_state_file_names_under_another_name_is_refused():
    from node_agent.policy.root_owner import NAMED_ELSEWHERE, Identity, judge, mark_for, refusal

    me = Identity(mark_for("a" * 32))
    verdict = judge({"COMPUTE_NODE"}, me, named_elsewhere=True)
    assert (verdict.owner, verdict.may_write) == (NAMED_ELSEWHERE, False)
    assert "take_over_provider = true" in refusal(verdict, "hv", "u-1", "other")
    assert judge({"COMPUTE_NODE"}, Identity(me.mark, take_over=True), True).may_write
    assert judge({me.mark}, me, named_elsewhere=True).may_write  # ours, renamed


def test_second_root_refusal_gives_the_command_for_each_case():
    from node_agent.policy.root_owner import second_root_refusal

    text = second_root_refusal("new", [("old", "u-1")], "CUSTOM_OWNER_NODE_AGENT_X")
    assert "openstack resource provider set --name new u-1" in text
    assert "systemd-machine-id-setup" in text
    both = second_root_refusal("new", [("old", "u-1")], "CUSTOM_OWNER_NODE_AGENT_X", "u-2")
    assert "openstack resource provider delete u-1" in both
