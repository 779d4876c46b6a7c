"""The unit-test guard (tests/unit/conftest.py) fails a unit test that
reaches the network or the real /sys, and lets a marked one through."""

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit.conftest import ReachedOut

CONFTEST = Path(__file__).with_name("conftest.py")

# 192.0.2.1 is TEST-NET-1 (RFC 5737): nothing answers there even if the guard fails.
INNER_TESTS = """
import os
import socket
import urllib.request
from pathlib import Path

import pytest


def test_connects():
    socket.create_connection(("192.0.2.1", 9), timeout=0.1)


def test_fetches_a_url():
    urllib.request.urlopen("http://192.0.2.1:9/", timeout=0.1)


def test_opens_real_sys():
    open("/sys/devices/system/cpu/online").read()


def test_reads_real_sys_through_pathlib():
    Path("/sys/devices/system/cpu/online").read_text()


def test_lists_real_sys():
    os.listdir("/sys/devices/system/cpu")


def test_stats_real_sys():
    os.path.exists("/sys/devices/system/node")


def test_reads_its_own_tree(tmp_path):
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys" / "online").write_text("0-3\\n")
    assert (tmp_path / "sys" / "online").read_text() == "0-3\\n"


def test_uses_a_unix_socket():
    a, b = socket.socketpair(socket.AF_UNIX)
    a.sendall(b"x")
    assert b.recv(1) == b"x"


@pytest.mark.allow_real_sys("proves the marker lets a test through")
def test_marked_may_stat_real_sys():
    os.path.exists("/sys/devices/system/cpu")


@pytest.mark.allow_network("proves the marker lets a test through")
def test_marked_may_bind():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
"""


def test_a_unit_test_that_reaches_out_fails_and_a_marked_one_passes(tmp_path):
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER_TESTS))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rf",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    failed = {
        line.split("::")[1].split()[0] for line in out.splitlines() if line.startswith("FAILED")
    }
    assert failed == {
        "test_connects",
        "test_fetches_a_url",
        "test_opens_real_sys",
        "test_reads_real_sys_through_pathlib",
        "test_lists_real_sys",
        "test_stats_real_sys",
    }, out
    assert "6 failed, 4 passed" in out, out
    assert "ReachedOut: unit test socket.connect" in out, out
    assert "unit tests do not read the real /sys" in out, out


def test_the_guard_is_on_in_this_suite():
    with pytest.raises(ReachedOut, match="allow_network"):
        socket.create_connection(("192.0.2.1", 9), timeout=0.1)
    with pytest.raises(ReachedOut, match="allow_real_sys"):
        Path("/sys/devices/system/cpu/online").read_text()
