"""The agent's local state: one versioned, checksummed JSON file.

The file is a cache of facts Placement also holds (the root provider's uuid,
the children the agent created). Losing it is safe, so a damaged file is
never "repaired": it is reported and the caller rebuilds from Placement.

Writes follow the kubelet's checkpoint recipe: a temp file in the same
directory, fsync, rename over the old file, fsync the directory. A crash
at any point leaves either the old file or the new one, never a mix.

Several writers share the file (the syncer, the maintenance command run
with sudo while the service runs, the audit, the applier): each changes only
its own keys, listed here, through :meth:`StateStore.update`, which reads,
changes and writes the file under an exclusive ``flock`` of its directory,
so no writer ever loses another's update. Readers need no lock: the rename
makes every read see a whole file.

:class:`Store` is what the syncer and the applier need of a store: this file,
or the applier's per-host record in Redis or SQL
(:mod:`node_agent.remote.coordination`, :mod:`node_agent.remote.sql_records`),
which keep the same envelope (:func:`encode`, :func:`decode`).
"""

from __future__ import annotations

import copy
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Protocol

from node_agent.errors import NodeAgentError, StateError

FILE_NAME = "state.json"
CORRUPT_SUFFIX = ".corrupt"  # a corrupt file, moved aside for a person to read
FORMAT_VERSION = 1
FILE_MODE = 0o600

LOG = logging.getLogger(__name__)

# The file's keys, and who writes each.
ROOT_UUID = "root_uuid"  # the syncer: the root provider's uuid
PROVIDERS = "providers"  # the syncer (or the upstream sender): name -> uuid
OWNED_CHILDREN = "owned_children"  # the syncer: children it created, uuids
APPLIED = "provider_config_applied"  # a cycle: provider -> operator traits applied
# A cycle: provider -> class -> the inventory the operator's files gave it,
# held while a file is refused (the refused file may be the one giving it).
FILE_INVENTORIES = "provider_config_inventories"
MAINTENANCE = "maintenance"  # the maintenance command / control RPC: the request
DEVICE_MAINTENANCE = "device_maintenance"  # maintenance --provider: name -> request
AUDIT = "audit"  # the allocation audit: its history
APPLIER = "applier"  # node-agent-applier: its per-host record
PROVIDER_CACHE = "provider_cache"  # the service and --once: the syncer's cache
AGGREGATES = "aggregates"  # the syncer: {"root_uuid", "ours"}, the aggregates it added
# A cycle: {"aggregate", "uuid"} of the sharing provider this host's DISK_GB
# moved to; kept until the reverse reshape moved it back (None then). A
# cache: the root's aggregates in Placement name it too.
SHARED_STORAGE = "shared_storage"


def _reason(exc: OSError) -> str:
    name = _errno_name(exc)
    return f"{exc.strerror or exc}" + (f" ({name})" if name else "")


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "")


class StateCorrupt(NodeAgentError):
    """The state file exists but cannot be trusted (garbage, bad checksum,
    unknown format version)."""


def _canonical(data: dict) -> str:
    # Sorted keys and fixed separators make the checksum independent of
    # dict order, so the same data always hashes the same.
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _checksum(payload_text: str) -> str:
    return hashlib.sha256(payload_text.encode("utf-8")).hexdigest()


def encode(data: dict) -> str:
    """The file's text for ``data``; raises TypeError/ValueError if ``data``
    is not JSON-serialisable."""
    payload = _canonical(data)
    return (
        json.dumps(
            {"version": FORMAT_VERSION, "sha256": _checksum(payload), "payload": data},
            sort_keys=True,
            indent=1,
        )
        + "\n"
    )


def decode(text: str, where: str = FILE_NAME) -> dict:
    """The dict stored in ``text``; raises :class:`StateCorrupt`."""
    try:
        envelope = json.loads(text)
    except ValueError as exc:
        raise StateCorrupt(
            f"state file {where} is not valid JSON ({exc}); it will be rebuilt from Placement"
        ) from exc
    if not isinstance(envelope, dict) or "version" not in envelope:
        raise StateCorrupt(
            f"state file {where} has no format version; it will be rebuilt from Placement"
        )
    if envelope["version"] != FORMAT_VERSION:
        raise StateCorrupt(
            f"state file {where} has format version {envelope['version']!r}, "
            f"this agent reads version {FORMAT_VERSION}; "
            "it will be rebuilt from Placement"
        )
    payload = envelope.get("payload")
    if not isinstance(payload, dict):
        raise StateCorrupt(
            f"state file {where} has no payload object; it will be rebuilt from Placement"
        )
    if envelope.get("sha256") != _checksum(_canonical(payload)):
        raise StateCorrupt(
            f"state file {where} fails its sha256 checksum "
            "(truncated or edited); it will be rebuilt "
            "from Placement"
        )
    wrong = shape_problem(payload)
    if wrong:
        raise StateCorrupt(
            f"state file {where} has a valid checksum but {wrong} (written by "
            "hand or by another program); it will be rebuilt from Placement"
        )
    return payload


