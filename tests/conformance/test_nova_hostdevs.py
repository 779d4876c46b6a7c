"""The PCI hostdev XML the agent's tests read is what nova 34 writes today
(``tests/data/nova_hostdevs``, see its README)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from node_agent.host.domain import parse_domain
from tests.conformance.bridge import NOVA_VENV, nova_python
from tests.real_parts import skip_or_fail

CORPUS = Path(__file__).resolve().parents[1] / "data" / "nova_hostdevs"


def test_committed_hostdevs_are_what_nova_writes_today(tmp_path):
    python = nova_python()
    if python is None:
        skip_or_fail(f"nova's virtualenv {NOVA_VENV} is not built (make nova-venv)")
    run = subprocess.run(
        [str(python), str(CORPUS / "generate.py"), str(tmp_path)],
        env={**os.environ, "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    fresh = (tmp_path / "pci-passthrough.xml").read_text()
    assert fresh == (CORPUS / "pci-passthrough.xml").read_text(), (
        "nova writes these hostdevs differently now: regenerate with `make nova-guests`"
    )
    assert parse_domain(fresh, True).pci_devices == ("0000:3b:02.1", "0000:81:00.0", "0001:0a:1f.7")
