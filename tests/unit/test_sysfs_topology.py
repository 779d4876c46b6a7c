import logging
import os
from pathlib import Path

import pytest

from node_agent.errors import DiscoveryError, ParseError
from node_agent.host.sysfs import SysFS
from node_agent.host.sysfs_topology import read_topology
from node_agent.model.cpuset import CpuSet, parse_cpulist
from node_agent.model.snapshot import HugePagePool
from tests.hostdata import HOSTDATA, SYSFS_TREES, ground_truth, sysfs_root_for, tree_name

TREE_IDS = [tree_name(tree) for tree in SYSFS_TREES]


def topology_of(name, tmp_path, **kwargs):
    system_dir = HOSTDATA / name
    if not (system_dir / "cpu").exists():
        system_dir = system_dir / "system"
    return read_topology(SysFS(str(sysfs_root_for(system_dir, tmp_path))), **kwargs)


def cpu(topo, cpu_id):
    return next(c for c in topo.cpus if c.id == cpu_id)


def node(topo, node_id):
    return next(n for n in topo.nodes if n.id == node_id)


def build_tree(tmp_path: Path, files: dict[str, str]) -> SysFS:
    """A sysfs root whose ``devices/system`` holds ``files`` (relative path -> text)."""
    root = tmp_path / "sys"
    for relpath, text in files.items():
        path = root / "devices" / "system" / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return SysFS(str(root))


SMALL_HOST = {
    "cpu/present": "0-1\n",
    "cpu/online": "0-1\n",
    "cpu/cpu0/topology/physical_package_id": "0\n",
    "cpu/cpu0/topology/core_id": "0\n",
    "cpu/cpu0/topology/thread_siblings_list": "0-1\n",
    "cpu/cpu1/topology/physical_package_id": "0\n",
    "cpu/cpu1/topology/core_id": "0\n",
    "cpu/cpu1/topology/thread_siblings_list": "0-1\n",
    "node/node0/cpulist": "0-1\n",
    "node/node0/meminfo": "Node 0 MemTotal: 1024 kB\nNode 0 HugePages_Total: 0\n",
}


# Every fixture tree against the independent ground truth ---------------------


@pytest.fixture(params=SYSFS_TREES, ids=TREE_IDS)
def tree(request, tmp_path):
    system_dir = request.param
    topo = read_topology(SysFS(str(sysfs_root_for(system_dir, tmp_path))))
    return topo, ground_truth()[tree_name(system_dir)]


def test_every_fixture_tree_is_covered_by_ground_truth():
    assert len(SYSFS_TREES) == 24
    assert set(TREE_IDS) == set(ground_truth())


def test_present_and_online_cpus_match_ground_truth(tree):
    topo, truth = tree
    assert topo.present == parse_cpulist(truth["present_list"])
    assert topo.online == parse_cpulist(truth["online_list"])
    assert topo.present - topo.online == parse_cpulist(truth["offline_list"])
    assert [c.id for c in topo.cpus] == topo.present.to_list()
    assert {c.id for c in topo.cpus if c.online} == set(topo.online)


def test_numa_nodes_and_their_cpus_match_ground_truth(tree):
    topo, truth = tree
    assert len(topo.nodes) == truth["numa_nodes"]
    assert [n.id for n in topo.nodes] == sorted(int(i) for i in truth["nodes"])
    for numa in topo.nodes:
        want = truth["nodes"][str(numa.id)]
        assert numa.cpus == parse_cpulist(want["cpus"]) & topo.present, numa.id
        assert len(numa.cpus) == want["present_cpus"], numa.id
        assert len(numa.cpus & topo.online) == want["online_cpus"], numa.id
        for cpu_id in numa.cpus:
            assert cpu(topo, cpu_id).node_id == numa.id


def test_node_memory_hugepages_and_distances_match_ground_truth(tree):
    topo, truth = tree
    for numa in topo.nodes:
        want = truth["nodes"][str(numa.id)]
        assert numa.memory_kb == want.get("MemTotal_kB"), numa.id
        pools = {f"hugepages-{p.size_kb}kB": p for p in numa.hugepages}
        want_pools = want.get("hugepages", {})
        assert set(pools) == set(want_pools), numa.id
        for size, counts in want_pools.items():
            assert pools[size].total == int(counts["nr_hugepages"])
            assert pools[size].free == int(counts["free_hugepages"])
        want_distances = [int(d) for d in want.get("distance", "").split()]
        assert [d for _node, d in numa.distances] == want_distances
    known = [truth["nodes"][str(n.id)].get("MemTotal_kB") for n in topo.nodes]
    expected_total = sum(known) if known and None not in known else None
    assert topo.memory_kb == expected_total


