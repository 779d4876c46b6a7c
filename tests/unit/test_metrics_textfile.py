"""[agent] metrics_textfile that cannot be written: one WARNING per cause
with the fix, not one per cycle, and one INFO when it is written again."""

import logging

from node_agent.service.metrics import Metrics


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
