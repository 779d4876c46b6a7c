"""Read the operator's provider files (``[compute] provider_config_location``).

The file access half of :mod:`node_agent.policy.provider_config`, which parses
and applies them without touching the file system.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from node_agent.config.files import not_utf8
from node_agent.errors import ConfigError
from node_agent.policy.provider_config import ProviderConfig, check_unique, parse_provider_config

# nova's provider.yaml 1.0 nests 7 levels and fits in a few KiB; the limits
# keep a runaway file (generated, or hostile) from exhausting the parser's
# recursion (a RecursionError that stopped every report) or the CPU.
MAX_BYTES = 1024 * 1024
MAX_DEPTH = 32
MAX_NODES = 100_000  # collections and scalars, aliases counted as expanded


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
            with open(path, "rb") as handle:
                data = handle.read(MAX_BYTES + 1)
        except OSError as exc:
            problems.append(f"provider file {path} cannot be read: {exc}. Fix its permissions.")
            continue
        if len(data) > MAX_BYTES:
            problems.append(
                f"provider file {path} is larger than {MAX_BYTES} bytes, the limit for a "
                "provider file; it is ignored. Split it or remove what it does not need."
            )
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(not_utf8(f"provider file {path}", data, exc))
            continue
        too_big = _too_big(text)
        if too_big:
            problems.append(f"provider file {path} {too_big}; it is ignored")
            continue
        try:
            configs.extend(parse_provider_config(text, str(path)))
        except ConfigError as exc:
            problems.extend(exc.problems)
    check_unique(configs)
    return tuple(configs), tuple(problems)


def _too_big(text: str) -> Optional[str]:
    """Why the YAML document in ``text`` is too deep or too large to parse
    (None when it is not, or when it is not valid YAML: the parser says so
    then). Reads YAML's event stream, which is not recursive, so the check
    itself cannot exhaust the stack; an alias counts as the node it repeats,
    and an alias inside its own anchor (a recursive document) is refused."""
    import yaml  # here: a host without provider files never pays for yaml

    opened = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
    closed = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
    # One open collection: [anchor, height of its tallest child, nodes so far].
    stack: list[list] = [[None, 0, 0]]
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (height, nodes)
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, opened):
                stack.append([event.anchor, 0, 1])
                if len(stack) - 1 > MAX_DEPTH:
                    return f"nests deeper than {MAX_DEPTH} levels, the limit for a provider file"
                continue
            if isinstance(event, closed):
                anchor, child_height, nodes = stack.pop()
                height = child_height + 1
            elif isinstance(event, yaml.ScalarEvent):
                anchor, height, nodes = event.anchor, 0, 1
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor not in anchors:
                    return f"has an alias *{event.anchor} inside its own anchor (a loop)"
                anchor, (height, nodes) = None, anchors[event.anchor]
            else:
                continue
            if anchor is not None:
                anchors[anchor] = (height, nodes)
            parent = stack[-1]
            parent[1] = max(parent[1], height)
            parent[2] += nodes
            if parent[1] + len(stack) - 1 > MAX_DEPTH:
                return f"nests deeper than {MAX_DEPTH} levels, the limit for a provider file"
            if sum(frame[2] for frame in stack) > MAX_NODES:
                return f"holds more than {MAX_NODES} values (aliases expanded), the limit for a provider file"
    except yaml.YAMLError:
        return None
    return None
