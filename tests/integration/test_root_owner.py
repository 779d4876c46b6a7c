"""Coexistence: the root provider has one writer. Real ``node-agent``
processes (service and ``--once``) against the real Placement; two machines
are told apart by their machine-id files (``[agent] machine_id_path``)."""

import time
from pathlib import Path

import pytest

from node_agent.errors import ProviderOwned
from node_agent.policy.root_owner import mark_for
from node_agent.state import FILE_NAME, ROOT_UUID, StateStore
from tests.cli.runner import run_agent, write_config
from tests.integration.agent_process import OTHER_HOST, SMALL_HOST, AgentProcess
from tests.integration.test_service_process import wait_until
from tests.machine_id import machine_id_of

pytestmark = pytest.mark.integration

ID_A = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1"
ID_B = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb2"


@pytest.fixture(autouse=True)
def machine_ids(host_name):
    """Two machines of each test's own: the suite shares one Placement, and
    one machine's mark on two host names' roots is refused (a renamed host
    or a clone)."""
    global ID_A, ID_B
    ID_A, ID_B = machine_id_of(host_name + "/a"), machine_id_of(host_name + "/b")


def machine_id(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    return path


def root_of(client, host):
    found = client.get(f"/resource_providers?name={host}")["resource_providers"]
    return found[0] if found else None


def machine(tmp_path, name, placement_url, host, system_dir, mid):
    base = tmp_path / name
    base.mkdir()
    ident = machine_id(base / "machine-id", mid)
    return AgentProcess(
        base,
        placement_url,
        host,
        system_dir=system_dir,
        agent_options=f"report_interval = 1\nfull_verify_interval = 0\nmachine_id_path = {ident}\n",
    )


@pytest.fixture
def two_machines(tmp_path, placement_server, host_name):
    first = machine(tmp_path, "a", placement_server.url, host_name, SMALL_HOST, ID_A)
    second = machine(tmp_path, "b", placement_server.url, host_name, OTHER_HOST, ID_B)
    try:
        yield first, second
    finally:
        try:
            first.stop()
        finally:
            second.stop()
            first.notify.close()
            second.notify.close()


def test_second_machine_with_the_same_host_refuses_loudly_and_never_overwrites(
    two_machines, placement
):
    first, second = two_machines
    first.start()
    wait_until(lambda: root_of(placement, first.host) is not None)
    path = f"/resource_providers/{root_of(placement, first.host)['uuid']}"
    # The mark is the first write on a new root; the cycle's end is its status.
    wait_until(lambda: mark_for(ID_A) in placement.get(f"{path}/traits")["traits"])
    first.status_after(lambda s: s.startswith("ok:"))
    settled = placement.get(f"{path}/inventories")

    second.start()

    def refused():
        first.notify.drain()
        second.notify.drain()
        return "managed by node-agent on another machine" in second.log()

    wait_until(refused, timeout=60)
    # Both keep cycling every second with a full verify each time: the
    # measured failure flipped the inventory every cycle.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert placement.get(f"{path}/inventories") == settled
        refused()
        time.sleep(0.2)
    assert second.proc.poll() is None and first.proc.poll() is None
    traits = placement.get(f"{path}/traits")["traits"]
    assert mark_for(ID_A) in traits and mark_for(ID_B) not in traits
    assert "ERROR" in second.log() and f"host = {first.host}" in second.log()
    assert "another machine" not in first.log()


def once_config(tmp_path, host, url, mid, extra=""):
    base = tmp_path / mid[:4]
    base.mkdir()
    ident = machine_id(base / "machine-id", mid)
    return write_config(
        base,
        SMALL_HOST,
        host,
        extra=(
            f"[agent]\nmachine_id_path = {ident}\n{extra}"
            f"[placement]\nauth_type = admin_token\ntoken = admin\nendpoint_override = {url}\n"
        ),
    )


def test_root_carrying_owner_nova_is_refused_with_nothing_written(
    tmp_path, placement_server, placement, host_name
):
    created = placement.post("/resource_providers", {"name": host_name})
    uuid = created["uuid"] if created else root_of(placement, host_name)["uuid"]
    placement.put(
        f"/resource_providers/{uuid}/traits",
        {"resource_provider_generation": 0, "traits": ["OWNER_NOVA"]},
    )
    before = placement.get(f"/resource_providers/{uuid}")
    config = once_config(tmp_path, host_name, placement_server.url, ID_A)

    for args in (["--once"], ["--once", "--dry-run"]):
        result = run_agent("--config-file", str(config), *args)
        assert result.code == 78, result.stderr
        assert "OWNER_NOVA" in result.stderr and "nova-compute manages it" in result.stderr
        assert "Traceback" not in result.stderr
    assert placement.get(f"/resource_providers/{uuid}") == before
    assert placement.get(f"/resource_providers/{uuid}/inventories")["inventories"] == {}


def test_a_cloned_state_file_does_not_let_a_second_machine_write(
    tmp_path, placement_server, placement, host_name
):
    first = once_config(tmp_path, host_name, placement_server.url, ID_A)
    assert run_agent("--config-file", str(first), "--once").code == 0
    root = root_of(placement, host_name)
    before = placement.get(f"/resource_providers/{root['uuid']}")
    # The clone: same host, same state directory, another machine id.
    clone = tmp_path / "clone.conf"
    clone.write_text(
        first.read_text().replace(
            str(tmp_path / ID_A[:4] / "machine-id"), str(machine_id(tmp_path / "mid-b", ID_B))
        )
    )

    result = run_agent("--config-file", str(clone), "--once")

    assert result.code == 78, result.stderr
    assert "another machine" in result.stderr and mark_for(ID_A) in result.stderr
    assert placement.get(f"/resource_providers/{root['uuid']}") == before


def test_take_over_provider_replaces_the_other_machines_mark(
    tmp_path, placement_server, placement, host_name
):
    first = once_config(tmp_path, host_name, placement_server.url, ID_A)
    assert run_agent("--config-file", str(first), "--once").code == 0
    second = once_config(
        tmp_path, host_name, placement_server.url, ID_B, extra="take_over_provider = true\n"
    )

    result = run_agent("--config-file", str(second), "--once")

    assert result.code == 0, result.stderr
    root = root_of(placement, host_name)
    traits = placement.get(f"/resource_providers/{root['uuid']}/traits")["traits"]
    assert mark_for(ID_B) in traits and mark_for(ID_A) not in traits
    refused = run_agent("--config-file", str(first), "--once")
    assert refused.code == 78 and "another machine" in refused.stderr


def test_unmarked_root_of_an_older_agent_is_adopted_and_marked(
    tmp_path, placement_server, placement, host_name
):
    placement.post("/resource_providers", {"name": host_name})
    config = once_config(tmp_path, host_name, placement_server.url, ID_A)

    result = run_agent("--config-file", str(config), "--once")

    assert result.code == 0, result.stderr
    root = root_of(placement, host_name)
    assert mark_for(ID_A) in placement.get(f"/resource_providers/{root['uuid']}/traits")["traits"]


def test_unreadable_machine_id_is_a_config_error_naming_the_option(
    tmp_path, placement_server, host_name
):
    config = once_config(tmp_path, host_name, placement_server.url, ID_A)
    config.write_text(
        config.read_text().replace(
            f"machine_id_path = {tmp_path / ID_A[:4] / 'machine-id'}",
            f"machine_id_path = {tmp_path / 'missing'}",
        )
    )

    result = run_agent("--config-file", str(config), "--once")

    assert result.code == 78, result.stderr
    assert f"machine_id_path = {tmp_path / 'missing'}" in result.stderr


NOVA_34_LINE = (
    "nova-compute manages 1 provider(s) in this Placement (OWNER_NOVA): a nova 34 "
    "scheduler requires OWNER_NOVA on the root (owner_nova_filter), so it will not "
    "schedule onto {host}, which this agent writes. On a nova cloud run the agent "
    "beside nova-compute in companion mode ([agent] mode = companion); owner mode is "
    "for Placement consumers other than nova"
)


def test_owner_mode_beside_nova_34_computes_says_nova_will_not_schedule_onto_its_root(
    tmp_path, fresh_placement_server, host_name
):
    """nova 34's owner_nova_filter adds root_required=OWNER_NOVA to every
    request once its computes are new enough: the dry run, and the service
    once per start, say so; the agent does not add the trait itself."""
    from node_agent.placement.client import PlacementClient

    placement = PlacementClient.for_endpoint(fresh_placement_server.url)
    nova = placement.post("/resource_providers", {"name": "compute-by-nova"})["uuid"]
    placement.put(
        f"/resource_providers/{nova}/traits",
        {"resource_provider_generation": 0, "traits": ["OWNER_NOVA"]},
    )
    config = once_config(tmp_path, host_name, fresh_placement_server.url, ID_A)

    plan = run_agent("--config-file", str(config), "--once", "--dry-run")
    assert plan.code == 0, plan.stderr
    assert f"  - {NOVA_34_LINE.format(host=host_name)}" in plan.stdout.splitlines()
    assert run_agent("--config-file", str(config), "--once").code == 0
    root = root_of(placement, host_name)["uuid"]
    assert "OWNER_NOVA" not in placement.get(f"/resource_providers/{root}/traits")["traits"]

    service = AgentProcess(
        tmp_path / "service",
        fresh_placement_server.url,
        host_name,
        extra=f"[agent]\nmachine_id_path = {tmp_path / ID_A[:4] / 'machine-id'}\n",
    )
    service.start()
    try:
        service.status_after(lambda s: s.startswith("ok:"))
        service.status_after(lambda s: s.startswith("ok:"))  # a second cycle
        assert service.log().count("a nova 34 scheduler requires OWNER_NOVA") == 1
    finally:
        assert service.stop() == 0
        service.notify.close()


# ---------------------------------------------------------------- one machine, one root


def marked_roots(client, mark):
    return [
        rp
        for rp in client.get(f"/resource_providers?required={mark}")["resource_providers"]
        if rp["parent_provider_uuid"] is None
    ]


def test_a_host_renamed_with_its_state_file_lost_gets_no_second_root(
    tmp_path, placement_server, placement, host_name
):
    config = once_config(tmp_path, host_name, placement_server.url, ID_A)
    assert run_agent("--config-file", str(config), "--once").code == 0
    old = root_of(placement, host_name)
    new_name = f"{host_name}-renamed"
    config.write_text(config.read_text().replace(f"host = {host_name}\n", f"host = {new_name}\n"))
    (tmp_path / ID_A[:4] / "state" / FILE_NAME).unlink()

    result = run_agent("--config-file", str(config), "--once")
    assert result.code == 78, result.stderr
    assert f"openstack resource provider set --name {new_name} {old['uuid']}" in result.stderr
    assert "Traceback" not in result.stderr
    assert root_of(placement, new_name) is None

    # What the message says to run, then the agent again: one root, renamed.
    placement.put(f"/resource_providers/{old['uuid']}", {"name": new_name})
    result = run_agent("--config-file", str(config), "--once")
    assert result.code == 0, result.stderr
    assert [rp["uuid"] for rp in marked_roots(placement, mark_for(ID_A))] == [old["uuid"]]


def test_a_state_file_naming_another_hosts_unmarked_root_writes_nothing(
    tmp_path, placement_server, placement, host_name
):
    other = placement.post("/resource_providers", {"name": f"{host_name}-other"})
    placement.put(
        f"/resource_providers/{other['uuid']}/inventories",
        {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 3}}},
    )
    before = (
        placement.get(f"/resource_providers/{other['uuid']}"),
        placement.get(f"/resource_providers/{other['uuid']}/inventories"),
        placement.get(f"/resource_providers/{other['uuid']}/traits"),
    )
    config = once_config(tmp_path, host_name, placement_server.url, ID_A)
    # The copied state file: another host's root as this host's.
    StateStore(tmp_path / ID_A[:4] / "state").put(ROOT_UUID, other["uuid"])

    result = run_agent("--config-file", str(config), "--once")

    assert result.code == 78, result.stderr
    assert "take_over_provider" in result.stderr and other["uuid"] in result.stderr
    assert f"remove this host's state file ({tmp_path / ID_A[:4] / 'state' / FILE_NAME})" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert (
        placement.get(f"/resource_providers/{other['uuid']}"),
        placement.get(f"/resource_providers/{other['uuid']}/inventories"),
        placement.get(f"/resource_providers/{other['uuid']}/traits"),
    ) == before
    assert root_of(placement, host_name) is None