def test_topology_ids_of_online_cpus_match_ground_truth(tree):
    topo, truth = tree
    online = [c for c in topo.cpus if c.online]
    assert sum(c.package_id is not None for c in online) == truth["online_cpus_with_topology"]
    assert sorted({c.package_id for c in online}) == truth["package_ids"]
    assert (
        len({(c.package_id, c.die_id, c.core_id) for c in online})
        == truth["cores(distinct pkg/die/core_id, online cpus)"]
    )
    sizes = truth["thread_siblings_list_size(min..max); None=file absent"]
    if sizes is None:
        assert all(c.siblings == CpuSet([c.id]) for c in topo.cpus)
    else:
        low, high = (int(x) for x in sizes.split(".."))
        assert (min(len(c.siblings) for c in online), max(len(c.siblings) for c in online)) == (
            low,
            high,
        )


# Traps named in the hostdata README ------------------------------------------


def test_offline_cpus_without_topology_dir_have_no_ids_and_only_themselves_as_siblings(tmp_path):
    topo = topology_of("virhostcpudata/linux-test6", tmp_path)
    for offline in (5, 7):
        c = cpu(topo, offline)
        assert not c.online
        assert (c.package_id, c.die_id, c.core_id) == (None, None, None)
        assert c.siblings == CpuSet([offline])
        assert c.node_id == 0
    assert sorted({c.core_id for c in topo.cpus if c.online}) == [0, 1, 9, 10]
    # The kernel lists online siblings only: cpu1's partner 5 is offline.
    assert cpu(topo, 1).siblings == CpuSet([1])
    assert cpu(topo, 0).siblings == CpuSet([0, 4])


def test_sparse_node_ids_are_kept_and_node_lists_are_cut_to_present_cpus(tmp_path):
    topo = topology_of("virhostcpudata/linux-deconf-cpus", tmp_path)
    assert [n.id for n in topo.nodes] == [0, 1, 16, 17]
    # node0's kernel list is 0-39,56-71,...; only 16-31 are present.
    assert node(topo, 0).cpus == parse_cpulist("16-31")
    assert [len(n.cpus) for n in topo.nodes] == [16, 24, 16, 24]
    assert 0 not in {c.id for c in topo.cpus}
    assert sorted({c.package_id for c in topo.cpus if c.online}) == [0, 1, 16, 17]


def test_cpu_less_nodes_are_kept_with_their_memory(tmp_path):
    topo = topology_of("virhostcpudata/linux-test1", tmp_path, default_hugepage_kb=2048)
    assert [(n.id, len(n.cpus), n.memory_kb) for n in topo.nodes] == [
        (0, 0, 33554432),
        (1, 0, 33554432),
    ]
    assert topo.memory_kb == 2 * 33554432
    assert all(c.node_id is None for c in topo.cpus)
    assert node(topo, 0).hugepages == (HugePagePool(size_kb=2048, total=1024, free=768),)
    assert node(topo, 1).hugepages == (HugePagePool(size_kb=2048, total=1024, free=1024),)


def test_sibling_list_without_the_cpu_itself_is_warned_and_not_trusted(tmp_path):
    # linux-test1's cpu1/topology/thread_siblings_list says "0" (hand-edited data).
    topo = topology_of("virhostcpudata/linux-test1", tmp_path)
    assert cpu(topo, 1).siblings == CpuSet([1])
    assert any("cpu1/topology/thread_siblings_list lists 0, not CPU 1" in w for w in topo.warnings)


def test_memory_only_node_beside_a_cpu_node_keeps_distances(tmp_path):
    topo = topology_of("vircaps2xmldata/linux-hmat", tmp_path)
    assert node(topo, 0).cpus == parse_cpulist("0-23")
    assert node(topo, 1).cpus == CpuSet()
    assert node(topo, 1).distances == ((0, 20), (1, 10))
    # hmat nodes have no meminfo: the host total is unknown, not zero.
    assert node(topo, 1).memory_kb is None
    assert topo.memory_kb is None


