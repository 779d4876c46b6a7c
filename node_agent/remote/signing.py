"""Signed agent messages (wire 2.2): who may speak for a host.

oslo.messaging does not authenticate senders, and every hypervisor holds
the same broker credentials. So each message carries
``signature = "hmac-sha256:" + HMAC-SHA256(key_host, signed_text(message))``
over its version, host, sequence number and digest (the digest is checked
against the body, so the body is covered too; a heartbeat has no body and
is covered the same way).

``key_host = HMAC-SHA256(master, label + host)``: the applier derives every
host's key from its master secret and needs no key table; a hypervisor only
holds its own key (provisioned with ``node-agent-applier derive-key HOST``).
A hypervisor that signs a message naming another host uses the wrong key:
the signature does not verify, exactly as a tampered one.

Rotation: the keyring holds the current master and, for an overlap the
operator sets, the previous one. A message verified only by a master
whose overlap ended is refused as ``expired_key``.

Pure: HMAC and the checks only; reading key files is
:mod:`node_agent.remote.keys`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Optional

ALGORITHM = "hmac-sha256"
# Domain separation: a host key is never the HMAC of anything else the
# master may be used for.
KEY_LABEL = b"node-agent host key v1\x00"
SIGNED_FIELDS = ("version", "host", "seq", "digest")

# Refusal reasons (the applier's metrics label them so).
UNSIGNED = "unsigned"
FORGED = "forged"
EXPIRED_KEY = "expired_key"
REASONS = (UNSIGNED, FORGED, EXPIRED_KEY)


def host_key(master: bytes, host: str) -> bytes:
    """The key of ``host`` under ``master`` (32 bytes)."""
    return hmac.new(master, KEY_LABEL + host.encode("utf-8"), hashlib.sha256).digest()


def signed_text(message: dict) -> bytes:
    """What the signature covers: the envelope's fields, canonical JSON."""
    fields = {k: message[k] for k in SIGNED_FIELDS}
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode("utf-8")


def signature(message: dict, key: bytes) -> str:
    mac = hmac.new(key, signed_text(message), hashlib.sha256).hexdigest()
    return f"{ALGORITHM}:{mac}"


def sign(message: dict, key: bytes) -> dict:
    """``message`` with its ``signature``."""
    return {**message, "signature": signature(message, key)}


def verifies(message: dict, key: bytes) -> bool:
    given = message.get("signature")
    return isinstance(given, str) and hmac.compare_digest(given, signature(message, key))


@dataclass(frozen=True)
class Master:
    """A master secret; ``until`` (seconds since the epoch) ends its use,
    None for the current master."""

    secret: bytes
    until: Optional[float] = None


@dataclass(frozen=True)
class Refusal:
    reason: str  # one of REASONS
    text: str  # for the reply and the log: names no key, no value


@dataclass(frozen=True)
class Keyring:
    """The masters the applier accepts, newest first, and whether messages
    of a wire version without signatures (2.0, 2.1) are let through (a
    transition only: such a message can name any host)."""

    masters: tuple[Master, ...]
    accept_unsigned: bool = False

    def check(self, message: dict, now: float) -> Optional[Refusal]:
        """None when ``message`` (its schema already checked) may be
        applied; else why not."""
        host = message["host"]
        if "signature" not in message:
            if self.accept_unsigned:
                return None
            return Refusal(
                UNSIGNED,
                (
                    f"wire format {message['version']} carries no signature and this "
                    f"applier accepts signed messages only: upgrade node-agent on {host} "
                    f"and provision its key ([agent] upstream_key_file, made with "
                    f"node-agent-applier derive-key {host})"
                ),
            )
        expired = False
        for master in self.masters:
            if verifies(message, host_key(master.secret, host)):
                if master.until is None or now < master.until:
                    return None
                expired = True
        if expired:
            return Refusal(
                EXPIRED_KEY,
                (
                    f"signed with the key of {host} under the previous master, whose "
                    f"overlap has ended: provision the key under the current master "
                    f"(node-agent-applier derive-key {host})"
                ),
            )
        return Refusal(
            FORGED,
            (
                f"the signature does not verify with the key of {host}: signed with "
                f"another host's key, altered, or a key not derived from this applier's "
                f"master"
            ),
        )
