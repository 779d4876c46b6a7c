"""Signed messages (wire 2.2): a host's key signs for that host only, the
applier refuses unsigned, forged and expired-key messages before it touches
a host's record, and key files open to others are refused. Messages are
built from a real fixture host; no bus, no Placement."""

import json
import os
import stat

import pytest

from node_agent.cycle.desired import desired_from
from node_agent.errors import ConfigError
from node_agent.model.cpuset import parse_cpu_spec
from node_agent.remote import keys, signing, wire
from tests.snapshots import settings, snapshot

MASTER = bytes.fromhex("6d" * 32)
OLD_MASTER = bytes.fromhex("4f" * 32)
NOW = 1_800_000_000.0


class Tripwire(Exception):
    pass


def _no_placement():
    raise Tripwire("the applier wanted Placement")


@pytest.fixture
def body(tmp_path):
    host = snapshot("virhostcpudata/linux-test4", tmp_path)
    desired = desired_from(
        settings(
            host="victim",
            cpu_dedicated_set=parse_cpu_spec("2-5"),
            cpu_shared_set=parse_cpu_spec("0-1,6-15"),
        ),
        host,
    )
    body = wire.body_of(desired)
    # What an unsigned 2.1 message may carry too (mem_encryption came with 2.3).
    del body["limits"]["mem_encryption"]
    return body


def ring(*masters, accept_unsigned=False):
    return signing.Keyring(
        tuple(masters) or (signing.Master(MASTER),), accept_unsigned=accept_unsigned
    )


def test_each_host_gets_its_own_key_and_each_master_its_own_keys():
    keys_ = {signing.host_key(m, h) for m in (MASTER, OLD_MASTER) for h in ("a", "b")}
    assert len(keys_) == 4 and all(len(k) == 32 for k in keys_)
    assert signing.host_key(MASTER, "a") == signing.host_key(MASTER, "a")


def test_a_message_signed_with_its_hosts_key_is_accepted(body):
    message = wire.full_message("victim", 1, body, signing.host_key(MASTER, "victim"))
    assert ring().check(message, NOW) is None
    beat = wire.heartbeat("victim", 2, message["digest"], signing.host_key(MASTER, "victim"))
    assert ring().check(beat, NOW) is None


def test_another_hosts_key_cannot_sign_for_the_victim(body):
    intruder_key = signing.host_key(MASTER, "intruder")
    message = wire.full_message("victim", 1, body, intruder_key)
    refusal = ring().check(message, NOW)
    assert refusal is not None and refusal.reason == signing.FORGED
    assert "does not verify with the key of victim" in refusal.text


@pytest.mark.parametrize(
    "change", [{"seq": 2}, {"host": "victim2"}, {"version": "2.2"}, {"digest": "0" * 64}]
)
def test_any_signed_field_changed_breaks_the_signature(body, change):
    message = wire.full_message("victim", 1, body, signing.host_key(MASTER, "victim"))
    refusal = ring().check({**message, **change}, NOW)
    assert refusal is not None and refusal.reason == signing.FORGED


def test_unsigned_is_refused_unless_the_transition_is_on(body):
    message = {
        k: v
        for k, v in wire.full_message("victim", 1, body, signing.host_key(MASTER, "victim")).items()
        if k != "signature"
    }
    message["version"] = "2.1"
    refusal = ring().check(message, NOW)
    assert refusal is not None and refusal.reason == signing.UNSIGNED
    assert "derive-key victim" in refusal.text
    assert ring(accept_unsigned=True).check(message, NOW) is None


def test_previous_master_is_accepted_until_its_overlap_ends(body):
    rotating = ring(signing.Master(MASTER), signing.Master(OLD_MASTER, until=NOW + 60))
    old = wire.full_message("victim", 1, body, signing.host_key(OLD_MASTER, "victim"))
    new = wire.full_message("victim", 1, body, signing.host_key(MASTER, "victim"))
    assert rotating.check(old, NOW) is None and rotating.check(new, NOW) is None
    late = rotating.check(old, NOW + 60)
    assert late is not None and late.reason == signing.EXPIRED_KEY
    assert rotating.check(new, NOW + 60) is None


@pytest.mark.parametrize(
    "who, reason",
    [
        ("intruder", signing.FORGED),  # the intruder's own key, the victim's name
        ("unsigned", signing.UNSIGNED),
    ],
)
def test_applier_refuses_before_touching_the_hosts_record_and_names_no_secret(
    tmp_path, body, caplog, who, reason
):
    from node_agent.applier.applier import Applier

    message = wire.full_message("victim", 1, body, signing.host_key(MASTER, who))
    if who == "unsigned":
        del message["signature"]
        message["version"] = "2.1"
    applier = Applier(_no_placement, tmp_path, keyring=ring(), clock=lambda: NOW)

    reply = applier.handle(message)

    assert reply["status"] == wire.REFUSED, reply
    assert applier.refused == {reason: 1} and applier.outcomes == {wire.REFUSED: 1}
    assert not (tmp_path / "victim").exists()  # no lock, no record, no sequence number
    for secret in (
        MASTER.hex(),
        signing.host_key(MASTER, "victim").hex(),
        signing.host_key(MASTER, who).hex(),
    ):
        assert secret not in json.dumps(reply) and secret not in caplog.text
    assert f"refused a message from victim ({reason}; 1 refused so far)" in caplog.text


def _oversized(body: dict) -> dict:
    """``body`` grown to 8.6 MB, as the fault harness sent it: its tree
    repeated (the schema would read every copy)."""
    copies = 8_600_000 // len(wire.canonical(body["tree"])) + 1
    return {**body, "tree": body["tree"] * copies}


