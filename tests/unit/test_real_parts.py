"""tests/real_parts.py: a missing real part skips, or fails where CI requires it."""

from __future__ import annotations

import pytest

from tests.real_parts import REQUIRE_REAL, skip_or_fail


@pytest.mark.parametrize("value", [None, "0", ""])
def test_a_missing_real_part_skips_with_its_reason_by_default(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(REQUIRE_REAL, raising=False)
    else:
        monkeypatch.setenv(REQUIRE_REAL, value)
    with pytest.raises(pytest.skip.Exception, match="redis-server is not installed"):
        skip_or_fail("redis-server is not installed")


def test_a_missing_real_part_fails_when_ci_requires_real_parts(monkeypatch):
    monkeypatch.setenv(REQUIRE_REAL, "1")
    with pytest.raises(pytest.fail.Exception, match="redis-server is not installed") as raised:
        skip_or_fail("redis-server is not installed")
    assert "NODE_AGENT_REQUIRE_REAL=1" in str(raised.value)
