"""Placement dies, freezes or crawls in the middle of a cycle (issue 28):
the reshape's consumer reads end after the reads already in flight, not
after one ``[placement] timeout`` per remaining consumer, and a phase of
slow answers ends at its deadline.

Against the real embedded Placement: a root in the legacy shape with many
pinned guests (as :mod:`tests.integration.reshape_bench` builds it), then
the agent's real client finds Placement frozen (SIGSTOP) or killed when it
starts reading the consumers, after the providers' view.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from node_agent.errors import PlacementError
from node_agent.model.cpuset import CpuSet
from node_agent.model.snapshot import Guest
from node_agent.placement.client import PlacementClient, Unavailable
from node_agent.placement.reshape_rules import pinned_to_pcpu
from node_agent.placement.reshaper import ensure_reshaped
from tests.integration.reshape_bench import HOST_CPUS, tree
from tests.integration.reshape_driver import allocate

TIMEOUT = 2.0  # [placement] timeout of the agent's client
GUESTS = 24  # at the old one-timeout-per-read, about 20 x TIMEOUT


class _FaultOnConsumerRead(PlacementClient):
    """The agent's client; ``fault`` runs once, just before its first
    consumer read (the providers' view has been read)."""

    fault = staticmethod(lambda: None)
    _done = False

    def consumer_allocations(self, consumer, microversion=None):
        if not self._done:
            self._done = True
            self.fault()
        return super().consumer_allocations(consumer, microversion)


def _legacy_host(url: str, n: int):
    scheduler = PlacementClient.for_endpoint(url)
    root, name = str(uuid.uuid4()), f"faults-{n}"
    for provider in tree(name, root, n, True, []).providers:
        scheduler.post("/resource_providers", {"name": provider.name, "uuid": provider.uuid})
        scheduler.put(
            f"/resource_providers/{provider.uuid}/inventories",
            {
                "resource_provider_generation": 0,
                "inventories": {rc: inv.as_placement() for rc, inv in provider.inventories.items()},
            },
        )
    guests = []
    for i in range(n):
        guest = Guest(
            uuid=str(uuid.uuid4()),
            name=f"guest-{i}",
            vcpus=1,
            running=True,
            memory_kb=256 * 1024,
            vcpupin=((0, CpuSet([i % (HOST_CPUS // 2)])),),
        )
        guests.append(guest)
        allocate(scheduler, guest.uuid, {root: {"VCPU": 1, "MEMORY_MB": 256}})
    rule = pinned_to_pcpu(guests, root, CpuSet(range(HOST_CPUS // 2)))
    return tree(name, root, n, False, []), guests, rule


def _reshape_against_fault(server, fault):
    desired, guests, rule = _legacy_host(server.url, GUESTS)
    agent = _FaultOnConsumerRead.for_endpoint(server.url, timeout=TIMEOUT)
    agent.fault = fault
    start = time.monotonic()
    with pytest.raises(Unavailable) as caught:
        ensure_reshaped(agent, desired, guests, rule)
    return time.monotonic() - start, caught.value, agent


def test_frozen_placement_ends_the_reshape_reads_within_two_timeouts(fresh_placement_server):
    pid = fresh_placement_server.proc.pid
    try:
        elapsed, error, agent = _reshape_against_fault(
            fresh_placement_server, lambda: os.kill(pid, signal.SIGSTOP)
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    assert elapsed < 2 * TIMEOUT, (elapsed, agent.stats.log[-10:])
    assert isinstance(error, PlacementError) and error.exit_code == 75
    assert f"did not answer within {TIMEOUT}s ([placement] timeout)" in str(error)
    # The reads in flight when it froze, not one per consumer.
    consumer_reads = [e for e in agent.stats.log if e[1].startswith("/allocations/")]
    assert len(consumer_reads) < GUESTS // 2, consumer_reads


def test_killed_placement_ends_the_reshape_reads_within_two_timeouts(fresh_placement_server):
    elapsed, error, agent = _reshape_against_fault(
        fresh_placement_server, fresh_placement_server.kill
    )
    assert elapsed < 2 * TIMEOUT, (elapsed, agent.stats.log[-10:])
    assert error.exit_code == 75
    assert "connection refused" in str(error)
    consumer_reads = {e[1] for e in agent.stats.log if e[1].startswith("/allocations/")}
    assert len(consumer_reads) < GUESTS // 2, consumer_reads


def _slow_placement(delay: float):
    """A server that answers every read as Placement would (an empty
    provider's inventories), each after ``delay`` seconds: alive, but slow."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(delay)
            data = json.dumps({"resource_provider_generation": 1, "inventories": {}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting, as it should

        def log_message(self, format, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_phase_of_slow_reads_ends_at_its_deadline_not_after_every_read():
    server = _slow_placement(0.7)
    try:
        agent = PlacementClient.for_endpoint(
            f"http://127.0.0.1:{server.server_address[1]}", timeout=TIMEOUT
        )

        def phase():
            with agent.deadline("the tree sync", 1.0):
                for _ in range(20):  # 14 s of reads, each well within the timeout
                    agent.inventories(str(uuid.uuid4()))

        start = time.monotonic()
        with pytest.raises(Unavailable) as caught:
            phase()
        elapsed = time.monotonic() - start
    finally:
        server.shutdown()
        server.server_close()
    # The second read's timeout is cut to the 0.3 s left: not 1.4 s.
    assert elapsed < 1.25, elapsed
    assert "what was left of the tree sync's deadline" in str(caught.value)
    assert caught.value.exit_code == 75
    assert agent.stats.reads == 2, agent.stats.log
    # Outside the block the session's timeout is back.
    assert agent._deadline is None
