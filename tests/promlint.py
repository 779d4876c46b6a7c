"""The checks ``promtool check metrics`` applies to an exposition, restated
for the tests (promtool is a Go binary in Debian's ``prometheus`` package,
which brings the whole server and its service; the suite does not install
it). ``promtool`` runs as well when it is on PATH: the two must agree.

Restated from Prometheus' ``util/promlint`` (2.42): a HELP for each
family; ``_total`` on counters and only on counters; no ``_bucket``,
``_count``, ``_sum`` suffix nor ``le``/``quantile`` label outside histograms
and summaries; no type name in the metric name; base units (seconds, bytes,
not milliseconds or kilobytes) and no abbreviated units (``_ms``, ``_kb``);
snake_case names and labels; no colon."""

from __future__ import annotations

import re
import shutil
import subprocess

_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
_ABBREVIATIONS = {"s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d"}
_PREFIXES = ("exa", "peta", "tera", "giga", "mega", "kilo", "milli", "micro", "nano", "pico")
_BASE_UNITS = ("seconds", "joules", "grams", "meters", "bytes", "volts", "amperes", "celsius")
_TIME_UNITS = {"minutes", "hours", "days", "weeks", "years"}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created", "_info")


def _families(text: str) -> dict[str, dict]:
    families: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            _, kind, name, *rest = line.split(" ", 3)
            family = families.setdefault(name, {"type": "untyped", "help": None, "labels": set()})
            if kind == "HELP":
                family["help"] = rest[0] if rest else ""
            else:
                family["type"] = rest[0]
        elif line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            if not match:
                continue
            name = match[1]
            owner = name
            if name not in families:
                owner = next(
                    (
                        name[: -len(s)]
                        for s in _SUFFIXES
                        if name.endswith(s) and name[: -len(s)] in families
                    ),
                    name,
                )
            family = families.setdefault(owner, {"type": "untyped", "help": None, "labels": set()})
            family["labels"].update(_LABEL.findall(match[3] or ""))
    return families


def problems(text: str) -> list[str]:
    """Every problem promtool's lint would report, as ``name: problem``."""
    found = []
    for name, family in sorted(_families(text).items()):
        kind = family["type"]

        def say(problem: str, name: str = name) -> None:
            found.append(f"{name}: {problem}")

        if not family["help"]:
            say("no help text")
        if kind == "counter" and not name.endswith("_total"):
            say('counter metrics should have "_total" suffix')
        if kind != "counter" and name.endswith("_total"):
            say('non-counter metrics should not have "_total" suffix')
        if kind not in ("histogram", "summary"):
            for suffix in ("_bucket", "_count", "_sum"):
                if name.endswith(suffix):
                    say(f'non-histogram and non-summary metrics should not have "{suffix}" suffix')
            if "quantile" in family["labels"]:
                say('non-summary metrics should not have "quantile" label')
        if kind != "histogram" and "le" in family["labels"]:
            say('non-histogram metrics should not have "le" label')
        tokens = name.split("_")[1:]  # promlint looks for "_unit_" or a "_unit" end
        for type_name in _TYPES:
            if type_name in tokens:
                say(f'metric name should not include type "{type_name}"')
        for token in tokens:
            if token in _ABBREVIATIONS:
                say("metric names should not contain abbreviated units")
            if token in _TIME_UNITS:
                say(f'use base unit "seconds" instead of "{token}"')
            for prefix in _PREFIXES:
                for unit in _BASE_UNITS:
                    if token == prefix + unit:
                        say(f'use base unit "{unit}" instead of "{token}"')
        if ":" in name:
            say("metric names should not contain ':'")
        if name != name.lower():
            say("metric names should be written in 'snake_case' not 'camelCase'")
        for label in sorted(family["labels"]):
            if label != label.lower():
                say(f"label names should be written in 'snake_case' not 'camelCase': {label}")
    return found


def promtool_problems(text: str) -> list[str] | None:
    """What ``promtool check metrics`` says of ``text``; None without promtool."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return None
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    said = (done.stdout + done.stderr).strip()
    return [line for line in said.splitlines() if line.strip()] if done.returncode else []
