"""The one gateway to sysfs: every file the agent reads under ``/sys`` goes through here.

The mount point is a value (``[host] sysfs_root``), so the whole agent can
run against a captured tree. This module only fetches text; parsing lives
with the callers' pure parsers.

Contract shared by all methods: a path that does not exist is "not present"
(None, logged at DEBUG) because many sysfs files are optional; any other
failure (permission denied, a directory where a file should be, I/O error)
raises DiscoveryError naming the full path, so a failed read is never
mistaken for an absent feature.
"""

from __future__ import annotations

import errno
import logging
import os

from node_agent.errors import DiscoveryError

LOG = logging.getLogger(__name__)

# ENOENT: the path is absent. ENOTDIR: a parent is a plain file, so the
# path cannot exist either. Both mean "not present", nothing more.
_ABSENT = (errno.ENOENT, errno.ENOTDIR)
_CHUNK = 65536


class SysFS:
    """Read-only access to a sysfs tree rooted at ``root`` (``/sys`` on a host)."""

    def __init__(self, root: str):
        self.root = os.fspath(root)
        # What os.path.join(root, relpath) gives, precomputed: discovery of a
        # large host builds thousands of paths per cycle.
        self._prefix = os.path.join(self.root, "")

    def __repr__(self) -> str:
        return f"SysFS({self.root!r})"

    def path(self, relpath: str) -> str:
        """The full path of ``relpath`` (relative to the root), for messages."""
        if relpath.startswith("/") or (".." in relpath and ".." in relpath.split("/")):
            raise ValueError(f"sysfs path must stay under the root: {relpath!r}")
        return self._prefix + relpath

    def read(self, relpath: str) -> str | None:
        """The file's text, or None when it does not exist."""
        full = self.path(relpath)
        try:
            data = _read_bytes(full)
        except OSError as exc:
            if exc.errno in _ABSENT:
                LOG.debug("%s is absent", full)
                return None
            raise DiscoveryError(f"cannot read {full}: {exc.strerror or exc}") from exc
        try:
            return data.decode("ascii")
        except UnicodeDecodeError as exc:
            # sysfs attributes are ASCII; binary content means the wrong file.
            raise DiscoveryError(f"{full} is not text: {exc}") from exc

    def listdir(self, relpath: str) -> list[str] | None:
        """Sorted entry names of a directory, or None when it does not exist."""
        full = self.path(relpath)
        try:
            return sorted(os.listdir(full))
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                LOG.debug("%s is absent", full)
                return None
            raise DiscoveryError(f"cannot list {full}: {exc.strerror or exc}") from exc

    def link_name(self, relpath: str) -> str | None:
        """The last part of a symlink's target (``physfn`` -> the PF's
        address), or None when there is no such link."""
        full = self.path(relpath)
        try:
            return os.path.basename(os.readlink(full))
        except OSError as exc:
            if exc.errno in _ABSENT:
                return None
            raise DiscoveryError(f"cannot read link {full}: {exc.strerror or exc}") from exc

    def exists(self, relpath: str) -> bool:
        """True when ``relpath`` exists (following symlinks, as sysfs readers
        do), False when it does not; like read, any other failure (a link
        loop, a directory that cannot be searched) is a DiscoveryError, where
        os.path.exists would answer False."""
        full = self.path(relpath)
        try:
            os.stat(full)
        except OSError as exc:
            if exc.errno in _ABSENT:
                return False
            raise DiscoveryError(f"cannot look up {full}: {exc.strerror or exc}") from exc
        return True


def _read_bytes(path: str) -> bytes:
    """The whole file, with bare os calls: a sysfs attribute is one short
    read, and a buffered file object costs more to set up than the read.

    A read shorter than asked is the end: sysfs hands over an attribute's
    text (at most a page) in one read, and a regular file (fixture trees)
    returns less than asked only at its end. A directory opens, then fails
    to read with EISDIR, as open() would."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, _CHUNK)
            chunks.append(chunk)
            if len(chunk) < _CHUNK:
                return b"".join(chunks) if len(chunks) > 1 else chunk
    finally:
        os.close(fd)
