"""One node-agent checkout driven over stdin/stdout, for section 11.

    PYTHONPATH=CHECKOUT python bench/version_driver.py

Runs whatever ``node_agent`` the interpreter finds first, the current tree
or the pre-change commit's, whose modules had other names: each import
below tries the current layout, then the old one. Only this checkout's
code runs here; the caller (bench/before_after.py) counts the requests in
Placement's log and makes the faults. One JSON command per line, one JSON
answer per line:

- ``init``: the host (sysfs tree, name, state directory, Placement URL)
- ``discover``: the host's discovery, timed
- ``register`` / ``cycle`` / ``fail``: a cycle (``fail``: a full verify is
  due and the caller makes Placement fail it)
- ``restart``: a new process's objects over the same state directory
- ``reshape``: the cycle after the CPU sets changed, with pinned guests
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import sys
import time
from pathlib import Path


def _first(*candidates: str):
    """The first importable ``module:attribute`` of ``candidates``."""
    for candidate in candidates:
        module, _, name = candidate.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    return None


TreeSyncer = _first("node_agent.placement.sync:TreeSyncer", "node_agent.sync:TreeSyncer")
PlacementClient = _first(
    "node_agent.placement.client:PlacementClient", "node_agent.placement:PlacementClient"
)
StateStore = _first("node_agent.state:StateStore")
Settings = _first("node_agent.config.settings:Settings", "node_agent.settings:Settings")
discover = _first("node_agent.host.discover:discover", "node_agent.discover:discover")
desired_from = _first("node_agent.cycle.desired:desired_from", "node_agent.cycle:desired_from")
Reconciler = _first("node_agent.cycle.reconcile:Reconciler", "node_agent.reconcile:Reconciler")
parse_device_specs = _first(
    "node_agent.model.device_spec:parse_device_specs", "node_agent.device_spec:parse_device_specs"
)
CpuSet = _first("node_agent.model.cpuset:CpuSet", "node_agent.cpuset:CpuSet")
Guest = _first("node_agent.model.snapshot:Guest", "node_agent.topology:Guest")
restore_cache = _first("node_agent.cycle.provider_cache:restore")  # new only
keep_cache = _first("node_agent.cycle.provider_cache:keep")

FULL_VERIFY = 300


class Driver:
    def init(
        self,
        url: str,
        host: str,
        sysfs_root: str,
        work: str,
        specs: list,
        dedicated: list | None = None,
        shared: list | None = None,
        retries: int = 0,
    ) -> dict:
        problems: list = []
        self.url, self.retries = url, retries
        self.state = Path(work) / "state" / host
        values = dict(
            host=host,
            state_path=str(self.state),
            sysfs_root=sysfs_root,
            libvirt_uri="",
            cpu_dedicated_set=None,
            cpu_shared_set=None,
            vcpu_pin_set=None,
            reserved_host_cpus=0,
            reserved_host_memory_mb=512,
            reserved_host_disk_mb=0,
            cpu_allocation_ratio=4.0,
            ram_allocation_ratio=1.0,
            disk_allocation_ratio=1.0,
            instances_path=work,
            pci_device_specs=tuple(parse_device_specs(specs, problems)),
        )
        if problems:
            raise ValueError(problems)
        self.settings = Settings(**values)
        self.after = (
            dataclasses.replace(
                self.settings, cpu_dedicated_set=CpuSet(dedicated), cpu_shared_set=CpuSet(shared)
            )
            if dedicated
            else None
        )
        self.snapshot = None
        self.now = 0.0
        self.restart()
        return {}

    def discover(self) -> dict:
        start = time.perf_counter()
        self.snapshot = discover(self.settings)
        return {"seconds": time.perf_counter() - start}

    def restart(self) -> dict:
        client = PlacementClient.for_endpoint(self.url, retries=self.retries)
        self.syncer = TreeSyncer(
            client, StateStore(self.state), full_verify_interval=FULL_VERIFY, clock=lambda: self.now
        )
        if restore_cache is not None:
            restore_cache(self.syncer)  # what the service does at start (new code)
        self.reconciler = Reconciler(client, self.syncer)
        return {}

    def _desired(self, settings, guests=()):
        if self.snapshot is None:
            self.snapshot = discover(self.settings)
        return desired_from(settings, dataclasses.replace(self.snapshot, guests=tuple(guests)))

    def _cycle(self, desired, advance: float) -> dict:
        self.now += advance
        maintained = getattr(self.reconciler, "maintained", None)  # new code only
        try:
            if maintained is not None:
                desired = maintained(desired)
            outcome = self.reconciler.apply(desired)
        except Exception as exc:  # noqa: BLE001 - a failed cycle is the point of "fail"
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        if keep_cache is not None:
            keep_cache(self.syncer)
        return {
            "ok": bool(outcome.ok),
            "error": "; ".join(outcome.errors or ()),
            "root_uuid": self.syncer.state.get("root_uuid"),
            "reshaper_requests": getattr(outcome.reshape, "requests", None),
        }

    def register(self) -> dict:
        return self._cycle(self._desired(self.settings), 60)

    def cycle(self, advance: float = 60) -> dict:
        return self._cycle(self._desired(self.settings), advance)

    def fail(self) -> dict:
        return self._cycle(self._desired(self.settings), FULL_VERIFY)

    def reshape(self, guests: list) -> dict:
        pinned = [
            Guest(
                uuid=u,
                name=f"pinned-{i}",
                vcpus=1,
                running=True,
                memory_kb=256 * 1024,
                vcpupin=((0, CpuSet([cpu])),),
            )
            for i, (u, cpu) in enumerate(guests)
        ]
        return self._cycle(self._desired(self.after, pinned), 60)


def main() -> int:
    logging.disable(logging.WARNING)
    driver = Driver()
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op == "quit":
            break
        try:
            answer = getattr(driver, op)(**command)
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            answer = {"error": f"{type(exc).__name__}: {exc}", "failed": True}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
