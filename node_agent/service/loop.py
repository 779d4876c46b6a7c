"""The long-running loop: when to run a cycle, never two at once, and what
to do about signals and failures. What a cycle does is passed in.

Timing. The first cycle waits a random 0..``startup_splay`` seconds; then
each wait is ``report_interval`` times a random factor in 1 +/-
``interval_jitter``, measured from the start of the previous cycle. A
cycle that takes longer than that is logged and the next starts as soon as
it ends. A cycle that fails waits ``report_interval * 2**(failures-1)``
(capped at ``retry_max_interval``, halved at random) instead, so a fleet
does not hammer a Placement that is down.

Failures are kept as one "problem" state; a line is logged when the state
changes (Placement went away, came back, the host became unreadable...),
not at every retry.

Signals. SIGHUP asks for a reload: the loader runs and validates; a refusal
is logged problem by problem and the running configuration stays. SIGTERM
and SIGINT stop the loop; a running cycle gets ``stop_timeout`` seconds to
finish and is then abandoned (it runs in a daemon thread), so the process
exits 0 within a bounded time.

Cycles run in a worker thread while the main thread waits on one Event,
woken by signals, requests (``trigger``) and the end of the cycle, and
sends systemd its READY/STATUS/WATCHDOG notifications.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import sdnotify

from node_agent.errors import (
    ConfigError,
    DiscoveryError,
    NodeAgentError,
    PlacementError,
    StateError,
)

LOG = logging.getLogger(__name__)

DEFAULT_STOP_TIMEOUT = 20.0
# The main loop wakes at least this often to tell systemd it is alive.
DEFAULT_TICK = 5.0
# A cycle running longer than this is considered hung: the watchdog pings
# stop, so systemd (WatchdogSec) restarts the agent.
HUNG_AFTER_MIN = 600.0


@dataclass(frozen=True)
class CycleResult:
    """What one cycle reports to the loop. ``ok`` False means the cycle ran
    but left something undone (a refused change); it is not an outage."""

    ok: bool = True
    summary: str = "done"


# ---------------------------------------------------------------- pure timing


def jittered(interval: float, jitter: float, rand: float) -> float:
    """``interval`` scaled by a factor in [1 - jitter, 1 + jitter]; ``rand``
    is a uniform draw in [0, 1)."""
    return interval * (1.0 + jitter * (2.0 * rand - 1.0))


def retry_delay(failures: int, interval: float, cap: float, rand: float) -> float:
    """Wait after ``failures`` consecutive failed cycles (>= 1): doubling
    from ``interval``, capped at ``max(cap, interval)``, then drawn from the
    upper half ("equal jitter") so retries of many agents spread out."""
    ceiling = max(cap, interval)
    base = min(ceiling, interval * 2.0 ** min(failures - 1, 32))
    return base / 2.0 + base / 2.0 * rand


def problem_kind(exc: BaseException) -> str:
    """The failure state an exception puts the agent in."""
    if isinstance(exc, PlacementError):
        return "placement"
    if isinstance(exc, DiscoveryError):
        return "host"
    if isinstance(exc, ConfigError):
        return "config"
    if isinstance(exc, StateError):
        return "state"
    return "internal"


def problem_reason(exc: BaseException) -> str:
    """The error's class in snake case (``placement_error``, ``provider_owned``),
    the metrics' reason label: a closed set, the error hierarchy's classes;
    ``unexpected`` for anything outside it."""
    if not isinstance(exc, NodeAgentError):
        return "unexpected"
    name = type(exc).__name__
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))


_PROBLEM_TEXT = {
    "placement": "Placement cannot be used",
    "host": "the host cannot be read; reported inventory is left as it was",
    "config": "the configuration does not fit this host",
    "state": "the state file cannot be used",
    "internal": "a cycle failed unexpectedly",
}
_RECOVERY_TEXT = {
    "placement": "Placement is reachable again",
    "host": "the host can be read again",
    "config": "the configuration fits the host again",
    "state": "the state file can be used again",
    "internal": "cycles succeed again",
}


@dataclass
class Health:
    """The current problem (or none) and how many cycles in a row failed."""

    kind: Optional[str] = None
    failures: int = 0
    since: Optional[float] = None
    message: str = ""
    reason: str = ""  # problem_reason of the last failure
    cause: str = ""

    def failed(self, exc: BaseException, now: float) -> bool:
        """Record a failure; True when this changes the state or its cause
        (a state directory read-only, then full: log it)."""
        kind = problem_kind(exc)
        cause = getattr(exc, "cause", "")
        changed = kind != self.kind or cause != self.cause
        if kind != self.kind:
            self.kind, self.since = kind, now
        self.cause = cause
        self.failures += 1
        self.reason = problem_reason(exc)
        self.message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return changed

    def succeeded(self) -> Optional[str]:
        """Record a success; returns the kind of problem that just ended."""
        ended, self.kind, self.failures, self.since = self.kind, None, 0, None
        self.message = self.reason = self.cause = ""
        return ended


# ---------------------------------------------------------------- the loop


class NullNotifier:
    def notify(self, state: str) -> None:
        """No systemd to tell."""


def systemd_notifier():
    """sd_notify through the sdnotify package; silent without NOTIFY_SOCKET.

    The socket does not block: a reader that stalls (a datagram queue of
    ``net.unix.max_dgram_qlen``, 10 on some kernels) loses a STATUS or a
    WATCHDOG line, where a blocking send would wedge the loop, SIGTERM
    included (sdnotify drops the failed send silently)."""
    notifier = sdnotify.SystemdNotifier()
    if notifier.socket is not None:
        notifier.socket.setblocking(False)
    return notifier


@dataclass
class _Requests:
    stop: bool = False
    reload: bool = False
    cycle: bool = False


@dataclass
class _Cycle:
    started: float
    done: threading.Event = field(default_factory=threading.Event)
    result: Optional[CycleResult] = None
    error: Optional[BaseException] = None


class Service:
    """Runs ``cycle(config)`` on a schedule until asked to stop.

    ``load()`` returns a config object (with ``report_interval``,
    ``startup_splay``, ``interval_jitter``, ``retry_max_interval``) and
    raises :class:`ConfigError` when the files are invalid; it is called on
    SIGHUP. ``cycle`` raises on failure (``PlacementError``,
    ``DiscoveryError``...) and returns a :class:`CycleResult` otherwise.
    """

    def __init__(
        self,
        cycle: Callable[[Any], CycleResult],
        load: Callable[[], Any],
        config: Any = None,
        *,
        notifier=None,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        tick: float = DEFAULT_TICK,
        after_cycle: Optional[Callable[[], None]] = None,
        unapplied: Optional[Callable[[Any, Any], list[str]]] = None,
    ):
        """``after_cycle`` runs in the loop after each cycle, once its
        outcome is recorded (metrics files). ``unapplied(old, new)`` names
        the options a reload changed that apply only at a restart."""
        self._cycle_fn = cycle
        self._unapplied = unapplied
        self._after_cycle = after_cycle
        self._load = load
        self.config = config if config is not None else load()
        self.notifier = notifier or NullNotifier()
        self.clock = clock
        self.rand = rand
        self.stop_timeout = stop_timeout
        self.tick = tick
        self.health = Health()
        self.cycles = 0  # cycles finished (ok or not)
        self.last_result: Optional[CycleResult] = None
        self.last_duration: Optional[float] = None  # seconds, last cycle
        # Wall time (time.time()) of the last cycle that left nothing undone:
        # one that left a change refused (CycleResult.ok False) ran, but
        # Placement does not follow the host, and an alert on this age is
        # what tells an operator so.
        self.last_success: Optional[float] = None
        self._requests = _Requests()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._finished = threading.Condition(self._lock)

    # -- requests, from signal handlers or other threads

    def request_stop(self) -> None:
        self._request("stop")

    def request_reload(self) -> None:
        self._request("reload")

    def trigger(self, wait: Optional[float] = None) -> Optional[int]:
        """Ask for a cycle now (after the running one, if any). With
        ``wait``, block up to that many seconds until a cycle that started
        after this call has finished; returns its number, or None on
        timeout."""
        with self._lock:
            target = self.cycles + (2 if getattr(self, "_running", None) else 1)
        self._request("cycle")
        if wait is None:
            return None
        with self._finished:
            if self._finished.wait_for(lambda: self.cycles >= target, wait):
                return self.cycles
        return None

    def _request(self, what: str) -> None:
        setattr(self._requests, what, True)
        self._wake.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop, SIGHUP reloads. Main thread only."""
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        signal.signal(signal.SIGINT, lambda *_: self.request_stop())
        signal.signal(signal.SIGHUP, lambda *_: self.request_reload())

    # -- the loop

    def run(self) -> int:
        """Loop until stopped; returns the exit code (0)."""
        self._running: Optional[_Cycle] = None
        splay = self.rand() * max(0, self.config.startup_splay)
        due = self.clock() + splay
        self.notifier.notify("READY=1")
        self._status(f"starting; first cycle in {splay:.0f}s")
        LOG.info(
            "service started; first cycle in %.0fs, then every %ss",
            splay,
            self.config.report_interval,
        )
        while True:
            self.notifier.notify("WATCHDOG=1")
            self._wait(due)
            if self._requests.stop:
                break
            if self._requests.reload:
                self._requests.reload = False
                self.reload()
                continue
            if self._requests.cycle or self.clock() >= due:
                self._requests.cycle = False
                started = self.clock()
                if not self._run_cycle():
                    break  # stopped while the cycle ran
                due = started + self._next_delay(self.clock() - started)
        self.notifier.notify("STOPPING=1")
        LOG.info("service stopped")
        return 0

    def _wait(self, due: float) -> None:
        remaining = due - self.clock()
        if remaining > 0 and not self._pending():
            self._wake.wait(min(remaining, self.tick))
        self._wake.clear()

    def _pending(self) -> bool:
        r = self._requests
        return r.stop or r.reload or r.cycle

    def reload(self) -> bool:
        """Load and validate the config files; keep the old config if they
        are invalid. Returns whether the new config is in effect."""
        self.notifier.notify("RELOADING=1")
        try:
            new = self._load()
        except NodeAgentError as exc:
            problems = getattr(exc, "problems", None) or (str(exc),)
            LOG.error(
                "reload refused, the running configuration stays: "
                "%d problem(s) in the new one:\n%s",
                len(problems),
                "\n".join(f"  - {p}" for p in problems),
            )
            self.notifier.notify("READY=1")
            return False
        waiting = self._unapplied(self.config, new) if self._unapplied else []
        self.config = new
        if waiting:
            LOG.warning(
                "configuration reloaded; it applies from the next cycle, except "
                "%s: read at start only, still the old value until "
                "`systemctl restart node-agent`",
                ", ".join(waiting),
            )
        else:
            LOG.info("configuration reloaded; it applies from the next cycle")
        self.notifier.notify("READY=1")
        return True

    def _hung_after(self) -> float:
        return max(HUNG_AFTER_MIN, 5.0 * self.config.report_interval)

    def _run_cycle(self) -> bool:
        """Run one cycle in a worker thread; False if stopped meanwhile."""
        current = _Cycle(self.clock())
        config = self.config

        def work():
            try:
                current.result = self._cycle_fn(config)
            except BaseException as exc:  # noqa: BLE001 - the loop decides what it means
                current.error = exc
            finally:
                current.done.set()
                self._wake.set()

        with self._lock:
            self._running = current
        threading.Thread(target=work, name="node-agent-cycle", daemon=True).start()
        while not current.done.is_set():
            if self._requests.stop:
                if not current.done.wait(self.stop_timeout):
                    LOG.warning(
                        "stopping: abandoning a cycle still running after %.0fs", self.stop_timeout
                    )
                    return False
                break
            if self.clock() - current.started < self._hung_after():
                self.notifier.notify("WATCHDOG=1")
            self._wake.wait(self.tick)
            self._wake.clear()
        self._finish(current)
        return not self._requests.stop

    def _finish(self, current: _Cycle) -> None:
        duration = self.clock() - current.started
        if current.error is not None:
            self._failed(current.error)
        else:
            ended = self.health.succeeded()
            if ended:  # good news: INFO, once; the failure was the ERROR
                LOG.info("%s; back to normal", _RECOVERY_TEXT[ended])
            self.last_result = current.result
            if current.result is None or current.result.ok:
                self.last_success = time.time()
        with self._finished:
            self._running = None
            self.cycles += 1
            self._finished.notify_all()
        self.last_duration = duration
        if self._after_cycle:
            self._after_cycle()

    def _failed(self, exc: BaseException) -> None:
        changed = self.health.failed(exc, self.clock())
        kind = problem_kind(exc)  # what failed() has just recorded
        if changed:
            log = LOG.exception if kind == "internal" else LOG.error
            log(
                "%s: %s; retrying with backoff, logging again when this changes",
                _PROBLEM_TEXT[kind],
                self.health.message,
                exc_info=exc if kind == "internal" else None,
            )
        else:
            LOG.debug("still failing (%d in a row): %s", self.health.failures, self.health.message)

    def _next_delay(self, duration: float) -> float:
        config = self.config
        interval = config.report_interval
        if self.health.kind is not None:
            delay = retry_delay(
                self.health.failures, interval, config.retry_max_interval, self.rand()
            )
            self._status(
                f"{_PROBLEM_TEXT[self.health.kind]} "
                f"({self.health.failures} failed cycles): "
                f"{self.health.message}; retry in {delay:.0f}s"
            )
            return delay
        delay = jittered(interval, config.interval_jitter, self.rand())
        if duration > delay:
            LOG.warning(
                "slow cycle: it took %.1fs, more than the %.0fs between "
                "cycles; the next one starts now",
                duration,
                delay,
            )
        summary = self.last_result.summary if self.last_result else "done"
        self._status(
            f"{'ok' if self.last_result is None or self.last_result.ok else 'incomplete'}"
            f": {summary}; next in {max(0.0, delay - duration):.0f}s"
        )
        return delay

    def _status(self, text: str) -> None:
        # STATUS= is one line; systemctl status shows it as is.
        self.notifier.notify("STATUS=" + " ".join(text.split()))
