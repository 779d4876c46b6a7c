"""Write the guest XML nova 34's libvirt driver produces, with nova's own answer.

Run under nova's virtualenv, never the agent's (``make nova-guests``)::

    PYTHONPATH= .venv-nova/bin/python tests/data/nova_guests/generate.py [OUTDIR] [CASE...]

For every host below and every flavor/image case nova accepts on it, this
uses nova's own code end to end: the fake libvirt connection of nova's test
fixtures reports the host, ``LibvirtDriver._get_host_numa_topology`` turns it
into the host's NUMA topology under the host's ``cpu_dedicated_set`` and
``cpu_shared_set``, ``hardware.numa_get_constraints`` and
``hardware.numa_fit_instance_to_host`` place the guest (its pins are nova's
choice, not ours), and ``LibvirtDriver._get_guest_xml`` writes the domain.
nova's answer comes from the same objects: the CPU policy, the dedicated
vCPUs and the emulator threads policy of the fitted instance topology, and
the VCPU/PCPU/MEMORY_MB of ``ResourceRequest.from_request_spec``, what the
scheduler asks Placement for.

Files written into OUTDIR (default: this directory):

* ``xml/<host>--<case>.xml``  the domain nova wrote;
* ``xml/<host>--<case>.pre-extra-specs.xml``  the same domain without
  ``<nova:extraSpecs>`` and the image's ``<nova:properties>``, as nova
  wrote it before it recorded them (only the pins are left to read);
* ``cases.json``  per case: the host, the flavor, the image properties,
  nova's answer, and what the pinning shape alone can tell (see
  ``_shape``).

Deterministic: fixed uuids (uuid5 of the case name), a fixed creation time,
no temporary paths in the XML; CASE names limit the run to those cases.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import sys
import tempfile
import types
import uuid
import warnings
from pathlib import Path
from unittest import mock

warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)

import nova.conf  # noqa: E402
import nova.tests  # noqa: E402


def _fixtures_package() -> None:
    """Make ``nova.tests.fixtures`` importable without its ``__init__``.

    That ``__init__`` imports every fixture, some through oslo.db's test
    fixtures and testtools, which nova's runtime requirements (and so
    .venv-nova) lack; the fake libvirt modules need neither.
    """
    package = types.ModuleType("nova.tests.fixtures")
    package.__path__ = [str(Path(nova.tests.__file__).parent / "fixtures")]
    sys.modules["nova.tests.fixtures"] = package


_fixtures_package()
from nova import context as nova_context  # noqa: E402
from nova import objects  # noqa: E402
from nova import version as nova_version  # noqa: E402
from nova.scheduler import utils as scheduler_utils  # noqa: E402
from nova.tests.fixtures import libvirt as fakelibvirt  # noqa: E402
from nova.virt import driver as virt_driver  # noqa: E402
from nova.virt import fake as fake_virt  # noqa: E402
from nova.virt import hardware  # noqa: E402
from nova.virt.libvirt import blockinfo  # noqa: E402
from nova.virt.libvirt import driver as libvirt_driver  # noqa: E402

CONF = nova.conf.CONF
HERE = Path(__file__).resolve().parent
NAMESPACE = uuid.UUID("6c1f3a52-0d4e-4b8e-9a57-2f3f7d1c9b10")
CREATION_TIME = 1700000000.0
USER_ID = "8a2c3e0e-1b7f-4c55-9d2a-5e6f7a8b9c0d"
PROJECT_ID = "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9"
IMAGE_ID = "155d900f-4e14-4e4c-a73d-069cbf4541e6"

# Per cell: 4 KiB pages for the rest of the cell's memory and 1024 pages of
# 2 MiB, so hw:mem_page_size=2MB fits a 1 GiB guest in any one cell.
HUGE_2M = 1024

# name -> the fake host nova's fixtures build, and its CPU sets.
HOSTS = {
    # One NUMA node, 8 cores without SMT: 2 shared CPUs, 6 dedicated.
    "one-node": dict(
        topology=dict(cpu_nodes=1, cpu_sockets=1, cpu_cores=8, cpu_threads=1),
        cpu_shared_set="0-1",
        cpu_dedicated_set="2-7",
    ),
    # Two NUMA nodes of 3 cores x 2 threads (node 0: CPUs 0-5, node 1: 6-11);
    # the first core of each node shared, the rest dedicated.
    "two-nodes-smt": dict(
        topology=dict(cpu_nodes=2, cpu_sockets=1, cpu_cores=3, cpu_threads=2),
        cpu_shared_set="0-1,6-7",
        cpu_dedicated_set="2-5,8-11",
    ),
    # One node whose shared set is a single CPU: the shape of a floating vCPU
    # or of a shared emulator pin is that of a dedicated one. Only the cases
    # that show it (and a dedicated and a shared baseline).
    "one-shared-cpu": dict(
        topology=dict(cpu_nodes=1, cpu_sockets=1, cpu_cores=6, cpu_threads=1),
        cpu_shared_set="0",
        cpu_dedicated_set="1-5",
        cases=[
            "no-policy",
            "dedicated",
            "shared-numa1-one-vcpu",
            "dedicated-emulator-share",
            "dedicated-emulator-isolate",
            "mixed-one-floating",
            "mixed-emulator-share",
            "mixed-emulator-isolate",
            "image-mixed",
        ],
    ),
}

# name -> (flavor vCPUs, extra specs, image properties); 1 GiB each.
CASES = {
    "no-policy": (4, {}, {}),
    "shared": (4, {"hw:cpu_policy": "shared"}, {}),
    "shared-numa1": (2, {"hw:numa_nodes": "1"}, {}),
    "shared-numa1-one-vcpu": (1, {"hw:numa_nodes": "1"}, {}),
    "shared-numa2": (4, {"hw:cpu_policy": "shared", "hw:numa_nodes": "2"}, {}),
    "shared-hugepages": (2, {"hw:mem_page_size": "2MB"}, {}),
    "shared-emulator-share": (2, {"hw:numa_nodes": "1", "hw:emulator_threads_policy": "share"}, {}),
    "dedicated": (4, {"hw:cpu_policy": "dedicated"}, {}),
    "dedicated-one-vcpu": (1, {"hw:cpu_policy": "dedicated"}, {}),
    "dedicated-numa2": (4, {"hw:cpu_policy": "dedicated", "hw:numa_nodes": "2"}, {}),
    "dedicated-hugepages": (2, {"hw:cpu_policy": "dedicated", "hw:mem_page_size": "large"}, {}),
    "dedicated-thread-isolate": (
        2,
        {"hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": "isolate"},
        {},
    ),
    "dedicated-emulator-isolate": (
        2,
        {"hw:cpu_policy": "dedicated", "hw:emulator_threads_policy": "isolate"},
        {},
    ),
    "dedicated-emulator-share": (
        2,
        {"hw:cpu_policy": "dedicated", "hw:emulator_threads_policy": "share"},
        {},
    ),
    "dedicated-realtime": (
        3,
        {"hw:cpu_policy": "dedicated", "hw:cpu_realtime": "yes", "hw:cpu_realtime_mask": "^0"},
        {},
    ),
    "mixed-mask": (4, {"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "2-3"}, {}),
    "mixed-mask-exclude": (4, {"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "^0-1"}, {}),
    "mixed-one-floating": (3, {"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "^0"}, {}),
    "mixed-realtime": (
        4,
        {"hw:cpu_policy": "mixed", "hw:cpu_realtime": "yes", "hw:cpu_realtime_mask": "^0-1"},
        {},
    ),
    # 'on' is as true as 'yes' to nova (strutils.bool_from_string).
    "mixed-realtime-on": (
        4,
        {"hw:cpu_policy": "mixed", "hw:cpu_realtime": "on", "hw:cpu_realtime_mask": "^0"},
        {},
    ),
    "mixed-emulator-isolate": (
        4,
        {
            "hw:cpu_policy": "mixed",
            "hw:cpu_dedicated_mask": "^0",
            "hw:emulator_threads_policy": "isolate",
        },
        {},
    ),
    "mixed-emulator-share": (
        4,
        {
            "hw:cpu_policy": "mixed",
            "hw:cpu_dedicated_mask": "^0",
            "hw:emulator_threads_policy": "share",
        },
        {},
    ),
    "resources-vcpu": (4, {"resources:VCPU": "2"}, {}),
    "resources-vcpu-numa1": (2, {"resources:VCPU": "1", "hw:numa_nodes": "1"}, {}),
    "resources-vcpu-zero": (2, {"resources:VCPU": "0"}, {}),
    "resources-pcpu": (2, {"resources:PCPU": "2"}, {}),
    # A numbered group's PCPU counts as the unnumbered one's (nova's
    # _get_vcpu_pcpu_resources): the guest is dedicated all the same.
    "resources-suffixed-pcpu": (2, {"resources1:PCPU": "2"}, {}),
    "resources-split-pcpu": (2, {"resources:PCPU": "1", "resources1:PCPU": "1"}, {}),
    "resources-suffixed-vcpu": (4, {"resources1:VCPU": "2"}, {}),
    "resources-pcpu-emulator-isolate": (
        2,
        {"resources:PCPU": "3", "hw:emulator_threads_policy": "isolate"},
        {},
    ),
    "image-dedicated": (2, {}, {"hw_cpu_policy": "dedicated"}),
    "image-mixed": (4, {"hw:cpu_dedicated_mask": "^0"}, {"hw_cpu_policy": "mixed"}),
    "image-shared-numa1": (2, {"hw:numa_nodes": "1"}, {"hw_cpu_policy": "shared"}),
    "image-realtime-mask": (
        4,
        {"hw:cpu_policy": "mixed", "hw:cpu_realtime": "yes", "hw:cpu_realtime_mask": "^0"},
        {"hw_cpu_realtime_mask": "^0-1"},
    ),
}
MEMORY_MB = 1024
CPU_RATIO = 4.0

_EXTRA_SPECS = re.compile(r"\s*<nova:extraSpecs(?:/>|>.*?</nova:extraSpecs>)", re.S)
_PROPERTIES = re.compile(r"\s*<nova:properties(?:/>|>.*?</nova:properties>)", re.S)


def pre_extra_specs(xml: str) -> str:
    """``xml`` as nova wrote it before it recorded the specs and properties."""
    stripped = _PROPERTIES.sub("", _EXTRA_SPECS.sub("", xml))
    if "extraSpec" in stripped or "nova:propert" in stripped:
        raise AssertionError("a nova:extraSpecs or nova:properties element was left")
    return stripped


def _mempages(cells: int, kb_per_cell: int):
    huge_kb = HUGE_2M * 2048
    return {
        cell: fakelibvirt.create_mempages([(4, (kb_per_cell - huge_kb) // 4), (2048, HUGE_2M)])
        for cell in range(cells)
    }


class Host:
    """One fake compute host: nova's libvirt driver on nova's fake libvirt."""

    def __init__(self, name: str, spec: dict):
        self.name = name
        self.spec = spec
        topo = spec["topology"]
        cells = topo["cpu_nodes"] * topo["cpu_sockets"]
        kb_mem = 16 * 1024 * 1024
        self.info = fakelibvirt.HostInfo(
            kB_mem=kb_mem, mempages=_mempages(cells, kb_mem // cells), **topo
        )
        self.connection = fakelibvirt.Connection(
            "qemu:///system",
            version=fakelibvirt.FAKE_LIBVIRT_VERSION,
            hv_version=fakelibvirt.FAKE_QEMU_VERSION,
            host_info=self.info,
        )

    def config(self) -> dict:
        return {
            "name": self.name,
            **{k: v for k, v in self.spec.items() if k != "cases"},
            "cpus": self.info.cpus,
            "cpu_allocation_ratio": CPU_RATIO,
            "hugepages_2M_per_cell": HUGE_2M,
        }


def _flavor(case: str, vcpus: int, extra_specs: dict) -> "objects.Flavor":
    return objects.Flavor(
        id=1,
        flavorid=f"flavor-{case}",
        name=case,
        memory_mb=MEMORY_MB,
        vcpus=vcpus,
        root_gb=10,
        ephemeral_gb=0,
        swap=0,
        vcpu_weight=None,
        rxtx_factor=1.0,
        extra_specs=dict(extra_specs),
    )


def _instance(host: Host, case: str, flavor, image_props: dict, numa_topology):
    system_metadata = {
        "image_base_image_ref": IMAGE_ID,
        "image_disk_format": "raw",
        "image_name": "cirros",
        **{f"image_{k}": v for k, v in image_props.items()},
    }
    return objects.Instance(
        id=1,
        uuid=str(uuid.uuid5(NAMESPACE, f"{host.name}/{case}")),
        display_name=f"{host.name}-{case}",
        project_id=PROJECT_ID,
        user_id=USER_ID,
        image_ref=IMAGE_ID,
        root_gb=10,
        ephemeral_gb=0,
        vcpus=flavor.vcpus,
        memory_mb=flavor.memory_mb,
        system_metadata=system_metadata,
        flavor=flavor,
        old_flavor=None,
        new_flavor=None,
        instance_type_id=1,
        numa_topology=numa_topology,
        pci_devices=objects.PciDeviceList(),
        config_drive=None,
        vm_mode=None,
        vm_state=None,
        task_state=None,
        kernel_id=None,
        ramdisk_id=None,
        os_type="linux",
        ephemeral_key_uuid=None,
        vcpu_model=None,
        host="compute1",
        node="compute1",
        trusted_certs=None,
        resources=None,
        migration_context=None,
        info_cache=None,
        cleaned=False,
    )


def _resources(flavor, image_meta) -> dict:
    spec = objects.RequestSpec(
        flavor=flavor, image=image_meta, is_bfv=False, requested_resources=[]
    )
    request = scheduler_utils.ResourceRequest.from_request_spec(spec)
    merged = request.merged_resources()
    return {rc: merged.get(rc, 0) for rc in ("VCPU", "PCPU", "MEMORY_MB")}


def _pins(xml: str) -> tuple[dict[int, set[int]], set[int] | None]:
    import xml.etree.ElementTree as ET

    root = ET.fromstring(xml)
    pins = {
        int(p.get("vcpu")): hardware.parse_cpu_spec(p.get("cpuset"))
        for p in root.findall("cputune/vcpupin")
    }
    emulator = root.find("cputune/emulatorpin")
    return pins, (hardware.parse_cpu_spec(emulator.get("cpuset")) if emulator is not None else None)


def _shape(xml: str, vcpus: int, answer: dict) -> dict:
    """What the pins alone say, and whether that can match nova's answer.

    The shape reading: a vCPU pinned alone to one host CPU that no other
    vCPU uses is dedicated; any other pinned vCPU floats; no pins at all is
    shared. An emulator pin of one host CPU that no vCPU uses reads as
    isolated. Where nova placed a floating vCPU (or a shared emulator) on
    a shared set of one CPU, its shape is that of a dedicated one: the case
    is ambiguous and ``fallback`` is what the shape reading gives.
    """
    pins, emulator = _pins(xml)
    used: dict[int, int] = {}
    for cpus in pins.values():
        for cpu in cpus:
            used[cpu] = used.get(cpu, 0) + 1
    alone = {v for v, cpus in pins.items() if len(cpus) == 1 and used[next(iter(cpus))] == 1}
    if not alone:
        policy = "shared"
    elif len(alone) == vcpus:
        policy = "dedicated"
    else:
        policy = "mixed"
    isolate = (
        policy != "shared"
        and emulator is not None
        and len(emulator) == 1
        and not used.get(next(iter(emulator)))
    )
    reading = {
        "policy": policy,
        "dedicated_vcpus": sorted(alone),
        "emulator_isolate": isolate,
        "vcpu": vcpus - len(alone),
        "pcpu": len(alone) + (1 if isolate else 0),
    }
    resources = answer["resources"]
    if (reading["policy"], reading["dedicated_vcpus"], reading["vcpu"], reading["pcpu"]) == (
        answer["policy"],
        answer["dedicated_vcpus"],
        resources["VCPU"],
        resources["PCPU"],
    ):
        return {"ambiguous": None}
    reasons = []
    floating_alone = alone - set(answer["dedicated_vcpus"])
    if floating_alone:
        reasons.append(
            f"floating vCPU(s) {sorted(floating_alone)} pinned each to a "
            "shared set of one host CPU no other vCPU uses"
        )
    if isolate and answer["emulator_threads_policy"] != "isolate":
        reasons.append(
            f"emulator threads ('{answer['emulator_threads_policy']}') pinned "
            f"to a shared set of one host CPU ({sorted(emulator)}) no vCPU uses"
        )
    if resources["VCPU"] + resources["PCPU"] != vcpus + (
        1 if answer["emulator_threads_policy"] == "isolate" else 0
    ):
        reasons.append(
            f"nova claims VCPU {resources['VCPU']}, PCPU {resources['PCPU']} "
            f"(resources:* extra specs) for a domain of {vcpus} vCPUs"
        )
    if not reasons:
        raise AssertionError(f"shape {reading} against nova {answer} unexplained")
    return {"ambiguous": "; ".join(reasons), "fallback": reading}


def one_case(drvr, host: Host, case: str) -> dict | None:
    vcpus, extra_specs, image_props = CASES[case]
    flavor = _flavor(case, vcpus, extra_specs)
    image_meta = objects.ImageMeta.from_dict(
        {"id": IMAGE_ID, "name": "cirros", "disk_format": "raw", "properties": dict(image_props)}
    )
    try:
        constraints = hardware.numa_get_constraints(flavor, image_meta)
    except Exception as exc:  # nova refuses the flavor: not a case
        raise SystemExit(f"{case}: nova refuses the flavor: {exc}") from exc
    fitted = None
    if constraints is not None:
        host_topology = drvr._get_host_numa_topology()
        # The NUMATopologyFilter's limits under nova 34's default ratios
        # (initial_cpu_allocation_ratio 4.0, initial_ram_allocation_ratio
        # 1.0): floating vCPUs may outnumber a cell's shared CPUs.
        limits = objects.NUMATopologyLimits(
            cpu_allocation_ratio=CPU_RATIO, ram_allocation_ratio=1.0
        )
        fitted = hardware.numa_fit_instance_to_host(host_topology, constraints, {}, limits=limits)
        if fitted is None:
            return None  # does not fit this host: no case
    instance = _instance(host, case, flavor, image_props, fitted)
    disk_info = blockinfo.get_disk_info(CONF.libvirt.virt_type, instance, image_meta)
    xml = drvr._get_guest_xml(nova_context.get_admin_context(), instance, [], disk_info, image_meta)
    policy = hardware.get_cpu_policy_constraint(flavor, image_meta)
    answer = {
        # numa_get_constraints' policy (resources:PCPU/VCPU decide it there)
        # is the instance topology's; without a topology nova's is shared.
        "policy": (fitted.cpu_policy if fitted is not None else None) or "shared",
        "cpu_policy_constraint": policy,
        "instance_cpu_policy": fitted.cpu_policy if fitted is not None else None,
        # The guest vCPUs each cell pins one to one (InstanceNUMACell.pcpuset).
        "dedicated_vcpus": sorted(
            v for cell in (fitted.cells if fitted is not None else []) for v in cell.pcpuset
        ),
        # The host CPUs those vCPUs (and an isolated emulator) hold.
        "dedicated_host_cpus": sorted(
            set(fitted.cpu_pinning)
            | {c for cell in fitted.cells for c in (cell.cpuset_reserved or ())}
            if fitted is not None
            else ()
        ),
        "emulator_threads_policy": (fitted.emulator_threads_policy if fitted is not None else None),
        "resources": _resources(flavor, image_meta),
        "numa_cells": len(fitted.cells) if fitted is not None else 0,
    }
    name = f"{host.name}--{case}"
    return {
        "name": name,
        "host": host.name,
        "case": case,
        "flavor": {"vcpus": vcpus, "memory_mb": MEMORY_MB, "extra_specs": extra_specs},
        "image_properties": image_props,
        "nova": answer,
        "shape": _shape(xml, vcpus, answer),
        "xml": xml,
    }


def _cgroups_v1():
    """nova's CGroupsFixture (version 1), whose module needs testtools."""
    host = "nova.virt.libvirt.host.Host."
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch(host + "_has_cgroupsv1_cpu_controller", return_value=True))
    stack.enter_context(mock.patch(host + "_has_cgroupsv2_cpu_controller", return_value=False))
    return stack