def _interleaved(client, method, between):
    """``client`` with ``between()`` run once, after its first ``send`` of
    a provider create, or before its first ``put_traits``: the moment the
    other machine's whole cycle lands in the race."""
    original = getattr(client, method)
    done = []

    def wrapped(*args, **kw):
        if method == "put_traits" and not done:
            done.append(between())
        result = original(*args, **kw)
        if method == "send" and args[0].kind == "create" and not done:
            done.append(between())
        return result

    setattr(client, method, wrapped)
    return client


@pytest.mark.parametrize("moment", ["send", "put_traits"])
def test_two_machines_with_one_host_name_racing_leave_one_owner(
    tmp_path, placement_server, placement, host_name, moment
):
    from node_agent.model.provider_tree import Inventory, Provider, ProviderTree
    from node_agent.placement.client import PlacementClient
    from node_agent.placement.sync import TreeSyncer
    from node_agent.policy.root_owner import Identity

    tree = ProviderTree((Provider(host_name, inventories={"VCPU": Inventory(total=8)}),))
    other_tree = ProviderTree((Provider(host_name, inventories={"VCPU": Inventory(total=16)}),))
    second = TreeSyncer(
        PlacementClient.for_endpoint(placement_server.url),
        StateStore(tmp_path / "b"),
        owner=Identity(mark_for(ID_B)),
    )
    outcomes = {}

    def second_cycle():
        try:
            outcomes["second"] = second.sync(other_tree).ok
        except ProviderOwned:
            outcomes["second"] = "refused"
        return True

    client = _interleaved(PlacementClient.for_endpoint(placement_server.url), moment, second_cycle)
    first = TreeSyncer(client, StateStore(tmp_path / "a"), owner=Identity(mark_for(ID_A)))
    try:
        outcomes["first"] = first.sync(tree).ok
    except ProviderOwned:
        outcomes["first"] = "refused"

    root = root_of(placement, host_name)
    traits = placement.get(f"/resource_providers/{root['uuid']}/traits")["traits"]
    marks = [t for t in traits if t.startswith("CUSTOM_OWNER_NODE_AGENT_")]
    assert len(marks) == 1, (outcomes, traits)
    winner = "first" if marks == [mark_for(ID_A)] else "second"
    loser = "second" if winner == "first" else "first"
    assert outcomes == {winner: True, loser: "refused"}
    total = placement.get(f"/resource_providers/{root['uuid']}/inventories")["inventories"]
    assert total["VCPU"]["total"] == (8 if winner == "first" else 16)


