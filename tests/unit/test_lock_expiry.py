"""How long a killed applier keeps a host locked in Redis, against how long
a message waits for that lock ([applier] lock_timeout)."""

from __future__ import annotations

import pytest

from node_agent.errors import ConfigError
from node_agent.remote.coordination import redis_lock_expiry

URL = "redis://:pw@127.0.0.1:6379"


@pytest.mark.parametrize("lock_timeout, expiry", [(20, 10), (8, 4), (3, 1), (2, 1), (7.5, 3)])
def test_unset_in_the_url_the_expiry_is_half_the_wait_so_the_next_message_applies(
    lock_timeout, expiry
):
    assert redis_lock_expiry(URL, lock_timeout) == (expiry, False)
    assert expiry < lock_timeout


@pytest.mark.parametrize("query", ["?lock_timeout=5", "?timeout=5", "?timeout=60&lock_timeout=5"])
def test_an_expiry_set_in_the_url_below_the_wait_is_kept(query):
    assert redis_lock_expiry(URL + query, 20) == (5, True)


@pytest.mark.parametrize("query", ["?lock_timeout=30", "?lock_timeout=20", "?timeout=30"])
def test_an_expiry_set_in_the_url_not_below_the_wait_is_refused(query):
    with pytest.raises(ConfigError, match="not less than \\[applier\\] lock_timeout"):
        redis_lock_expiry(URL + query, 20)


def test_a_wait_too_short_for_any_expiry_or_a_bad_number_is_refused():
    with pytest.raises(ConfigError, match="lock_timeout = 1 is too short"):
        redis_lock_expiry(URL, 1)
    with pytest.raises(ConfigError, match="not a whole number"):
        redis_lock_expiry(URL + "?lock_timeout=soon", 20)
