"""Run a command as ``nobody`` inside the file-system sandbox the shipped
unit (systemd/node-agent.service) asks systemd for, where systemd itself
cannot run (a container, CI).

What is emulated, from the unit file itself: ``ProtectSystem=strict`` (every
mount read-only but /dev, /proc and /sys), ``ReadOnlyPaths=/sys``, and the
writable paths the unit grants (``StateDirectory=``, ``LogsDirectory=``,
``ReadWritePaths=``). It runs in a private mount namespace (``unshare -m``,
root only): /var/lib and /var/log are empty tmpfs there, so the machine's
own directories are neither read nor written; the directories systemd would
make for the service (State/LogsDirectory) belong to ``nobody``, as they
would to ``User=``. Not emulated: PrivateTmp (the fixtures live in /tmp),
the capability and address-family filters.
"""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "node-agent.service"
UNSHARE = shutil.which("unshare")


def unit_service(path: Path = UNIT) -> configparser.SectionProxy:
    parser = configparser.RawConfigParser(strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(path)
    return parser["Service"]


def granted_paths(service) -> tuple[list[str], list[str]]:
    """(directories systemd makes for the service user, other writable
    paths that must already exist; a leading "-" means "when it exists")."""
    made = [f"/var/lib/{name}" for name in service.get("StateDirectory", "").split()]
    made += [f"/var/log/{name}" for name in service.get("LogsDirectory", "").split()]
    others = [p for p in service.get("ReadWritePaths", "").split() if p.lstrip("-") not in made]
    return made, others


def sandbox_script(service, existing: list[str], after: str = "") -> str:
    """The shell run in the new mount namespace before ``exec "$@"``.
    ``existing``: optional ReadWritePaths to create (the operator's
    directory, owned by nobody as after the documented setfacl). ``after``:
    shell run in the namespace once the command ended (to show its files)."""
    assert service["ProtectSystem"] == "strict", "the emulation assumes ProtectSystem=strict"
    made, others = granted_paths(service)
    writable = made + [p.lstrip("-") for p in others]
    lines = [
        "set -e",
        "mount --make-rprivate /",
        "mount -t tmpfs -o mode=0755 tmpfs /var/lib",
        "mount -t tmpfs -o mode=0755 tmpfs /var/log",
    ]
    for path in made + existing:
        lines.append(f"mkdir -p {shlex.quote(path)} && chown nobody:nogroup {shlex.quote(path)}")
    # ProtectSystem=strict: every mount read-only but the API file systems.
    lines.append(
        "awk '{print $5}' /proc/self/mountinfo | sort -u | while read -r mp; do "
        'case "$mp" in /proc|/proc/*|/dev|/dev/*|/sys|/sys/*) continue;; esac; '
        'mount -o remount,bind,ro "$mp" 2>/dev/null || true; done'
    )
    for path in service.get("ReadOnlyPaths", "").split():
        path = shlex.quote(path.lstrip("-"))
        lines.append(f"mount --bind {path} {path} && mount -o remount,bind,ro {path}")
    for path in writable:
        quoted = shlex.quote(path)
        lines.append(
            f"if [ -d {quoted} ]; then mount --bind {quoted} {quoted} && "
            f"mount -o remount,bind,rw {quoted}; fi"
        )
    lines.append(f'"$@" && rc=0 || rc=$?\n{after}\nexit $rc' if after else 'exec "$@"')
    return "\n".join(lines)


def skip_unless_namespaces() -> None:
    if UNSHARE is None:
        pytest.skip("unshare is not installed")
    probe = subprocess.run(
        [UNSHARE, "-m", "--propagation", "private", "true"], capture_output=True, timeout=30
    )
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")


def in_sandbox(
    command: list[str], service=None, existing: tuple[str, ...] = (), after: str = ""
) -> list[str]:
    """``command`` (already switching to nobody) wrapped in the unit's sandbox."""
    service = service if service is not None else unit_service()
    assert UNSHARE is not None
    script = sandbox_script(service, list(existing), after)
    return [UNSHARE, "-m", "--propagation", "private", "sh", "-c", script, "sandbox", *command]
