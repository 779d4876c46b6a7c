"""The production libvirt path against a real libvirtd with real QEMU guests.

The session's private libvirtd (conftest ``libvirtd``) is reached read-only
over ``qemu+unix:///system?socket=...``, exactly as ``qemu:///system`` is in
production; the host is this machine's real ``/sys``. Guests are QEMU under
TCG with no disk: one pinned with ``vcpupin`` and ``numatune`` and nova's
metadata, one floating, and one backed by huge pages. As root the module
reserves the few 2 MiB pages that guest needs when the host has none free
(``vm.nr_hugepages``), and gives them back afterwards.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
import time
import uuid
from pathlib import Path
from typing import Optional

import os_traits as ot
import pytest

from node_agent.cycle.desired import compute_desired
from node_agent.host.capabilities import parse_capabilities
from node_agent.host.discover import discover
from node_agent.host.hypervisor import Hypervisor
from node_agent.model.cpuset import CpuSet, parse_cpulist
from node_agent.placement.client import PlacementClient
from node_agent.service.daemon import Agent, load
from node_agent.service.loop import Service
from node_agent.tree.cpu_traits import feature_traits
from tests.integration.libvirtd import guest_xml
from tests.integration.reshape_driver import (
    agent_cycle,
    allocate,
    cpu_view,
    expected_after_reshape,
    make_settings,
    reshaper_posts,
)
from tests.machine_id import isolated_config

pytestmark = pytest.mark.integration

ONLINE = parse_cpulist(Path("/sys/devices/system/cpu/online").read_text())
PINNED_CPU = max(ONLINE)
NUMA_NODE0 = Path("/sys/devices/system/node/node0").exists()
HUGE_KIB = 4096
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")


def _reserve_hugepages(memory_kib: int) -> Optional[int]:
    """As root, raise ``vm.nr_hugepages`` so that ``memory_kib`` of default-size
    pages are free; return the value to restore, or None when nothing changed."""
    if os.geteuid() != 0 or not NR_HUGEPAGES.exists():
        return None
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    free = int(meminfo.get("HugePages_Free", "0").split()[0])
    size_kib = int(meminfo.get("Hugepagesize", "0 kB").split()[0]) or 2048
    short = -(-memory_kib // size_kib) - free
    if short <= 0:
        return None
    before = int(NR_HUGEPAGES.read_text())
    try:
        NR_HUGEPAGES.write_text(str(before + short))
    except OSError:
        return None
    return before


class Guests:
    """The module's guests, by role, with their uuids."""

    def __init__(self, daemon):
        self.daemon = daemon
        self.pinned = str(uuid.uuid4())
        self.floating = str(uuid.uuid4())
        self.huge = str(uuid.uuid4())
        self.restore_hugepages = _reserve_hugepages(HUGE_KIB)
        self.huge_skipped = daemon.hugepage_reason(HUGE_KIB)
        daemon.start_guest(
            guest_xml(
                "pinned",
                self.pinned,
                pins={0: str(PINNED_CPU)},
                numa_nodeset="0" if NUMA_NODE0 else None,
                nova={"flavor": "m1.pinned", "memory_mb": 64},
            )
        )
        daemon.start_guest(
            guest_xml("floating", self.floating, nova={"flavor": "m1.tiny", "memory_mb": 64})
        )
        if not self.huge_skipped:
            daemon.start_guest(guest_xml("huge", self.huge, memory_kib=HUGE_KIB, hugepages=True))

    def destroy(self):
        for guest in (self.pinned, self.floating, self.huge):
            try:
                self.daemon.destroy_guest(guest)
            except Exception:  # never started (no huge pages) or already gone
                pass
        if self.restore_hugepages is not None:
            NR_HUGEPAGES.write_text(str(self.restore_hugepages))


@pytest.fixture(scope="module")
def guests(libvirtd):
    made = Guests(libvirtd)
    yield made
    made.destroy()


def settings_for(libvirtd, tmp_path, host="real-libvirtd", **kw):
    return make_settings(
        host, "/sys", libvirtd.ro_uri, str(tmp_path / "state"), str(tmp_path), **kw
    )


def read_host(libvirtd, tmp_path):
    with Hypervisor(libvirtd.ro_uri) as hypervisor:
        return discover(settings_for(libvirtd, tmp_path), hypervisor)


# ---------------------------------------------------------------- discovery


