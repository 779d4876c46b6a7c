"""Issue 12, the proof: a stateful property test of the capacity invariant
against the real Placement.

Hypothesis drives random sequences of what happens to a compute node:

* the operator changes ``cpu_dedicated_set`` / ``cpu_shared_set`` (any
  subsets of the online CPUs, valid, overlapping and over running guests
  alike), turns ``numa_in_placement`` on and off, changes the ratios;
* guests arrive and leave, pinned and floating (libvirt's test driver: the
  host.xml the agent reads is rewritten), each with the allocation the
  scheduler writes for it (``PUT /allocations/{consumer}``, consumer
  generation null for a new consumer, the current one to remove it);
* consumers with no guest here (a migration record) arrive and leave;
* the state file is lost, the agent restarts (a fresh syncer and
  reconciler), maintenance goes on and off (the state file's record, as
  ``node-agent maintenance on|off`` writes it).

After every step the agent runs one cycle, as the service does, and the test
reads Placement back with the scheduler's client and asserts:

1. the invariant on what Placement holds, twice: with
   :mod:`node_agent.policy.capacity` and with :func:`simple_verdict`, a
   deliberately simple re-statement here, so a bug in the module cannot
   hide itself. CPUs are bounded by the online CPUs of the configured sets
   (:func:`configured_cpus`) after a cycle that applied cleanly; after a
   refused or failed one Placement may still hold the records of an
   earlier configuration, bounded by every online CPU;
2. maintenance: once a cycle has run with maintenance on (and until it is
   turned off), every class on every provider of the tree is closed
   (``reserved = total``), whatever the usage;
3. no allocation was lost or changed, except by a reshape that moved a
   consumer whole: the same amounts per class, on providers of the host's
   tree, or -- for a guest pinned in libvirt -- VCPU and PCPU exchanged.

Whether the agent succeeded is not asserted: refusals are allowed,
overstatement and lost allocations are not.

Steps: ``NODE_AGENT_PROPERTY_EXAMPLES`` x ``NODE_AGENT_PROPERTY_STEPS``
(default 8 x 30 = at most 240 steps; ``make property`` runs more). The seed is
``--hypothesis-seed`` or ``NODE_AGENT_PROPERTY_SEED``; hypothesis prints the
shrunk step sequence on failure. The seed (a random one when none is given)
is in the failure's message and in pytest's terminal summary, with or
without ``-s``.

Host: the 16-CPU fixture linux-test4 (NUMA node 0 = CPUs 0-7, node 1 =
8-15), memory from its node meminfo, disk from the filesystem of tmp_path.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import ClassVar

import psutil
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from node_agent.cycle.desired import compute_desired, forget_applied_off
from node_agent.cycle.reconcile import Reconciler
from node_agent.errors import NodeAgentError
from node_agent.model.cpuset import parse_cpu_spec
from node_agent.placement.client import PlacementClient
from node_agent.placement.errors import PlacementError
from node_agent.placement.sync import TreeSyncer
from node_agent.policy import maintenance as maint
from node_agent.policy.capacity import HostLimits, Published, check
from node_agent.state import APPLIED as APPLIED_KEY
from node_agent.state import MAINTENANCE as MAINTENANCE_KEY
from node_agent.state import StateStore
from tests.hostdata import HOSTDATA, sysfs_root_for
from tests.integration.reshape_driver import PROJECT, USER, make_settings
from tests.integration.test_nested_reshape import host_xml

pytestmark = pytest.mark.integration
LOG = logging.getLogger(__name__)

FIXTURE = HOSTDATA / "virhostcpudata" / "linux-test4"
ONLINE = frozenset(range(16))
NODE_CPUS = {0: frozenset(range(8)), 1: frozenset(range(8, 16))}


def env_count(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    if not value.isdigit() or int(value) < 1:
        raise pytest.UsageError(f"{name}={value!r}: give a whole number >= 1 (default {default})")
    return int(value)


EXAMPLES = env_count("NODE_AGENT_PROPERTY_EXAMPLES", 8)
STEPS = env_count("NODE_AGENT_PROPERTY_STEPS", 30)
SEED = os.environ.get("NODE_AGENT_PROPERTY_SEED") or None
VERBOSE = bool(os.environ.get("NODE_AGENT_PROPERTY_VERBOSE"))


def host_memory_mb() -> int:
    """The fixture's memory: the sum of its nodes' MemTotal (what a fixture
    root has; psutil knows nothing of it)."""
    total_kb = 0
    for meminfo in sorted((FIXTURE / "node").glob("node*/meminfo")):
        for line in meminfo.read_text().splitlines():
            if "MemTotal:" in line:
                total_kb += int(line.split()[-2])
    return total_kb // 1024


def schedulable(rc: str, record: dict) -> int:
    """Units the scheduler can still place: ``total - reserved``, times the
    ratio for exact resources (PCPU); VCPU's and MEMORY_MB's ratios are the
    operator's overcommit policy."""
    free = record["total"] - record["reserved"]
    if free <= 0:
        return 0
    return int(free * record["allocation_ratio"]) if rc == "PCPU" else free


