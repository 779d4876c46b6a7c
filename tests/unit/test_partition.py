"""CPU policy: pools from cpu_dedicated_set / cpu_shared_set / vcpu_pin_set."""

import pytest

from node_agent.errors import ConfigError
from node_agent.model.cpuset import CpuSet, parse_cpu_spec
from node_agent.policy.partition import node_split, partition_cpus
from tests.snapshots import settings, snapshot

TEST6 = "virhostcpudata/linux-test6"  # 0-7 present, 5 and 7 offline
TEST3 = "virhostcpudata/linux-test3"  # 48 CPUs, 8 interleaved nodes
DECONF = "virhostcpudata/linux-deconf-cpus"  # sparse nodes, 10 of 80 online


def spec(text):
    return parse_cpu_spec(text)


@pytest.fixture
def test6(tmp_path):
    return snapshot(TEST6, tmp_path)


def refused(host, **opts) -> str:
    with pytest.raises(ConfigError) as info:
        partition_cpus(settings(**opts), host)
    return str(info.value)


def test_no_sets_makes_every_online_cpu_vcpu(test6):
    part = partition_cpus(settings(), test6)
    assert part.shared == CpuSet({0, 1, 2, 3, 4, 6})
    assert part.dedicated == CpuSet() and part.pcpu == CpuSet()


def test_dedicated_and_shared_split_the_host(test6):
    part = partition_cpus(
        settings(cpu_dedicated_set=spec("2-4,6"), cpu_shared_set=spec("0-1")), test6
    )
    assert part.pcpu == CpuSet({2, 3, 4, 6})
    assert part.shared == CpuSet({0, 1})
    assert part.unused == CpuSet()


def test_only_dedicated_set_gives_no_vcpu(test6):
    part = partition_cpus(settings(cpu_dedicated_set=spec("2-3")), test6)
    assert part.shared == CpuSet()
    assert part.unused == CpuSet({0, 1, 4, 6})


def test_vcpu_pin_set_alone_gives_vcpu_from_it(test6):
    part = partition_cpus(settings(vcpu_pin_set=spec("1-3")), test6)
    assert part.shared == CpuSet({1, 2, 3}) and part.pcpu == CpuSet()


def test_vcpu_pin_set_keeps_defining_vcpu_next_to_cpu_shared_set(test6):
    # nova 34 (_get_vcpu_available): vcpu_pin_set wins; cpu_shared_set then
    # only names the emulator-thread CPUs.
    part = partition_cpus(settings(vcpu_pin_set=spec("0-1"), cpu_shared_set=spec("0-4,6")), test6)
    assert part.shared == CpuSet({0, 1}) and part.pcpu == CpuSet()
    assert any("VCPU comes from vcpu_pin_set" in w for w in part.warnings)


def test_vcpu_pin_set_with_cpu_shared_set_allows_reserved_host_cpus(test6):
    # nova skips the reserved_host_cpus check while vcpu_pin_set is set.
    part = partition_cpus(
        settings(vcpu_pin_set=spec("0-3"), cpu_shared_set=spec("4"), reserved_host_cpus=1), test6
    )
    assert part.shared == CpuSet({0, 1, 2, 3}) and part.vcpu_reserved == 1


def test_overlapping_sets_are_refused_naming_the_shared_cpus(test6):
    message = refused(test6, cpu_dedicated_set=spec("0-3"), cpu_shared_set=spec("3-4"))
    assert "cpu_dedicated_set = '0-3'" in message
    assert "cpu_shared_set = '3-4'" in message
    assert "overlap on CPUs 3" in message


def test_vcpu_pin_set_with_dedicated_set_is_refused(test6):
    message = refused(test6, cpu_dedicated_set=spec("2-3"), vcpu_pin_set=spec("0-1"))
    assert "vcpu_pin_set = '0-1' cannot be combined with cpu_dedicated_set" in message


@pytest.mark.parametrize("option", ["cpu_dedicated_set", "cpu_shared_set"])
def test_reserved_host_cpus_with_a_new_set_is_refused(test6, option):
    message = refused(test6, reserved_host_cpus=1, **{option: spec("2")})
    assert "reserved_host_cpus = 1 cannot be combined" in message