def test_real_host_cpu_is_expanded_through_baseline_cpu_into_feature_traits(libvirtd, tmp_path):
    with Hypervisor(libvirtd.ro_uri) as hypervisor:
        caps = parse_capabilities(hypervisor.capabilities_xml())
    host = read_host(libvirtd, tmp_path)

    assert host.cpu_model.model == caps.cpu_model.model and caps.cpu_model.model
    # Capabilities list only what the model does not imply; baselineCPU adds the rest.
    assert caps.cpu_model.features < host.cpu_model.features
    traits = {t for t, present in feature_traits(host.cpu_model).items() if present}
    if host.cpu_model.arch == "x86_64":
        assert "sse2" not in caps.cpu_model.features
        assert ot.HW_CPU_X86_SSE2 in traits
    desired = compute_desired(settings_for(libvirtd, tmp_path))
    assert traits <= set(desired.tree.providers[0].traits)


def test_guests_are_read_live_with_pins_numatune_and_nova_metadata(libvirtd, guests, tmp_path):
    by_uuid = {g.uuid: g for g in read_host(libvirtd, tmp_path).guests}

    pinned, floating = by_uuid[guests.pinned], by_uuid[guests.floating]
    assert pinned.running and floating.running
    assert dict(pinned.vcpupin) == {0: CpuSet([PINNED_CPU])}
    assert pinned.numa_nodes == (frozenset({0}) if NUMA_NODE0 else frozenset())
    assert dict(pinned.metadata) == {
        "nova:name": "pinned",
        "flavor:name": "m1.pinned",
        "flavor:memory": "64",
        "flavor:vcpus": "1",
    }
    assert dict(floating.metadata)["flavor:name"] == "m1.tiny"
    assert floating.vcpupin == ()
    assert floating.memory_kb == 65536


def test_hugepage_backed_guest_is_read_as_such(libvirtd, guests, tmp_path):
    if guests.huge_skipped:
        pytest.skip(f"no hugepage-backed guest: {guests.huge_skipped}")
    by_uuid = {g.uuid: g for g in read_host(libvirtd, tmp_path).guests}
    assert by_uuid[guests.huge].hugepages


def test_real_host_numa_cells_agree_with_sysfs_without_a_warning(libvirtd, tmp_path):
    host = read_host(libvirtd, tmp_path)
    assert not [w for w in host.warnings if "NUMA cells" in w], host.warnings


