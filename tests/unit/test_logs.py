"""Log lines as an operator reads them, through oslo.log's own formatter."""

import logging

import pytest
from oslo_config import cfg

from node_agent import logs
from node_agent.errors import ConfigError


@pytest.fixture
def log_file(tmp_path):
    conf = cfg.ConfigOpts()
    logs.register(conf)
    path = tmp_path / "agent.log"
    conf([])
    conf.set_override("log_file", str(path))
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    logs.setup(conf)
    yield path
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.level = level


def test_an_error_logged_while_handling_it_is_said_once(log_file):
    log = logging.getLogger("node_agent.test")
    try:
        raise ConfigError("cpu_dedicated_set overlaps cpu_shared_set on CPUs 4-7")
    except ConfigError as exc:
        log.error("reload refused: %s", exc)
    try:
        raise ConfigError("the disk is on fire")
    except ConfigError:
        log.error("reload refused")  # the summary adds what the message lacks

    lines = log_file.read_text().splitlines()
    assert lines[0].endswith(
        "reload refused: cpu_dedicated_set overlaps cpu_shared_set on CPUs 4-7"
    ), lines[0]
    assert lines[1].endswith(
        "reload refused: node_agent.errors.ConfigError: the disk is on fire"
    ), lines[1]
