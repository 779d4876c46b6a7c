"""nova 34's whole libvirt driver against the agent, on the same host (area
``whole_driver``).

Each case is a fake host (nova's fakelibvirt ``HostInfo``, PCI and mdev
fixtures, or a real host of the corpus: ``CORPUS`` and ``CAPTURED_TREES``)
and a nova.conf. nova runs ``LibvirtDriver.init_host`` and
``update_provider_tree`` on it, plus the traits its resource tracker adds on
the root; the agent runs discovery and its tree builder on the same sysfs,
the same libvirt answers and the same nova.conf
(:mod:`tests.conformance.driver_host`). Whole trees are compared: every
provider, every inventory field, every trait, and a refusal on either side.
Many cases port what nova's own tests assert
(``nova/tests/unit/virt/libvirt/test_driver.py``), named after them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from node_agent.tree.cpu_traits import NOVA_FEATURE_TRAITS
from tests.conformance.differences import UNCLASSIFIED, Observed, check
from tests.conformance.driver_host import CAPTURED, agent_tree, captured_libvirt, corpus_libvirt
from tests.hostdata import HOSTDATA

# The resource tracker marks nova's root OWNER_NOVA; the agent never does
# (issue 27: two writers of one root). Every other root trait is compared.
CAPABILITY_TRAITS_EXCLUDED = frozenset({"OWNER_NOVA"})

OWNER_NOVA = "OWNER_NOVA"

SMT = {"cpu_nodes": 2, "cpu_sockets": 1, "cpu_cores": 2, "cpu_threads": 2, "kB_mem": 65536}
FLAT = {"cpu_cores": 4, "kB_mem": 32768}

# name -> (host, nova.conf, extras). ``differs``: the listed difference the
# case shows (its row says why); everything else must be the same.
CASES = {
    "flat-defaults": dict(host=FLAT, conf={}),
    "smt-two-nodes": dict(host=SMT, conf={}),
    "dedicated-and-shared": dict(
        host=SMT, conf={"compute": {"cpu_dedicated_set": "4-7", "cpu_shared_set": "0-3"}}
    ),
    "reserved-and-ratios": dict(
        host=FLAT,
        conf={
            "DEFAULT": {
                "reserved_host_memory_mb": 1024,
                "reserved_host_disk_mb": 1536,
                "cpu_allocation_ratio": 2.0,
            }
        },
    ),
    # test_driver.py test_update_provider_tree_with_file_backed_memory
    "file-backed-memory": dict(
        host=FLAT,
        conf={
            "libvirt": {"file_backed_memory": 1024},
            "DEFAULT": {"ram_allocation_ratio": 1.0, "reserved_host_memory_mb": 0},
        },
    ),
    # test_driver.py test_update_provider_tree_for_image_cache
    # (reserve_disk_resource_for_image_cache): the cache's blocks, in GiB
    # rounded up, on top of reserved_host_disk_mb.
    "image-cache-reserved": dict(
        host=FLAT,
        conf={
            "DEFAULT": {"reserved_host_disk_mb": 512},
            "workarounds": {"reserve_disk_resource_for_image_cache": True},
        },
        image_cache={"_base/abcd": 1024 * 1024},
    ),
    "image-cache-not-reserved": dict(host=FLAT, conf={}, image_cache={"_base/abcd": 1024 * 1024}),
    # test_driver.py test_cpu_traits... on a 32-bit ARM host: nova names
    # the arch trait HW_ARCH_ + the arch upper-cased; ARMV7L is none.
    "arch-armv7l": dict(host={**FLAT, "arch": "armv7l"}, conf={"libvirt": {"virt_type": "qemu"}}),
    "arch-aarch64": dict(host={**FLAT, "arch": "aarch64"}, conf={"libvirt": {"virt_type": "qemu"}}),
    # nova 34 leaves physnet devices to neutron: no child, no SRIOV_NET_VF.
    "physnet-pf": dict(
        host=FLAT,
        conf={
            "pci": {
                "device_spec": [
                    '{"vendor_id": "8086", "product_id": "1528", "physical_network": "physnet1"}'
                ]
            }
        },
        pci={"num_pfs": 1, "num_vfs": 2},
        differs="driver-physnet-sriov-children",
    ),
    # test_driver.py test_cpu_compatibility_skip_compare_at_init
    "skip-cpu-compare": dict(
        host=FLAT,
        conf={
            "libvirt": {"cpu_mode": "custom", "cpu_models": ["Haswell"], "virt_type": "kvm"},
            "workarounds": {"skip_cpu_compare_at_startup": True},
        },
    ),
    "cpu-compare-refused": dict(
        host=FLAT,
        conf={"libvirt": {"cpu_mode": "custom", "cpu_models": ["Haswell"], "virt_type": "kvm"}},
    ),
    # test_driver.py test_get_cpu_feature_traits_... with baselineCPU
    # unsupported (VIR_ERR_NO_SUPPORT): nova reports no CPU feature traits.
    "cpu-mode-none-no-baseline": dict(
        host=FLAT,
        conf={"libvirt": {"cpu_mode": "none", "virt_type": "kvm"}},
        refuse=["baselineCPU"],
    ),
    "cpu-mode-none": dict(host=FLAT, conf={"libvirt": {"cpu_mode": "none", "virt_type": "kvm"}}),
}


# nova's fake GPUs (fakelibvirt MDEV_TYPES devices): 0000:81:00.0 and
# 0000:81:01.0, each offering nvidia-11 (16 left) and nvidia-12 (8 left).
GPUS = {"num_pfs": 0, "num_vfs": 0, "num_mdevcap": 2, "multiple_gpu_types": True}


def _vgpu(types, **sections):
    conf = {"devices": {"enabled_mdev_types": types}}
    conf.update({f"mdev_{name}": values for name, values in sections.items()})
    return dict(host=FLAT, conf=conf, pci=GPUS)


# test_driver.py's vGPU tests (test_update_provider_tree_for_vgpu*,
# test_get_gpu_inventories_with_max_instances...): the type each GPU
# serves, the max_instances cap, mdev_class.
CASES.update(
    {
        "vgpu-one-type": _vgpu(["nvidia-11"]),
        "vgpu-default-type-first": _vgpu(["nvidia-12", "nvidia-11"]),
        "vgpu-device-addresses": _vgpu(
            ["nvidia-11", "nvidia-12"],
            **{
                "nvidia-11": {"device_addresses": ["0000:81:00.0"]},
                "nvidia-12": {"device_addresses": ["0000:81:01.0"], "mdev_class": "CUSTOM_NOTVGPU"},
            },
        ),
        "vgpu-default-type-class-is-vgpu": _vgpu(
            ["nvidia-12"], **{"nvidia-12": {"mdev_class": "CUSTOM_NOTVGPU"}}
        ),
        "vgpu-max-instances": _vgpu(["nvidia-11"], **{"nvidia-11": {"max_instances": 20}}),
        "vgpu-same-gpu-two-types": _vgpu(
            ["nvidia-11", "nvidia-12"],
            **{
                "nvidia-11": {"device_addresses": ["0000:81:00.0"]},
                "nvidia-12": {"device_addresses": ["0000:81:00.0"]},
            },
        ),
        "vgpu-type-not-offered": _vgpu(
            ["mlx5_core"], **{"mlx5_core": {"device_addresses": ["0000:81:00.0"]}}
        ),
    }
)


# test_driver.py test_update_provider_tree_for_vpmem / _discover_vpmems:
# one class per label, a unit per namespace; a namespace the host lacks, or
# named twice, is refused at start.
CASES.update(
    {
        "pmem-namespaces": dict(
            host=FLAT,
            conf={"libvirt": {"pmem_namespaces": ["128G:ns0|ns1", "SMALL:ns2"]}},
            pmem=["ns0", "ns1", "ns2", "ns3"],
        ),
        "pmem-namespace-absent": dict(
            host=FLAT,
            conf={"libvirt": {"pmem_namespaces": ["128G:ns0|ns9"]}},
            pmem=["ns0"],
        ),
        "pmem-namespace-twice": dict(
            host=FLAT,
            conf={"libvirt": {"pmem_namespaces": ["128G:ns0|ns1", "SMALL:ns1"]}},
            pmem=["ns0", "ns1"],
        ),
    }
)


# Hosts of the corpus (tests/data/hostdata, libvirt's test suite) with both
# halves of one genuine pair: the sysfs tree libvirt read and the
# capabilities XML it produced from it (vircaps2xmltest). nova's fake
# connection answers getCapabilities with that XML, getCPUMap with the
# tree's present and online CPUs, getInfo with the memory the XML's cells
# add up to; the agent reads the tree itself. libvirt's test mocks the
# cells' memory ((cell+1) GiB each, hostdata README), so the agent's copy of
# the tree has each node's MemTotal set to its cell's memory: on a real host
# libvirt reads a cell's memory from that very file, and both sides count
# the same memory (driver_host.corpus_libvirt, corpus_sysfs). The tree's
# huge pages stay as captured: no provider of a flat tree counts them.
# ``with_qemu``: the host's XML plus the <guest> elements a libvirtd with
# QEMU adds (vircaps2xmltest formats the host part only).
VIRCAPS = HOSTDATA / "vircaps2xmldata"
SPLIT = {"compute": {"cpu_dedicated_set": "4-7", "cpu_shared_set": "0-3"}}
CORPUS = {
    "corpus-basic": ("linux-basic", "x86_64-basic", {}),
    "corpus-aarch64-basic": ("linux-basic", "aarch64-basic", {}),
    "corpus-basic-dies": ("linux-basic-dies", "x86_64-basic-dies", {}),
    "corpus-caches": ("linux-caches", "x86_64-caches", {}),
    "corpus-caches-split": ("linux-caches", "x86_64-caches", SPLIT),
    "corpus-caches-with-qemu": ("linux-caches", "x86_64-caches", {}, True),
    "corpus-hmat": ("linux-hmat", "x86_64-hmat", {}),
    "corpus-hmat-split": ("linux-hmat", "x86_64-hmat", SPLIT),
    "corpus-resctrl": ("linux-resctrl", "x86_64-resctrl", {}),
    "corpus-resctrl-with-qemu": ("linux-resctrl", "x86_64-resctrl", {}, True),
}
CASES.update(
    {
        name: dict(
            host=FLAT,
            conf=conf,
            corpus=(VIRCAPS / tree / "system", VIRCAPS / f"vircaps-{caps}.xml", *qemu),
        )
        for name, (tree, caps, conf, *qemu) in CORPUS.items()
    }
)

# The virhostcpudata trees (real hosts' sysfs, libvirt's test suite) with
# what a real libvirtd answered reading each of them
# (tests/data/virhostcpu-caps: getCapabilities, getInfo, getCPUMap,
# captured by its generate.py, `make virhostcpu-caps`). The agent reads the
# same copy of the tree the daemon read (tests.hostdata.copy_tree).
CAPTURED_TREES = sorted(json.loads((CAPTURED / "answers.json").read_text()))
CASES.update(
    {f"libvirtd-{name}": dict(host=FLAT, conf={}, captured=name) for name in CAPTURED_TREES}
)
CASES.update(
    {
        # Interleaved NUMA numbering (node0 = 0,4,8...).
        "libvirtd-linux-test3-split": dict(
            host=FLAT,
            conf={"compute": {"cpu_dedicated_set": "0-23", "cpu_shared_set": "24-47"}},
            captured="linux-test3",
        ),
        # CPUs 5 and 7 offline: nova refuses a dedicated set naming them.
        "libvirtd-linux-test6-offline-dedicated": dict(
            host=FLAT, conf={"compute": {"cpu_dedicated_set": "4-7"}}, captured="linux-test6"
        ),
        "libvirtd-linux-test6-online-split": dict(
            host=FLAT,
            conf={"compute": {"cpu_dedicated_set": "4,6", "cpu_shared_set": "0-3"}},
            captured="linux-test6",
        ),
    }
)


def _nova_case(name: str, spec: dict, instances: Path) -> dict:
    case = {
        "name": name,
        "host": spec["host"],
        "conf": spec["conf"],
        "instances_path": str(instances),
    }
    for key in ("pci", "mdevs", "refuse", "pmem"):
        if key in spec:
            case[key] = spec[key]
    if "corpus" in spec:
        case["corpus"] = corpus_libvirt(*spec["corpus"])
    if "captured" in spec:
        case["corpus"] = captured_libvirt(spec["captured"])
    return case


def _nova_tree(answer: dict) -> dict:
    """nova's providers, with the tracker's root traits on the root."""
    providers = {p["name"]: p for p in answer["providers"]}
    root = next(p for p in providers.values() if p["parent"] is None)
    traits = set(root["traits"]) | {"COMPUTE_NODE", OWNER_NOVA}
    traits |= {t for t, on in answer["tracker_traits"].items() if on}
    providers[root["name"]] = dict(root, traits=sorted(traits))
    return providers


def _child_owner_mark(line: str) -> bool:
    """A child's owner trait: nova's OWNER_NOVA, the agent's own mark."""
    return line.endswith(
        ("trait OWNER_NOVA: nova only", "trait CUSTOM_NODE_AGENT_CHILD: agent only")
    )


