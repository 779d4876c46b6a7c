"""This machine's identity (``[agent] machine_id_path``, /etc/machine-id),
read once per syncer: :mod:`node_agent.policy.root_owner` turns it into the
owner mark of the root provider."""

from __future__ import annotations

from pathlib import Path

from node_agent.errors import ConfigError
from node_agent.model.settings import Settings
from node_agent.policy.root_owner import Identity, mark_for, parse_machine_id


def identity(settings: Settings) -> Identity:
    """This machine's :class:`Identity`; ConfigError (78) naming the file
    when it cannot be read or holds no machine id."""
    path = settings.machine_id_path
    try:
        text = Path(path).read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise ConfigError(
            f"[agent] machine_id_path = {path}: cannot read this machine's id "
            f"({exc.strerror or exc}). The agent marks its root provider with it. "
            "Run `systemd-machine-id-setup`, or point machine_id_path at a "
            "readable file holding this machine's id."
        ) from None
    return Identity(mark_for(parse_machine_id(text, path)), settings.take_over_provider)