def test_missing_present_file_falls_back_to_cpu_directories_with_a_warning(tmp_path):
    topo = topology_of("vircaps2xmldata/linux-hmat", tmp_path)
    assert topo.present == parse_cpulist("0-23")
    assert any("present is absent" in w for w in topo.warnings)


def test_bulldozer_module_siblings_keep_their_different_core_ids(tmp_path):
    topo = topology_of("virhostcpudata/linux-test8", tmp_path)
    first, partner = cpu(topo, 0), cpu(topo, 4)
    assert first.siblings == partner.siblings == CpuSet([0, 4])
    assert first.core_id != partner.core_id
    assert all(len(c.siblings) == 2 for c in topo.cpus)


def test_opteron_without_sibling_files_gets_no_invented_smt(tmp_path):
    topo = topology_of("virhostcpudata/linux-test3", tmp_path)
    # core_id 0-5 repeats on both dies of a package; that is not SMT.
    assert all(c.siblings == CpuSet([c.id]) for c in topo.cpus)


def test_negative_package_id_is_kept_as_the_kernel_reports_it(tmp_path):
    topo = topology_of("virhostcpudata/linux-raspberrypi", tmp_path)
    assert [(c.id, c.package_id, c.core_id) for c in topo.cpus] == [(0, -1, 0)]
    assert topo.nodes == ()
    assert topo.memory_kb is None


def test_huge_topology_ids_are_read_exactly(tmp_path):
    topo = topology_of("virhostcpudata/linux-high-ids", tmp_path)
    assert sorted({c.package_id for c in topo.cpus}) == [2047, 4095, 6143, 8191]
    assert {c.core_id for c in topo.cpus} == {2047, 4095, 6143, 8191}
    assert cpu(topo, 0).siblings == CpuSet([0, 1])


def test_dies_are_read_from_die_id(tmp_path):
    topo = topology_of("virhostcpudata/linux-with-die", tmp_path)
    assert sorted({(c.package_id, c.die_id) for c in topo.cpus}) == [
        (p, d) for p in (0, 1) for d in (0, 1, 2)
    ]
    assert len({(c.package_id, c.die_id, c.core_id) for c in topo.cpus}) == 12


def test_tree_that_links_to_another_reads_the_same_as_its_target(tmp_path):
    dies = topology_of("vircaps2xmldata/linux-basic-dies", tmp_path / "a")
    target = topology_of("virhostcpudata/linux-with-die", tmp_path / "b")
    assert dies.cpus == target.cpus


def test_one_gib_hugepages_are_reported_per_node(tmp_path):
    topo = topology_of("vircaps2xmldata/linux-resctrl", tmp_path)
    assert node(topo, 1).hugepages == (
        HugePagePool(size_kb=2048, total=0, free=0),
        HugePagePool(size_kb=1048576, total=4, free=4),
    )
    assert node(topo, 0).hugepages == (
        HugePagePool(size_kb=2048, total=0, free=0),
        HugePagePool(size_kb=1048576, total=0, free=0),
    )


def test_meminfo_hugepages_of_unknown_size_are_warned_about_not_guessed(tmp_path):
    topo = topology_of("virhostcpudata/linux-test7", tmp_path)
    assert node(topo, 0).hugepages == ()
    assert any("8192 huge pages" in w for w in topo.warnings)


def test_meminfo_hugepages_take_the_default_size_when_given(tmp_path):
    topo = topology_of("virhostcpudata/linux-test7", tmp_path, default_hugepage_kb=2048)
    assert node(topo, 0).hugepages == (HugePagePool(size_kb=2048, total=8192, free=4466),)
    assert topo.warnings == ()


# Trees built in tmp_path -------------------------------------------------------


def test_small_host_reads_cleanly(tmp_path):
    topo = read_topology(build_tree(tmp_path, SMALL_HOST))
    assert topo.present == topo.online == CpuSet([0, 1])
    assert topo.isolated == CpuSet()
    assert [(c.id, c.core_id, str(c.siblings), c.node_id) for c in topo.cpus] == [
        (0, 0, "0-1", 0),
        (1, 0, "0-1", 0),
    ]
    assert topo.memory_kb == 1024
    assert topo.warnings == ()


