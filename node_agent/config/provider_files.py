"""Read the operator's provider files (``[compute] provider_config_location``).

The file access half of :mod:`node_agent.policy.provider_config`, which parses
and applies them without touching the file system.
"""

from __future__ import annotations

from pathlib import Path

from node_agent.config.files import not_utf8
from node_agent.errors import ConfigError
from node_agent.policy.provider_config import ProviderConfig, check_unique, parse_provider_config


def load_provider_configs(location: str) -> tuple[ProviderConfig, ...]:
    """Every ``*.yaml`` of ``location``, sorted by name. A missing directory
    means no files; an unreadable or invalid file or directory is a
    ConfigError listing every problem."""
    configs, refused = load_provider_files(location)
    if refused:
        raise ConfigError(list(refused))
    return configs


def load_provider_files(location: str) -> tuple[tuple[ProviderConfig, ...], tuple[str, ...]]:
    """(entries of the valid files, problems of the refused ones). A file
    with any problem (unreadable, not UTF-8 text, invalid) is refused whole,
    so one bad file does not stop the others; each problem names its file
    and the place inside it. An unreadable directory is a ConfigError."""
    directory = Path(location)
    try:
        if not directory.exists():  # raises when a parent cannot be searched
            return (), ()
        paths = sorted(directory.glob("*.yaml"))
    except OSError as exc:
        raise ConfigError(
            f"[compute] provider_config_location = '{location}': cannot "
            f"read it: {exc}. Fix its permissions."
        ) from exc
    configs: list[ProviderConfig] = []
    problems: list[str] = []
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as exc:
            problems.append(f"provider file {path} cannot be read: {exc}. Fix its permissions.")
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(not_utf8(f"provider file {path}", data, exc))
            continue
        try:
            configs.extend(parse_provider_config(text, str(path)))
        except ConfigError as exc:
            problems.extend(exc.problems)
    check_unique(configs)
    return tuple(configs), tuple(problems)
