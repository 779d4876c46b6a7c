"""The agent's reshape cycle (discover -> reshape -> tree sync), runnable as
a process so the crash test can SIGKILL it:

    python -m tests.integration.reshape_driver PLACEMENT_URL HOST SYSFS_ROOT \
        LIBVIRT_URI STATE_DIR INSTANCES_PATH [--dedicated SPEC --shared SPEC]

It prints ``ready`` once imported (so the killer knows the cycle starts)
and ``done <json>`` at the end. :func:`agent_cycle` is what the in-process
tests call. Also holds the "scheduler" helpers the tests share.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid
from pathlib import Path

from node_agent.config.settings import Settings
from node_agent.cycle.desired import compute_desired
from node_agent.cycle.reconcile import Reconciler
from node_agent.host.libvirt_facts import read_guests
from node_agent.model.cpuset import parse_cpu_spec
from node_agent.placement.client import PlacementClient
from node_agent.placement.sync import TreeSyncer
from node_agent.state import StateStore
from tests.hostdata import HOSTDATA, sysfs_root_for
from tests.machine_id import machine_id_file_of_host

PROJECT = "33333333000040008000000000000001"
USER = "22222222000040008000000000000001"
LOG = logging.getLogger(__name__)


def make_settings(
    host: str,
    sysfs_root: str,
    libvirt_uri: str,
    state_dir: str,
    instances_path: str,
    dedicated=None,
    shared=None,
    transition=False,
) -> Settings:
    return Settings(
        host=host,
        state_path=state_dir,
        sysfs_root=sysfs_root,
        libvirt_uri=libvirt_uri,
        cpu_dedicated_set=parse_cpu_spec(dedicated) if dedicated else None,
        cpu_shared_set=parse_cpu_spec(shared) if shared else None,
        vcpu_pin_set=None,
        reserved_host_cpus=0,
        reserved_host_memory_mb=512,
        reserved_host_disk_mb=0,
        cpu_allocation_ratio=4.0,
        ram_allocation_ratio=1.0,
        disk_allocation_ratio=1.0,
        instances_path=instances_path,
        pcpu_transition_mode=transition,
        machine_id_path=str(machine_id_file_of_host(host)),
    )


def agent_cycle(client, settings: Settings, before_post=None):
    """One cycle as the agent runs it (node_agent.cycle.reconcile: reshape, then sync),
    with a fresh process's objects. Returns (the ReshapeOutcome, or the
    ReshapeRefused when the reshape was refused; SyncReport; Desired)."""
    store = StateStore(Path(settings.state_path))
    desired = compute_desired(settings, state=store.load_or_empty(LOG))
    outcome = Reconciler(
        client, TreeSyncer(client, store), guests_now=lambda: read_guests(settings)
    ).apply(desired, before_post)
    return outcome.refused or outcome.reshape, outcome.report, desired


def allocate(client, consumer: str, resources_by_rp: dict, generation=None) -> None:
    """Write allocations the way the scheduler does (new consumer: null generation)."""
    client.put(
        f"/allocations/{consumer}",
        {
            "allocations": {rp: {"resources": res} for rp, res in resources_by_rp.items()},
            "project_id": PROJECT,
            "user_id": USER,
            "consumer_generation": generation,
        },
    )


# ---------------------------------------------------------------- test fixtures

HOST_XML = Path(__file__).resolve().parents[1] / "data" / "libvirt" / "host.xml"
# Consumers are global in the shared Placement: each test gets the guests of
# host.xml under its own uuid prefix.
GUEST_PREFIX = "11111111-0000-4000-8000-0000000000"


class Host:
    """One fixture host: its settings per state, the agent's client, the
    scheduler's client, and the shared-storage provider a guest also uses."""

    def __init__(self, tmp_path, url, name):
        self.url, self.name, self.tmp = url, name, tmp_path
        self.sysfs = str(sysfs_root_for(HOSTDATA / "virhostcpudata" / "linux-test4", tmp_path))
        prefix = str(uuid.uuid4())[:-2]
        xml = tmp_path / "host.xml"
        xml.write_text(HOST_XML.read_text().replace(GUEST_PREFIX, prefix))
        self.uri = f"test://{xml}"
        self.pinned = prefix + "01"  # 4 vCPUs, pins 2,10,3,11
        self.pinned_2 = prefix + "02"  # 2 vCPUs, pins 4,12
        self.unpinned = [prefix + "03", prefix + "05", prefix + "06"]
        self.not_a_guest = str(uuid.uuid4())
        self.state_dir = str(tmp_path / "state")
        self.agent = PlacementClient.for_endpoint(url)
        self.scheduler = PlacementClient.for_endpoint(url)
        self.shared_disk = str(uuid.uuid4())

    def settings(self, state_dir=None, **kw):
        return make_settings(
            self.name, self.sysfs, self.uri, state_dir or self.state_dir, str(self.tmp), **kw
        )

    @property
    def root(self) -> str:
        return StateStore(Path(self.state_dir)).load()["root_uuid"]

    def boot(self, consumer, vcpu, memory, disk=0, pcpu=0, shared_disk=0):
        res = {"MEMORY_MB": memory}
        res.update({k: v for k, v in (("VCPU", vcpu), ("PCPU", pcpu), ("DISK_GB", disk)) if v})
        by_rp = {self.root: res}
        if shared_disk:
            by_rp[self.shared_disk] = {"DISK_GB": shared_disk}
        allocate(self.scheduler, consumer, by_rp)

    def make_shared_disk(self):
        self.scheduler.post(
            "/resource_providers", {"name": f"{self.name}-nfs", "uuid": self.shared_disk}
        )
        self.scheduler.put(
            f"/resource_providers/{self.shared_disk}/inventories",
            {"resource_provider_generation": 0, "inventories": {"DISK_GB": {"total": 10000}}},
        )

    def allocations(self):
        """consumer -> provider -> resources, for every consumer we booted."""
        found = {}
        for consumer in [self.pinned, self.pinned_2, *self.unpinned, self.not_a_guest]:
            body = self.scheduler.get(f"/allocations/{consumer}")["allocations"]
            if body:
                found[consumer] = {rp: a["resources"] for rp, a in body.items()}
        return found

    def inventories(self):
        return self.scheduler.get(f"/resource_providers/{self.root}/inventories")["inventories"]