def configured_cpus(dedicated, shared) -> frozenset:
    """The CPUs the configured sets name (all online here), as nova reads
    them: ``cpu_dedicated_set`` | ``cpu_shared_set``; neither set (legacy):
    every online CPU. A dedicated set alone leaves no CPU to VCPU."""
    if dedicated is None and shared is None:
        return ONLINE
    return frozenset(dedicated or ()) | frozenset(shared or ())


def open_classes(tree: list[Published]) -> list[str]:
    """``provider: class`` for each inventory not fully reserved."""
    return [
        f"{p.name}: {rc}"
        for p in tree
        for rc, record in sorted(p.inventories.items())
        if record["reserved"] < record["total"]
    ]


def simple_verdict(tree: list[Published], cpus: int, memory_mb: int) -> list[str]:
    """The invariant, re-stated without node_agent's code."""
    problems = []
    cpu = sum(
        schedulable(rc, p.inventories[rc])
        for p in tree
        for rc in ("PCPU", "VCPU")
        if rc in p.inventories
    )
    if cpu > cpus:
        problems.append(f"PCPU + VCPU: {cpu} schedulable on {cpus} online CPUs")
    memory = sum(
        schedulable("MEMORY_MB", p.inventories["MEMORY_MB"])
        for p in tree
        if "MEMORY_MB" in p.inventories
    )
    if memory > memory_mb:
        problems.append(f"MEMORY_MB: {memory} schedulable on a {memory_mb} MiB host")
    for rc in {rc for p in tree for rc in p.inventories}:
        levels = {
            p.root for p in tree if rc in p.inventories and schedulable(rc, p.inventories[rc])
        }
        if levels == {True, False}:
            problems.append(f"{rc} schedulable on the root and on a child")
    return problems


def totals(by_rp: dict) -> dict:
    out: dict = {}
    for res in by_rp.values():
        for rc, n in res.items():
            out[rc] = out.get(rc, 0) + n
    return out


def moved_whole(before: dict, after: dict, tree: set, pinned: bool) -> bool:
    """``after`` is ``before`` moved by a reshape: same amounts per class,
    every provider that changed in the host's tree (``tree``: every provider
    it had, children since deleted included); a pinned guest's VCPU
    may have become PCPU (and back)."""
    changed = {rp for rp in set(before) | set(after) if before.get(rp) != after.get(rp)}
    if not changed <= tree:
        return False
    was, now = totals(before), totals(after)
    if pinned:
        was["CPU"] = was.pop("VCPU", 0) + was.pop("PCPU", 0)
        now["CPU"] = now.pop("VCPU", 0) + now.pop("PCPU", 0)
    return was == now


CPU_SETS = st.one_of(st.none(), st.frozensets(st.sampled_from(sorted(ONLINE)), min_size=1))


