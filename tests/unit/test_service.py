"""The service loop with a stand-in cycle: timing, overlap, signals' effects,
failure states. Real threads and short intervals; no servers."""

import logging
import threading
import time
from dataclasses import dataclass

import pytest

from node_agent.errors import ConfigError, DiscoveryError, StateError
from node_agent.placement.client import Unavailable
from node_agent.service.loop import (
    CycleResult,
    Health,
    Service,
    jittered,
    problem_kind,
    retry_delay,
)


@dataclass(frozen=True)
class Timing:
    report_interval: float = 0.02
    startup_splay: float = 0
    interval_jitter: float = 0.1
    retry_max_interval: float = 0.05
    name: str = "first"


class Recorder:
    def __init__(self):
        self.sent = []

    def notify(self, state):
        self.sent.append(state)


def start(service):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("rc", service.run()), daemon=True)
    thread.start()
    return thread, result


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


# -- pure timing


@pytest.mark.parametrize("rand, expected", [(0.0, 54.0), (0.5, 60.0), (0.999999, 66.0)])
def test_jitter_spreads_the_interval_by_the_fraction_both_ways(rand, expected):
    assert jittered(60, 0.1, rand) == pytest.approx(expected, abs=1e-3)


def test_retry_delay_doubles_from_the_interval_up_to_the_cap():
    upper = [retry_delay(n, 60, 300, 0.999999) for n in range(1, 7)]
    assert upper == pytest.approx([60, 120, 240, 300, 300, 300], abs=1e-3)


def test_retry_delay_is_drawn_from_the_upper_half_of_the_step():
    assert retry_delay(2, 60, 300, 0.0) == 60
    assert retry_delay(2, 60, 300, 0.5) == 90


def test_retry_cap_below_the_interval_never_retries_faster_than_the_interval():
    assert retry_delay(5, 60, 10, 0.999999) == pytest.approx(60, abs=1e-3)


def test_failures_are_classified_by_error_type():
    assert problem_kind(Unavailable("down")) == "placement"
    assert problem_kind(DiscoveryError("libvirt gone")) == "host"
    assert problem_kind(ConfigError("bad")) == "config"
    assert problem_kind(RuntimeError("bug")) == "internal"


def test_health_reports_a_change_only_when_the_kind_of_problem_changes():
    health = Health()
    assert health.failed(Unavailable("a"), 1.0) is True
    assert health.failed(Unavailable("b"), 2.0) is False
    assert health.failed(DiscoveryError("c"), 3.0) is True
    assert health.failures == 3
    assert health.succeeded() == "host"
    assert health.succeeded() is None


# -- the loop


def test_cycles_never_overlap_even_when_triggered_while_running():
    active, peak, count = [0], [0], [0]
    lock = threading.Lock()

    def cycle(config):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.01)
        with lock:
            active[0] -= 1
            count[0] += 1
        return CycleResult()

    service = Service(cycle, Timing, Timing(), tick=0.01)
    thread, result = start(service)
    for _ in range(20):
        service.trigger()
        time.sleep(0.003)
    wait_for(lambda: count[0] >= 10)
    service.request_stop()
    thread.join(5)
    assert result["rc"] == 0
    assert peak[0] == 1


def test_trigger_with_wait_returns_after_a_cycle_that_started_after_the_call():
    starts = []

    def cycle(config):
        starts.append(time.monotonic())
        return CycleResult()

    service = Service(cycle, Timing, Timing(report_interval=3600), tick=0.01)
    thread, _ = start(service)
    wait_for(lambda: service.cycles == 1)
    asked = time.monotonic()
    number = service.trigger(wait=5)
    assert number == 2
    assert starts[-1] >= asked
    service.request_stop()
    thread.join(5)


def test_stop_abandons_a_stuck_cycle_within_the_stop_timeout():
    entered, never = threading.Event(), threading.Event()

    def cycle(config):
        entered.set()
        never.wait()
        return CycleResult()

    service = Service(cycle, Timing, Timing(), stop_timeout=0.2, tick=0.01)
    thread, result = start(service)
    assert entered.wait(5)
    began = time.monotonic()
    service.request_stop()
    thread.join(5)
    assert result["rc"] == 0
    assert time.monotonic() - began < 1.0


