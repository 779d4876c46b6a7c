"""A private, real ``libvirtd`` with real QEMU guests, for integration tests.

The daemon runs in its own mount namespace (``unshare --mount``), where
``/etc/libvirt``, ``/run`` and ``/var`` are bind mounts of directories under
one temporary directory. So nothing it writes lands in the host's ``/etc``,
``/var`` or ``/run`` (the qemu driver keeps its state under
``/run/libvirt/qemu``, which would otherwise collide with any other libvirtd),
and every process it starts (``virtlogd``, QEMU) is recognisable by that
namespace: when the namespace ends (:meth:`Libvirtd.stop`, or the test
process dying), whatever is left in it is killed.

Guests run as root without a security driver (``security_driver = "none"``,
``dynamic_ownership = 0``) and without cgroups, so no AppArmor or cgroup tree
is needed. libvirtd still looks its default ``libvirt-qemu`` user up at
start; where the host lacks it (no libvirt-daemon-system), the namespace gets
an ``/etc/passwd`` and ``/etc/group`` that name it. Guests are QEMU under
TCG (``<domain type='qemu'>``), with no disk and a few MiB of memory, and
idle cheaply.

The agent connects exactly as in production, read-only, only the URI
differs: ``qemu+unix:///system?socket=<dir>/run/libvirt/libvirt-sock-ro``. The
fixture itself defines and destroys guests over the read-write socket.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

# `uname -m` -> the QEMU system emulator Debian ships for it.
QEMU_BY_MACHINE = {
    "x86_64": "qemu-system-x86_64",
    "aarch64": "qemu-system-aarch64",
    "ppc64le": "qemu-system-ppc64",
    "s390x": "qemu-system-s390x",
}
# The machine type each emulator runs a no-disk guest with.
MACHINE_TYPE = {"x86_64": "pc", "aarch64": "virt", "ppc64le": "pseries", "s390x": "s390-ccw-virtio"}

# Host paths the daemon sees replaced by directories of its own: whole /run
# and /var, because /var/lib/libvirt and friends may not exist on the host
# (no libvirt-daemon-system) and a bind mount needs an existing target.
_PRIVATE = ("etc/libvirt", "run", "var")
_VAR_DIRS = ("lib/libvirt", "log/libvirt", "cache/libvirt", "tmp")

NOVA_NS = "http://openstack.org/xmlns/libvirt/nova/1.1"

# The process holding the namespace (after the mounts, exec'd by its shell).
# It starts the daemons (one JSON line on stdin: argv and a stderr file; it
# answers the pid) and is the subreaper of everything started in the
# namespace, so a QEMU that exits is reaped at once (libvirt's destroy waits
# until the pid is gone; left to a lazy init, that takes seconds). When its
# stdin closes (stop(), or the test process dying, even by SIGKILL) it
# SIGKILLs every other process of its mount namespace, twice in case one
# forked meanwhile, and exits.
_HOLDER = """
import ctypes, json, os, sys, threading, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER

def reap():
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.05)

threading.Thread(target=reap, daemon=True).start()
for line in sys.stdin:
    request = json.loads(line)
    out = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    pid = os.posix_spawnp(request["argv"][0], request["argv"], os.environ, file_actions=[
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, request["stderr"], out, 0o644)])
    print(pid, flush=True)
me = os.readlink("/proc/self/ns/mnt")
for _ in range(2):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(pid) != os.getpid() and os.readlink(f"/proc/{pid}/ns/mnt") == me:
                os.kill(int(pid), 9)
        except OSError:
            pass
    time.sleep(0.2)
"""


class _Daemon:
    """A process the holder started: not our child, so watched through /proc
    (the holder reaps it the moment it exits)."""

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self) -> Optional[str]:
        """None while it runs, else "ended" (the exit code went to the holder)."""
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return "ended"
        return "ended" if state in ("Z", "X") else None

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.02)


def unavailable_reason() -> Optional[str]:
    """Why a private libvirtd cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return (
            "a private libvirtd with QEMU guests needs root (its own mount "
            "namespace, guests running as root); run the suite as root, as CI does"
        )
    missing = [
        name for name in ("libvirtd", "virtlogd", "unshare", emulator_name()) if not _which(name)
    ]
    if missing:
        return (
            f"{', '.join(missing)} not installed: `make install` adds Debian's "
            "libvirt-daemon, libvirt-daemon-driver-qemu and the QEMU emulator"
        )
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"cannot create a private mount namespace for libvirtd: {probe.stderr.strip()}"
    return None