class CapacityMachine(RuleBasedStateMachine):
    """One compute node per example: its own name, state dir and host.xml."""

    url: str = ""
    steps_run = 0  # checked steps, over every example
    outcomes: ClassVar[list] = []  # "ok" / "refused" / "error" per cycle
    seconds: ClassVar[dict] = {"cycle": 0.0, "check": 0.0}
    tmp_root: Path = Path("/tmp")

    def __init__(self):
        super().__init__()
        self.name = f"prop-{uuid.uuid4().hex[:8]}"
        self.tmp = self.tmp_root / self.name
        self.tmp.mkdir(parents=True)
        self.sysroot = str(sysfs_root_for(FIXTURE, self.tmp))
        self.state_dir = str(self.tmp / "state")
        self.agent = PlacementClient.for_endpoint(self.url)
        self.scheduler = PlacementClient.for_endpoint(self.url)
        self.config = {
            "dedicated": None,
            "shared": None,
            "numa": False,
            "cpu_ratio": 4.0,
            "ram_ratio": 1.0,
        }
        self.guests: dict[str, dict] = {}  # uuid -> domain (pins: pinned)
        self.consumers: dict[str, dict] = {}  # uuid -> provider -> resources
        self.providers: set[str] = set()  # every provider the host's tree had
        self.limits = HostLimits(
            cpus=len(ONLINE),
            memory_mb=host_memory_mb(),
            disk_gb=psutil.disk_usage(str(self.tmp)).total // 2**30,
            online_cpus=len(ONLINE),
        )
        self.trace: list[str] = []
        self.clean = False  # the last cycle applied without refusal or error
        self.maintenance_on = False
        self.closed = False  # a cycle ran with maintenance on: it must hold
        self.uri = host_xml(self.tmp / "host.xml", [])
        self.restart()

    # ------------------------------------------------------------ the agent

    def restart(self):
        self.syncer = TreeSyncer(self.agent, StateStore(Path(self.state_dir)))
        self.reconciler = Reconciler(self.agent, self.syncer)

    def settings(self):
        c = self.config
        base = make_settings(self.name, self.sysroot, self.uri, self.state_dir, str(self.tmp))
        return dataclasses.replace(
            base,
            cpu_dedicated_set=cpu_set(c["dedicated"]),
            cpu_shared_set=cpu_set(c["shared"]),
            numa_in_placement=c["numa"],
            cpu_allocation_ratio=c["cpu_ratio"],
            ram_allocation_ratio=c["ram_ratio"],
        )

    def cycle(self):
        """One cycle as the service runs it (node_agent.service.daemon.Agent)."""
        settings = self.settings()
        store = StateStore(Path(settings.state_path))
        self.clean = False
        try:
            desired = compute_desired(settings, state=store.load_or_empty(LOG))
            desired = self.reconciler.maintained(desired)
            outcome = self.reconciler.apply(desired)
            self.closed = self.closed or self.maintenance_on
            if outcome.ok:
                self.syncer.remember(APPLIED_KEY, desired.applied)
                forget_applied_off(store, desired.maintenance)
            self.trace.append("ok" if outcome.ok else f"refused: {outcome.errors[:1]}")
            self.clean = outcome.ok
            return outcome.ok
        except NodeAgentError as exc:  # refusals are allowed
            self.trace.append(f"error: {type(exc).__name__}: {str(exc)[:160]}")
            return False

    # ------------------------------------------------------------ Placement

    def root(self):
        found = self.scheduler.get(f"/resource_providers?name={self.name}")["resource_providers"]
        return found[0]["uuid"] if found else None

    def tree(self) -> tuple[list[Published], dict]:
        """(the tree as Placement holds it, uuid -> name)."""
        root = self.root()
        if root is None:
            return [], {}
        listing = self.scheduler.get(f"/resource_providers?in_tree={root}")["resource_providers"]
        tree = [
            Published(
                rp["uuid"],
                rp["parent_provider_uuid"] is None,
                self.scheduler.get(f"/resource_providers/{rp['uuid']}/inventories")["inventories"],
            )
            for rp in listing
        ]
        return tree, {rp["uuid"]: rp["name"] for rp in listing}

    def held_allocations(self, names: dict) -> dict:
        """consumer -> provider -> resources, over every provider of the tree
        (the test's consumers allocate nowhere else)."""
        held: dict = {}
        for rp in names:
            body = self.scheduler.get(f"/resource_providers/{rp}/allocations")["allocations"]
            for consumer, alloc in body.items():
                held.setdefault(consumer, {})[rp] = alloc["resources"]
        return held

    def write_allocation(self, consumer: str, by_rp: dict) -> bool:
        """As the scheduler writes it; False when Placement refuses (no room)."""
        try:
            self.scheduler.put(
                f"/allocations/{consumer}",
                {
                    "allocations": {rp: {"resources": res} for rp, res in by_rp.items()},
                    "project_id": PROJECT,
                    "user_id": USER,
                    "consumer_generation": None,
                },
            )
        except PlacementError as exc:
            if exc.status != 409:
                raise
            return False
        self.consumers[consumer] = by_rp
        return True

    def remove_allocation(self, consumer: str) -> None:
        generation = self.scheduler.get(f"/allocations/{consumer}")["consumer_generation"]
        self.scheduler.put(
            f"/allocations/{consumer}",
            {
                "allocations": {},
                "project_id": PROJECT,
                "user_id": USER,
                "consumer_generation": generation,
            },
        )
        del self.consumers[consumer]

    def provider_for(self, rc: str, node: int, tree: list[Published], names: dict):
        """Where the scheduler puts ``rc`` (+ MEMORY_MB): the NUMA child of
        ``node`` when the tree has NUMA children, else the root."""
        child = [p.name for p in tree if names[p.name].endswith(f"_NUMA_{node}")]
        target = child[0] if child else next(p.name for p in tree if p.root)
        provider = next(p for p in tree if p.name == target)
        return target if rc in provider.inventories else None

    # ------------------------------------------------------------ checks

    def check(self, step: str):
        self.trace.append(step)
        tree, names = self.last_tree = self.tree()
        named = [dataclasses.replace(p, name=names[p.name]) for p in tree]
        cpus = len(
            configured_cpus(self.config["dedicated"], self.config["shared"])
            if self.clean
            else ONLINE
        )
        verdict = check(named, dataclasses.replace(self.limits, cpus=cpus))
        assert verdict.ok, (step, verdict.lines(), self.trace[-6:])
        problems = simple_verdict(named, cpus, self.limits.memory_mb)
        assert not problems, (step, problems, self.trace[-6:])
        if self.closed:
            assert not open_classes(named), (
                step,
                "maintenance is on but these are open",
                open_classes(named),
                self.trace[-6:],
            )
        held = self.held_allocations(names)
        self.providers |= set(names)  # a deleted child still counts as the host's
        for consumer, before in list(self.consumers.items()):
            after = held.get(consumer, {})
            assert after, f"{step}: the allocation of {consumer} was lost (was {before})"
            if after != before:
                pinned = bool(self.guests.get(consumer, {}).get("pins"))
                assert moved_whole(before, after, self.providers, pinned), (
                    f"{step}: the allocation of {consumer} changed, not moved whole",
                    before,
                    after,
                    self.trace[-6:],
                )
                self.consumers[consumer] = after

    def step(self, what: str):
        started = time.perf_counter()
        self.cycle()
        checked = time.perf_counter()
        self.check(what)
        CapacityMachine.seconds["cycle"] += checked - started
        CapacityMachine.seconds["check"] += time.perf_counter() - checked

    # ------------------------------------------------------------ rules

    @initialize()
    def first_cycle(self):
        assert self.cycle(), self.trace
        self.check("first cycle (legacy: every CPU VCPU)")

    @rule(dedicated=CPU_SETS, shared=CPU_SETS, complement=st.booleans())
    def cpu_sets(self, dedicated, shared, complement):
        if complement and dedicated is not None:
            shared = (ONLINE - dedicated) or None
        self.config.update(dedicated=dedicated, shared=shared)
        self.step(f"cpu_dedicated_set={spec_text(dedicated)} cpu_shared_set={spec_text(shared)}")

    @rule(on=st.booleans())
    def numa(self, on):
        self.config["numa"] = on
        self.step(f"numa_in_placement={on}")

    @rule(cpu=st.sampled_from([1.0, 2.0, 4.0, 16.0]), ram=st.sampled_from([1.0, 1.5]))
    def ratios(self, cpu, ram):
        self.config.update(cpu_ratio=cpu, ram_ratio=ram)
        self.step(f"cpu_allocation_ratio={cpu} ram_allocation_ratio={ram}")

    @rule(
        pinned=st.booleans(),
        vcpus=st.integers(1, 4),
        memory=st.sampled_from([512, 2048]),
        node=st.integers(0, 1),
        data=st.data(),
    )
    def guest_arrives(self, pinned, vcpus, memory, node, data):
        tree, names = self.last_tree  # as the last check read it
        if not tree:
            return self.step("guest not scheduled: no tree")
        rc = "PCPU" if pinned and any("PCPU" in p.inventories for p in tree) else "VCPU"
        where = self.provider_for(rc, node, tree, names)
        if where is None:
            return self.step(f"guest not scheduled: no {rc} on node {node}")
        pins = ()
        if pinned:
            # nova pins a dedicated guest inside cpu_dedicated_set; a legacy
            # host (VCPU only) pinned it anywhere on the node.
            pool = NODE_CPUS[node] & (
                self.config["dedicated"] or ONLINE if rc == "PCPU" else ONLINE
            )
            if len(pool) < vcpus:
                return self.step("pinned guest not scheduled: too few CPUs to pin")
            pins = tuple(data.draw(st.permutations(sorted(pool)))[:vcpus])
        guest = {
            "uuid": str(uuid.uuid4()),
            "vcpus": vcpus,
            "memory": memory,
            "pins": pins,
            "nodes": str(node),
        }
        guest["name"] = f"instance-{guest['uuid'][:8]}"
        if not self.write_allocation(guest["uuid"], {where: {rc: vcpus, "MEMORY_MB": memory}}):
            return self.step("guest not scheduled: Placement has no room")
        self.guests[guest["uuid"]] = guest
        self.uri = host_xml(self.tmp / "host.xml", list(self.guests.values()))
        self.step(f"guest arrives: {rc} {vcpus} pins {pins} node {node} MEMORY_MB {memory}")

    @precondition(lambda self: self.guests)
    @rule(data=st.data())
    def guest_leaves(self, data):
        consumer = data.draw(st.sampled_from(sorted(self.guests)))
        self.remove_allocation(consumer)
        del self.guests[consumer]
        self.uri = host_xml(self.tmp / "host.xml", list(self.guests.values()))
        self.step(f"guest leaves: {consumer}")

    @rule(vcpus=st.integers(1, 4), memory=st.sampled_from([256, 1024]), node=st.integers(0, 1))
    def migration_record_arrives(self, vcpus, memory, node):
        tree, names = self.last_tree
        where = self.provider_for("VCPU", node, tree, names) if tree else None
        if where is None or not self.write_allocation(
            str(uuid.uuid4()), {where: {"VCPU": vcpus, "MEMORY_MB": memory}}
        ):
            return self.step("migration record not written")
        self.step(f"migration record arrives: VCPU {vcpus} MEMORY_MB {memory} node {node}")

    @precondition(lambda self: set(self.consumers) - set(self.guests))
    @rule(data=st.data())
    def migration_record_leaves(self, data):
        consumer = data.draw(st.sampled_from(sorted(set(self.consumers) - set(self.guests))))
        self.remove_allocation(consumer)
        self.step(f"migration record leaves: {consumer}")

    @rule()
    def state_file_lost(self):
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.step("state file lost")

    @rule()
    def agent_restarts(self):
        self.restart()
        self.step("agent restarts")

    @rule(on=st.booleans())
    def maintenance(self, on):
        # What ``node-agent maintenance on|off`` writes (node_agent.cli.main).
        StateStore(Path(self.state_dir)).put(
            MAINTENANCE_KEY, maint.record(on, "property test", "2026-01-01T00:00:00+00:00")
        )
        self.maintenance_on = on
        self.closed = self.closed and on
        self.step(f"maintenance {'on' if on else 'off'}")

    def teardown(self):
        CapacityMachine.steps_run += len(
            [t for t in self.trace if not t.startswith(("ok", "refused", "error"))]
        )
        CapacityMachine.outcomes.extend(
            t.split(":")[0] for t in self.trace if t.startswith(("ok", "refused", "error"))
        )
        if VERBOSE:
            print("\n".join([f"--- {self.name}"] + self.trace))
        shutil.rmtree(self.tmp, ignore_errors=True)


