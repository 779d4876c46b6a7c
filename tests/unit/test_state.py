import json
import logging
import os
import stat

import pytest

from node_agent.state import FILE_NAME, StateCorrupt, StateStore, encode, shape_problem

SAMPLE = {
    "root_uuid": "8a4f2a3e-7d52-4a5c-9f4f-0b1c2d3e4f50",
    "providers": {
        "host1": "8a4f2a3e-7d52-4a5c-9f4f-0b1c2d3e4f50",
        "host1_NUMA0": "0c8e7c1e-62f1-4a39-8d0e-6f0b8f3b2a11",
    },
    "owned_children": ["0c8e7c1e-62f1-4a39-8d0e-6f0b8f3b2a11"],
}


def test_missing_file_loads_as_empty(tmp_path):
    assert StateStore(tmp_path / "nowhere").load() == {}


def test_saved_data_loads_back_identical(tmp_path):
    store = StateStore(tmp_path / "state")
    store.save(SAMPLE)
    assert StateStore(tmp_path / "state").load() == SAMPLE


def test_second_save_replaces_first(tmp_path):
    store = StateStore(tmp_path)
    store.save(SAMPLE)
    store.save({"root_uuid": "0b7e5f1c-3d2a-4e6f-8a9b-1c2d3e4f5a6b"})
    assert store.load() == {"root_uuid": "0b7e5f1c-3d2a-4e6f-8a9b-1c2d3e4f5a6b"}


def test_failing_write_keeps_old_file_and_leaves_no_temp_file(tmp_path):
    store = StateStore(tmp_path)
    store.save(SAMPLE)
    before = (tmp_path / FILE_NAME).read_bytes()
    with pytest.raises(TypeError):
        store.save({"not_json": object()})
    assert (tmp_path / FILE_NAME).read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [FILE_NAME]
    assert store.load() == SAMPLE


def test_file_is_private_to_the_owner(tmp_path):
    StateStore(tmp_path).save(SAMPLE)
    mode = stat.S_IMODE((tmp_path / FILE_NAME).stat().st_mode)
    assert mode == 0o600


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "not json at all",
        "[1, 2]",
        "\x00\x01garbage",
    ],
)
def test_garbage_is_reported_as_corrupt(tmp_path, text):
    (tmp_path / FILE_NAME).write_text(text)
    with pytest.raises(StateCorrupt, match="rebuilt from Placement"):
        StateStore(tmp_path).load()


def test_non_utf8_bytes_are_reported_as_corrupt(tmp_path):
    (tmp_path / FILE_NAME).write_bytes(b"\xff\xfe\x80")
    with pytest.raises(StateCorrupt):
        StateStore(tmp_path).load()


def _edit_envelope(tmp_path, change):
    path = tmp_path / FILE_NAME
    envelope = json.loads(path.read_text())
    change(envelope)
    path.write_text(json.dumps(envelope))


def test_edited_payload_fails_the_checksum(tmp_path):
    StateStore(tmp_path).save(SAMPLE)
    _edit_envelope(tmp_path, lambda e: e["payload"].update(root_uuid="hand-edited"))
    with pytest.raises(StateCorrupt, match="checksum"):
        StateStore(tmp_path).load()


def test_truncated_file_is_corrupt(tmp_path):
    StateStore(tmp_path).save(SAMPLE)
    path = tmp_path / FILE_NAME
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(StateCorrupt):
        StateStore(tmp_path).load()


def test_unknown_format_version_is_corrupt(tmp_path):
    StateStore(tmp_path).save(SAMPLE)
    _edit_envelope(tmp_path, lambda e: e.update(version=99))
    with pytest.raises(StateCorrupt, match="version 99"):
        StateStore(tmp_path).load()


def test_load_or_empty_logs_corruption_and_returns_empty(tmp_path, caplog):
    (tmp_path / FILE_NAME).write_text("{broken")
    log = logging.getLogger("test.state")
    with caplog.at_level(logging.WARNING, logger="test.state"):
        assert StateStore(tmp_path).load_or_empty(log) == {}
    assert "not valid JSON" in caplog.text


def test_load_or_empty_returns_saved_data(tmp_path):
    StateStore(tmp_path).save(SAMPLE)
    assert StateStore(tmp_path).load_or_empty(logging.getLogger()) == SAMPLE


GOOD_UUID = "0b7e5f1c-3d2a-4e6f-8a9b-1c2d3e4f5a6b"


@pytest.mark.parametrize(
    "payload, problem",
    [
        ({"root_uuid": GOOD_UUID, "anything": [1]}, None),
        ({"root_uuid": None, "provider_cache": None}, None),
        ({"maintenance": {"on": True, "reason": "", "since": "2026-01-01"}}, None),
        ({"applier": {"seq": 3}}, None),
        ({"root_uuid": "nope"}, "its 'root_uuid' is str \"nope\", not a provider uuid"),
        ({"root_uuid": 7}, "its 'root_uuid' is int 7"),
        ({"providers": [GOOD_UUID]}, "its 'providers' is list"),
        ({"providers": {"h": 1}}, "its 'providers' is dict"),
        ({"owned_children": GOOD_UUID}, "its 'owned_children' is str"),
        ({"provider_config_applied": {"h": "CUSTOM_A"}}, "its 'provider_config_applied'"),
        ({"maintenance": True}, "its 'maintenance' is bool true"),
        ({"maintenance": {"on": "yes"}}, "its 'maintenance' is dict"),
        ({"audit": []}, "its 'audit' is list"),
        ({"applier": {"seq": "3"}}, "its 'applier' is dict"),
        ({"provider_cache": "x" * 100}, '"' + "x" * 56 + "..."),
    ],
)
def test_a_payload_of_the_wrong_shape_is_named_by_key(payload, problem):
    found = shape_problem(payload)
    assert (found is None) if problem is None else (problem in found), found


def test_a_wrong_shaped_file_is_corrupt_warned_once_and_kept_aside(tmp_path, caplog):
    bad = encode({"root_uuid": GOOD_UUID, "providers": ["x"]})
    (tmp_path / FILE_NAME).write_text(bad)
    store = StateStore(tmp_path)
    with pytest.raises(StateCorrupt, match="valid checksum but its 'providers' is list"):
        store.load()

    with caplog.at_level(logging.WARNING):
        assert store.load_or_empty(logging.getLogger("t")) == {}
        assert store.load_or_empty(logging.getLogger("t")) == {}
        assert store.put("root_uuid", GOOD_UUID) == {"root_uuid": GOOD_UUID}

    (warning,) = caplog.records
    assert f"the bad file is kept as {tmp_path / FILE_NAME}.corrupt" in warning.getMessage()
    assert (tmp_path / (FILE_NAME + ".corrupt")).read_text() == bad
