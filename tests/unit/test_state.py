import json
import logging
import os
import stat

import pytest

from node_agent.state import FILE_NAME, StateCorrupt, StateStore

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
    store.save({"root_uuid": "other"})
    assert store.load() == {"root_uuid": "other"}


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