_UUID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")


def _is_uuid(value: Any) -> bool:
    return isinstance(value, str) and _UUID.fullmatch(value.lower()) is not None


def _maybe_text(value: Any) -> bool:
    return value is None or isinstance(value, str)


# What each key must hold for its readers; a key not listed is kept as is.
_SHAPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    ROOT_UUID: ("a provider uuid", lambda v: v is None or _is_uuid(v)),
    PROVIDERS: (
        "an object of provider name -> uuid",
        lambda v: isinstance(v, dict) and all(_is_uuid(u) for u in v.values()),
    ),
    OWNED_CHILDREN: (
        "a list of provider uuids",
        lambda v: isinstance(v, list) and all(_is_uuid(u) for u in v),
    ),
    APPLIED: (
        "an object of provider name -> list of traits",
        lambda v: (
            isinstance(v, dict)
            and all(isinstance(t, list) and all(isinstance(x, str) for x in t) for t in v.values())
        ),
    ),
    FILE_INVENTORIES: (
        "an object of provider name -> class -> inventory",
        lambda v: (
            isinstance(v, dict)
            and all(
                isinstance(by_class, dict)
                and all(
                    isinstance(inv, dict) and type(inv.get("total")) is int
                    for inv in by_class.values()
                )
                for by_class in v.values()
            )
        ),
    ),
    MAINTENANCE: (
        "an object with on, reason and since",
        lambda v: (
            isinstance(v, dict)
            and isinstance(v.get("on", True), bool)
            and _maybe_text(v.get("reason"))
            and _maybe_text(v.get("since"))
        ),
    ),
    DEVICE_MAINTENANCE: (
        "an object of provider name -> {on, reason, since}",
        lambda v: (
            isinstance(v, dict)
            and all(
                isinstance(r, dict)
                and isinstance(r.get("on", True), bool)
                and _maybe_text(r.get("reason"))
                and _maybe_text(r.get("since"))
                for r in v.values()
            )
        ),
    ),
    AUDIT: ("an object", lambda v: isinstance(v, dict)),
    APPLIER: (
        "an object with an integer seq",
        lambda v: isinstance(v, dict) and type(v.get("seq", 0)) is int,
    ),
    PROVIDER_CACHE: ("an object", lambda v: v is None or isinstance(v, dict)),
    AGGREGATES: (
        "an object with root_uuid and a list of aggregate uuids, ours",
        lambda v: (
            isinstance(v, dict)
            and _is_uuid(v.get("root_uuid"))
            and isinstance(v.get("ours"), list)
            and all(_is_uuid(u) for u in v["ours"])
        ),
    ),
    SHARED_STORAGE: (
        "an object with aggregate and uuid",
        lambda v: (
            v is None
            or (isinstance(v, dict) and _is_uuid(v.get("aggregate")) and _is_uuid(v.get("uuid")))
        ),
    ),
}


def shape_problem(payload: dict) -> Optional[str]:
    """What is wrong with the shape of a decoded payload (the first key whose
    value its readers cannot use), or None. A wrong shape is a lost file, not
    a crash: every reader can then trust the keys it reads."""
    for key, (shape, fits) in _SHAPES.items():
        if key in payload and not fits(payload[key]):
            value = payload[key]
            return f"its {key!r} is {type(value).__name__} {_short(value)}, not {shape}"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def decode_or_empty(text: Optional[str], where: str, log: logging.Logger = LOG) -> dict:
    """The dict stored in ``text``; ``{}`` when there is none, and when it
    cannot be trusted (logged): a store's copy is rebuilt from Placement."""
    if text is None:
        return {}
    try:
        return decode(text, where)
    except StateCorrupt as exc:
        log.warning("%s", exc)
        return {}


def edited(state: dict, change: Callable[[dict], None]) -> dict:
    """A copy of ``state`` that ``change`` edited in place; ``state`` is left
    as it was, so the caller writes only when the two differ."""
    new = copy.deepcopy(state)
    change(new)
    return new


class Store(Protocol):
    """A host's state: the state file, or the applier's record elsewhere.

    A store implements :meth:`load`, :meth:`save` and :meth:`update`
    (read, edit, write back only when changed, atomically against other
    writers); subclassing this class gives it :meth:`load_or_empty` and
    :meth:`put`."""

    def load(self) -> dict:
        """The stored dict; ``{}`` when there is none. Raises
        :class:`StateCorrupt` for one that cannot be trusted."""
        ...

    def save(self, data: dict) -> None: ...

    def update(self, change: Callable[[dict], None]) -> dict:
        """Let ``change`` edit the stored dict; returns the new content."""
        ...

    def load_or_empty(self, log: logging.Logger) -> dict:
        """:meth:`load`, but a corrupt copy is logged and treated as absent."""
        try:
            return self.load()
        except StateCorrupt as exc:
            log.warning("%s", exc)
            return {}

    def put(self, key: str, value: Any) -> dict:
        """:meth:`update` that sets one key."""

        def set_key(state: dict) -> None:
            state[key] = value

        return self.update(set_key)


