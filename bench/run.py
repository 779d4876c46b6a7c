"""``make bench``: measure node-agent (and nova's report client) and write BENCHMARKS.md.

    .venv/bin/python -m bench.run [--output BENCHMARKS.md] [--nova-python .venv-nova/bin/python]
                                  [--skip-fleet] [--only SECTION ...] [--json FILE]

Benchmarks report; they never fail the build: a section that breaks is
reported as such in the file and the others still run. ``--only`` runs the
named sections (discovery, phases, memory, fleet, messaging, production,
outage, audit, companion, appliers, before_after, candidates) and replaces just their part
of an existing output file.
"""

from __future__ import annotations

import argparse
import compileall
import json
import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench import (
    appliers,
    audit,
    before_after,
    candidates,
    companion,
    discovery,
    fleet,
    memory,
    messaging,
    outage,
    phases,
    production,
    report,
    synthetic_host,
)
from devenv.embedded_placement import start_subprocess
from tests.hostdata import HOSTDATA, sysfs_root_for

REPO = Path(__file__).resolve().parents[1]
# Seconds for the whole fleet section: a size that the previous one projects
# past it is skipped (and the file says so).
FLEET_BUDGET = 150
SECTIONS = report.SECTION_ORDER
RUN_ORDER = (
    "phases",
    "production",
    "outage",
    "before_after",
    "discovery",
    "memory",
    "fleet",
    "messaging",
    "appliers",
    "audit",
    "companion",
    "candidates",
)


def _section(results: dict, name: str, fn) -> None:
    start = time.monotonic()
    print(f"[bench] {name} ...", flush=True)
    try:
        results[name] = fn()
    except Exception:  # noqa: BLE001 - reported in BENCHMARKS.md, never fatal
        results[name] = {"failed": traceback.format_exc()}
        print(results[name]["failed"], file=sys.stderr)
    took = time.monotonic() - start
    results.setdefault("durations", {})[name] = took
    print(f"[bench] {name} done in {took:.0f} s", flush=True)


def _memory(work: Path, nova_python: Path) -> dict:
    # As an installed copy has: without bytecode (PYTHONDONTWRITEBYTECODE),
    # every process would compile the package again (Makefile, install).
    compileall.compile_dir(str(REPO / "node_agent"), quiet=1)
    fixture = sysfs_root_for(HOSTDATA / memory.FIXTURE, work / "memory-fixture")
    synthetic = synthetic_host.build(work / "memory-synthetic", synthetic_host.Shape())
    server = start_subprocess(work / "placement-soak")
    try:
        return memory.run(work / "memory", nova_python, fixture, synthetic, server.url)
    finally:
        server.stop()


def _render_saved(saved: Path, output: Path) -> int:
    results = json.loads(saved.read_text())
    done = [s for s in SECTIONS if s in results]
    m = results["machine"]
    note = (
        f"*Measured on {m['date']} at commit `{m['commit']}` in {{took:.0f}} s, in a "
        "full run that was stopped before its last sections; the machine line above "
        "is that of an earlier full run.*"
    )
    output.write_text(report.merge(output.read_text(), results, done, note))
    print(f"[bench] merged {', '.join(done)} from {saved} into {output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    # Processes the bench starts load compiled bytecode, as an installed
    # package does (pip compiles it): a shell that forbids writing it would
    # time the compiler on every start instead.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--output", type=Path, default=REPO / "BENCHMARKS.md")
    parser.add_argument("--nova-python", type=Path, default=REPO / ".venv-nova" / "bin" / "python")
    parser.add_argument("--skip-fleet", action="store_true")
    parser.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        metavar="SECTION",
        help="run only this section (repeatable; one of "
        f"{', '.join(SECTIONS)}) and merge it into --output",
    )
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument(
        "--render-json",
        type=Path,
        metavar="FILE",
        help="run nothing: merge the sections a (possibly interrupted) "
        "run wrote to FILE with --json into --output",
    )
    args = parser.parse_args(argv)
    if args.render_json:
        return _render_saved(args.render_json, args.output)
    # The processes the bench starts (node-agent, the probes) run this
    # checkout's code, not whatever the venv's editable install points at.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    logging.disable(logging.WARNING)  # the agents' per-cycle lines would drown the output
    chosen = [
        s
        for s in SECTIONS
        if s in (args.only or SECTIONS) and not (s == "fleet" and args.skip_fleet and not args.only)
    ]

    started = time.monotonic()
    results: dict = {
        "machine": report.machine(args.nova_python),
        "load": {"start": os.getloadavg()[0]},
    }
    # Not a context manager: the report is written before the (slow) removal
    # of the synthetic hosts' many small files.
    tmp = tempfile.TemporaryDirectory(prefix="node-agent-bench-")
    work = Path(tmp.name)
    runs = {
        "discovery": lambda: discovery.run(work / "discovery"),
        "phases": lambda: phases.run(work / "phases", args.nova_python),
        "memory": lambda: _memory(work, args.nova_python),
        "fleet": lambda: fleet.run(work / "fleet", FLEET_BUDGET),
        "messaging": lambda: messaging.run(work / "messaging"),
        "production": lambda: production.run(work / "production", args.nova_python),
        "outage": lambda: outage.run(work / "outage"),
        "audit": lambda: audit.run(work / "audit"),
        "companion": lambda: companion.run(work / "companion"),
        "appliers": lambda: appliers.run(work / "appliers"),
        "before_after": lambda: before_after.run(work / "before-after"),
        "candidates": lambda: candidates.run(work / "candidates"),
    }
    try:
        # The sections issue 19 asked for first, so an interrupted run still
        # has them (--json is rewritten after every section).
        for name in sorted(chosen, key=RUN_ORDER.index):
            _section(results, name, runs[name])
            if args.json:
                args.json.write_text(json.dumps(results, indent=1, default=str))
        results["total_seconds"] = time.monotonic() - started
        results["load"]["end"] = os.getloadavg()[0]
        if args.only and args.output.exists():
            text = report.merge(args.output.read_text(), results, chosen)
        else:
            text = report.render(results, args.output.read_text() if args.output.exists() else "")
        args.output.write_text(text)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, default=str))
    finally:
        tmp.cleanup()
    print(f"[bench] wrote {args.output} in {results['total_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
