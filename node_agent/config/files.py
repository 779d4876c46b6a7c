"""Load the config files into a ConfigOpts and refuse what oslo.config would ignore.

oslo.config silently ignores unknown options and sections; for an operator a
typo ("cpu_dedicated_sets") is then a setting that quietly does nothing. This
module reports them, together with unreadable or unparsable files, as one
ConfigError.

nova.conf is read as it is (``--config-file /etc/nova/nova.conf
--config-file /etc/node-agent/node-agent.conf``): sections and options that
are nova's (:mod:`node_agent.config.nova_options`) and not the agent's are ignored
with one DEBUG line; a name that is neither is still refused, except in a file
that is nova's (:func:`novas_files`), where nova ignores it too (an option an
older nova had, ``use_neutron``). The logging options of a nova file are
nova's: the agent's logging comes from its own files only.

Why one module over 500 lines: reading the files and turning each of oslo.config's
errors into the message an operator acts on (with secrets kept out) belong
together; most of the length is those messages.
"""

from __future__ import annotations

import configparser
import glob
import logging
import os
import re
from typing import Optional, Sequence

from oslo_config import cfg

from node_agent import logs
from node_agent.config import options as conf_mod
from node_agent.config.nova_options import NOVA_DYNAMIC_SECTION_PREFIXES, NOVA_OPTIONS, NOVA_VERSION
from node_agent.errors import ConfigError

LOG = logging.getLogger(__name__)

PROJECT = "node-agent"
# Sections that belong to libraries; their keys are theirs to check.
_LIBRARY_SECTION_PREFIXES = ("oslo_", "keystone_authtoken", "ssl")


def _names(opts) -> set[str]:
    return {opt.dest for opt in opts} | {opt.name.replace("-", "_") for opt in opts}


def _opt_names(opt, group: str) -> set[str]:
    """An option's names in ``group``: its own and its deprecated ones."""
    names = {opt.dest, opt.name.replace("-", "_")}
    for old in opt.deprecated_opts:
        if old.name and (old.group in (None, group)):
            names.add(old.name.replace("-", "_"))
    return names


def _known_keys(conf: cfg.ConfigOpts) -> dict[str, Optional[set[str]]]:
    """Option names per section; ``None`` for a section not to check."""
    listed: dict[str, set[str]] = {}
    for group, opts in conf_mod.list_opts(with_messaging=False, with_placement=False):
        names = listed.setdefault(group, set())
        for opt in opts:
            names |= _opt_names(opt, group)
    listed.setdefault("DEFAULT", set()).update({"config_file", "config_dir"})
    known: dict[str, Optional[set[str]]] = dict(listed)
    # nova's [mdev_<type>] of each enabled type: read (config/settings.py).
    mdev_names = {name for opt in conf_mod.MDEV_TYPE_OPTS for name in _opt_names(opt, "")}
    for mdev_type in _enabled_mdev_types(conf):
        known[f"mdev_{mdev_type}"] = mdev_names
        known[f"vgpu_{mdev_type}"] = {"device_addresses"}  # its older name
    if conf_mod.PLACEMENT_GROUP in conf:
        known[conf_mod.PLACEMENT_GROUP] = _placement_keys(conf)
    return known


def _enabled_mdev_types(conf: cfg.ConfigOpts) -> list[str]:
    try:
        return [t.strip() for t in conf.devices.enabled_mdev_types or () if t.strip()]
    except (cfg.Error, ValueError):
        return []  # a bad value is reported by the settings check


def _placement_keys(conf: cfg.ConfigOpts) -> Optional[set[str]]:
    """What ``[placement]`` may hold: the options every auth type shares and
    those of the configured ``auth_type`` only (asking keystoneauth for
    every plugin's options scans every installed distribution's metadata).
    ``None`` when that plugin cannot be loaded: the auth_type itself is then
    the problem, which the Placement client reports."""
    from keystoneauth1 import loading as ks_loading

    group = conf_mod.PLACEMENT_GROUP
    names: set[str] = set()
    for opt in conf_mod.placement_base_opts():
        names |= _opt_names(opt, group)
    try:
        auth_type = conf[group].auth_type
    except cfg.Error:  # a bad $reference in it: unresolved_references reports it
        auth_type = None
    if auth_type:
        try:
            plugin_opts = ks_loading.get_plugin_options(auth_type)
        except Exception:  # noqa: BLE001 - unknown or broken plugin: reported where loaded
            return None
        for opt in plugin_opts:
            names |= _opt_names(opt, group)
    return names