def boot_legacy_guests(host, pinned_2=True):
    host.make_shared_disk()
    host.boot(host.pinned, vcpu=4, memory=4096, disk=20, shared_disk=100)
    if pinned_2:
        host.boot(host.pinned_2, vcpu=2, memory=2048)
    for n, consumer in enumerate(host.unpinned):
        host.boot(consumer, vcpu=2, memory=1024, disk=10 + n)


def reshaper_posts(client):
    return [entry for entry in client.stats.log if entry[:2] == ("POST", "/reshaper")]


def cpu_view(inventories):
    return {rc: inventories[rc]["total"] for rc in ("VCPU", "PCPU") if rc in inventories}


def expected_after_reshape(before, pinned):
    after = {}
    for consumer, by_rp in before.items():
        after[consumer] = {}
        for rp, res in by_rp.items():
            res = dict(res)
            if consumer in pinned and "VCPU" in res:
                res["PCPU"] = res.pop("VCPU")
            after[consumer][rp] = res
    return after


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    for name in ("placement", "host", "sysfs_root", "libvirt_uri", "state_dir", "instances_path"):
        parser.add_argument(name)
    parser.add_argument("--dedicated")
    parser.add_argument("--shared")
    args = parser.parse_args(argv)
    print("ready", flush=True)
    settings = make_settings(
        args.host,
        args.sysfs_root,
        args.libvirt_uri,
        args.state_dir,
        args.instances_path,
        args.dedicated,
        args.shared,
    )
    client = PlacementClient.for_endpoint(args.placement)
    outcome, report, _desired = agent_cycle(client, settings)
    reshaped = getattr(outcome, "reshaped", False)
    print("done " + json.dumps({"reshaped": reshaped, "sync_ok": report.ok}), flush=True)
    return 0 if report.ok and not isinstance(outcome, Exception) else 1


if __name__ == "__main__":
    sys.exit(main())
