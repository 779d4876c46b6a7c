"""DISK_GB on a reused nova.conf: what nova's libvirt driver sizes, and what
the agent sizes, with the same file (area ``disk_gb``)."""

from __future__ import annotations

import itertools
import os

from node_agent.config.files import load_conf
from node_agent.config.settings import load_settings
from tests.conformance.differences import UNCLASSIFIED, Observed, check

STATE_PATHS = (None, "/srv/nova", "/srv/nova/")
INSTANCES_PATHS = (None, "/data/guests", "$state_path/vms")
IMAGES_TYPES = (None, "default", "raw", "flat", "qcow2", "ploop", "lvm", "rbd")


def nova_confs() -> list[str]:
    """Every combination of the options that decide what DISK_GB sizes."""
    confs = []
    for state, instances, images in itertools.product(STATE_PATHS, INSTANCES_PATHS, IMAGES_TYPES):
        if instances == "$state_path/vms" and state is None:
            continue  # $pybasedir: where nova's Python package is, not a host path
        text = "[DEFAULT]\nmy_ip = 10.0.0.7\n"
        text += f"state_path = {state}\n" if state else ""
        text += f"instances_path = {instances}\n" if instances else ""
        text += "[libvirt]\nimages_rbd_pool = vms\nimages_volume_group = vg0\n"
        text += f"images_type = {images}\n" if images else ""
        confs.append(text)
    return confs


def _difference(text: str, novas: list, agents: str) -> str:
    kind, where = novas
    if kind in ("lvm", "rbd"):
        return "disk-images-type-pool"
    if "state_path" not in text and "instances_path" not in text:
        return "instances-path-without-state-path"
    return UNCLASSIFIED + f" silent ({kind} {where} vs {agents})"


def test_disk_gb_sizes_what_nova_sizes_on_the_same_nova_conf(nova, tmp_path):
    confs = nova_confs()
    paths = []
    for n, text in enumerate(confs):
        path = tmp_path / f"nova{n}.conf"
        path.write_text(text)
        paths.append(str(path))
    theirs = nova.call("local_disk", paths=paths)
    observed = Observed("disk_gb", cases=len(confs))
    for text, path, answer in zip(confs, paths, theirs):
        settings = load_settings(load_conf(["--config-file", path]))
        assert "value" in answer, answer  # nova loads every one of these files
        kind, where = answer["value"]
        if kind == "fs" and os.path.normpath(where) == os.path.normpath(settings.instances_path):
            continue
        observed.add(
            _difference(text, answer["value"], settings.instances_path),
            f"{text!r}: nova sizes {kind} {where}, the agent the filesystem "
            f"of {settings.instances_path}",
        )
    check(observed)