def test_invalid_reload_keeps_the_running_config_and_logs_each_problem(caplog):
    seen = []

    def cycle(config):
        seen.append(config.name)
        return CycleResult()

    def bad_load():
        raise ConfigError(
            [
                "[agent] report_interval has an invalid value: -1",
                "[compute] cpu_dedicated_set = 'x' is not a CPU spec",
            ]
        )

    service = Service(cycle, bad_load, Timing(), tick=0.01)
    thread, _ = start(service)
    wait_for(lambda: seen)
    with caplog.at_level(logging.ERROR, logger="node_agent.service.loop"):
        service.request_reload()
        count = len(seen)
        wait_for(lambda: len(seen) > count + 2)
    service.request_stop()
    thread.join(5)
    assert set(seen) == {"first"}
    text = caplog.text
    assert "reload refused" in text and "2 problem(s)" in text
    assert "report_interval has an invalid value: -1" in text
    assert "cpu_dedicated_set = 'x' is not a CPU spec" in text


def test_valid_reload_applies_from_the_next_cycle():
    seen = []

    def cycle(config):
        seen.append(config.name)
        return CycleResult()

    service = Service(cycle, lambda: Timing(name="second"), Timing(), tick=0.01)
    thread, _ = start(service)
    wait_for(lambda: seen)
    service.request_reload()
    wait_for(lambda: "second" in seen)
    service.request_stop()
    thread.join(5)
    assert seen[0] == "first" and seen[-1] == "second"


def test_an_outage_is_logged_once_and_its_end_once(caplog):
    outcomes = iter([Unavailable("GET / : connection refused")] * 5 + [None] * 100)
    done = []

    def cycle(config):
        outcome = next(outcomes)
        done.append(outcome)
        if outcome is not None:
            raise outcome
        return CycleResult(summary="no change (0 requests)")

    service = Service(cycle, Timing, Timing(), tick=0.01)
    with caplog.at_level(logging.DEBUG, logger="node_agent.service.loop"):
        thread, _ = start(service)
        wait_for(lambda: len(done) >= 8)
        service.request_stop()
        thread.join(5)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    recovered = [r for r in caplog.records if "reachable again" in r.getMessage()]
    assert len(errors) == 1 and "Placement cannot be used" in errors[0].getMessage()
    assert len(recovered) == 1
    assert service.health.kind is None


def test_failures_back_off_instead_of_running_every_interval():
    starts = []

    def cycle(config):
        starts.append(time.monotonic())
        raise DiscoveryError("cannot connect to libvirt")

    timing = Timing(report_interval=0.02, retry_max_interval=0.16, interval_jitter=0)
    service = Service(cycle, Timing, timing, rand=lambda: 0.999, tick=0.01)
    chosen = []
    next_delay = service._next_delay
    service._next_delay = lambda duration: chosen.append(next_delay(duration)) or chosen[-1]
    thread, _ = start(service)
    # The fifth delay is chosen just after the fifth start: wait for both.
    wait_for(lambda: len(starts) >= 5 and len(chosen) >= 5)
    service.request_stop()
    thread.join(5)
    # The schedule doubles from the interval up to the cap (upper half of
    # each step with rand ~1). The real gaps are checked against it as lower
    # bounds, less a margin: each start is recorded inside the cycle's thread,
    # which a loaded machine may start late.
    assert [round(d, 2) for d in chosen[:5]] == [0.02, 0.04, 0.08, 0.16, 0.16]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    for gap, delay in zip(gaps, chosen):
        assert gap >= delay - 0.05


def test_systemd_hears_ready_first_then_status_and_watchdog_and_stopping():
    notifier = Recorder()
    service = Service(
        lambda c: CycleResult(summary="no change (0 requests)"),
        Timing,
        Timing(),
        notifier=notifier,
        tick=0.01,
    )
    thread, _ = start(service)
    wait_for(lambda: service.cycles >= 2)
    service.request_stop()
    thread.join(5)
    sent = notifier.sent
    assert sent[0] == "READY=1"
    assert "WATCHDOG=1" in sent
    assert any(s.startswith("STATUS=ok: no change (0 requests); next in") for s in sent)
    assert sent[-1] == "STOPPING=1"


