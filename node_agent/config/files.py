"""Load the config files into a ConfigOpts and refuse what oslo.config would ignore.

oslo.config silently ignores unknown options and sections; for an operator a
typo ("cpu_dedicated_sets") is then a setting that quietly does nothing. This
module reports them, together with unreadable or unparsable files, as one
ConfigError.

nova.conf is read as it is (``--config-file /etc/nova/nova.conf
--config-file /etc/node-agent/node-agent.conf``): sections and options that
are nova's (:mod:`node_agent.config.nova_options`) and not the agent's are ignored
with one DEBUG line; a name that is neither is still refused.
"""

from __future__ import annotations

import configparser
import glob
import logging
import os
from typing import Sequence

from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

from node_agent.config import options as conf_mod
from node_agent.errors import ConfigError
from node_agent.config.nova_options import NOVA_DYNAMIC_SECTION_PREFIXES, NOVA_OPTIONS

LOG = logging.getLogger(__name__)

PROJECT = "node-agent"
# Sections that belong to libraries; their keys are theirs to check.
_LIBRARY_SECTION_PREFIXES = ("oslo_", "keystone_authtoken", "ssl")


def _names(opts) -> set[str]:
    return {opt.dest for opt in opts} | {opt.name.replace("-", "_") for opt in opts}


def _known_keys(conf: cfg.ConfigOpts) -> dict[str, set[str]]:
    known: dict[str, set[str]] = {}
    for group, opts in conf_mod.list_opts(with_messaging=False):
        names = known.setdefault(group, set())
        for opt in opts:
            names.add(opt.dest)
            names.add(opt.name.replace("-", "_"))
            for old in opt.deprecated_opts:
                if old.name and (old.group in (None, group)):
                    names.add(old.name.replace("-", "_"))
    known.setdefault(conf_mod.PLACEMENT_GROUP, set()).update(_auth_plugin_keys(conf))
    known["DEFAULT"] |= {"config_file", "config_dir"}
    return known


def _auth_plugin_keys(conf: cfg.ConfigOpts) -> set[str]:
    """The options of the configured ``[placement] auth_type``, as
    keystoneauth's plugin loader lists them (any installed plugin). An
    unknown auth_type adds none: loading the session reports it."""
    name = conf[conf_mod.PLACEMENT_GROUP].auth_type
    if not name:
        return set()
    try:
        options = ks_loading.get_plugin_options(name)
    except Exception:  # no such plugin, or a broken third-party one
        return set()
    return {opt.dest for opt in options}


def _files(conf: cfg.ConfigOpts) -> list[str]:
    files = list(conf.config_file or [])
    for directory in conf.config_dir or []:
        files += sorted(glob.glob(os.path.join(directory, "*.conf")))
    return files


def _is_nova_section(section: str) -> bool:
    return section in NOVA_OPTIONS or section.startswith(NOVA_DYNAMIC_SECTION_PREFIXES)


def unknown_options(conf: cfg.ConfigOpts) -> list[str]:
    """Problems: sections and options neither the agent's nor nova's. The
    names that are nova's only are ignored, with one DEBUG line."""
    problems, ignored = _classify_keys(conf)
    if ignored:
        LOG.debug("nova options the agent does not use, ignored: %s", ", ".join(ignored))
    return problems


def nova_only_keys(conf: cfg.ConfigOpts) -> list[str]:
    """``[section]`` and ``[section] option`` names in the files that are
    nova's and not the agent's: ignored (a nova.conf given as it is)."""
    return _classify_keys(conf)[1]


def _classify_keys(conf: cfg.ConfigOpts) -> tuple[list[str], list[str]]:
    known = _known_keys(conf)
    problems: list[str] = []
    ignored: list[str] = []
    for path in _files(conf):
        parser = configparser.RawConfigParser(strict=False, interpolation=None)
        parser.optionxform = str
        try:
            parser.read(path)
        except configparser.Error:
            continue  # oslo.config already parsed it; its grammar is slightly wider
        for section in parser.sections() + ["DEFAULT"]:
            if section not in known:
                if _is_nova_section(section):
                    ignored.append(f"[{section}]")
                elif not section.startswith(_LIBRARY_SECTION_PREFIXES):
                    problems.append(f"{path}: unknown section [{section}]. Check the "
                                    "spelling against etc/node-agent.conf.sample.")
                continue
            keys = parser.defaults() if section == "DEFAULT" else parser[section]
            own = keys.keys() if section == "DEFAULT" else (
                set(keys.keys()) - set(parser.defaults().keys()))
            unknown = [key for key in own if key.replace("-", "_") not in known[section]]
            if unknown and section == "DEFAULT":
                known[section] |= _names(conf_mod.messaging_default_opts())
            for key in unknown:
                name = key.replace("-", "_")
                if name in known[section]:
                    continue
                if name in NOVA_OPTIONS.get(section, ()):
                    ignored.append(f"[{section}] {key}")
                else:
                    problems.append(f"{path}: unknown option [{section}] {key}. Check the "
                                    "spelling against etc/node-agent.conf.sample.")
    return problems, list(dict.fromkeys(ignored))


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
    return (f"{what} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start} (line {line}) cannot be decoded. Re-save the file as UTF-8 "
            "(for example iconv -f latin1 -t utf-8).")


def load_conf(args: Sequence[str]) -> cfg.ConfigOpts:
    """Parse ``--config-file``/``--config-dir`` arguments into a checked ConfigOpts."""
    conf = parse_conf(args)
    problems = unknown_options(conf)
    if problems:
        raise ConfigError(problems)
    return conf


def parse_conf(args: Sequence[str]) -> cfg.ConfigOpts:
    """Parse the files into a ConfigOpts; raises ConfigError when they
    cannot be read or parsed (unknown options are left to the caller)."""
    problems = undecodable_files(_arg_files(args))
    if problems:
        raise ConfigError(problems)
    conf = cfg.ConfigOpts()
    conf_mod.register_opts(conf)
    try:
        conf(list(args), project=PROJECT, default_config_files=None,
             use_env=False)
    except cfg.ConfigFilesNotFoundError as exc:
        raise ConfigError(f"config file not found or unreadable: {', '.join(exc.config_files)}. "
                          "Check the path and that the service user can read it.") from None
    except cfg.ConfigFilesPermissionDeniedError as exc:
        raise ConfigError(f"permission denied reading config file "
                          f"{', '.join(exc.config_files)}. Make it readable by the service "
                          "user (for example chmod 0640 and chgrp node-agent).") from None
    except cfg.ConfigFileParseError as exc:
        raise ConfigError(f"config file {exc.config_file} cannot be parsed: {exc.msg}") from None
    except cfg.Error as exc:
        raise ConfigError(f"configuration error: {exc}") from None
    except OSError as exc:  # a directory given as a file, an I/O error
        raise ConfigError(f"config file {exc.filename} cannot be read: "
                          f"{exc.strerror or exc}. Give the path of a readable "
                          "file.") from None
    return conf
