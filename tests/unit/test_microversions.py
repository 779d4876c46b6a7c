"""Microversion arithmetic and the version check's verdicts (pure)."""

import pytest

from node_agent.placement import microversions
from node_agent.placement.client import PlacementClient, version_refusal


@pytest.mark.parametrize(
    "version, wanted, expected",
    [
        ("1.10", "1.9", True),
        ("1.9", "1.10", False),
        ("1.38", "1.38", True),
        ("2.0", "1.39", True),
        ("1.29", "1.30", False),
    ],
)
def test_versions_compare_numerically_not_as_text(version, wanted, expected):
    assert microversions.at_least(version, wanted) is expected


@pytest.mark.parametrize("text", ["", "1", "1.", "v1.30", "1.3a", "latest"])
def test_malformed_version_is_refused(text):
    with pytest.raises(ValueError):
        microversions.parse(text)


def test_required_is_the_newest_version_in_the_table():
    newest = max(microversions.parse(v) for v, _ in microversions.FEATURES)

    assert microversions.parse(microversions.REQUIRED) == newest
    assert PlacementClient.MICROVERSION == microversions.REQUIRED


def test_table_is_oldest_first_without_duplicates():
    versions = [microversions.parse(v) for v, _ in microversions.FEATURES]

    assert versions == sorted(set(versions))


def test_server_just_below_a_feature_lacks_it_and_everything_newer():
    missing = microversions.missing_features("1.29")

    assert [v for v, _ in missing][0] == "1.30"
    assert all(microversions.at_least(v, "1.30") for v, _ in missing)
    assert microversions.missing_features(microversions.REQUIRED) == []


def test_server_with_the_required_version_is_accepted():
    assert version_refusal("http://p", "1.0", microversions.REQUIRED) is None


def test_too_old_server_message_names_url_versions_and_missing_feature():
    message = version_refusal("http://p:8778", "1.0", "1.28")

    assert message.startswith(
        f"Placement at http://p:8778 supports up to 1.28; node-agent needs {microversions.REQUIRED}"
    )
    assert "1.30 POST /reshaper" in message


def test_server_that_dropped_our_version_is_refused():
    message = version_refusal("http://p", "2.0", "2.5")

    assert "no longer accepts" in message


def test_request_stats_count_forever_but_keep_only_recent_requests():
    from node_agent.placement.client import RequestStats

    stats = RequestStats()
    for n in range(RequestStats.LOG_LIMIT + 500):
        stats.record("GET" if n % 2 else "PUT", f"/p/{n}", 200)
    assert stats.total == RequestStats.LOG_LIMIT + 500
    assert stats.reads == stats.writes == (RequestStats.LOG_LIMIT + 500) // 2
    assert len(stats.log) == RequestStats.LOG_LIMIT
    assert stats.log[-1] == ("GET", f"/p/{RequestStats.LOG_LIMIT + 499}", 200)
    assert stats.by_status[("PUT", 200)] == stats.writes
