"""Two real processes updating one state file keep each other's updates.

The service (the syncer's keys) and ``sudo node-agent maintenance on`` (the
maintenance key) write the same file; each read-modify-write must happen
under the store's lock or one of them silently loses the other's update.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from node_agent.state import MAINTENANCE, OWNED_CHILDREN, StateStore

# Each writer's own key (the keys the file's readers check for shape are not
# lists of counters).
SERVICE_KEY, COMMAND_KEY = "test_service_writes", "test_command_writes"
CHILD, OTHER = "0c8e7c1e-62f1-4a39-8d0e-6f0b8f3b2a11", "0b7e5f1c-3d2a-4e6f-8a9b-1c2d3e4f5a6b"

ROOT = Path(__file__).resolve().parents[2]
UPDATES = 150

# Each writer bumps a shared counter (the worst case: both touch one key)
# and keeps a list of its own writes under its own key.
WRITER = """
import sys
from pathlib import Path
from node_agent.state import StateStore

directory, key, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
store = StateStore(directory)
sys.stdout.write("ready\\n")
sys.stdout.flush()
sys.stdin.readline()  # start together

def step(n):
    def change(state):
        state["counter"] = state.get("counter", 0) + 1
        state[key] = state.get(key, []) + [n]
    return change

for n in range(count):
    store.update(step(n))
"""


def _writer(directory: Path, key: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), key, str(UPDATES)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    return process


def test_two_processes_updating_the_state_file_lose_no_update(tmp_path):
    writers = [_writer(tmp_path, COMMAND_KEY), _writer(tmp_path, SERVICE_KEY)]
    for process in writers:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    for process in writers:
        assert process.wait(timeout=600) == 0

    state = StateStore(tmp_path).load()
    assert state[COMMAND_KEY] == list(range(UPDATES))
    assert state[SERVICE_KEY] == list(range(UPDATES))
    assert state["counter"] == 2 * UPDATES


def test_an_update_keeps_the_keys_another_writer_saved(tmp_path):
    service, command = StateStore(tmp_path), StateStore(tmp_path)
    service.put(OWNED_CHILDREN, [CHILD])
    command.put(MAINTENANCE, {"on": True})
    assert service.put(OWNED_CHILDREN, [CHILD, OTHER]) == {
        OWNED_CHILDREN: [CHILD, OTHER],
        MAINTENANCE: {"on": True},
    }