INSTANCES_PATH = "/var/lib/nova/instances"


def run(outdir: Path, only: set[str]) -> list[dict]:
    objects.register_all()
    CONF([], project="nova", default_config_files=[])
    # What nova-compute registers at start (ComputeManager.init_host).
    nova.conf.neutron.register_dynamic_opts(CONF)
    nova.conf.devices.register_dynamic_opts(CONF)
    # nova's driver creates instance directories and probes O_DIRECT under
    # instances_path: a temporary directory takes them (nothing is written
    # outside it, whoever runs this), and the domains name nova's default,
    # /var/lib/nova/instances, as nova-compute's would (see write()).
    scratch = tempfile.mkdtemp(prefix="nova-guests-")
    CONF.set_override("instances_path", scratch)
    CONF.set_override("vcpu_pin_set", None)
    found = []
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, scratch, True)
        # O_DIRECT as on a host's local disk (a tmpfs has none): cache="none".
        stack.enter_context(mock.patch("nova.privsep.utils.supports_direct_io", return_value=True))
        stack.enter_context(fakelibvirt.LibvirtFixture())
        stack.enter_context(_cgroups_v1())
        # nova.virt.driver stamps <nova:creationTime> with time.time().
        stack.enter_context(
            mock.patch.object(
                virt_driver, "time", types.SimpleNamespace(time=lambda: CREATION_TIME)
            )
        )
        # The package string would read /etc/nova/release of this machine.
        stack.enter_context(
            mock.patch.object(
                nova_version,
                "version_string_with_package",
                return_value=nova_version.version_string(),
            )
        )
        for host_name, spec in HOSTS.items():
            host = Host(host_name, spec)
            CONF.set_override("cpu_shared_set", spec["cpu_shared_set"], group="compute")
            CONF.set_override("cpu_dedicated_set", spec["cpu_dedicated_set"], group="compute")
            with (
                mock.patch(
                    "nova.virt.libvirt.host.Host.get_connection", return_value=host.connection
                ),
                mock.patch(
                    "nova.virt.libvirt.host.Host.get_online_cpus",
                    return_value=set(range(host.info.cpus)),
                ),
            ):
                drvr = libvirt_driver.LibvirtDriver(fake_virt.FakeVirtAPI(), False)
                for case in spec.get("cases", CASES):
                    name = f"{host_name}--{case}"
                    if only and name not in only:
                        continue
                    entry = one_case(drvr, host, case)
                    if entry is not None:
                        entry["host_config"] = host.config()
                        found.append(entry)
    return found


def write(outdir: Path, entries: list[dict], complete: bool) -> None:
    xml_dir = outdir / "xml"
    xml_dir.mkdir(parents=True, exist_ok=True)
    if complete:
        for old in xml_dir.glob("*.xml"):
            old.unlink()
    cases = {}
    for entry in entries:
        xml = re.sub(r"/[^\"'<>]*?/nova-guests-[^/\"'<>]+", INSTANCES_PATH, entry.pop("xml"))
        (xml_dir / f"{entry['name']}.xml").write_text(xml + "\n")
        (xml_dir / f"{entry['name']}.pre-extra-specs.xml").write_text(pre_extra_specs(xml) + "\n")
        cases[entry.pop("name")] = entry
    document = {
        "nova_version": nova_version.version_string(),
        "generator": "tests/data/nova_guests/generate.py",
        "cases": cases,
    }
    (outdir / "cases.json").write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")


def main(argv: list[str]) -> int:
    outdir = Path(argv[0]) if argv else HERE
    only = set(argv[1:])
    entries = run(outdir, only)
    write(outdir, entries, complete=not only)
    print(f"{len(entries)} guests written to {outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
