"""Options the service reads at start only, and which of them a reload
changed: a reload must not claim to apply them (``systemctl reload`` said
"reloaded" while the old metrics file, log and bus stayed in use)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

# (section, option). Logging is set up once (node_agent.logs), the metrics
# endpoint and file once (service.metrics), the bus once (remote.messaging,
# with every option of the [oslo_messaging_*] sections).
RESTART_ONLY: tuple[tuple[str, str], ...] = (
    ("agent", "metrics_port"),
    ("agent", "metrics_host"),
    ("agent", "metrics_textfile"),
    ("DEFAULT", "transport_url"),
    ("DEFAULT", "debug"),
    ("DEFAULT", "log_file"),
    ("DEFAULT", "log_dir"),
    ("DEFAULT", "log_config_append"),
    ("DEFAULT", "use_journal"),
    ("DEFAULT", "use_syslog"),
    ("DEFAULT", "use_json"),
    ("DEFAULT", "use_stderr"),
    ("DEFAULT", "default_log_levels"),
)
MESSAGING_SECTION_PREFIX = "oslo_messaging_"

# What oslo.config parsed: one {section: {option: [values]}} per file, in order.
Parsed = Sequence[Mapping[str, Mapping[str, Sequence[str]]]]


def _written(parsed: Parsed, section: str, name: str) -> list:
    """The value that counts: the last one written, in any file."""
    return [v for f in parsed for v in f.get(section, {}).get(name, ())][-1:]


def changed_restart_only(old: Parsed, new: Parsed) -> list[str]:
    """``[section] option`` of each start-only option written differently
    in two readings of the files (names only: values may be secrets)."""
    names = list(RESTART_ONLY)
    sections = sorted(
        {s for f in (*old, *new) for s in f if s.startswith(MESSAGING_SECTION_PREFIX)}
    )
    for section in sections:
        options = {o for f in (*old, *new) for o in f.get(section, {})}
        names += [(section, option) for option in sorted(options)]
    return [
        f"[{section}] {name}"
        for section, name in names
        if _written(old, section, name) != _written(new, section, name)
    ]


def parsed_files(conf: Any) -> Parsed:
    """What oslo.config read from the files of a loaded ConfigOpts."""
    namespace = getattr(conf, "_namespace", None)
    return list(getattr(namespace, "_parsed", None) or [])