def test_isolated_cpus_are_read_when_the_file_exists(tmp_path):
    topo = read_topology(build_tree(tmp_path, {**SMALL_HOST, "cpu/isolated": "1\n"}))
    assert topo.isolated == CpuSet([1])


def test_missing_node_directory_means_no_nodes(tmp_path):
    files = {k: v for k, v in SMALL_HOST.items() if not k.startswith("node/")}
    topo = read_topology(build_tree(tmp_path, files))
    assert topo.nodes == ()
    assert topo.memory_kb is None
    assert all(c.node_id is None for c in topo.cpus)


def test_missing_online_file_uses_per_cpu_online_flags(tmp_path):
    files = {k: v for k, v in SMALL_HOST.items() if k != "cpu/online"}
    files["cpu/cpu1/online"] = "0\n"
    topo = read_topology(build_tree(tmp_path, files))
    assert topo.online == CpuSet([0])
    assert not cpu(topo, 1).online


def test_per_cpu_online_disagreeing_with_online_file_counts_only_what_both_say(tmp_path):
    topo = read_topology(build_tree(tmp_path, {**SMALL_HOST, "cpu/cpu1/online": "0\n"}))
    assert topo.online == CpuSet([0])
    assert any("disagree about CPUs 1; counting as online only" in w for w in topo.warnings)


def _damaged_copy(tmp_path, name: str, online: str) -> SysFS:
    import shutil

    system_dir = tmp_path / "copy" / "system"
    shutil.copytree(HOSTDATA / name, system_dir, symlinks=True)
    (system_dir / "cpu" / "online").write_text(online)
    return SysFS(str(sysfs_root_for(system_dir, tmp_path)))


def test_a_damaged_online_file_listing_offline_cpus_does_not_count_them(tmp_path):
    # A real POWER8 host with 20 of its 160 CPUs online (subcores); its
    # online file damaged to list all 160, as the per-CPU files do not.
    truth = ground_truth()["virhostcpudata/linux-subcores1"]
    topo = read_topology(_damaged_copy(tmp_path, "virhostcpudata/linux-subcores1", "0-159\n"))
    assert topo.online == parse_cpulist(truth["online_list"])
    assert len(topo.online) == 20
    assert {c.id for c in topo.cpus if c.online} == set(topo.online)
    (warning,) = [w for w in topo.warnings if "disagree" in w]
    assert "counting as online only the CPUs both call online: 0,8,16," in warning


def test_a_damaged_online_file_listing_too_few_cpus_is_the_smaller_set(tmp_path):
    topo = read_topology(_damaged_copy(tmp_path, "virhostcpudata/linux-subcores1", "0,8\n"))
    assert topo.online == CpuSet([0, 8])
    assert any("disagree" in w for w in topo.warnings)


def test_online_file_and_per_cpu_files_agreeing_on_no_cpu_is_a_parse_error(tmp_path):
    sysfs = _damaged_copy(tmp_path, "virhostcpudata/linux-subcores1", "1-7\n")
    with pytest.raises(ParseError, match="agree on no online CPU"):
        read_topology(sysfs)


@pytest.mark.parametrize(
    "text, shown",
    [
        ("x-y\n", "'x-y'"),
        ("0-1,\n", "''"),
        ("3-1\n", "runs backwards"),
    ],
)
def test_garbage_online_file_is_a_parse_error_naming_the_file(tmp_path, text, shown):
    sysfs = build_tree(tmp_path, {**SMALL_HOST, "cpu/online": text})
    with pytest.raises(ParseError) as info:
        read_topology(sysfs)
    assert str(info.value).startswith(sysfs.path("devices/system/cpu/online") + ": ")
    assert shown in str(info.value)


def test_empty_online_file_is_an_error_not_zero_cpus(tmp_path):
    with pytest.raises(ParseError, match="cpu/online: empty"):
        read_topology(build_tree(tmp_path, {**SMALL_HOST, "cpu/online": "\n"}))


