"""Unit tests reach neither the network nor the real ``/sys`` (STYLE.md,
habit 11): they take literal values and captured host files, so they give
the same answer on every machine.

An autouse fixture makes every unit test fail with :class:`ReachedOut`
when it (or a fixture it uses) connects, binds or sends on an IPv4/IPv6
socket, or opens, lists or stats a path under the real ``/sys``. Unix
sockets and every other path stay usable: a tree built in ``tmp_path`` or
read from ``tests/data`` is the way to test a sysfs reader.

A test that genuinely needs one of them says so with a marker, and
the reason::

    @pytest.mark.allow_network("binds 127.0.0.1:0 to prove the port check")
    @pytest.mark.allow_real_sys("compares the capture with this host")

``tests/unit/test_unit_guard.py`` proves the guard fails a test that tries.
"""

from __future__ import annotations

import builtins
import io
import os
import socket

import psutil  # noqa: F401 - see below
import pytest

# psutil probes /sys/devices/system/cpu when it is first imported (a module
# constant), whoever imports it: oslo.messaging does, through oslo.utils.
# Imported here, before any test, so that probe is not taken for a test's read.

NETWORK_MARK = "allow_network"
REAL_SYS_MARK = "allow_real_sys"
_INET = (socket.AF_INET, socket.AF_INET6)


class ReachedOut(AssertionError):
    """A unit test reached the network or the real /sys."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"{NETWORK_MARK}(reason): a unit test that must use an IPv4/IPv6 socket"
    )
    config.addinivalue_line(
        "markers", f"{REAL_SYS_MARK}(reason): a unit test that must read the real /sys"
    )


def _under_sys(path) -> bool:
    if isinstance(path, int):  # a file descriptor
        return False
    try:
        path = os.fsdecode(os.fspath(path))
    except TypeError:
        return False
    if not path.startswith("/"):
        return False
    path = os.path.normpath(path)
    return path == "/sys" or path.startswith("/sys/")


def _refuse_sys(name: str, real):
    def guarded(*args, **kwargs):
        path = args[0] if args else kwargs.get("file", kwargs.get("path"))
        if path is not None and _under_sys(path):
            raise ReachedOut(
                f"unit test {name}({os.fspath(path)!r}): unit tests do not read the real /sys. "
                f"Build the tree in tmp_path or use a capture under tests/data; if this test "
                f"must read this host, mark it @pytest.mark.{REAL_SYS_MARK}(reason)"
            )
        return real(*args, **kwargs)

    guarded.__wrapped__ = real  # type: ignore[attr-defined]
    return guarded


def _refuse_inet(name: str, real):
    def guarded(sock, *args, **kwargs):
        if sock.family in _INET:
            raise ReachedOut(
                f"unit test socket.{name}{args!r}: unit tests do not use the network. "
                f"Pass the data in, or move the test to tests/integration; if it must "
                f"open a socket, mark it @pytest.mark.{NETWORK_MARK}(reason)"
            )
        return real(sock, *args, **kwargs)

    guarded.__wrapped__ = real  # type: ignore[attr-defined]
    return guarded


@pytest.fixture(autouse=True)
def _no_network_no_real_sys(request, monkeypatch):
    if request.node.get_closest_marker(NETWORK_MARK) is None:
        # socket.create_connection and every client library end in one of these.
        for name in ("connect", "connect_ex", "bind", "sendto"):
            monkeypatch.setattr(
                socket.socket, name, _refuse_inet(name, getattr(socket.socket, name))
            )
    if request.node.get_closest_marker(REAL_SYS_MARK) is None:
        # pathlib goes through io.open, os.stat, os.listdir and os.scandir.
        for module, name in (
            (builtins, "open"),
            (io, "open"),
            (os, "open"),
            (os, "stat"),
            (os, "lstat"),
            (os, "listdir"),
            (os, "scandir"),
        ):
            real = getattr(module, name)
            monkeypatch.setattr(module, name, _refuse_sys(f"{module.__name__}.{name}", real))
