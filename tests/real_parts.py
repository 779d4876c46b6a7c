"""Skipping a test whose real part (a server, a daemon) is missing here.

On a developer's machine a missing redis-server or libvirtd skips, with the
reason. CI sets ``NODE_AGENT_REQUIRE_REAL=1``: there a missing real part is
a broken machine, and a skip would let the tests that need it pass
unnoticed, so it fails instead."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_REAL = "NODE_AGENT_REQUIRE_REAL"


def skip_or_fail(reason: str) -> NoReturn:
    if os.environ.get(REQUIRE_REAL) == "1":
        pytest.fail(f"{reason} ({REQUIRE_REAL}=1: a real part must not be skipped)", pytrace=False)
    pytest.skip(reason)