def test_children_follow_a_root_the_operator_renamed_after_the_state_file_was_lost(
    tmp_path, placement_server, placement, host_name
):
    """Issue 28's rename advice, on a host with children: after the
    operator renames the root as the refusal says, the children named
    after the old name are renamed too, keeping their uuids (and so their
    allocations); no second set is created."""
    from tests.hostdata import HOSTDATA

    numa = "[compute]\nnuma_in_placement = true\n"
    base = tmp_path / ID_A[:4]
    base.mkdir()
    ident = machine_id(base / "machine-id", ID_A)
    config = write_config(
        base,
        HOSTDATA / "vircaps2xmldata/linux-basic/system",
        host_name,
        extra=(
            f"[agent]\nmachine_id_path = {ident}\n{numa}[placement]\nauth_type = admin_token\n"
            f"token = admin\nendpoint_override = {placement_server.url}\n"
        ),
    )
    assert (first := run_agent("--config-file", str(config), "--once")).code == 0, first.stderr
    old = root_of(placement, host_name)
    before = {rp["name"]: rp["uuid"] for rp in placement.providers_in_tree(old["uuid"])}
    assert len(before) > 1, "no child: the children's rename is not tested"
    new_name = f"{host_name}-renamed"
    config.write_text(config.read_text().replace(f"host = {host_name}\n", f"host = {new_name}\n"))
    (base / "state" / FILE_NAME).unlink()
    placement.put(f"/resource_providers/{old['uuid']}", {"name": new_name})

    result = run_agent("--config-file", str(config), "--once")

    assert result.code == 0, result.stderr
    after = {rp["name"]: rp["uuid"] for rp in placement.providers_in_tree(old["uuid"])}
    assert after == {name.replace(host_name, new_name, 1): u for name, u in before.items()}