def emulator_name() -> str:
    return QEMU_BY_MACHINE.get(platform.machine(), f"qemu-system-{platform.machine()}")


def _which(name: str) -> Optional[str]:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def hugepage_reason(memory_kib: int) -> Optional[str]:
    """Why a guest of ``memory_kib`` cannot be backed by huge pages here, or
    None. The daemon mounts its own hugetlbfs, so free pages are all it needs."""
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    free = int(meminfo.get("HugePages_Free", "0").split()[0])
    size_kib = int(meminfo.get("Hugepagesize", "0 kB").split()[0])
    if free * size_kib < memory_kib:
        return (
            f"the host has {free} free huge pages of {size_kib} KiB, fewer than the "
            f"{memory_kib} KiB the guest needs (set vm.nr_hugepages to try it)"
        )
    return None


def _free_id(used: set[int]) -> int:
    """An unused uid/gid in the range Debian gives system packages' users;
    marked used."""
    found = next(n for n in range(64055, 65000) if n not in used)
    used.add(found)
    return found


def _wait_or_kill(proc, timeout: float) -> None:
    """Wait for ``proc`` (a Popen or a _Daemon) to end; SIGKILL it after ``timeout``."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Libvirtd:
    """One private libvirtd (plus its virtlogd) under ``base``.

    ``start``/``stop``/``restart`` control the daemon; guests survive a
    restart (libvirtd reattaches to running QEMU processes) and are
    destroyed by :meth:`stop`, together with anything else left in the
    namespace.
    """

    def __init__(self, base: Path, binds: tuple[tuple[Path, str], ...] = ()):
        """``binds``: more (directory, mount point) pairs for the namespace,
        e.g. a sysfs tree over ``/sys/devices/system``."""
        self.base = base
        self.binds = binds
        self.run_dir = base / "run/libvirt"
        self.log_dir = base / "log"
        self.ro_uri = f"qemu+unix:///system?socket={self.run_dir}/libvirt-sock-ro"
        self.rw_uri = f"qemu+unix:///system?socket={self.run_dir}/libvirt-sock"
        self.proc: Optional[_Daemon] = None
        self._holder: Optional[subprocess.Popen] = None
        self._rw = None

    # -- the namespace and its daemons

    def _write_config(self) -> None:
        for rel in _PRIVATE:
            (self.base / rel).mkdir(parents=True, exist_ok=True)
        for rel in _VAR_DIRS:
            (self.base / "var" / rel).mkdir(parents=True, exist_ok=True)
        if not (self.base / "var/run").is_symlink():
            (self.base / "var/run").symlink_to("/run")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.base / "hugepages").mkdir(exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        etc = self.base / "etc/libvirt"
        (etc / "libvirtd.conf").write_text(
            f'unix_sock_dir = "{self.run_dir}"\n'
            'auth_unix_ro = "none"\nauth_unix_rw = "none"\n'
            f'log_outputs = "3:file:{self.log_dir}/libvirtd.log"\n'
        )
        (etc / "virtlogd.conf").write_text(f'log_outputs = "3:file:{self.log_dir}/virtlogd.log"\n')
        (etc / "qemu.conf").write_text(
            'user = "root"\ngroup = "root"\ndynamic_ownership = 0\n'
            'security_driver = "none"\ncgroup_controllers = [ ]\n'
            "remember_owner = 0\n"
            # QEMU stays in this namespace (no private /dev of its own), so
            # the holder's sweep finds it.
            "namespaces = [ ]\n"
            f'hugetlbfs_mount = "{self.base / "hugepages"}"\n'
        )

    def _accounts(self) -> list[tuple[str, str]]:
        """Private /etc/passwd and /etc/group naming the qemu driver's default
        user and groups: libvirtd looks them up at start even when qemu.conf
        says root, and they exist only with libvirt-daemon-system installed.
        Returns the bind mounts needed (none when the host has them)."""
        import grp
        import pwd

        binds = []
        group_ids = {g.gr_gid for g in grp.getgrall()}
        names = {g.gr_name for g in grp.getgrall()}
        added = [
            f"{name}:x:{_free_id(group_ids)}:\n"
            for name in ("kvm", "libvirt-qemu")
            if name not in names
        ]
        if added:
            (self.base / "group").write_text(Path("/etc/group").read_text() + "".join(added))
            binds.append(("group", "/etc/group"))
        users = {p.pw_name: p.pw_uid for p in pwd.getpwall()}
        if "libvirt-qemu" not in users:
            uid = _free_id(set(users.values()))
            (self.base / "passwd").write_text(
                Path("/etc/passwd").read_text()
                + f"libvirt-qemu:x:{uid}:{uid}::/var/lib/libvirt:/usr/sbin/nologin\n"
            )
            binds.append(("passwd", "/etc/passwd"))
        return binds

    def start(self) -> "Libvirtd":
        """Start the namespace (held by the ``_HOLDER`` process), virtlogd, then
        libvirtd; return once the read-only socket answers. A no-op while
        libvirtd runs."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        if self._holder is None:
            self._write_config()
            mounts = [(self.base / rel, f"/{rel}") for rel in _PRIVATE] + [
                (self.base / rel, target) for rel, target in self._accounts()
            ]
            mounts += [(Path(source), target) for source, target in self.binds]
            binds = " && ".join(
                f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}"
                for source, target in mounts
            )
            # Optional: without it only the hugepage-backed guest is skipped.
            huge = shlex.quote(str(self.base / "hugepages"))
            binds += f" && (mount -t hugetlbfs hugetlbfs {huge} || true)"
            # The holder keeps the namespace alive across libvirtd restarts,
            # and ends it when its stdin closes: on stop(), or when the test
            # process dies, even by SIGKILL.
            self._holder = subprocess.Popen(
                [
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    f"{binds} && exec {shlex.quote(sys.executable)} -c {shlex.quote(_HOLDER)}",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            self._wait(self._mounted, "the private mount namespace", self._holder)
            virtlogd = self._spawn(
                ["virtlogd", "--pid-file", str(self.base / "virtlogd.pid")], "virtlogd.stderr"
            )
            self._wait(lambda: (self.run_dir / "virtlogd-sock").exists(), "virtlogd", virtlogd)
        self._start_libvirtd()
        return self

    def _mounted(self) -> bool:
        try:
            return " /var " in Path(f"/proc/{self._holder.pid}/mounts").read_text()
        except OSError:
            return False

    def hugepage_reason(self, memory_kib: int) -> Optional[str]:
        """Why a guest of ``memory_kib`` cannot be backed by huge pages, or None."""
        mounts = Path(f"/proc/{self._holder.pid}/mounts").read_text()
        if f" {self.base / 'hugepages'} hugetlbfs " not in mounts:
            return "hugetlbfs could not be mounted in libvirtd's namespace"
        return hugepage_reason(memory_kib)

    def _spawn(self, argv: list[str], stderr: str) -> _Daemon:
        """Start ``argv`` in the namespace, as a child of the holder."""
        import json

        self._holder.stdin.write(
            json.dumps({"argv": argv, "stderr": str(self.log_dir / stderr)}) + "\n"
        )
        self._holder.stdin.flush()
        return _Daemon(int(self._holder.stdout.readline()))

    def _start_libvirtd(self) -> None:
        sock = self.run_dir / "libvirt-sock-ro"
        sock.unlink(missing_ok=True)
        self.proc = self._spawn(
            ["libvirtd", "--pid-file", str(self.base / "libvirtd.pid")], "libvirtd.stderr"
        )
        self._wait(self._answers, "libvirtd's read-only socket", self.proc)

    def _answers(self) -> bool:
        import libvirt

        try:
            libvirt.openReadOnly(self.ro_uri).close()
            return True
        except libvirt.libvirtError:
            return False

    def _wait(self, ready, what, proc, timeout=30.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                ended = getattr(proc, "stderr", None) and proc.poll() is not None
                stderr = proc.stderr.read() if ended else ""
                raise RuntimeError(
                    f"{what} did not come up (exit {proc.poll()}) {stderr}; "
                    f"see {self.log_dir}: {self.log_tail()}"
                )
            time.sleep(0.05)

    def log_tail(self, lines: int = 15) -> str:
        path = self.log_dir / "libvirtd.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        err = self.log_dir / "libvirtd.stderr"
        text += err.read_text(errors="replace") if err.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop_daemon(self) -> None:
        """Stop libvirtd only (guests and virtlogd keep running)."""
        if self._rw is not None:
            try:
                self._rw.close()
            except Exception:  # a connection to a dying daemon may not close cleanly
                pass
            self._rw = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            _wait_or_kill(self.proc, 20)
        self.proc = None

    def restart(self) -> None:
        self.stop_daemon()
        self._start_libvirtd()

    def stop(self) -> None:
        """Destroy every guest, stop libvirtd and virtlogd, and end anything
        still running in the namespace. Safe to call more than once."""
        if self._holder is None:
            return
        try:
            if self.proc is not None and self.proc.poll() is None:
                for dom in self.rw().listAllDomains(0):
                    try:
                        dom.destroy()
                    except Exception:  # already gone; the holder's sweep ends the rest
                        pass
        except Exception:
            pass
        self.stop_daemon()
        self._holder.stdin.close()  # the holder kills what is left, then exits
        _wait_or_kill(self._holder, 30)
        self._holder = None

    # -- guests, over the read-write socket

    def rw(self):
        import libvirt

        if self._rw is None:
            self._rw = libvirt.open(self.rw_uri)
        return self._rw

    def start_guest(self, xml: str):
        """Create a transient guest (no persistent definition) and start it."""
        return self.rw().createXML(xml, 0)

    def destroy_guest(self, uuid: str) -> None:
        self.rw().lookupByUUIDString(uuid).destroy()


def guest_xml(
    name: str,
    uuid: str,
    *,
    vcpus: int = 1,
    memory_kib: int = 65536,
    pins: Optional[dict[int, str]] = None,
    numa_nodeset: Optional[str] = None,
    hugepages: bool = False,
    nova: Optional[dict] = None,
) -> str:
    """A QEMU guest with no disk, ``<domain type='qemu'>`` (TCG, no KVM needed).

    ``pins``: vCPU -> host cpuset (``<vcpupin>``); ``numa_nodeset``: strict
    ``<numatune>``; ``nova``: flavor name, vcpus and memory_mb for nova's
    ``<metadata>``, as nova writes it.
    """
    arch = platform.machine()
    cputune = ""
    if pins:
        cputune = (
            "<cputune>"
            + "".join(
                f"<vcpupin vcpu='{vcpu}' cpuset='{cpus}'/>" for vcpu, cpus in sorted(pins.items())
            )
            + "</cputune>"
        )
    numatune = (
        f"<numatune><memory mode='strict' nodeset='{numa_nodeset}'/></numatune>"
        if numa_nodeset is not None
        else ""
    )
    backing = "<memoryBacking><hugepages/></memoryBacking>" if hugepages else ""
    metadata = ""
    if nova:
        metadata = (
            f"<metadata><nova:instance xmlns:nova='{NOVA_NS}'>"
            f"<nova:name>{name}</nova:name>"
            f"<nova:flavor name='{nova['flavor']}'><nova:memory>{nova['memory_mb']}"
            f"</nova:memory><nova:vcpus>{vcpus}</nova:vcpus></nova:flavor>"
            "</nova:instance></metadata>"
        )
    return (
        f"<domain type='qemu'><name>{name}</name><uuid>{uuid}</uuid>{metadata}"
        f"<memory unit='KiB'>{memory_kib}</memory><vcpu placement='static'>{vcpus}</vcpu>"
        f"{cputune}{numatune}{backing}"
        f"<os><type arch='{arch}' machine='{MACHINE_TYPE.get(arch, 'virt')}'>hvm</type></os>"
        f"<devices><emulator>{_which(emulator_name()) or emulator_name()}</emulator>"
        "</devices></domain>"
    )