def _arch_trait_without_guests(spec: dict, line: str) -> bool:
    """nova's emulated-arch and vIOMMU traits on a host with no <guest>."""
    if "corpus" not in spec or len(spec["corpus"]) > 2 or not line.endswith(": nova only"):
        return False
    return " trait COMPUTE_ARCH_" in line or " trait COMPUTE_VIOMMU_MODEL_" in line


def _cpu_trait_beyond_nova_table(line: str) -> bool:
    """A root CPU feature trait nova's table lacks, or SSE3 (``pni``)."""
    match = re.search(r" trait (HW_CPU_X86_\w+): agent only$", line)
    if not match:
        return False
    return match.group(1) not in NOVA_FEATURE_TRAITS or match.group(1) == "HW_CPU_X86_SSE3"


def differences(nova: dict, agent: dict) -> list[str]:
    """What differs between two whole trees, one line each."""
    out = []
    for name in sorted(set(nova) | set(agent)):
        theirs, ours = nova.get(name), agent.get(name)
        if theirs is None or ours is None:
            out.append(f"provider {name}: {'agent only' if theirs is None else 'nova only'}")
            continue
        if theirs["parent"] != ours["parent"]:
            out.append(f"{name} parent: nova {theirs['parent']}, agent {ours['parent']}")
        for rc in sorted(set(theirs["inventories"]) | set(ours["inventories"])):
            a, b = theirs["inventories"].get(rc), ours["inventories"].get(rc)
            if a is None or b is None:
                out.append(f"{name} {rc}: {'agent only' if a is None else 'nova only'}")
                continue
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    out.append(f"{name} {rc}.{key}: nova {a.get(key)}, agent {b.get(key)}")
        for trait in sorted(set(theirs["traits"]) ^ set(ours["traits"])):
            if trait in CAPABILITY_TRAITS_EXCLUDED and theirs["parent"] is None:
                continue
            side = "nova only" if trait in theirs["traits"] else "agent only"
            out.append(f"{name} trait {trait}: {side}")
    return out