def spec_text(cpus) -> str:
    return ",".join(map(str, sorted(cpus))) if cpus else "unset"


def cpu_set(cpus):
    return parse_cpu_spec(spec_text(cpus)) if cpus else None


class SeedSummary:
    """Writes the seed in pytest's terminal summary (seen without ``-s``)."""

    NAME = "node-agent-capacity-property-seed"

    def __init__(self, line: str):
        self.line = line

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.write_line(self.line)


def test_placement_never_overstates_the_host_and_no_allocation_is_lost(
    placement_server, tmp_path, request
):
    CapacityMachine.url = placement_server.url
    CapacityMachine.tmp_root = tmp_path
    chosen = SEED or request.config.getoption("hypothesis_seed", None)
    if chosen is not None and not str(chosen).isdigit():
        raise pytest.UsageError(f"seed {chosen!r}: give a whole number")
    chosen = int(chosen) if chosen is not None else random.getrandbits(32)
    machine = hypothesis_seed(chosen)(type("CapacityMachine", (CapacityMachine,), {}))
    rerun = (
        f"capacity property test: {EXAMPLES} examples x {STEPS} steps, seed {chosen} "
        f"(rerun: NODE_AGENT_PROPERTY_SEED={chosen})"
    )
    print(rerun)
    if not request.config.pluginmanager.has_plugin(SeedSummary.NAME):
        request.config.pluginmanager.register(SeedSummary(rerun), SeedSummary.NAME)
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                derandomize=False,
                suppress_health_check=list(HealthCheck),
                database=None,
                print_blob=True,
            ),
        )
    except BaseException as exc:
        exc.add_note(rerun)
        raise
    outcomes = CapacityMachine.outcomes
    print(
        f"property test: {CapacityMachine.steps_run} steps checked; cycles: "
        + ", ".join(f"{outcomes.count(k)} {k}" for k in ("ok", "refused", "error"))
        + "; seconds in "
        + ", ".join(f"{k} {v:.1f}" for k, v in CapacityMachine.seconds.items())
    )


