"""[agent] metrics_textfile (and the log directory) that cannot be written:
one WARNING per cause with the fix for that cause, not one per cycle, and
one INFO when it is written again."""

import errno
import logging
import os

import pytest

from node_agent.logs import log_path_fix
from node_agent.service.metrics import UNIT_TEXTFILE_DIR, Metrics, textfile_fix


def test_an_unwritable_textfile_is_said_once_per_cause_and_its_end_once(tmp_path, caplog):
    directory = tmp_path / "textfile"
    metrics = Metrics(textfile=str(directory / "node-agent.prom"))
    with caplog.at_level(logging.INFO, logger="node_agent.service.metrics"):
        for _cycle in range(3):
            metrics.write_textfile()
        directory.mkdir()
        metrics.write_textfile()
        metrics.write_textfile()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert len(lines) == 2, lines
    (level, warning), (again_level, again) = lines
    assert level == logging.WARNING
    assert f"cannot write metrics to {directory / 'node-agent.prom'}" in warning
    assert f"{directory} does not exist" in warning
    assert again_level == logging.INFO and "written to" in again
    assert (directory / "node-agent.prom").read_text().startswith("# HELP")


@pytest.mark.parametrize(
    "code, fragments",
    [
        (errno.EROFS, ("/srv/m is read-only", UNIT_TEXTFILE_DIR, "ReadWritePaths=/srv/m")),
        (errno.EACCES, ("setfacl -m u:node-agent:rwx /srv/m",)),
        (errno.ENOENT, ("/srv/m does not exist",)),
    ],
)
def test_the_textfile_fix_matches_the_cause(code, fragments):
    text = textfile_fix(OSError(code, os.strerror(code)), "/srv/m/node-agent.prom")
    for fragment in fragments:
        assert fragment in text, text


def test_a_read_only_log_directory_names_the_units_log_directory():
    text = log_path_fix(OSError(errno.EROFS, os.strerror(errno.EROFS)))
    assert "log_dir = /var/log/node-agent" in text and "ReadWritePaths=" in text