class StateStore(Store):
    """``state.json`` in ``directory``; the directory is created on save."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.path = self.directory / FILE_NAME

    def load(self) -> dict:
        """The saved dict; ``{}`` when there is no file yet.

        Raises :class:`StateCorrupt` for a file that cannot be trusted.
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except UnicodeDecodeError as exc:
            raise StateCorrupt(
                f"state file {self.path} is not UTF-8 text; it will be rebuilt from Placement"
            ) from exc
        except OSError as exc:
            self._refuse_a_file_in_the_way()
            raise StateError(
                f"state file {self.path} cannot be read: {_reason(exc)}. Make it and "
                f"{self.directory} readable by the user the agent runs as (a command "
                "run with sudo may have left it owned by root: chown it to the "
                "service user).",
                _errno_name(exc),
            ) from None
        return decode(text, str(self.path))

    def update(self, change: Callable[[dict], None]) -> dict:
        """Read the file, let ``change`` edit the dict in place, write it back
        (only when it changed), all under an exclusive lock: two processes
        updating at once both keep their update. A corrupt file is logged
        and read as empty. Returns the file's new content. The lock waits
        for the other writer (a write takes milliseconds)."""
        with self._locked():
            state = self._load_or_set_aside(LOG)
            new = edited(state, change)
            if new != state:
                self.save(new)
            return new

    def load_or_empty(self, log: logging.Logger) -> dict:
        """:meth:`load`; a corrupt file is logged once, moved aside to
        ``state.json.corrupt`` (replacing an earlier one) for a person to
        read, and read as absent: the next write rebuilds it from Placement,
        as after a lost file."""
        try:
            return self.load()
        except StateCorrupt:
            pass
        try:
            with self._locked():
                return self._load_or_set_aside(log)
        except StateError:  # not even lockable: leave the file where it is
            return super().load_or_empty(log)

    def _load_or_set_aside(self, log: logging.Logger) -> dict:
        # Under the lock, so the file moved aside is the one read: no writer
        # can have replaced it with a good one in between.
        try:
            return self.load()
        except StateCorrupt as exc:
            aside = self.path.with_name(FILE_NAME + CORRUPT_SUFFIX)
            try:
                os.replace(self.path, aside)
                kept = f"; the bad file is kept as {aside}"
            except OSError as failed:
                kept = f"; it could not be moved aside to {aside}: {_reason(failed)}"
            log.warning("%s%s", exc, kept)
            return {}

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # The directory itself is locked: no lock file to own, and a sudo
        # run leaves nothing the service user cannot open. The kernel drops
        # the lock when its holder dies.
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            self._refuse_a_file_in_the_way()
            raise StateError(
                f"state directory {self.directory} cannot be opened: {_reason(exc)}. "
                "Make it readable and writable by the user the agent runs as.",
                _errno_name(exc),
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def save(self, data: dict) -> None:
        """Replace the file with ``data`` atomically, mode 0600.

        Serialisation happens before any file is touched, so unserialisable
        data raises (TypeError/ValueError) and leaves the old file as it was.
        A file system that refuses the write (permission, ENOSPC, read-only)
        raises :class:`StateError` naming the path, and leaves the old file.

        Run as root (``sudo node-agent maintenance on``), the file gets the
        owner and group of its directory, so the service user can still
        read it.
        """
        text = encode(data)
        try:
            self._write(text)
        except OSError as exc:
            self._refuse_a_file_in_the_way()
            raise StateError(
                f"state file {self.path} cannot be written: {_reason(exc)}. Make "
                f"{self.directory} writable by the user the agent runs as and "
                "check the file system has free space; the previous state file, "
                "if any, is unchanged.",
                _errno_name(exc),
            ) from None

    def _refuse_a_file_in_the_way(self) -> None:
        """Raise StateError when state_path, or a directory above it, is a
        file: a path to fix in the config, not a permission."""
        for path in (self.directory, *self.directory.parents):
            if path.exists():
                if path.is_dir():
                    return
                raise StateError(
                    f"state_path {self.directory}: {path} is not a directory. "
                    f"state_path names the directory that holds {FILE_NAME}; point "
                    "it at a directory (or move the file away)."
                )

    def _write(self, text: str) -> None:
        # Here, not at the top: tempfile loads shutil, random, bz2 and lzma
        # (3 ms), which a dry run, which never writes, need not pay.
        import tempfile

        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".state-", suffix=".tmp", dir=self.directory)
        try:
            os.fchmod(fd, FILE_MODE)
            if os.geteuid() == 0:
                owner = os.stat(self.directory)
                os.fchown(fd, owner.st_uid, owner.st_gid)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_directory(self.directory)


def _fsync_directory(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
