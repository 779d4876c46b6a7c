"""Capture what a real libvirtd answers on each virhostcpudata host.

For every ``tests/data/hostdata/virhostcpudata/linux-*`` tree: copy it
(``tests.hostdata.copy_tree``), start a private libvirtd
(``tests/integration/libvirtd.py``) in a mount namespace where the copy is
bind-mounted over ``/sys/devices/system``, and write what it answers on a
read-only connection: ``linux-<name>.xml`` (getCapabilities) and the
tree's entry in ``answers.json`` (getInfo, getCPUMap, libvirt's version,
and baselineCPU of the host ``<cpu>`` with its features expanded).
``this-machine`` is the machine running it: its own sysfs topology files
are copied to ``tests/data/realhost/system`` first, then read the same way.
Run as root with libvirtd and QEMU installed: ``make virhostcpu-caps``
(``generate.py NAME...`` for some trees only).
The suite reads the files only (tests/conformance/test_driver_conformance.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tests.hostdata import HOSTDATA, copy_tree  # noqa: E402
from tests.integration.libvirtd import Libvirtd, unavailable_reason  # noqa: E402

DATA = HERE.parent
# This machine's own sysfs topology, captured with its libvirtd's answers.
THIS_MACHINE = DATA / "realhost" / "system"


def capture(tree: Path, work: Path) -> tuple[str, dict]:
    import libvirt

    system = copy_tree(tree, work / "system")
    daemon = Libvirtd(work / "libvirtd", binds=((system, "/sys/devices/system"),))
    daemon.base.mkdir()
    try:
        daemon.start()
        conn = libvirt.openReadOnly(daemon.ro_uri)
        try:
            xml = conn.getCapabilities()
            answers = {
                name: _answer(lambda name=name: getattr(conn, name)())
                for name in ("getInfo", "getCPUMap", "getLibVersion")
            }
            # The host CPU with every feature its model implies, as nova
            # and the agent ask for it.
            cpu = ET.tostring(ET.fromstring(xml).find("host/cpu"), encoding="unicode")
            flags = libvirt.VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES
            answers["baselineCPU"] = _answer(lambda: conn.baselineCPU([cpu], flags))
        finally:
            conn.close()
    finally:
        daemon.stop()
    return xml, answers


def _answer(call) -> dict:
    """``{"value": ...}``, or libvirt's refusal as ``{"libvirt_error": [code,
    message]}`` (on some trees libvirt cannot count the node's memory)."""
    import libvirt

    try:
        value = call()
    except libvirt.libvirtError as exc:
        return {"libvirt_error": [exc.get_error_code(), str(exc)]}
    return {"value": list(value) if isinstance(value, tuple) else value}


# The files of this machine's /sys/devices/system that libvirt or the agent
# read (topology, caches, nodes, memory, huge pages), for ``this-machine``.
_KEEP = re.compile(
    r"cpu/(present|online|possible|offline|isolated|kernel_max"
    r"|cpu\d+/(online|topology/\w+|cache/index\d+/(level|type|size|id|shared_cpu_list)))"
    r"|node/(online|possible|has_cpu|has_memory|has_normal_memory"
    r"|node\d+/(cpulist|cpumap|distance|meminfo"
    r"|hugepages/hugepages-\d+kB/(nr|free|surplus)_hugepages))"
)


def snapshot_this_machine(dest: Path) -> Path:
    """This machine's sysfs topology files, copied to ``dest``."""
    source = Path("/sys/devices/system")
    shutil.rmtree(dest, ignore_errors=True)
    for top in ("cpu", "node"):
        for where, dirs, files in os.walk(source / top):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(where, d))]
            for name in files:
                rel = Path(where, name).relative_to(source)
                if _KEEP.fullmatch(rel.as_posix()):
                    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                    (dest / rel).write_text((source / rel).read_text())
    return dest


def main() -> int:
    reason = unavailable_reason()
    if reason:
        print(f"cannot capture: {reason}", file=sys.stderr)
        return 1
    # A tree without node/ is a kernel without NUMA; this machine's kernel
    # has it, so libvirt (libnuma) would find no node and count no memory:
    # not what libvirt says on that host.
    trees = {
        p.name: p for p in (HOSTDATA / "virhostcpudata").glob("linux-*") if (p / "node").is_dir()
    }
    trees["this-machine"] = THIS_MACHINE
    names = sys.argv[1:] or sorted(trees)
    path = HERE / "answers.json"
    every = json.loads(path.read_text()) if path.exists() else {}
    for name in names:
        if name == "this-machine":
            snapshot_this_machine(THIS_MACHINE)
        with tempfile.TemporaryDirectory(prefix="virhostcpu-caps-") as work:
            xml, answers = capture(trees[name], Path(work))
        (HERE / f"{name}.xml").write_text(xml)
        every[name] = dict(answers, tree=trees[name].relative_to(DATA).as_posix())
        print(f"{name}: {answers['getInfo']}")
    path.write_text(json.dumps(every, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