def test_real_host_memory_is_libvirts_node_info_as_nova_reports_it(libvirtd, tmp_path):
    """nova's MEMORY_MB total is libvirt's virNodeGetInfo (the NUMA nodes'
    MemTotal on Linux), which on some machines (this suite's sandbox) is
    less than the kernel's /proc/meminfo MemTotal; the agent follows nova,
    never above the kernel's figure."""
    import psutil

    with Hypervisor(libvirtd.ro_uri) as hypervisor:
        libvirt_mb = hypervisor.memory_mb_total()
    expected = min(libvirt_mb, psutil.virtual_memory().total // (1024 * 1024))
    host = read_host(libvirtd, tmp_path)
    assert host.memory_mb == expected
    desired = compute_desired(settings_for(libvirtd, tmp_path))
    assert desired.tree.providers[0].inventories["MEMORY_MB"].total == expected


# ---------------------------------------------------------------- reshape


def held_on(client, root: str, consumers) -> dict:
    """consumer -> {root: resources} as Placement holds them."""
    return {
        c: {root: client.get(f"/allocations/{c}")["allocations"][root]["resources"]}
        for c in consumers
    }


def test_dedicated_set_reshapes_the_running_pinned_guest_to_pcpu(
    libvirtd, guests, placement_server, host_name, tmp_path
):
    if len(ONLINE) < 2:
        pytest.skip(f"one online CPU ({ONLINE}): no room for a dedicated and a shared set")
    shared = ",".join(str(c) for c in ONLINE if c != PINNED_CPU)
    agent = PlacementClient.for_endpoint(placement_server.url)
    scheduler = PlacementClient.for_endpoint(placement_server.url)
    legacy = settings_for(libvirtd, tmp_path, host_name)
    _outcome, report, _ = agent_cycle(agent, legacy)
    assert report.ok
    root = scheduler.get(f"/resource_providers?name={host_name}")["resource_providers"][0]["uuid"]
    for guest in (guests.pinned, guests.floating):
        allocate(scheduler, guest, {root: {"VCPU": 1, "MEMORY_MB": 64}})
    before = held_on(scheduler, root, (guests.pinned, guests.floating))

    pinned = settings_for(libvirtd, tmp_path, host_name, dedicated=str(PINNED_CPU), shared=shared)
    outcome, report, _ = agent_cycle(agent, pinned)

    assert report.ok and outcome.reshaped
    after = held_on(scheduler, root, (guests.pinned, guests.floating))
    assert after == expected_after_reshape(before, {guests.pinned})
    inventories = scheduler.get(f"/resource_providers/{root}/inventories")["inventories"]
    assert cpu_view(inventories) == {"VCPU": len(ONLINE) - 1, "PCPU": 1}
    again, _report, _ = agent_cycle(agent, pinned)
    assert again is None or not again.reshaped
    assert len(reshaper_posts(agent)) == 1
    for guest in (guests.pinned, guests.floating):
        scheduler.delete(f"/allocations/{guest}")


# ---------------------------------------------------------------- the service


class Notes:
    """Stands in for systemd: keeps every sd_notify line."""

    def __init__(self):
        self.lines: list[str] = []

    def notify(self, state: str) -> None:
        self.lines.append(state)

    def statuses(self) -> list[str]:
        return [line[len("STATUS=") :] for line in self.lines if line.startswith("STATUS=")]


class RunningService:
    """The real service loop and cycle (node_agent.service.daemon) in a thread."""

    def __init__(self, tmp_path, libvirtd, placement_url, host, interval=3600):
        config = tmp_path / "node-agent.conf"
        config.write_text(
            isolated_config(tmp_path, host)
            + f"[DEFAULT]\nhost = {host}\n[agent]\nstate_path = {tmp_path / 'state'}\n"
            f"[libvirt]\nconnection_uri = {libvirtd.ro_uri}\n"
            f"[compute]\ninstances_path = {tmp_path}\n"
            f"[agent]\nreport_interval = {interval}\nstartup_splay = 0\n"
            "retry_max_interval = 8\n"
            "[placement]\nauth_type = admin_token\ntoken = admin\n"
            f"endpoint_override = {placement_url}\n"
        )
        args = ["--config-file", str(config)]
        self.agent = Agent()
        self.notes = Notes()
        self.service = Service(
            self.agent,
            lambda: load(args),
            load(args),
            notifier=self.notes,
            tick=0.05,
            rand=lambda: 0.999,
        )
        self.thread = threading.Thread(target=self.service.run, daemon=True)
        self.client = PlacementClient.for_endpoint(placement_url)
        self.host = host

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_exc):
        self.service.request_stop()
        self.thread.join(30)
        self.agent.close()

    def cycle(self) -> None:
        assert self.service.trigger(wait=60) is not None, "no cycle finished in time"

    def guests(self) -> set[str]:
        return {g.uuid for g in self.agent.last_desired.host.guests}

    def inventories(self) -> dict:
        root = self.client.get(f"/resource_providers?name={self.host}")["resource_providers"]
        return self.client.get(f"/resource_providers/{root[0]['uuid']}/inventories")["inventories"]


def test_a_guest_started_and_one_destroyed_between_cycles_are_both_seen(
    libvirtd, guests, placement_server, host_name, tmp_path
):
    leaving, arriving = str(uuid.uuid4()), str(uuid.uuid4())
    libvirtd.start_guest(guest_xml("leaving", leaving))
    with RunningService(tmp_path, libvirtd, placement_server.url, host_name) as running:
        running.cycle()
        assert {leaving, guests.pinned} <= running.guests()
        assert arriving not in running.guests()

        libvirtd.start_guest(guest_xml("arriving", arriving))
        libvirtd.destroy_guest(leaving)
        running.cycle()

        assert arriving in running.guests() and leaving not in running.guests()
        assert running.service.health.kind is None
    libvirtd.destroy_guest(arriving)


def test_service_reconnects_after_libvirtd_restarts(
    libvirtd, guests, placement_server, host_name, tmp_path, caplog
):
    with RunningService(tmp_path, libvirtd, placement_server.url, host_name) as running:
        running.cycle()
        assert guests.pinned in running.guests()
        try:
            libvirtd.restart()
        finally:
            libvirtd.start()  # no-op when up; brings it back if restart failed
        with caplog.at_level(logging.WARNING, logger="node_agent"):
            running.cycle()
        assert running.service.health.kind is None, running.service.health.message
        assert guests.pinned in running.guests()
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_libvirtd_stopped_keeps_inventory_backs_off_and_says_so_once(
    libvirtd, guests, placement_server, host_name, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="node_agent")
    with RunningService(tmp_path, libvirtd, placement_server.url, host_name, interval=1) as running:
        running.cycle()
        before = running.inventories()
        try:
            libvirtd.stop_daemon()
            wait_for(lambda: running.service.health.failures >= 3, timeout=30)
            statuses = running.notes.statuses()
            kept = running.inventories()
        finally:
            libvirtd.start()
        running.cycle()
        healed = running.service.health.kind is None
        seen_again = guests.pinned in running.guests()

    assert kept == before
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(said) == 1 and "the host cannot be read" in said[0], said
    assert libvirtd.ro_uri in said[0]
    retries = [s for s in statuses if "retry in" in s]
    # rand 0.999: 1, 2, 4 s (report_interval 1, doubling up to retry_max_interval 8)
    assert [s.split("retry in ")[1] for s in retries[:3]] == ["1s", "2s", "4s"], retries
    assert healed and seen_again
    assert "the host can be read again; back to normal" in caplog.text


def wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


# ---------------------------------------------------------------- make run


def test_make_run_uses_a_libvirtd_that_answers_and_says_so(libvirtd):
    from devenv.demo import libvirt_uri

    uri, said = libvirt_uri(libvirtd.ro_uri)
    assert uri == libvirtd.ro_uri
    assert said == f"a local libvirtd answers at {libvirtd.ro_uri}; using it (read-only)"


def test_make_run_falls_back_to_sysfs_alone_when_no_libvirtd_answers(tmp_path):
    from devenv.demo import libvirt_uri

    uri, said = libvirt_uri(f"qemu+unix:///system?socket={tmp_path}/none-sock-ro")
    assert uri == ""
    assert said.startswith("no libvirtd answers (") and "using sysfs alone" in said
    assert "\n" not in said


# ---------------------------------------------------------------- static traits


def test_domain_capabilities_traits_reach_placement_only_with_the_read_write_option(
    libvirtd, placement_server, host_name, tmp_path, caplog
):
    import dataclasses

    client = PlacementClient.for_endpoint(placement_server.url)
    read_only = dataclasses.replace(settings_for(libvirtd, tmp_path, host_name), virt_type="qemu")
    with caplog.at_level(logging.INFO, logger="node_agent.host.discover"):
        _outcome, report, _ = agent_cycle(client, read_only)
    assert report.ok
    root = client.get(f"/resource_providers?name={host_name}")["resource_providers"][0]
    traits = set(client.get(f"/resource_providers/{root['uuid']}/traits")["traits"])
    assert ot.COMPUTE_NET_VIRTIO_PACKED in traits
    assert not {t for t in traits if t.startswith(("COMPUTE_STORAGE_BUS_", "COMPUTE_ARCH_"))}
    from node_agent.host import warn_once

    # said once per process (an earlier test may have said it first)
    assert any("domain_capabilities is off" in line for line in warn_once._LOGGED)

    read_write = dataclasses.replace(
        read_only, libvirt_uri=libvirtd.rw_uri, domain_capabilities=True
    )
    _outcome, report, _ = agent_cycle(client, read_write)
    assert report.ok
    traits = set(client.get(f"/resource_providers/{root['uuid']}/traits")["traits"])
    native = {
        "x86_64": ot.COMPUTE_ARCH_X86_64,
        "aarch64": ot.COMPUTE_ARCH_AARCH64,
        "s390x": ot.COMPUTE_ARCH_S390X,
    }.get(platform.machine())
    assert {ot.COMPUTE_STORAGE_BUS_VIRTIO, ot.COMPUTE_GRAPHICS_MODEL_NONE} <= traits
    if native:
        assert native in traits


def _custom_models(libvirtd) -> dict[str, list[str]]:
    """{'yes': [...], 'no': [...]}: the custom-mode CPU models this host's KVM
    can run and cannot, as libvirt's domain capabilities say."""
    import xml.etree.ElementTree as ET

    import libvirt

    conn = libvirt.open(libvirtd.rw_uri)
    try:
        xml = conn.getDomainCapabilities(None, None, None, "kvm", 0)
    except libvirt.libvirtError as exc:
        pytest.skip(f"no KVM domain capabilities here: {exc}")
    finally:
        conn.close()
    models: dict[str, list[str]] = {"yes": [], "no": []}
    for model in ET.fromstring(xml).findall("cpu/mode[@name='custom']/model"):
        models.setdefault(model.get("usable", ""), []).append(model.text or "")
    return models


