"""BENCHMARKS.md from the results of bench.run: machine, versions, tables."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from collections import Counter
from importlib import metadata
from pathlib import Path

from bench.common import fmt_stat

REPO = Path(__file__).resolve().parents[1]

# phase -> (nova as the issue recorded it, node-agent target).
ISSUE = {
    "first registration": ("28", "≤ 18"),
    "steady cycle, 0 instances": ("6 GETs", "≤ 1"),
    "steady cycle, 100 instances": ("106 GETs", "≤ 1"),
    "steady cycle, 1000 instances": ("–", "≤ 1"),
    "inventory change after scheduler activity, 100 instances": ("229", "≤ 3"),
    "reshape, 100 consumers (VCPU → PCPU)": ("128", "≤ 102"),
    "reshape, 1000 consumers (VCPU → PCPU)": ("–", "≤ 1002"),
}


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str:
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def machine(nova_python: Path) -> dict:
    nova = subprocess.run(
        [str(nova_python), "-c", "from importlib import metadata as m; "
         "print(m.version('nova'), m.version('keystoneauth1'))"],
        capture_output=True, text=True)
    nova_versions = nova.stdout.split() or ["not installed", "?"]
    mem_kib = next((int(line.split()[1]) for line in open("/proc/meminfo")
                    if line.startswith("MemTotal:")), 0)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(), "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(), "python": platform.python_version(),
        "commit": _git_commit(),
        "versions": {
            "node-agent": _version("node-agent"),
            "openstack-placement": _version("openstack-placement"),
            "keystoneauth1": _version("keystoneauth1"),
            "SQLAlchemy": _version("SQLAlchemy"),
            "psycopg2-binary": _version("psycopg2-binary"),
            "nova (in .venv-nova)": nova_versions[0],
            "keystoneauth1 (in .venv-nova)": nova_versions[1] if len(nova_versions) > 1 else "?",
        },
    }


def _failed(section: dict) -> str | None:
    if "failed" in section:
        return "This section failed:\n\n```\n" + section["failed"].strip() + "\n```\n"
    return None


def _machine(m: dict) -> list[str]:
    lines = ["## Machine and versions", "",
             f"- measured {m['date']} at commit `{m['commit']}`",
             f"- {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB RAM, "
             f"Linux {m['kernel']}, Python {m['python']}"]
    lines += [f"- {name} {version}" for name, version in m["versions"].items()]
    return lines + [""]


def _discovery(d: dict) -> list[str]:
    lines = ["## 1. Discovery and plan time", ""]
    if _failed(d):
        return lines + [_failed(d)]
    lines += [
        f"Milliseconds, median (min–max) of {d['repeats']} runs in one process. "
        "*discover* reads sysfs (and sizes the instances filesystem); *build* is "
        "partition + tree; *plan* is `plan_changes` against a Placement that already "
        "matches (a steady cycle) and against an empty one (first registration). "
        "*cycle* = discover + build + steady plan. Target: cycle < 50 ms.", "",
        "| host | CPUs | providers | discover | build | plan (steady) | "
        "plan (first) | cycle |",
        "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for h in d["hosts"]:
        lines.append(
            f"| {h['host']} | {h['cpus']} | {h['providers']} | {fmt_stat(h['discover'])} "
            f"| {fmt_stat(h['build'])} | {fmt_stat(h['plan_steady'])} "
            f"| {fmt_stat(h['plan_first'])} ({h['first_changes']} requests) "
            f"| **{fmt_stat(h['cycle'])}** |")
    base = d["scaling"][0]["cycle"]["median"]
    lines += ["", "Growth with the CPU count (synthetic host, same 16 GPUs and 4 PFs × "
              "128 VFs, NUMA nodes grow with the CPUs):", "",
              "| scale | CPUs | NUMA nodes | providers | discover | cycle | cycle vs 1× |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for s in d["scaling"]:
        lines.append(
            f"| {s['factor']}× | {s['cpus']} | {2 * s['factor']} | {s['providers']} "
            f"| {fmt_stat(s['discover'])} | {fmt_stat(s['cycle'])} "
            f"| {s['cycle']['median'] / base:.2f}× |")
    b = d["breakdown"]
    lines += ["", f"Where discovery of the 384-CPU synthetic host goes: CPU/NUMA topology "
              f"{fmt_stat(b['topology'])} ms, PCI devices (16 GPUs, 4 PFs, 512 VFs: "
              f"every device directory is visited) {fmt_stat(b['pci'])} ms.", ""]
    return lines


def _req(side: dict | None) -> str:
    if not side:
        return "–"
    r = side["requests"]
    first = side["first"]
    text = f"{r['median']:g}"
    if r["min"] != r["max"]:
        text += f" ({r['min']:g}–{r['max']:g})"
    detail = f"{first['gets']} GET, {first['writes']} write"
    if first["conflicts"]:
        detail += f", {first['conflicts']}× 409"
    text += f" [{detail}]"
    if side["errors"]:
        text += " ⚠ error"
    return text


def _phases(p: dict) -> list[str]:
    lines = ["## 2. Placement requests and wall time per phase", ""]
    if _failed(p):
        return lines + [_failed(p)]
    lines += [
        "Same embedded Placement (SQLite, loopback) for both agents, each with its own "
        "host: the 384-CPU synthetic host reported as root + 4 SR-IOV children "
        "(`[pci] device_spec` on the 4 PFs). Requests are counted from Placement's "
        "request log, the same way for both sides; the bracket is the first run's "
        "split. Instances are allocations (1 VCPU, 256 MiB) written on the root by a "
        "stand-in scheduler. node-agent cycles are 60 s apart on a simulated clock, "
        "with its full verify every 300 s shown as its own row. nova is "
        "`SchedulerReportClient` + `ProviderTree` driven as the resource tracker's "
        "`_update_to_placement` drives them (bench/nova_driver.py).", "",
        "| phase | node-agent requests | nova requests | nova / node-agent | nova in the issue "
        "| node-agent target | node-agent ms | nova ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for phase, sides in p["rows"].items():
        na, nova = sides.get("node-agent"), sides.get("nova")
        ratio = "–"
        if na and nova:
            a, b = na["requests"]["median"], nova["requests"]["median"]
            ratio = ((f"{b / a:.0f}×" if b / a >= 10 else f"{b / a:.2f}×")
                     if a else f"0 vs {b:g}")
        issue, target = ISSUE.get(phase, ("–", "–"))
        lines.append(
            f"| {phase} | {_req(na)} | {_req(nova)} | {ratio} | {issue} | {target} "
            f"| {fmt_stat(na['seconds']) if na else '–'} "
            f"| {fmt_stat(nova['seconds']) if nova else '–'} |")
    lines += ["", "Reshape check (PCPU used on the root afterwards, should equal the "
              "consumers): " + ", ".join(
                  f"{n} consumers: node-agent {c['node-agent']}, nova {c['nova']}"
                  for n, c in p["reshape_check"].items()), ""]
    lines += _errors(p) + _request_detail(p)
    return lines


def _errors(p: dict) -> list[str]:
    found = [(phase, side, e) for phase, sides in p["rows"].items()
             for side, v in sides.items() for e in v["errors"][:1]]
    if not found:
        return []
    return ["Errors reported by a side (first of each phase):", ""] + [
        f"- {phase}, {side}: `{e[:300]}`" for phase, side, e in found] + [""]


def _request_detail(p: dict) -> list[str]:
    lines = ["<details><summary>Requests of each phase (first run), uuids folded"
             "</summary>", ""]
    for phase, sides in p["rows"].items():
        for side, v in sides.items():
            shapes = Counter(v["first"]["paths"])
            listed = "; ".join(f"{n}× {s}" if n > 1 else s for s, n in shapes.items())
            extra = v["first"].get("reply") or {}
            note = (f" (reshaper part: {extra['reshaper_requests']})"
                    if "reshaper_requests" in extra else "")
            lines.append(f"- **{phase}, {side}**{note}: {listed or 'none'}")
    return lines + ["", "</details>", ""]


def _memory(m: dict) -> list[str]:
    lines = ["## 3. Memory and start-up", ""]
    if _failed(m):
        return lines + [_failed(m)]
    na, nova = m["node_agent_import"], m["nova_import"]

    def mib(v):
        return f"{v:.1f}"

    def sec(v):
        return f"{v:.2f}"

    lines += [
        "Fresh interpreter each time, median (min–max) of "
        f"{na['seconds']['n']} runs.", "",
        "| | import time (s) | RSS after import (MiB) |", "|---|---:|---:|",
        f"| node-agent (cli, cycle, sync, placement, reshaper, daemon) "
        f"| {fmt_stat(na['seconds'], sec)} | {fmt_stat(na['rss_mib'], mib)} |",
        f"| nova report client + ProviderTree | {fmt_stat(nova['seconds'], sec)} "
        f"| {fmt_stat(nova['rss_mib'], mib)} |",
        f"| ratio nova / node-agent | {nova['seconds']['median'] / na['seconds']['median']:.1f}× "
        f"| {nova['rss_mib']['median'] / na['rss_mib']['median']:.1f}× |", "",
        "`node-agent --once --dry-run --output json` (whole process, no libvirt, no "
        "Placement), target < 1 s:", ""]
    for d in m["dry_run"]:
        lines.append(f"- {d['host']}: {fmt_stat(d['seconds'], sec)} s (exit {d['exit']})")
    s = m["soak"]
    samples = s["samples_kib"]
    start = samples[0]
    lines += ["", f"Soak: {s['cycles']:,} cycles in one process against "
              f"{s['fixture']} (discovery + partition + tree + steady sync against the "
              f"embedded Placement, full verify every 5th cycle: {s['requests']} requests "
              f"in all), {s['seconds']:.0f} s, "
              f"{s['seconds'] / s['cycles'] * 1000:.1f} ms per cycle:", "",
              "| cycles | " + " | ".join(f"{k:,}" for k in sorted(samples)) + " |",
              "|---|" + "---:|" * len(samples),
              "| RSS (MiB) | " + " | ".join(f"{samples[k] / 1024:.1f}"
                                          for k in sorted(samples)) + " |",
              "| growth since start (MiB) | " + " | ".join(
                  f"{(samples[k] - start) / 1024:+.1f}" for k in sorted(samples)) + " |",
              ""]
    return lines


def _fleet(f: dict, phases: dict) -> list[str]:
    lines = ["## 4. Fleet against one Placement on PostgreSQL", ""]
    if _failed(f):
        return lines + [_failed(f)]
    lines += [
        f"One embedded Placement (single process, threaded WSGI server) on PostgreSQL "
        f"{f['postgres']} at 127.0.0.1, a fresh database dropped afterwards. N agents, "
        f"each its own TreeSyncer, HTTP session, state directory and root provider "
        f"(root + 4 children), run {f['cycles']} cycles in waves on {f['workers']} "
        "worker threads; a cycle is the pure pipeline plus the sync (discovery is "
        "section 1). Cycles are 60 s apart on a simulated clock, so cycle 6 is a full "
        "verify. Latency includes waiting for Placement behind the other agents of "
        "the wave.", "",
        "| agents | cycle 1 (registration): requests, wall s, req/s, p50 / p99 s "
        "| cycles 2–10: requests per agent-cycle | cycles 2–10: p50 / p99 s "
        "| full-verify wave: req/s | failed cycles |",
        "|---:|---|---:|---|---:|---:|"]
    for fl in f["fleets"]:
        first = fl["waves"][0]
        verify = max(fl["waves"][1:], key=lambda w: w["requests"])
        failed = sum(w["failed"] for w in fl["waves"])
        lines.append(
            f"| {fl['size']:,} | {first['requests']:,}, {first['wall']:.1f}, "
            f"{first['rps']:.0f}, {first['p50']:.2f} / {first['p99']:.2f} "
            f"| {fl['steady_requests_per_agent_cycle']:.2f} "
            f"| {fl['steady_p50']:.4f} / {fl['steady_p99']:.2f} "
            f"| {verify['rps']:.0f} | {failed} |")
    for skipped in f["skipped"]:
        lines.append(f"\n{skipped['size']:,} agents were skipped: the smaller fleet "
                     f"projected {skipped['estimate']:.0f} s, more than the "
                     f"{skipped['left']:.0f} s left of the fleet budget.")
    lines += [""] + _fleet_comparison(f, phases)
    return lines


def _nova_steady(phases: dict, instances: int):
    try:
        return phases["rows"][f"steady cycle, {instances} instances"]["nova"][
            "requests"]["median"]
    except (KeyError, TypeError):
        return None


def _fleet_comparison(f: dict, phases: dict) -> list[str]:
    if not f["fleets"]:
        return []
    capacity = max(fl["waves"][0]["rps"] for fl in f["fleets"])
    lines = ["Steady state at the default 60 s report interval, requests per second "
             "Placement must serve (node-agent: measured over cycles 2–10, full "
             "verify included; nova: its measured steady cycle from section 2 times "
             f"the fleet). This Placement served up to {capacity:.0f} req/s here.", "",
             "| agents | node-agent req/s | nova req/s, 0 instances/host "
             "| nova req/s, 100 instances/host | nova / node-agent (0 instances) |",
             "|---:|---:|---:|---:|---:|"]
    nova0, nova100 = _nova_steady(phases, 0), _nova_steady(phases, 100)
    for fl in f["fleets"]:
        n = fl["size"]
        na = fl["steady_requests_per_agent_cycle"] * n / 60
        n0 = nova0 * n / 60 if nova0 is not None else None
        n100 = nova100 * n / 60 if nova100 is not None else None
        lines.append(
            f"| {n:,} | {na:.2f} | {'–' if n0 is None else f'{n0:.0f}'} "
            f"| {'–' if n100 is None else f'{n100:.0f}'} "
            f"| {'–' if n0 is None or not na else f'{n0 / na:.0f}×'} |")
    return lines + [""]


def render(results: dict) -> str:
    m = results["machine"]
    lines = ["# Benchmarks", "",
             "Generated by `make bench` (`bench/run.py`); do not edit by hand. "
             "Benchmarks report, they never fail the build. Ratios between node-agent "
             "and nova measured in the same run are the figures to compare; absolute "
             "times depend on this machine.", ""]
    lines += _machine(m)
    lines += _discovery(results.get("discovery", {"failed": "not run"}))
    lines += _phases(results.get("phases", {"failed": "not run"}))
    lines += _memory(results.get("memory", {"failed": "not run"}))
    if "fleet" in results:
        lines += _fleet(results["fleet"], results.get("phases", {}))
    durations = ", ".join(f"{k} {v:.0f} s" for k, v in results.get("durations", {}).items())
    lines += ["## How to rerun", "",
              "```", "make bench", "```", "",
              "creates `.venv-nova` (nova from the package index) when missing and runs "
              "`.venv/bin/python -m bench.run`, which rewrites this file. It needs a "
              "PostgreSQL server on 127.0.0.1:5432 (user `postgres`, trust "
              "authentication) for section 4; `--skip-fleet` leaves that out, "
              "`--json FILE` also writes the raw numbers.", "",
              f"This run took {results.get('total_seconds', 0) / 60:.1f} minutes "
              f"({durations}).", ""]
    return "\n".join(lines)
