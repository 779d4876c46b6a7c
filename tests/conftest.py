"""What every test directory shares: the strict mode for real parts.

A test whose real part is missing (nova's virtualenv, a RabbitMQ, Redis or
PostgreSQL server, libvirtd) skips with the reason. CI sets
``NODE_AGENT_REQUIRE_REAL=1``: then it fails instead, so a green run proves
that every real part ran.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_REAL = "NODE_AGENT_REQUIRE_REAL"


def skip_or_fail(reason: str) -> NoReturn:
    """Skip with ``reason``; with ``NODE_AGENT_REQUIRE_REAL=1``, fail."""
    if os.environ.get(REQUIRE_REAL) == "1":
        pytest.fail(f"{reason} ({REQUIRE_REAL}=1: a missing real part is a failure)",
                    pytrace=False)
    pytest.skip(reason)