def test_custom_cpu_model_kvm_cannot_run_here_is_refused_and_a_usable_one_decides_traits(
    libvirtd, tmp_path
):
    import dataclasses

    from node_agent.errors import ConfigError

    models = _custom_models(libvirtd)
    if not models["yes"] or not models["no"]:
        pytest.skip(f"need usable and unusable custom models, libvirt lists {models}")
    base = dataclasses.replace(
        settings_for(libvirtd, tmp_path),
        libvirt_uri=libvirtd.rw_uri,
        domain_capabilities=True,
        virt_type="kvm",
        cpu_mode="custom",
    )
    with pytest.raises(ConfigError, match="compareHypervisorCPU"):
        compute_desired(dataclasses.replace(base, cpu_models=(models["no"][-1],)))

    usable = "qemu64" if "qemu64" in models["yes"] else models["yes"][0]
    desired = compute_desired(dataclasses.replace(base, cpu_models=(usable,)))
    ((name, features),) = desired.host.guest_cpu_models
    assert name == usable
    host_cpu = desired.host.cpu_model

    def present(cpu):
        return {t for t, on in feature_traits(cpu).items() if on}

    root = {
        t
        for t, on in desired.tree.providers[0].traits.items()
        if on and t.startswith("HW_CPU_X86_")
    }
    if host_cpu.arch == "x86_64":
        model_traits = present(dataclasses.replace(host_cpu, features=features))
        assert root == model_traits  # the model's, not the host's
        assert present(host_cpu) - model_traits, "the host CPU should have more than the model"


# ---------------------------------------------------------------- companion mode


def test_companion_on_a_nova_host_audits_real_guests_and_previews_the_reshape_read_only(
    libvirtd, guests, placement_server, host_name, tmp_path
):
    """nova-compute owns the provider (the test plays it); the running QEMU
    guests are what the audit and the restart preview see."""
    from tests.cli.runner import run_agent
    from tests.integration.test_applier import RequestLog

    if len(ONLINE) < 2:
        pytest.skip(f"one online CPU ({ONLINE}): no room for a dedicated and a shared set")
    nova = PlacementClient.for_endpoint(placement_server.url)
    desired = compute_desired(settings_for(libvirtd, tmp_path, host_name))
    root = str(uuid.uuid4())
    nova.post("/resource_providers", {"name": host_name, "uuid": root})
    nova.put(
        f"/resource_providers/{root}/inventories",
        {
            "resource_provider_generation": 0,
            "inventories": {
                rc: inv.as_placement() for rc, inv in desired.tree.root.inventories.items()
            },
        },
    )
    nova.put(
        f"/resource_providers/{root}/traits",
        {
            "resource_provider_generation": 1,
            "traits": sorted(desired.tree.root.wanted_traits | {"OWNER_NOVA"}),
        },
    )
    orphan = str(uuid.uuid4())  # an instance deleted while the host was down
    for consumer in (guests.pinned, orphan):  # the floating guest has none
        allocate(nova, consumer, {root: {"VCPU": 1, "MEMORY_MB": 64}})
    before = {c: nova.get(f"/allocations/{c}") for c in (guests.pinned, orphan)}
    shared = ",".join(str(c) for c in ONLINE if c != PINNED_CPU)
    config = tmp_path / "node-agent.conf"
    config.write_text(
        isolated_config(tmp_path, host_name) + f"[DEFAULT]\nhost = {host_name}\n"
        f"[agent]\nmode = companion\nstate_path = {tmp_path / 'state'}\n"
        f"[libvirt]\nconnection_uri = {libvirtd.ro_uri}\n"
        f"[compute]\ninstances_path = {tmp_path}\ncpu_dedicated_set = {PINNED_CPU}\n"
        f"cpu_shared_set = {shared}\n"
        "[placement]\nauth_type = admin_token\ntoken = admin\n"
        f"endpoint_override = {placement_server.url}\n"
    )
    log = RequestLog(placement_server)
    try:
        # A guest without allocation is an alarm once two audits have seen it.
        for _ in range(2):
            run = run_agent("--config-file", str(config), "--once", "--output", "json")
            assert run.code == 3, run.stderr  # drift (PCPU) and audit alarms
        findings = {(f["kind"], f["consumer"]): f["state"] for f in run.json()["audit"]["findings"]}
        assert findings[("orphan", orphan)] == "alarm"
        assert findings[("no_allocation", guests.floating)] == "alarm"
        assert ("no_allocation", guests.pinned) not in findings
        plan = run_agent("--config-file", str(config), "--once", "--dry-run", "--output", "json")
        assert plan.code == 0, plan.stderr
        restart = plan.json()["companion"]["next_restart"]
        moved = {c["consumer"]: c["moves"] for c in restart["reshape"]["consumers"]}
        assert [(m["from_class"], m["to_class"]) for m in moved[guests.pinned]] == [
            ("VCPU", "PCPU")
        ]
        assert all(r.startswith("GET ") for r in log.requests()), log.requests()
        assert {c: nova.get(f"/allocations/{c}") for c in before} == before
    finally:
        for consumer in (guests.pinned, orphan):
            nova.delete(f"/allocations/{consumer}")
        nova.delete(f"/resource_providers/{root}")
