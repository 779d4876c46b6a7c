"""Key files of signed messages: the hypervisor's host key, the applier's
master secrets. The only code that reads or writes them.

Both are secrets: a file readable or writable by its group or by others is
refused (exit 78) before it is used, as ssh refuses a private key. Errors
name the option and the path, never the content.
"""

from __future__ import annotations

import os
import re
import stat
from datetime import datetime, timezone
from typing import Optional

from node_agent.errors import ConfigError
from node_agent.remote import signing

HOST_KEY = re.compile(r"[0-9a-f]{64}")
MIN_MASTER_BYTES = 32


def _read_secret(path: str, option: str) -> bytes:
    if not path:
        raise ConfigError(f"{option} is not set: it names the file holding the key")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ConfigError(f"{option} = {path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{option} = {path}: cannot be read: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{option} = {path}: not a regular file")
        if mode & 0o077:
            raise ConfigError(
                f"{option} = {path}: the key is open to its group or others (mode "
                f"{stat.S_IMODE(mode):04o}); it must be readable by its owner only: "
                f"chmod 0600 {path}"
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read().strip()
    finally:
        os.close(fd)


def read_host_key(path: str, option: str = "[agent] upstream_key_file") -> bytes:
    """The hypervisor's key (a file of 64 hex digits, made by
    ``node-agent-applier derive-key``); raises ConfigError."""
    text = _read_secret(path, option)
    if not HOST_KEY.fullmatch(text.decode("ascii", "replace")):
        raise ConfigError(
            f"{option} = {path}: not a host key (64 hex digits, as "
            f"node-agent-applier derive-key HOST writes)"
        )
    return bytes.fromhex(text.decode("ascii"))


def read_master(path: str, option: str = "[applier] master_key_file") -> bytes:
    """A master secret: the file's content, at least 32 bytes (e.g.
    ``openssl rand -hex 32``); raises ConfigError."""
    secret = _read_secret(path, option)
    if len(secret) < MIN_MASTER_BYTES:
        raise ConfigError(
            f"{option} = {path}: a master secret needs at least "
            f"{MIN_MASTER_BYTES} bytes (make one with: openssl rand -hex 32)"
        )
    return secret


def parse_until(text: str, option: str) -> float:
    """An ISO 8601 date-time (UTC when it names no zone) as epoch seconds."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"{option} = {text!r}: not an ISO 8601 date-time (e.g. 2026-12-01T00:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def keyring(group) -> signing.Keyring:
    """The applier's keyring from its ``[applier]`` options; raises
    ConfigError listing every problem."""
    problems: list[str] = []
    masters: list[signing.Master] = []
    try:
        masters.append(signing.Master(read_master(group.master_key_file or "")))
    except ConfigError as exc:
        problems += exc.problems
    previous: Optional[str] = group.previous_master_key_file
    if previous:
        until_text = group.previous_master_key_until
        try:
            if not until_text:
                raise ConfigError(
                    "[applier] previous_master_key_file is set without "
                    "previous_master_key_until: say when the overlap of the old "
                    "master ends (e.g. 2026-12-01T00:00:00Z)"
                )
            until = parse_until(until_text, "[applier] previous_master_key_until")
            masters.append(
                signing.Master(read_master(previous, "[applier] previous_master_key_file"), until)
            )
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems)
    return signing.Keyring(tuple(masters), accept_unsigned=bool(group.accept_unsigned))


def write_host_key(path: str, key: bytes) -> None:
    """Write a host key file, mode 0600 (replacing one that exists)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (key.hex() + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
