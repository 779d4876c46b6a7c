"""The soak's host: a writable copy of a real sysfs fixture tree and a
libvirt test-driver XML whose guests come and go.

Every file is replaced with write-to-temp + rename, as the kernel's
attributes change in one step: a cycle never sees half a write.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import uuid
from pathlib import Path

from soak.model import cpulist
from tests.hostdata import HOSTDATA

FIXTURE = HOSTDATA / "virhostcpudata" / "linux-test4"  # 16 CPUs, 2 nodes
HOST_XML = Path(__file__).resolve().parents[1] / "tests" / "data" / "libvirt" / "host.xml"
FIXTURE_GUEST_PREFIX = "11111111-0000-4000-8000-0000000000"
# An unpinned, running guest of host.xml: the template of the guests that boot.
_TEMPLATE = re.compile(
    r'  <domain type="test"[^>]*>\s*<name>instance-00000003</name>'
    r".*?</domain>\n",
    re.S,
)
_MEMTOTAL = re.compile(r"MemTotal:\s+(\d+) kB")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".soak-tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _make_writable(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, os.stat(dirpath).st_mode | stat.S_IWUSR | stat.S_IXUSR)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR)


class SoakHost:
    """``sysroot`` is the agent's ``[host] sysfs_root``; ``uri`` its libvirt URI."""

    def __init__(self, workdir: Path, fixture: Path = FIXTURE):
        self.sysroot = workdir / "sysroot"
        self.system = self.sysroot / "devices" / "system"
        shutil.copytree(fixture, self.system, symlinks=True)
        _make_writable(self.sysroot)
        cpu_dir = self.system / "cpu"
        self.present = sorted(int(p.name[3:]) for p in cpu_dir.glob("cpu[0-9]*"))
        # cpu0 has no cpuN/online in this tree: it cannot be taken offline.
        self.hotpluggable = [c for c in self.present if (cpu_dir / f"cpu{c}" / "online").exists()]
        self.online = set(self.present)
        self.set_online(self.online)
        self.memory_mb = self._node_memory_mb()
        self.xml_path = workdir / "host.xml"
        prefix = str(uuid.uuid4())[:-2]
        base = HOST_XML.read_text().replace(FIXTURE_GUEST_PREFIX, prefix)
        self._template = _TEMPLATE.search(base).group(0)
        self._base = base
        self.fixture_guests = [prefix + f"{n:02d}" for n in range(1, 7)]
        self.booted: dict[str, str] = {}  # guest uuid -> its domain XML
        self._write_xml()

    @property
    def uri(self) -> str:
        return f"test://{self.xml_path}"

    # -- CPUs

    def set_online(self, cpus) -> None:
        cpus = set(cpus)
        cpu_dir = self.system / "cpu"
        for cpu in self.hotpluggable:
            _write(cpu_dir / f"cpu{cpu}" / "online", "1\n" if cpu in cpus else "0\n")
        _write(cpu_dir / "online", cpulist(cpus) + "\n")
        self.online = cpus

    def _node_memory_mb(self) -> int:
        total_kb = 0
        for meminfo in sorted((self.system / "node").glob("node[0-9]*/meminfo")):
            total_kb += int(_MEMTOTAL.search(meminfo.read_text()).group(1))
        return total_kb // 1024

    # -- guests

    def boot(self, guest: str, name: str) -> None:
        domain = re.sub(r"<name>[^<]*</name>", f"<name>{name}</name>", self._template, count=1)
        domain = re.sub(r"<uuid>[^<]*</uuid>", f"<uuid>{guest}</uuid>", domain, count=1)
        self.booted[guest] = domain
        self._write_xml()

    def destroy(self, guest: str) -> None:
        self.booted.pop(guest)
        self._write_xml()

    def _write_xml(self) -> None:
        extra = "".join(self.booted.values())
        _write(self.xml_path, self._base.replace("</node>", extra + "</node>"))
