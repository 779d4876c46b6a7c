"""Scrape the real agent's metrics endpoint (and its textfile) while it
runs against the real Placement."""

import re
import signal
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import promlint
from tests.integration.agent_process import AgentProcess
from tests.integration.rabbit import free_port

pytestmark = pytest.mark.integration


def samples(text):
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_endpoint_shows_inventory_requests_and_last_success(
    tmp_path, placement_server, host_name
):
    textfile = tmp_path / "node_agent.prom"
    scraped = samples(
        scrape_running(
            tmp_path,
            placement_server.url,
            host_name,
            textfile,
            lambda s: s.startswith("ok:"),
            lambda s: "no change" in s,
        )
    )

    vcpu = ("node_agent_inventory", (("provider", host_name), ("resource_class", "VCPU")))
    assert scraped[vcpu] == 16
    assert scraped[("node_agent_last_success_timestamp_seconds", ())] > 0
    assert scraped[("node_agent_cycles_total", ())] >= 2
    assert scraped[("node_agent_problem", (("kind", "placement"),))] == 0
    posts = scraped[
        ("node_agent_placement_requests_total", (("method", "POST"), ("status", "200")))
    ]
    assert posts == 1  # the root provider, created once
    assert samples(textfile.read_text())[vcpu] == 16


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.read().decode()


def scrape_running(tmp_path, url: str, host: str, textfile, *ready) -> str:
    """The endpoint of a service writing ``textfile`` too, scraped once its
    status has passed each of ``ready`` in turn; the service is then stopped."""
    port = free_port()
    agent = AgentProcess.with_metrics(tmp_path, url, host, port, textfile).start()
    try:
        for check in ready:
            agent.status_after(check)
        return scrape(port)
    finally:
        agent.stop()
        agent.notify.close()


def test_metrics_are_promtool_clean_with_build_and_process_metrics(
    tmp_path, placement_server, host_name
):
    """Issue 28: ``promtool check metrics`` refused the gauge
    node_agent_inventory_total, and there was no build or process metric.
    The endpoint's and the textfile's output pass promtool's checks
    (tests/promlint.py, and promtool itself when it is installed)."""
    textfile = tmp_path / "node_agent.prom"
    text = scrape_running(
        tmp_path, placement_server.url, host_name, textfile, lambda s: s.startswith("ok:")
    )
    written = textfile.read_text()
    for output in (text, written):
        assert promlint.problems(output) == []
        assert promlint.promtool_problems(output) in (None, [])
        assert "node_agent_inventory{" in output
    scraped = samples(text)
    [(labels, value)] = [(k[1], v) for k, v in scraped.items() if k[0] == "node_agent_build_info"]
    assert value == 1 and dict(labels)["version"] and re.match(r"3\.\d+", dict(labels)["python"])
    assert scraped[("process_resident_memory_bytes", ())] > 0
    assert scraped[("process_cpu_seconds_total", ())] > 0
    assert scraped[("process_start_time_seconds", ())] > 0
    assert scraped[("process_open_fds", ())] > 0
    # node_exporter reads the textfile and exports its own process_* series.
    assert "process_" not in written and "node_agent_build_info{" in written


HOST_XML = Path(__file__).resolve().parents[1] / "data" / "libvirt" / "host.xml"


def test_a_refused_configuration_raises_problem_with_its_reason_and_logs_one_error(
    tmp_path, placement_server, host_name
):
    """Issue 28: with guests the CPU sets leave without CPUs the service
    looked healthy (node_agent_problem 0, last success moving) and logged the
    same ERROR every cycle. Now: one ERROR, the problem with its reason, the
    last success held; the fix clears it with one INFO line."""
    port = free_port()
    agent = AgentProcess.with_metrics(tmp_path, placement_server.url, host_name, port)
    # Floating guests 03, 05, 06 of host.xml need a cpu_shared_set.
    good = agent.config_text().replace(
        "[libvirt]\nconnection_uri =\n", f"[libvirt]\nconnection_uri = test://{HOST_XML}\n"
    )
    fits = good.replace(
        "reserved_host_memory_mb = 512\n",
        "reserved_host_memory_mb = 512\ncpu_dedicated_set = 2-13\ncpu_shared_set = 0-1,14-15\n",
    )
    refused = good.replace(
        "reserved_host_memory_mb = 512\n",
        "reserved_host_memory_mb = 512\ncpu_dedicated_set = 0-15\n",
    )
    problem = ("node_agent_problem", (("kind", "config"), ("reason", "guests_do_not_fit")))
    success = ("node_agent_last_success_timestamp_seconds", ())
    agent.write_config(fits)
    agent.start()
    try:
        agent.status_after(lambda s: s.startswith("ok:"))
        before = samples(scrape(port))
        assert before[success] > 0 and problem not in before

        agent.write_config(refused)
        agent.send(signal.SIGHUP)
        agent.new_status(lambda s: s.startswith("incomplete:"))
        held = samples(scrape(port))[success]  # the last ok cycle's, before the reload
        for _ in range(2):  # two more refused cycles
            agent.new_status(lambda s: s.startswith("incomplete:"))
        during = samples(scrape(port))
        assert during[problem] == 1
        assert during[("node_agent_problem", (("kind", "placement"),))] == 0
        assert during[success] == held >= before[success]
        errors = [line for line in agent.log().splitlines() if " ERROR " in line]
        assert len(errors) == 1, errors
        assert "CPU sets refused" in errors[0]
        assert agent.log().count("shared guest instance-00000003 (") == 1

        agent.write_config(fits)
        agent.send(signal.SIGHUP)
        agent.new_status(lambda s: s.startswith("ok:"))
        after = samples(scrape(port))
    finally:
        agent.stop()
        agent.notify.close()
    assert problem not in after
    assert after[("node_agent_problem", (("kind", "config"),))] == 0
    assert after[success] > held
    assert "the refusal (guests_do_not_fit) is over" in agent.log()