@pytest.mark.parametrize(
    "relpath, text",
    [
        ("cpu/cpu1/topology/core_id", "\n"),
        ("cpu/cpu1/topology/core_id", "zero\n"),
        ("cpu/cpu0/topology/physical_package_id", "0x1\n"),
        ("cpu/cpu1/topology/thread_siblings_list", "0-1-2\n"),
        ("cpu/cpu1/online", "yes\n"),
        ("node/node0/cpulist", "0-a\n"),
        ("node/node0/distance", "10 twenty\n"),
    ],
)
def test_garbage_topology_file_is_a_parse_error_naming_the_file(tmp_path, relpath, text):
    sysfs = build_tree(tmp_path, {**SMALL_HOST, relpath: text})
    with pytest.raises(ParseError, match=relpath):
        read_topology(sysfs)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "no meminfo fields"),
        ("Node 0 MemTotal:       16175540 kB\nNode 0 MemFr", "line 2"),
        ("Node 0 MemFree: 12 kB\n", "no MemTotal"),
    ],
)
def test_bad_node_meminfo_is_a_parse_error_naming_the_file(tmp_path, text, reason):
    sysfs = build_tree(tmp_path, {**SMALL_HOST, "node/node0/meminfo": text})
    with pytest.raises(ParseError) as info:
        read_topology(sysfs)
    assert sysfs.path("devices/system/node/node0/meminfo") in str(info.value)
    assert reason in str(info.value)


def test_hugepage_pool_without_counts_is_an_error_not_an_empty_pool(tmp_path):
    files = {**SMALL_HOST, "node/node0/hugepages/hugepages-2048kB/free_hugepages": "0\n"}
    with pytest.raises(DiscoveryError, match="hugepages-2048kB/nr_hugepages is missing"):
        read_topology(build_tree(tmp_path, files))


def test_distance_row_of_the_wrong_length_is_warned_and_dropped(tmp_path):
    topo = read_topology(build_tree(tmp_path, {**SMALL_HOST, "node/node0/distance": "10 20\n"}))
    assert node(topo, 0).distances == ()
    assert any("2 distances for 1 nodes" in w for w in topo.warnings)


def test_online_cpus_that_are_not_present_are_dropped_with_a_warning(tmp_path):
    topo = read_topology(build_tree(tmp_path, {**SMALL_HOST, "cpu/online": "0-2\n"}))
    assert topo.online == CpuSet([0, 1])
    assert any("not present" in w for w in topo.warnings)


def test_wrong_root_is_a_discovery_error_that_names_the_option(tmp_path):
    with pytest.raises(DiscoveryError, match=r"\[host\] sysfs_root"):
        read_topology(SysFS(str(tmp_path)))


def test_directory_where_a_file_is_expected_is_a_read_error(tmp_path):
    sysfs = build_tree(tmp_path, SMALL_HOST)
    (tmp_path / "sys/devices/system/cpu/isolated").mkdir()
    with pytest.raises(DiscoveryError, match=r"cannot read .*cpu/isolated") as info:
        read_topology(sysfs)
    assert not isinstance(info.value, ParseError)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_a_read_error_not_an_absent_file(tmp_path):
    sysfs = build_tree(tmp_path, {**SMALL_HOST, "cpu/isolated": "1\n"})
    (tmp_path / "sys/devices/system/cpu/isolated").chmod(0)
    with pytest.raises(DiscoveryError, match=r"cannot read .*cpu/isolated"):
        read_topology(sysfs)


# The SysFS gateway -------------------------------------------------------------


def test_sysfs_absent_file_is_none_and_logged_at_debug(tmp_path, caplog):
    sysfs = SysFS(str(tmp_path))
    with caplog.at_level(logging.DEBUG, logger="node_agent.host.sysfs"):
        assert sysfs.read("devices/system/cpu/isolated") is None
    assert "isolated is absent" in caplog.text
    assert sysfs.listdir("devices/system/node") is None
    assert not sysfs.exists("devices/system/node")


def test_sysfs_refuses_paths_outside_its_root(tmp_path):
    sysfs = SysFS(str(tmp_path))
    for bad in ("/etc/passwd", "../etc/passwd", "devices/../../x"):
        with pytest.raises(ValueError):
            sysfs.read(bad)


def test_sysfs_binary_content_is_a_read_error(tmp_path):
    (tmp_path / "blob").write_bytes(b"\xff\xfe")
    with pytest.raises(DiscoveryError, match="not text"):
        SysFS(str(tmp_path)).read("blob")