def test_replayed_dedicated_set_beside_a_floating_guest_leaves_no_pcpu_beside_vcpu(
    placement_server, tmp_path
):
    """Issue 12's first bullet as a fixed step sequence of the machine (VCPU
    16, a floating guest holds 3, cpu_dedicated_set = 0-15): the checks
    after the last step catch PCPU 16 + VCPU 16 when enforcement is off."""
    CapacityMachine.url = placement_server.url
    CapacityMachine.tmp_root = tmp_path
    machine = CapacityMachine()
    try:
        machine.first_cycle()
        machine.guest_arrives(pinned=False, vcpus=3, memory=1024, node=0, data=None)
        machine.cpu_sets(dedicated=ONLINE, shared=None, complement=False)
        assert machine.trace[-2].startswith("refused"), machine.trace
    finally:
        machine.teardown()


# ------------------------------------------------ the test's own checks, on literals


def inv(total, reserved=0, ratio=1.0):
    return {"total": total, "reserved": reserved, "allocation_ratio": ratio}


def test_simple_verdict_flags_pcpu_16_beside_vcpu_16_and_a_class_on_two_levels():
    doubled = [Published("root", True, {"PCPU": inv(16), "VCPU": inv(16, ratio=4.0)})]
    assert simple_verdict(doubled, 16, 1024) == ["PCPU + VCPU: 32 schedulable on 16 online CPUs"]
    both = [
        Published("root", True, {"MEMORY_MB": inv(1000)}),
        Published("root_NUMA_0", False, {"MEMORY_MB": inv(500)}),
    ]
    assert simple_verdict(both, 16, 2000) == ["MEMORY_MB schedulable on the root and on a child"]
    closed = [Published("root", True, {"PCPU": inv(16, 16), "VCPU": inv(16, ratio=4.0)})]
    assert simple_verdict(closed, 16, 1024) == []


