"""The project's error hierarchy; the CLI maps each class to an exit code."""

import os
import re
from typing import NamedTuple


class NodeAgentError(Exception):
    """Base of every error the agent raises on purpose."""

    exit_code = 1


class ConfigError(NodeAgentError):
    """The configuration cannot be used; the message names option, value and fix.

    ``problems`` holds every problem found, so an operator fixes them all in
    one edit instead of one per run.
    """

    exit_code = getattr(os, "EX_CONFIG", 78)

    def __init__(self, problems):
        if isinstance(problems, str):
            problems = [problems]
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


class DiscoveryError(NodeAgentError):
    """The host could not be read (sysfs, libvirt, psutil)."""

    exit_code = 69  # EX_UNAVAILABLE


class DomainCapsRefused(DiscoveryError):
    """libvirt refused domain capabilities (access denied, read-only, or a
    driver without them): the traits they decide are not reported."""


class CpuExpansionUnsupported(DiscoveryError):
    """This libvirt has no baselineCPU (VIR_ERR_NO_SUPPORT): a CPU model's
    features cannot be expanded, and nova then reports none of them."""


class ParseError(DiscoveryError):
    """A host-provided text (sysfs file, XML) is malformed."""


class PlacementError(NodeAgentError):
    """Placement refused a request or could not be reached."""

    exit_code = 75  # EX_TEMPFAIL


class ReshapeError(NodeAgentError):
    """A reshape cannot be computed or was refused."""

    exit_code = 70  # EX_SOFTWARE


class HostBusy(ReshapeError):
    """A reshape kept being refused because allocations on the host changed
    between its reads and its write: temporary, the next cycle tries again."""

    exit_code = 75  # EX_TEMPFAIL


class ResourceError(NodeAgentError):
    """A local resource the agent needs is unreadable, unwritable or busy
    (the state file, its directory, the metrics port)."""

    exit_code = 69  # EX_UNAVAILABLE


class StateError(ResourceError):
    """The state file or its directory cannot be read or written (permission,
    full or read-only file system). Unlike a corrupt file this is not
    ignored: the file may hold the operator's maintenance flag.

    ``cause`` names the file system's refusal (``EACCES``, ``ENOSPC``,
    ``EROFS``...), so the service logs again when the cause changes."""

    def __init__(self, message: str, cause: str = ""):
        self.cause = cause
        super().__init__(message)


class GuestsDoNotFit(ReshapeError):
    """The CPU configuration leaves guests of this host without the CPUs nova
    needs to run them (:mod:`node_agent.policy.guest_fit`): the CPU classes
    are not changed; ``kept`` says what the caller still wrote."""

    def __init__(self, reasons, kept: str = "nothing was written to Placement"):
        self.reasons = tuple(reasons)
        super().__init__(
            "\n".join(
                [
                    f"CPU sets refused, {kept}: under cpu_dedicated_set and "
                    "cpu_shared_set as configured, these guests have no CPU to run on:",
                    *self.reasons,
                ]
            )
        )


class ProviderOwned(ConfigError):
    """This host's root provider is managed by nova-compute or by node-agent
    on another machine (:mod:`node_agent.policy.root_owner`); nothing is
    written. A configuration problem: the host name, the mode or
    ``[agent] take_over_provider`` is the fix."""


class UnknownProvider(NodeAgentError):
    """A command named a provider this host's tree does not have as a child
    (``maintenance on --provider NAME``); the message lists the children.
    Exit 2, as a value argparse refuses."""

    exit_code = 2


class ExitCode(NamedTuple):
    """One class of the hierarchy as the CLI's exit-code reference shows it."""

    code: int
    name: str
    parent: str
    summary: str  # the docstring's first sentence, without reST markup

    @property
    def own_code(self) -> bool:
        """The class brings a code of its own (its parent exits otherwise)."""
        return self.parent == "" or self.code != _CLASSES[self.parent].exit_code


def _first_sentence(doc: str | None) -> str:
    text = re.sub(r":\w+:`([^`]*)`", r"\1", " ".join((doc or "").split()))
    return text.replace("``", "`").split(". ")[0].rstrip(".") + "."


def exit_codes() -> list[ExitCode]:
    """Every class of this module's hierarchy with its exit code, by code
    then name. ``node-agent --help`` and docs/reference/exit-codes.md are
    made from it, so a new class or a changed code reaches both."""
    return sorted(
        (
            ExitCode(
                cls.exit_code,
                cls.__name__,
                "" if cls is NodeAgentError else cls.__mro__[1].__name__,
                _first_sentence(cls.__doc__),
            )
            for cls in _CLASSES.values()
        ),
        key=lambda row: (row.code, row.name),
    )


_CLASSES = {
    name: cls
    for name, cls in dict(globals()).items()
    if isinstance(cls, type) and issubclass(cls, NodeAgentError)
}
