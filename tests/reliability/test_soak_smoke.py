"""A short run of ``make soak``'s harness (soak/run.py), so the soak itself
keeps working: the real agent service, the real Placement and RabbitMQ,
random host changes, Placement checked against the model after each cycle."""

import pytest

from soak import model
from soak.run import Options, run
from tests.integration.rabbit import rabbitmq  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration


def test_model_publishes_a_cut_below_usage_and_holds_everything_when_config_does_not_fit():
    host = model.HostFacts(online_cpus=16, memory_mb=65536, disk_gb=100)
    before = model.after_cycle(None, host, model.Config(), {}).records
    smaller = model.HostFacts(online_cpus=2, memory_mb=65536, disk_gb=100)

    shrunk = model.after_cycle(before, smaller, model.Config(cpu_allocation_ratio=1.0), {"VCPU": 5})
    unfit = model.after_cycle(before, host, model.Config(reserved_host_memory_mb=70000), {})

    # 2 CPUs at 1.0 under 5 VCPU in use: published as nova writes it (the
    # old behaviour kept the 16-CPU record, which the invariant then closed).
    assert shrunk.outcome == "ok" and shrunk.cut == ("VCPU",) and shrunk.kept == ()
    assert shrunk.records["VCPU"] == {
        **before["VCPU"],
        "total": 2,
        "max_unit": 2,
        "allocation_ratio": 1.0,
    }
    assert shrunk.records["MEMORY_MB"] == before["MEMORY_MB"]
    assert unfit.outcome == "unfit" and unfit.records == before
    assert model.cpulist({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"


def test_thirty_soak_cycles_keep_placement_equal_to_the_model(tmp_path, placement_server, rabbitmq):
    result = run(
        Options(
            cycles=30,
            seed=11,
            sample_every=10,
            workdir=tmp_path,
            placement_url=placement_server.url,
            transport_url=rabbitmq,
        )
    )

    assert result["failure"] is None, result["failure"]
    assert result["cycles_checked"] == 30
    assert result["agent_exit_code"] == 0
    assert sum(result["changes"].values()) >= 20
    assert result["checks_passed"] >= 30 * 5
    assert result["open_fds"]["last"] - result["open_fds"]["first"] <= 3