def test_moved_whole_allows_a_reshape_and_refuses_a_change_of_amounts():
    before = {"root": {"VCPU": 2, "MEMORY_MB": 512}}
    to_child = {"child": {"VCPU": 2, "MEMORY_MB": 512}}
    assert moved_whole(before, to_child, {"root", "child"}, pinned=False)
    assert not moved_whole(before, to_child, {"root"}, pinned=False)  # left the tree
    as_pcpu = {"child": {"PCPU": 2, "MEMORY_MB": 512}}
    assert moved_whole(before, as_pcpu, {"root", "child"}, pinned=True)
    assert not moved_whole(before, as_pcpu, {"root", "child"}, pinned=False)
    assert not moved_whole(before, {"root": {"VCPU": 1, "MEMORY_MB": 512}}, {"root"}, True)


def test_configured_cpus_are_the_sets_or_every_online_cpu_in_legacy_mode():
    assert configured_cpus(None, None) == ONLINE
    assert configured_cpus(frozenset({2, 3}), None) == {2, 3}  # no VCPU left
    assert configured_cpus(frozenset({2, 3}), frozenset({0, 1})) == {0, 1, 2, 3}
    assert configured_cpus(None, frozenset({8})) == {8}


def test_open_classes_names_each_inventory_not_fully_reserved():
    tree = [
        Published("root", True, {"VCPU": inv(16, 16), "MEMORY_MB": inv(1000, 512)}),
        Published("root_NUMA_0", False, {"PCPU": inv(8, 8)}),
    ]
    assert open_classes(tree) == ["root: MEMORY_MB"]
