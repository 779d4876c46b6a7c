"""etc/node-agent.conf.sample is generated from node_agent/config/options.py, never hand-edited."""

import subprocess
import sys
from pathlib import Path

from node_agent.config.files import load_conf

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "etc" / "node-agent.conf.sample"


def test_sample_matches_what_the_generator_writes_now(tmp_path):
    out = tmp_path / "sample.conf"
    generator = Path(sys.executable).with_name("oslo-config-generator")
    subprocess.run(
        [
            str(generator),
            "--namespace",
            "node_agent",
            "--output-file",
            str(out),
            "--wrap-width",
            "79",
        ],
        check=True,
        capture_output=True,
    )
    assert out.read_text() == SAMPLE.read_text(), "run `make config` and commit the result"


def test_sample_with_every_option_uncommented_has_no_unknown_option(tmp_path):
    lines = []
    for line in SAMPLE.read_text().splitlines():
        if line.startswith("#") and " = " in line and not line.startswith("# "):
            name, value = line[1:].split(" = ", 1)
            if "<" not in value:  # skip sample placeholders such as <None>
                lines.append(f"{name} = {value}")
                continue
        lines.append(line if line.startswith("[") else "")
    config = tmp_path / "all.conf"
    config.write_text("\n".join(lines) + "\n")
    load_conf(["--config-file", str(config)])
