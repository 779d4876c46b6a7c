"""The one line an operator reads when the metrics endpoint cannot listen:
the fix fits the cause."""

import errno
import os

import pytest

from node_agent.service.metrics import listen_problem


def failure(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@pytest.mark.parametrize(
    "code, port, fix",
    [
        (errno.EADDRINUSE, 9100, "Another process holds the port (see `ss -ltnp`)"),
        (errno.EACCES, 80, "Ports below 1024 need privileges the service user does not have"),
        (errno.EADDRNOTAVAIL, 9100, "192.0.2.1 is not an address of this machine"),
    ],
)
def test_the_hint_names_the_cause_of_the_failed_listen(code, port, fix):
    text = listen_problem("[agent] metrics_port", "192.0.2.1", port, failure(code))
    assert text.startswith(
        f"[agent] metrics_port = {port}: cannot listen on 192.0.2.1:{port}: {os.strerror(code)}. "
    )
    assert fix in text


def test_a_privileged_port_is_not_blamed_on_another_process():
    text = listen_problem("[applier] metrics_port", "0.0.0.0", 443, failure(errno.EACCES))
    assert "Another process" not in text
