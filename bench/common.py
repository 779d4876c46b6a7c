"""Helpers the benchmark sections share: statistics, settings, request counting."""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

from node_agent.config.settings import Settings
from node_agent.model.device_spec import parse_device_specs

# placement's request log: one INFO line per request, written when the
# response is ready (placement/requestlog.py).
_REQUEST = re.compile(r'placement\.requestlog .*"(\w+) ([^ "]+)[^"]*" status: (\d+)')


def summary(values: Sequence[float]) -> dict:
    """median, min, max (and n) of ``values``."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def percentile(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))
    return ordered[index]


def timed(fn: Callable, repeats: int) -> tuple[list[float], object]:
    """Seconds of each of ``repeats`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def settings(
    host: str, sysfs_root: str, instances_path: str, state_path: str, **overrides
) -> Settings:
    values = dict(
        host=host,
        state_path=state_path,
        sysfs_root=sysfs_root,
        libvirt_uri="",
        cpu_dedicated_set=None,
        cpu_shared_set=None,
        vcpu_pin_set=None,
        reserved_host_cpus=0,
        reserved_host_memory_mb=512,
        reserved_host_disk_mb=0,
        cpu_allocation_ratio=4.0,
        ram_allocation_ratio=1.0,
        disk_allocation_ratio=1.0,
        instances_path=instances_path,
    )
    values.update(overrides)
    return Settings(**values)


def device_specs(texts: Sequence[str]):
    problems: list[str] = []
    specs = parse_device_specs(texts, problems)
    if problems:
        raise ValueError("; ".join(problems))
    return specs


class RequestLog:
    """Counts requests in placement's log, in windows around a phase."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def _lines(self) -> list[tuple[str, str, int]]:
        if not self.path.exists():
            return []
        found = []
        with open(self.path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                match = _REQUEST.search(line)
                if match:
                    found.append((match.group(1), match.group(2), int(match.group(3))))
        return found

    def mark(self) -> int:
        self.settle()
        return len(self._lines())

    def since(self, mark: int) -> list[tuple[str, str, int]]:
        self.settle()
        return self._lines()[mark:]

    def settle(self, quiet: float = 0.05, limit: float = 2.0) -> None:
        """Wait until the log stops growing (the last line of a phase may
        land just after the client got its answer)."""
        deadline = time.monotonic() + limit
        size = -1
        while time.monotonic() < deadline:
            now = self.path.stat().st_size if self.path.exists() else 0
            if now == size:
                return
            size = now
            time.sleep(quiet)


def count(requests: Sequence[tuple[str, str, int]]) -> dict:
    gets = sum(1 for method, _, _ in requests if method == "GET")
    conflicts = sum(1 for _, _, status in requests if status == 409)
    return {
        "total": len(requests),
        "gets": gets,
        "writes": len(requests) - gets,
        "conflicts": conflicts,
    }


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def fmt_stat(stat: dict, scale: Callable[[float], str] = fmt_ms) -> str:
    """median (min–max); a single run is shown alone, never as a range."""
    if stat.get("n", 2) == 1:
        return f"{scale(stat['median'])} (1 run)"
    return f"{scale(stat['median'])} ({scale(stat['min'])}–{scale(stat['max'])})"


def fmt_ratio(stat: dict) -> str:
    """A ratio's median (min–max), e.g. ``1.13× (0.79–1.53)``."""

    def one(v: float) -> str:
        return f"{v:.0f}" if v >= 10 else f"{v:.2f}"

    text = f"{one(stat['median'])}×"
    if stat.get("n", 2) > 1 and stat["min"] != stat["max"]:
        text += f" ({one(stat['min'])}–{one(stat['max'])})"
    return text


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def shape(request: tuple[str, str, int]) -> str:
    """``GET /resource_providers/{uuid}/inventories 200``: uuids folded."""
    method, path, status = request
    return f"{method} {_UUID.sub('{uuid}', path.split('?')[0])} {status}"