def test_dedicated_set_with_absent_cpu_is_refused(test6):
    message = refused(test6, cpu_dedicated_set=spec("6-9"))
    assert "names CPUs 8-9 that this host does not have (present: 0-7)" in message


def test_dedicated_set_with_offline_cpu_is_refused(test6):
    message = refused(test6, cpu_dedicated_set=spec("4-6"))
    assert "names offline CPUs 5 (online: 0-4,6)" in message
    assert "cpu_dedicated_set" in message


def test_cpu_power_management_lets_dedicated_cpus_be_offline_and_counts_each_once(test6):
    # nova's _get_pcpu_available with [libvirt] cpu_power_management: the
    # dedicated set must be present, not online (nova powers idle ones down).
    part = partition_cpus(
        settings(
            cpu_dedicated_set=spec("4-7"), cpu_shared_set=spec("0-3"), cpu_power_management=True
        ),
        test6,
    )
    assert part.pcpu == CpuSet({4, 5, 6, 7}) and len(part.pcpu) == 4
    assert part.shared == CpuSet({0, 1, 2, 3})
    assert not (part.pcpu & part.shared)


def test_cpu_power_management_still_refuses_offline_shared_and_absent_cpus(test6):
    message = refused(
        test6,
        cpu_dedicated_set=spec("4-8"),
        cpu_shared_set=spec("0-1,5"),
        cpu_power_management=True,
    )
    assert "cpu_shared_set = '0-1,5' names offline CPUs 5" in message
    assert "cpu_dedicated_set = '4-8' names CPUs 8 that this host does not have" in message
    assert "cpu_dedicated_set = '4-8' names offline" not in message


def test_shared_set_with_offline_cpu_on_sparse_numa_host_is_refused(tmp_path):
    host = snapshot(DECONF, tmp_path)
    message = refused(host, cpu_shared_set=spec("16-17"))
    assert "offline CPUs 17" in message


def test_reserved_host_cpus_equal_to_total_is_refused(test6):
    message = refused(test6, reserved_host_cpus=6)
    assert "reserved_host_cpus = 6 is not below the 6 CPUs" in message


def test_every_problem_is_reported_at_once(test6):
    with pytest.raises(ConfigError) as info:
        partition_cpus(
            settings(cpu_dedicated_set=spec("0-9"), cpu_shared_set=spec("0"), reserved_host_cpus=2),
            test6,
        )
    assert len(info.value.problems) == 4  # overlap, reserved, absent, offline


def test_isolated_cpus_in_shared_set_only_warn(test6):
    import dataclasses

    host = dataclasses.replace(test6, isolated=CpuSet({1}))
    part = partition_cpus(settings(cpu_shared_set=spec("0-1")), host)
    assert any("isolated CPUs 1" in w for w in part.warnings)


@pytest.mark.parametrize("sets", [dict(vcpu_pin_set="0-4"), dict()])
def test_transition_mode_is_refused_because_it_counts_cpus_twice(test6, sets):
    with pytest.raises(ConfigError) as err:
        partition_cpus(
            settings(pcpu_transition_mode=True, **{k: spec(v) for k, v in sets.items()}), test6
        )
    assert "[compute] pcpu_transition_mode = true" in str(err.value)
    assert "set cpu_dedicated_set" in str(err.value)


def test_node_split_follows_interleaved_numbering(tmp_path):
    host = snapshot(TEST3, tmp_path)
    part = partition_cpus(
        settings(cpu_dedicated_set=spec("0-23"), cpu_shared_set=spec("24-47")), host
    )
    rows = {row["node"]: row for row in node_split(part, host)}
    assert len(rows) == 8
    # Interleaved: node0 = 0,4,...,20 (all dedicated), node1 = 24,28,...,44.
    assert rows[0] == {"node": 0, "dedicated": "0,4,8,12,16,20", "shared": "", "unused": ""}
    assert rows[1] == {"node": 1, "dedicated": "", "shared": "24,28,32,36,40,44", "unused": ""}
    assert rows[6]["dedicated"] == "1,5,9,13,17,21"