def _files(conf: cfg.ConfigOpts) -> list[str]:
    files = list(conf.config_file or [])
    for directory in conf.config_dir or []:
        files += sorted(glob.glob(os.path.join(directory, "*.conf")))
    return files


def _is_nova_section(section: str) -> bool:
    return section in NOVA_OPTIONS or section.startswith(NOVA_DYNAMIC_SECTION_PREFIXES)


def unknown_options(conf: cfg.ConfigOpts) -> list[str]:
    """Problems: sections and options neither the agent's nor nova's (in a
    file of nova's: none). The names ignored are logged by
    :func:`log_ignored`, once logging is set up."""
    return _classify_keys(conf)[0]


def log_ignored(conf: cfg.ConfigOpts) -> None:
    """The one DEBUG line naming what the files hold that the agent ignores.
    Called once the configured log exists, so the line reaches it."""
    ignored = nova_only_keys(conf)
    if ignored:
        LOG.debug("nova options the agent does not use, ignored: %s", ", ".join(ignored))


def nova_only_keys(conf: cfg.ConfigOpts) -> list[str]:
    """``[section]`` and ``[section] option`` names in the files that are
    nova's and not the agent's: ignored (a nova.conf given as it is)."""
    return _classify_keys(conf)[1]


class _CaseKeepingParser(configparser.RawConfigParser):
    """Option names as written: oslo.config does not lower-case them either."""

    def optionxform(self, optionstr: str) -> str:
        return optionstr


def _parsed(path: str) -> Optional[configparser.RawConfigParser]:
    parser = _CaseKeepingParser(strict=False, interpolation=None)
    try:
        parser.read(path)
    except configparser.Error:
        return None  # oslo.config already parsed it; its grammar is slightly wider
    return parser


def _agent_only_sections() -> set[str]:
    """Sections only the agent has ([agent], [host], [node], [applier])."""
    return {
        group
        for group, _opts in conf_mod.list_opts(with_messaging=False, with_placement=False)
        if group not in NOVA_OPTIONS
    }


def _is_novas(parser: configparser.RawConfigParser, known) -> bool:
    """A file of nova's: no section only the agent has, and at least one
    section or option only nova has (a real nova.conf always has some:
    ``compute_driver``, ``my_ip``, ``[api_database]``...). Anything else is
    the agent's own file, where every name must be known."""
    if set(parser.sections()) & _agent_only_sections():
        return False
    for section in parser.sections() + ["DEFAULT"]:
        if section not in known:
            if _is_nova_section(section):
                return True
            continue
        names = known[section]
        if names is None:
            continue  # [placement] of an auth type that cannot load: not a sign
        if _nova_only(parser, section, names):
            return True
    return False


def _nova_only(parser: configparser.RawConfigParser, section: str, names: set[str]) -> bool:
    """Whether ``section`` of the file holds an option nova has and the agent not."""
    defaults = set(parser.defaults())
    keys = defaults if section == "DEFAULT" else set(parser[section]) - defaults
    novas = {key.replace("-", "_") for key in keys} & NOVA_OPTIONS.get(section, frozenset())
    novas -= names
    if novas and section == "DEFAULT":  # oslo.messaging's, imported only when needed
        novas -= _names(conf_mod.messaging_default_opts())
    return bool(novas)


def novas_files(conf: cfg.ConfigOpts) -> list[str]:
    """The config files that are nova's (see :func:`_is_novas`), as read."""
    known = _known_keys(conf)
    out = []
    for path in _files(conf):
        parser = _parsed(path)
        if parser is not None and _is_novas(parser, known):
            out.append(path)
    return out


