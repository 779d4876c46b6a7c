"""Logging through oslo.log, as every OpenStack service does: ``debug``,
``log_file``, ``use_journal``, ``use_json`` and the format options come
from ``[DEFAULT]`` of the config file, and node-agent and
node-agent-applier log in the same format.

Libraries that talk a lot at DEBUG (stevedore lists every plugin it loads)
stay at WARNING even with ``--debug``; an operator who wants them says so in
``default_log_levels``. Log options are read at start; SIGHUP does not
change them.

``--once``, ``--dry-run`` and ``--check-config`` that log to stderr only
(no ``log_file``, ``log_dir``, journal, syslog, JSON or
``log_config_append``) keep the standard library's handler the command set
up, at the configured levels: ``oslo_log.log`` costs such a short run about
3 MiB of peak RSS, a tenth of the whole (measured on the 384-CPU synthetic
host: 32.4 MiB with it, 29.1 without). Its options
are registered from ``oslo_log._options`` alone, the module oslo.log names
as its options' home for oslo-config-generator.
"""

from __future__ import annotations

import errno
import logging
import sys

from oslo_log import _options

from node_agent.errors import ConfigError

DOMAIN = "node-agent"
# Added to oslo.log's own list (which already quiets stevedore, keystoneauth,
# urllib3, amqp...).
QUIET_LIBRARIES = (
    "oslo_service=WARN",
    "oslo_concurrency=WARN",
    "kombu=WARN",
    "oslo_config=WARN",
    "oslo_policy=WARN",
    "stevedore=WARN",
    "keystoneauth1=WARN",
    "urllib3=WARN",
    "libvirt=WARN",
)


def quiet_libraries() -> None:
    """Apply the library levels before the config is read (its parsing
    loads plugins through stevedore, which logs each at DEBUG)."""
    _set_levels(list(_options.DEFAULT_LOG_LEVELS) + list(QUIET_LIBRARIES))


def _set_levels(items) -> None:
    for item in items:
        name, _, level = item.partition("=")
        logging.getLogger(name).setLevel(logging.getLevelName(level))


def register(conf) -> None:
    """oslo.log's options, with node-agent's quieter library levels. The
    same options as ``oslo_log.log.register_options``, without its SIGHUP hook
    (log options are read at start)."""
    conf.register_cli_opts(_options.common_cli_opts)
    conf.register_cli_opts(_options.logging_cli_opts)
    conf.register_opts(_options.generic_log_opts)
    conf.register_opts(_options.log_opts)
    conf.set_default(
        "default_log_levels",
        list(dict.fromkeys(list(_options.DEFAULT_LOG_LEVELS) + list(QUIET_LIBRARIES))),
    )


def option_problems(conf) -> list[str]:
    """A problem per oslo.log option whose value in the files is not of its
    type (``debug = maybe``), naming the file. oslo.config would exit on
    some of these while parsing; node_agent.config.files leaves them here."""
    problems = []
    for _group, opts in _options.list_opts():
        for opt in opts:
            if opt.dest not in conf:  # listed for the sample, not registered
                continue
            try:
                conf[opt.dest]
            except ValueError as exc:  # cfg.ConfigFileValueError
                detail = str(exc).split(" is not valid: ")[-1]
                try:
                    raw, where = opt._get_from_namespace(conf._namespace, None)
                    written = f" = '{raw}'" + (f" in {where.detail}" if where else "")
                except (KeyError, AttributeError):
                    written = ""
                problems.append(
                    f"[DEFAULT] {opt.dest}{written} is not valid: {detail}. "
                    "See etc/node-agent.conf.sample for what it accepts."
                )
    return problems


def stderr_only(conf) -> bool:
    """The options ask for nothing but lines on stderr."""
    return not (
        conf.log_file
        or conf.log_dir
        or conf.use_journal
        or conf.use_syslog
        or conf.use_json
        or conf.log_config_append
    )