@pytest.fixture(scope="module")
def results(nova, tmp_path_factory):
    work = tmp_path_factory.mktemp("driver")
    cases = []
    for name, spec in CASES.items():
        instances = work / name / "instances"
        instances.mkdir(parents=True)
        for rel, size in spec.get("image_cache", {}).items():
            path = instances / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(size))
        cases.append(_nova_case(name, spec, instances))
    answers = nova.call("whole_driver", cases=cases)
    out = {}
    for case, answer in zip(cases, answers):
        host = answer["host"] if "refused" in answer else answer["value"]
        agent = agent_tree(nova, case, host, work / case["name"])
        out[case["name"]] = (answer, agent)
    return out


def test_whole_driver_trees_are_nova_s(results):
    observed = Observed("whole_driver")
    for name, (nova_answer, agent) in results.items():
        observed.cases += 1
        expected = CASES[name].get("differs")
        if "refused" in nova_answer:
            lines = [] if "refused" in agent else [f"nova refused: {nova_answer['refused']}"]
        elif "refused" in agent:
            lines = [f"agent refused, nova did not: {agent['refused']}"]
        else:
            ours = {p["name"]: p for p in agent["value"]["providers"]}
            lines = differences(_nova_tree(nova_answer["value"]), ours)
        for line in lines:
            if _child_owner_mark(line):
                observed.add("driver-child-owner-mark", f"{name}: {line}")
            elif _arch_trait_without_guests(CASES[name], line):
                observed.add("driver-arch-traits-without-guests", f"{name}: {line}")
            elif "captured" in CASES[name] and _cpu_trait_beyond_nova_table(line):
                observed.add("driver-cpu-traits-beyond-nova-table", f"{name}: {line}")
            else:
                observed.add(expected or UNCLASSIFIED, f"{name}: {line}")
    check(observed)