def test_maintenance_set_over_rpc_says_whether_its_cycle_ended(tmp_path):
    """The control RPC's answer must not say "applied" for a cycle that had
    not ended when it answered (the CLI printed so on a loaded host)."""
    from node_agent.cli.main import service_maintenance_line
    from node_agent.service.control import Control

    @dataclass(frozen=True)
    class Config(Timing):
        settings: object = None

    @dataclass(frozen=True)
    class Paths:
        state_path: str

    entered, release = threading.Event(), threading.Event()

    def cycle(config):
        entered.set()
        release.wait()
        return CycleResult()

    config = Config(report_interval=3600, settings=Paths(str(tmp_path)))
    service = Service(cycle, lambda: config, config, tick=0.01)
    control = Control(agent=None, service=service)
    control.SYNC_WAIT = 0.2
    thread, _ = start(service)
    try:
        assert entered.wait(5)  # the first cycle runs and does not end
        answer = control.set_maintenance(True, "disk swap")
        assert (answer["on"], answer["applied_in_cycle"]) == (True, None)
        line = service_maintenance_line("on", "hv", answer)
        assert "recorded it; the cycle that applies it had not ended" in line
        assert "applied it in a cycle" not in line
    finally:
        release.set()
    wait_for(lambda: service.cycles >= 2)
    control.SYNC_WAIT = 5
    answer = control.set_maintenance(False)
    assert answer["applied_in_cycle"] is not None
    assert "recorded it and applied it in a cycle" in service_maintenance_line("off", "hv", answer)
    service.request_stop()
    thread.join(5)


def test_a_reload_names_the_start_only_options_it_changed_and_nothing_else():
    from node_agent.service.restart_only import changed_restart_only

    before = [
        {"DEFAULT": {"host": ["a"]}, "agent": {"report_interval": ["60"]}},
        {"oslo_messaging_rabbit": {"ssl": ["false"]}},
    ]
    after = [
        {"DEFAULT": {"host": ["a"], "log_dir": ["/var/log/node-agent"]}},
        {
            "agent": {"report_interval": ["30"], "metrics_textfile": ["/x.prom"]},
            "oslo_messaging_rabbit": {"ssl": ["true"]},
        },
    ]
    assert changed_restart_only(before, after) == [
        "[agent] metrics_textfile",
        "[DEFAULT] log_dir",
        "[oslo_messaging_rabbit] ssl",
    ]
    assert changed_restart_only(before, before) == []
    # The value that counts is the last one written, whichever file holds it.
    moved = [{"agent": {"metrics_textfile": ["/x.prom"]}}, {}]
    assert changed_restart_only(moved, [{}, {"agent": {"metrics_textfile": ["/x.prom"]}}]) == []


def test_a_reload_that_cannot_apply_an_option_says_so(caplog):
    service = Service(
        lambda config: CycleResult(),
        lambda: Timing(name="second"),
        Timing(),
        tick=0.01,
        unapplied=lambda old, new: ["[agent] metrics_textfile"] if old.name != new.name else [],
    )
    with caplog.at_level(logging.INFO, logger="node_agent.service.loop"):
        assert service.reload()
    (record,) = [r for r in caplog.records if "reloaded" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "except [agent] metrics_textfile" in record.getMessage()


def test_problem_reason_is_the_error_class_in_snake_case():
    from node_agent.errors import GuestsDoNotFit, ProviderOwned
    from node_agent.service.loop import problem_reason

    assert problem_reason(ProviderOwned("nova owns it")) == "provider_owned"
    assert problem_reason(GuestsDoNotFit(["g"])) == "guests_do_not_fit"
    assert problem_reason(Unavailable("down")) == "unavailable"
    assert problem_reason(RuntimeError("bug")) == "unexpected"


def test_a_cycle_that_left_a_refusal_does_not_move_the_last_success():
    """Issue 28: a refused configuration kept last_success moving, so an
    alert on its age never fired while Placement stopped following the host."""
    results = iter([CycleResult(True, "ok"), CycleResult(False, "refused")])
    seen = []

    def cycle(_config):
        seen.append(1)
        return next(results, CycleResult(False, "refused"))

    service = Service(cycle, Timing)
    thread, _ = start(service)
    wait_for(lambda: service.cycles >= 1)
    first = service.last_success
    wait_for(lambda: service.cycles >= 3)
    service.request_stop()
    thread.join(5)
    assert first is not None and service.last_success == first
    assert service.health.kind is None  # ran: not an outage, no backoff


def test_health_reports_a_new_cause_of_the_same_problem():
    health = Health()
    assert health.failed(StateError("read-only", "EROFS"), 1.0) is True
    assert health.failed(StateError("read-only again", "EROFS"), 2.0) is False
    assert health.failed(StateError("disk full", "ENOSPC"), 3.0) is True
    assert health.message == "disk full" and health.since == 1.0