def _classify_keys(conf: cfg.ConfigOpts) -> tuple[list[str], list[str]]:
    known = _known_keys(conf)
    problems: list[str] = []
    ignored: list[str] = []
    for path in _files(conf):
        parser = _parsed(path)
        if parser is None:
            continue
        novas = _is_novas(parser, known)
        for section in parser.sections() + ["DEFAULT"]:
            if section not in known:
                if _is_nova_section(section) or novas:
                    ignored.append(f"[{section}]")
                elif not section.startswith(_LIBRARY_SECTION_PREFIXES):
                    problems.append(
                        f"{path}: unknown section [{section}]. Check the "
                        "spelling against etc/node-agent.conf.sample."
                    )
                continue
            names = known[section]
            if names is None:
                continue
            keys = parser.defaults() if section == "DEFAULT" else parser[section]
            own = (
                keys.keys()
                if section == "DEFAULT"
                else (set(keys.keys()) - set(parser.defaults().keys()))
            )
            unknown = [key for key in own if key.replace("-", "_") not in names]
            if unknown and section == "DEFAULT":
                names = names | _names(conf_mod.messaging_default_opts())
            for key in unknown:
                name = key.replace("-", "_")
                if name in names:
                    continue
                if name in NOVA_OPTIONS.get(section, ()):
                    ignored.append(f"[{section}] {key}")
                elif novas:
                    # nova ignores a name it does not know (one an older
                    # nova had): so does the agent, in nova's file.
                    ignored.append(f"[{section}] {key} (unknown to nova {NOVA_VERSION})")
                else:
                    problems.append(
                        f"{path}: unknown option [{section}] {key}. Check the "
                        "spelling against etc/node-agent.conf.sample."
                    )
    return problems, list(dict.fromkeys(ignored))


DEFAULT_CONFIG_FILE = "/etc/node-agent/node-agent.conf"


def config_args(args: Sequence[str], default: str = DEFAULT_CONFIG_FILE) -> list[str]:
    """``args``, or ``--config-file default`` when no file is named.

    A missing default file is refused: running on built-in defaults would
    write a state file for a host named after the machine, against no
    Placement the operator chose.
    """
    args = list(args)
    if any(a in ("--config-file", "--config-dir") for a in args):
        return args
    if not os.path.exists(default):
        raise ConfigError(
            f"no configuration: {default} does not exist and no "
            "--config-file or --config-dir was given. Create it (see "
            "etc/node-agent.conf.sample) or name a file with "
            "--config-file FILE."
        )
    return ["--config-file", default]


def placement_configured(conf) -> bool:
    """``[placement]`` names an auth type or an endpoint. Its options are
    registered only when a file has that section (:func:`parse_conf`)."""
    if "placement" not in conf:
        return False
    group = conf.placement
    return bool(group.auth_type or group.endpoint_override)


def oslo_args(args) -> list[str]:
    """``--config-file``/``--config-dir`` for oslo.config from an argparse
    namespace with ``config_file`` and ``config_dir`` lists."""
    out: list[str] = []
    for path in args.config_file:
        out += ["--config-file", path]
    for path in args.config_dir:
        out += ["--config-dir", path]
    return out


def _arg_files(args: Sequence[str]) -> list[str]:
    """The files ``--config-file``/``--config-dir`` arguments name, in order."""
    files: list[str] = []
    args = list(args)
    for flag, value in zip(args, args[1:]):
        if flag == "--config-file":
            files.append(value)
        elif flag == "--config-dir" and os.path.isdir(value):
            files += sorted(glob.glob(os.path.join(value, "*.conf")))
    return files


def _has_section(paths: Sequence[str], section: str) -> bool:
    """Whether any of the files has a ``[section]`` header. A file that
    cannot be read counts as having it: oslo.config reports that file."""
    header = re.compile(rb"^[ \t]*\[" + re.escape(section.encode()) + rb"\]", re.MULTILINE)
    for path in paths:
        try:
            with open(path, "rb") as handle:
                if header.search(handle.read()):
                    return True
        except OSError:
            return True
    return False


def undecodable_files(paths: Sequence[str]) -> list[str]:
    """A problem per file that is not UTF-8 text, naming the byte offset.

    oslo.config decodes files as UTF-8 and lets UnicodeDecodeError escape
    as a traceback; a stray Latin-1 byte is an operator's typo, not a crash.
    Unreadable files are left to oslo.config, which reports them itself.
    """
    problems = []
    for path in paths:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(not_utf8(f"config file {path}", data, exc))
    return problems


def not_utf8(what: str, data: bytes, exc: UnicodeDecodeError) -> str:
    """The problem of a file that is not UTF-8 text: where, and the fix."""
    line = data.count(b"\n", 0, exc.start) + 1
    return (
        f"{what} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset "
        f"{exc.start} (line {line}) cannot be decoded. Re-save the file as UTF-8 "
        "(for example iconv -f latin1 -t utf-8)."
    )


