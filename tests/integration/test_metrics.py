"""Scrape the real agent's metrics endpoint (and its textfile) while it
runs against the real Placement."""

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

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
    port = free_port()
    textfile = tmp_path / "node_agent.prom"
    agent = AgentProcess(
        tmp_path,
        placement_server.url,
        host_name,
        agent_options=(
            f"report_interval = 1\nmetrics_port = {port}\nmetrics_textfile = {textfile}\n"
        ),
    ).start()
    try:
        agent.status_after(lambda s: s.startswith("ok:"))
        agent.status_after(lambda s: "no change" in s)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            scraped = samples(r.read().decode())
    finally:
        agent.stop()
        agent.notify.close()

    vcpu = ("node_agent_inventory_total", (("provider", host_name), ("resource_class", "VCPU")))
    assert scraped[vcpu] == 16
    assert scraped[("node_agent_last_success_timestamp_seconds", ())] > 0
    assert scraped[("node_agent_cycles_total", ())] >= 2
    assert scraped[("node_agent_problem", (("kind", "placement"),))] == 0
    posts = scraped[
        ("node_agent_placement_requests_total", (("method", "POST"), ("status", "200")))
    ]
    assert posts == 1  # the root provider, created once
    assert samples(textfile.read_text())[vcpu] == 16