def setup(conf, debug: bool = False, reporting: bool = False) -> None:
    """Configure the root logger from ``conf``; ``debug`` is ``--debug``.
    ``reporting``: a command that prints a report (not a service); with
    :func:`stderr_only` options it keeps the handler it has.

    Raises ConfigError when an option's value is not valid, or the options
    ask for what this host lacks (``use_journal`` without the systemd
    Python bindings).
    """
    problems = option_problems(conf)
    if problems:
        raise ConfigError(problems)
    if debug:
        conf.set_override("debug", True)
    if reporting and stderr_only(conf):
        logging.getLogger().setLevel(logging.DEBUG if conf.debug else logging.INFO)
        _set_levels(conf.default_log_levels)
    else:
        _setup_oslo_log(conf)
    logging.captureWarnings(True)
    # What the config files' reader held back until the configured log
    # exists (config/files.py: the nova options it ignores), so the line
    # reaches that log. A hook on the conf: config/ registers this module's
    # options and sits above it, so this module does not import config/.
    ready = getattr(conf, "logging_ready", None)
    if ready is not None:
        ready()


def _setup_oslo_log(conf) -> None:
    if conf.use_journal:
        try:
            import systemd.journal  # noqa: F401 (oslo.log's journal handler needs it)
        except ImportError:
            raise ConfigError(
                "[DEFAULT] use_journal = true needs the systemd Python bindings in "
                f"node-agent's environment, {sys.prefix}: `make install-service "
                "JOURNAL=yes` installs them there (the `journal` extra), else "
                f"`{sys.prefix}/bin/pip install systemd-python` (needs libsystemd-dev; "
                "Debian's python3-systemd does not reach a virtualenv). Or remove "
                "use_journal: under systemd, stderr already goes to the journal."
            ) from None
    if not (conf.log_file or conf.log_dir or conf.use_journal or conf.use_syslog):
        # oslo.log would fall back to stdout, where --dry-run prints its report.
        conf.set_override("use_stderr", True)
    from oslo_log import log as oslo_log

    try:
        oslo_log.setup(conf, DOMAIN)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"logging cannot be set up: {exc}. {log_path_fix(exc)}") from None
    for handler in logging.getLogger().handlers:
        if handler.formatter is not None:
            _say_errors_once(handler.formatter)


# systemd/node-agent.service's LogsDirectory=: the one log directory its
# sandbox (ProtectSystem=strict) lets the agent write.
UNIT_LOG_DIR = "/var/log/node-agent"


def log_path_fix(exc: BaseException) -> str:
    """What to do when the log file cannot be opened, by cause."""
    code = getattr(exc, "errno", None)
    if code == errno.EROFS:
        return (
            "The file system is read-only to the agent: under the shipped "
            f"unit (ProtectSystem=strict) it may log only in {UNIT_LOG_DIR} "
            f"(LogsDirectory=). Set [DEFAULT] log_dir = {UNIT_LOG_DIR}, or "
            "allow the directory with ReadWritePaths= in a drop-in "
            "(`systemctl edit node-agent`)."
        )
    if code == errno.ENOENT:
        return (
            "The directory does not exist: create it, writable by the service "
            f"user (the shipped unit makes {UNIT_LOG_DIR})."
        )
    if code == errno.EACCES:
        return "The service user may not write there: give it write access to the directory."
    return "Check [DEFAULT] log_file, log_dir and log_config_append."


def _say_errors_once(formatter: logging.Formatter) -> None:
    """oslo.log appends ``: Type: text`` of the exception being handled to a
    WARNING or ERROR logged inside an ``except`` block. node-agent's
    messages already say what went wrong; the suffix is dropped when its text
    is in the message, and kept when it adds something."""
    plain = formatter.format

    def format(record: logging.LogRecord) -> str:
        text = plain(record)
        summary = getattr(record, "error_summary", "")
        if (
            not record.exc_info
            and summary
            and summary != "-"
            and text.endswith(": " + summary)
            and summary.partition(": ")[2] in record.getMessage()
        ):
            return text[: -len(summary) - 2]
        return text

    formatter.format = format  # type: ignore[method-assign]