class _ConfigOpts(cfg.ConfigOpts):
    """oslo.config checks the file values of the options it could also take
    on its command line (oslo.log's ``debug``, ``use_json``...) while it
    parses, and on a bad one writes to stderr and exits 1: no file named, the
    other problems hidden, and a service that dies on SIGHUP. node-agent's
    command line is argparse's, so those options come from files only; their
    values are checked when read, like every other option's
    (node_agent.logs.option_problems)."""

    def _validate_cli_options(self, namespace) -> None:
        return None

    def logging_ready(self) -> None:
        """Called by :func:`node_agent.logs.setup` once the configured log
        exists: the line naming what the files hold that the agent ignores."""
        log_ignored(self)


def load_conf(args: Sequence[str]) -> cfg.ConfigOpts:
    """Parse ``--config-file``/``--config-dir`` arguments into a checked ConfigOpts."""
    conf = parse_conf(args)
    problems = unknown_options(conf)
    if problems:
        raise ConfigError(problems)
    return conf


def unreadable_file_advice(path: str) -> str:
    """The fix for a config file the service user may not read. A file
    another service owns (nova.conf, root:nova 0640) keeps its group: the
    service user joins that group; a chgrp would lock its owner out."""
    import grp

    try:
        gid = os.stat(path).st_gid
    except OSError:
        gid = None
    try:
        group = grp.getgrgid(gid).gr_name if gid is not None else None
    except KeyError:
        group = str(gid)
    head = f"permission denied reading config file {path}."
    if group is None or group in (PROJECT, "root"):
        return (
            f"{head} Make it readable by the service user: node-agent's own "
            f"files are root:{PROJECT} mode 0640 (chgrp {PROJECT} and chmod 0640)."
        )
    return (
        f"{head} Its group is {group}: add the service user to that group "
        f"instead of changing the file (another service, nova-compute for "
        f"nova.conf, reads it through that group). Under systemd: `systemctl "
        f"edit node-agent` with [Service] SupplementaryGroups={group} "
        "(docs/admin/install.md, reading nova.conf); else `usermod -aG "
        f"{group} node-agent`. The file must be readable by its group (0640)."
    )


def parse_conf(args: Sequence[str]) -> cfg.ConfigOpts:
    """Parse the files into a ConfigOpts; raises ConfigError when they
    cannot be read or parsed (unknown options are left to the caller)."""
    paths = _arg_files(args)
    problems = undecodable_files(paths)
    if problems:
        raise ConfigError(problems)
    conf = _ConfigOpts()
    conf_mod.register_opts(conf, placement=_has_section(paths, conf_mod.PLACEMENT_GROUP))
    try:
        conf(list(args), project=PROJECT, default_config_files=None, use_env=False)
    except cfg.ConfigFilesNotFoundError as exc:
        raise ConfigError(
            f"config file not found or unreadable: {', '.join(exc.config_files)}. "
            "Check the path and that the service user can read it."
        ) from None
    except cfg.ConfigFilesPermissionDeniedError as exc:
        raise ConfigError([unreadable_file_advice(path) for path in exc.config_files]) from None
    except cfg.ConfigFileParseError as exc:
        raise ConfigError(
            f"config file {exc.config_file} cannot be parsed: {_without_line(exc.msg or '')}"
        ) from None
    except cfg.Error as exc:
        raise ConfigError(f"configuration error: {exc}") from None
    except OSError as exc:  # a directory given as a file, an I/O error
        raise ConfigError(
            f"config file {exc.filename} cannot be read: "
            f"{exc.strerror or exc}. Give the path of a readable "
            "file."
        ) from None
    problems = unresolved_references(conf)
    if problems:
        raise ConfigError(problems)
    _logging_from_own_files(conf)
    return conf


# oslo.config's parse errors end with the offending line, quoted: a
# ``password`` line missing its ``=`` would be echoed whole.
_QUOTED_LINE = re.compile(r""": (?:'.*'|".*")$""", re.DOTALL)


def _without_line(message: str) -> str:
    """oslo.config's parse error without the line it quotes (its file and
    line number stay) when that line may hold a secret (a word of
    :data:`_SECRET_WORDS` in it); a section header or another line is shown,
    as the operator needs it to find the mistake."""
    quoted = _QUOTED_LINE.search(message)
    if not quoted or not any(word in quoted.group(0).lower() for word in _SECRET_WORDS):
        return message
    return _QUOTED_LINE.sub("", message) + (
        " (the line is not shown: it may hold a secret). Write it as `name = value`."
    )


# Option names that hold or may hold secrets (a transport_url's password): a
# message names the option, never a part of its value.
_SECRET_WORDS = (
    "password",
    "secret",
    "token",
    "passcode",
    "key",
    "credential",
    "url",
    "connection",
)