@pytest.fixture
def validated(monkeypatch):
    """What the wire schema validated, in order: each message's keys."""
    from node_agent.remote import schema

    seen: list[set] = []
    real = schema.first_error

    def spy(message, *args, **kwargs):
        seen.append(set(message) if isinstance(message, dict) else {"?"})
        return real(message, *args, **kwargs)

    monkeypatch.setattr(schema, "first_error", spy)
    return seen


def test_an_oversized_unsigned_message_is_refused_before_its_body_is_validated(
    tmp_path, body, validated
):
    from node_agent.applier.applier import Applier

    message = {**wire.full_message("victim", 1, _oversized(body), b"k" * 32), "version": "2.1"}
    del message["signature"]
    assert len(json.dumps(message)) > 8_500_000
    applier = Applier(_no_placement, tmp_path, keyring=ring(), clock=lambda: NOW)

    reply = applier.handle(message)

    assert reply["status"] == wire.REFUSED and applier.refused == {signing.UNSIGNED: 1}
    assert validated == [{"version", "host", "seq", "digest"}]  # the envelope only


def test_a_signed_message_over_the_size_limit_is_refused_before_its_body_is_validated(
    tmp_path, body, validated
):
    from node_agent.applier.applier import Applier

    key = signing.host_key(MASTER, "victim")
    message = wire.full_message("victim", 1, _oversized(body), key)
    applier = Applier(_no_placement, tmp_path, keyring=ring(), clock=lambda: NOW)

    reply = applier.handle(message)

    assert reply["status"] == wire.REFUSED and applier.refused == {"format": 1}
    assert f"more than the {wire.MAX_BODY_BYTES} a host's tree needs" in reply["error"]
    assert all("body" not in keys_ for keys_ in validated)


def test_once_a_host_signed_its_unsigned_messages_are_refused_during_the_transition(tmp_path, body):
    from node_agent.applier.applier import Applier
    from node_agent.state import StateStore

    StateStore(tmp_path / "victim").save(
        {
            "applier": {
                "seq": 5,
                "digest": wire.digest_of(body),
                "body": body,
                "ok": True,
                "signed": True,
            }
        }
    )
    applier = Applier(_no_placement, tmp_path, keyring=ring(accept_unsigned=True))
    unsigned = {**wire.full_message("victim", 6, body, b"k" * 32), "version": "2.1"}
    del unsigned["signature"]

    reply = applier.handle(unsigned)

    assert reply["status"] == wire.REFUSED and "has sent signed messages" in reply["error"]
    assert applier.refused == {signing.UNSIGNED: 1}


# ---------------------------------------------------------------- key files


def test_host_key_file_round_trips_with_mode_0600(tmp_path):
    path = tmp_path / "upstream.key"
    key = signing.host_key(MASTER, "victim")
    keys.write_host_key(str(path), key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert keys.read_host_key(str(path)) == key


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_key_file_open_to_group_or_others_is_refused_with_the_fix(tmp_path, mode):
    path = tmp_path / "upstream.key"
    keys.write_host_key(str(path), signing.host_key(MASTER, "victim"))
    os.chmod(path, mode)
    with pytest.raises(ConfigError) as refused:
        keys.read_host_key(str(path))
    assert refused.value.exit_code == 78
    assert f"(mode {mode:04o})" in str(refused.value) and f"chmod 0600 {path}" in str(refused.value)
    assert signing.host_key(MASTER, "victim").hex() not in str(refused.value)


def test_short_master_and_a_file_that_is_not_a_key_are_refused(tmp_path):
    short, bad = tmp_path / "master", tmp_path / "host.key"
    short.write_text("tooshort\n")
    bad.write_text("not hex at all\n")
    for path in (short, bad):
        os.chmod(path, 0o600)
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        keys.read_master(str(short))
    with pytest.raises(ConfigError, match="not a host key"):
        keys.read_host_key(str(bad))
    with pytest.raises(ConfigError, match="no such file"):
        keys.read_host_key(str(tmp_path / "missing"))


def test_a_flood_of_forged_messages_is_one_warning_a_minute_per_sender_and_cause(
    tmp_path, body, caplog
):
    """Issue 28: every refused message was a log line at WARNING, so a
    sender flooding the applier with forged messages flooded its log. Now:
    the first refusal per sender and cause is a WARNING, the rest DEBUG
    until a minute has passed, and the next WARNING says how many it skipped."""
    import logging

    from node_agent.applier.applier import REFUSAL_LOG_INTERVAL, Applier

    now = [NOW]
    applier = Applier(_no_placement, tmp_path, keyring=ring(), clock=lambda: now[0])
    forged = signing.host_key(MASTER, "intruder")
    caplog.set_level(logging.DEBUG, logger="node_agent.applier.applier")
    for seq in range(1, 101):
        applier.handle(wire.full_message("victim", seq, body, forged))
        now[0] += 0.1
    now[0] += REFUSAL_LOG_INTERVAL
    applier.handle(wire.full_message("victim", 101, body, forged))
    applier.handle(wire.full_message("other", 1, body, forged))

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert applier.refused == {signing.FORGED: 102}
    assert len(warnings) == 3, warnings
    assert "(forged; 1 refused so far)" in warnings[0]
    assert "(forged; 101 refused so far; 99 more from victim" in warnings[1]
    assert "refused a message from other (forged; 102 refused so far)" in warnings[2]