def _references(value: str) -> list[str]:
    r"""The option names oslo.config substitutes in ``value`` (``$name``,
    ``${name}``, ``${group.name}``); ``$$`` and ``\$`` are a literal ``$``."""
    value = value.replace(r"\$", "$$")  # as oslo.config does
    return [
        m.group("named") or m.group("braced")
        for m in cfg.ConfigOpts.Template.pattern.finditer(value)
        if m.group("named") or m.group("braced")
    ]


def _reference_problem(conf: cfg.ConfigOpts, known, section: str, name: str) -> Optional[str]:
    """Why oslo.config cannot substitute ``$name`` in an option of
    ``section``, or None when it can. Its order: ``group.name`` in that
    group; else ``name`` in ``section``, then ``[DEFAULT]``, where a
    section of that name comes first (and cannot be substituted)."""

    def has(group: str, option: str) -> bool:
        names = known.get(group)
        if names is not None and option in names:
            return True
        if group == "DEFAULT":
            return option in conf
        return group in conf and option in conf[group]

    if "." in name and has(*name.split(".", 1)):
        return None
    if section != "DEFAULT" and has(section, name):
        return None
    if name in known and name != "DEFAULT":
        return f"${name} names the section [{name}], which oslo.config cannot substitute"
    if has("DEFAULT", name):
        return None
    return f"${name} names no option"


def unresolved_references(conf: cfg.ConfigOpts) -> list[str]:
    """Problems: values of the agent's options holding a ``$name`` that
    names no option. oslo.config substitutes ``$name`` with the option of
    that name when the value is read, and raises NoSuchOptError (a
    traceback, far from the file) when there is none: ``password =
    pa$word``. The message names the file, section and option, and the
    fix: ``$$`` is a literal ``$``. A secret's value is never shown."""
    known = _known_keys(conf)
    problems = []
    for path in _files(conf):
        parser = _parsed(path)
        if parser is None:
            continue
        for section in ["DEFAULT", *parser.sections()]:
            names = known.get(section)
            if names is None:
                continue  # not the agent's section: never read
            keys = (
                parser.defaults()
                if section == "DEFAULT"
                else {k: v for k, v in parser[section].items() if k not in parser.defaults()}
            )
            for key, value in keys.items():
                if "$" not in (value or ""):
                    continue
                if key.replace("-", "_") not in names and section == "DEFAULT":
                    # oslo.messaging's (transport_url), imported only when needed
                    names = names | _names(conf_mod.messaging_default_opts())
                if key.replace("-", "_") not in names:
                    continue  # not read by the agent
                why = [
                    w
                    for w in (
                        _reference_problem(conf, known, section, r) for r in _references(value)
                    )
                    if w
                ]
                if not why:
                    continue
                secret = any(word in key.lower() for word in _SECRET_WORDS)
                what = (
                    "a `$`, which oslo.config reads as a reference to another option "
                    "(not shown: it may be a secret)"
                    if secret
                    else f"a `$`, which oslo.config reads as a reference to another "
                    f"option: {'; '.join(why)}"
                )
                problems.append(
                    f"{path}: [{section}] {key}: the value has {what}. Write $$ for a "
                    "literal $ (for example p$$ss for p$ss)."
                )
    return problems


def _logging_from_own_files(conf: cfg.ConfigOpts) -> None:
    """oslo.log's options (``debug``, ``log_dir``, ``log_file``...) set in a
    file of nova's are nova's logging: the agent takes each from its own
    files, or its default. (nova.conf's ``log_dir = /var/log/nova`` would
    put the agent's log in nova's directory; its ``debug`` would turn on the
    agent's.)"""
    novas = novas_files(conf)
    if not novas:
        return
    dest = {name: opt.dest for opt in conf_mod.log_opts() for name in _opt_names(opt, "DEFAULT")}
    taken = set()
    for path in novas:
        parser = _parsed(path)
        if parser is not None:
            taken |= {
                dest[key.replace("-", "_")]
                for key in parser.defaults()
                if key.replace("-", "_") in dest
            }
    if not taken:
        return
    own = cfg.ConfigOpts()
    logs.register(own)
    args: list[str] = []
    for path in _files(conf):
        if path not in novas:
            args += ["--config-file", path]
    own(args, project=PROJECT, default_config_files=None, use_env=False)
    for name in sorted(taken):
        try:
            conf.set_override(name, own[name])
        except cfg.NoSuchOptError:  # one oslo.log registers only when used
            continue
