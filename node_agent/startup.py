"""The start-up check: the one validation of the configuration. Start-up,
SIGHUP and ``--check-config`` all call :func:`validate`, so they cannot
disagree.

It collects every problem in one pass, in the order an operator reads a
file: what cannot be decoded or parsed (which stops there: nothing else can
be read), unknown options, bad values, what the values mean on this host
(CPU sets against the online CPUs...), and what the chosen mode needs
(``[placement]`` for direct mode, ``transport_url`` for messaging).

It reads the host (``cycle.desired``), this machine's identity and the
upstream key, and builds the Placement client: a composition step above
``config/``, ``host/``, ``placement/``, ``cycle/`` and ``remote/``, not part
of ``config/`` (the ranks are tests/unit/test_import_contract.py's).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Optional, Sequence

from oslo_config import cfg

from node_agent import logs
from node_agent.config.files import parse_conf, placement_configured, unknown_options
from node_agent.config.options import PLACEMENT_GROUP, configured_host
from node_agent.config.settings import check_settings
from node_agent.errors import ConfigError, DiscoveryError
from node_agent.model.settings import CycleMode, Settings
from node_agent.policy.node_name import node_name

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Validated:
    conf: cfg.ConfigOpts
    settings: Settings
    desired: object = None  # cycle.Desired, when the host was read
    client: object = None  # PlacementClient (direct mode), not yet contacted


def mode_problems(conf, settings: Settings) -> tuple[list[str], object]:
    """What ``[agent] upstream`` (and ``mode``) need: (problems,
    PlacementClient or None)."""
    from node_agent.config.settings import _configured_value

    # The pair the typed setting cannot hold (CycleMode.of lets companion win).
    if (
        _configured_value(conf, "mode", "agent") == "companion"
        and _configured_value(conf, "upstream", "agent") == "messaging"
    ):
        return [
            "[agent] mode = companion reads Placement itself, so it cannot be "
            "combined with [agent] upstream = messaging; set upstream = placement "
            "with a [placement] section (read access is enough)."
        ], None
    if settings.cycle_mode is CycleMode.VIA_APPLIER:
        problems = []
        if not _configured_value(conf, "transport_url", None):
            problems.append(
                "[agent] upstream = messaging needs [DEFAULT] transport_url "
                "(the broker node-agent-applier listens on); set it, or set "
                "upstream = placement with a [placement] section."
            )
        if not settings.upstream_key_file:
            problems.append(
                "[agent] upstream = messaging needs [agent] upstream_key_file, "
                "this host's signing key: make it on the control node with "
                f"node-agent-applier derive-key {settings.host} --output FILE, "
                "copy it here with mode 0600"
            )
        else:
            from node_agent.remote import keys

            try:
                keys.read_host_key(settings.upstream_key_file)
            except ConfigError as exc:
                problems += exc.problems
        return problems, None
    if not placement_configured(conf):
        return [
            "no Placement is configured: set [placement] auth_type (and its "
            "credentials) or endpoint_override, or [agent] upstream = messaging "
            "with [DEFAULT] transport_url; use --once --dry-run to only show "
            "the tree"
        ], None
    from node_agent.placement.client import PlacementClient

    try:
        return [], PlacementClient.from_conf(conf, group=PLACEMENT_GROUP)
    except ConfigError as exc:
        return list(exc.problems), None


def named_as_nova_names_it(conf, settings: Settings) -> Settings:
    """``settings`` with the host named as :mod:`node_agent.policy.node_name`
    says: libvirt's hostname, as nova-compute names its compute node, when
    the agent reads libvirt and no file sets ``[DEFAULT] host``. In
    companion mode, where nova-compute wrote the root, a set host that
    differs is logged. Raises DiscoveryError when libvirt cannot be read:
    the agent must not guess a name it would change later."""
    configured = configured_host(conf)
    if not settings.libvirt_uri or (
        configured is not None and settings.cycle_mode is not CycleMode.COMPANION
    ):
        return settings
    from node_agent.host.hypervisor import Hypervisor

    with Hypervisor(settings.libvirt_uri) as hypervisor:
        libvirt_name = hypervisor.hostname()
    name = node_name(configured, libvirt_name, settings.host)
    if name != libvirt_name:
        LOG.warning(
            "[DEFAULT] host = %s, but nova-compute names this compute node and "
            "its provider %s (libvirt's hostname; nova's [DEFAULT] host names "
            "only its service): companion mode looks for %s. Remove [DEFAULT] "
            "host from the agent's file, or set it to %s.",
            name,
            libvirt_name,
            name,
            libvirt_name,
        )
    return dataclasses.replace(settings, host=name)


def validate(
    args: Sequence[str],
    *,
    read_host: bool = True,
    need_upstream: bool = True,
    state: Optional[dict] = None,
    lenient_files: bool = False,
) -> Validated:
    """Parse and check the config files named by ``args`` (oslo.config
    arguments); raises ConfigError listing every problem.

    ``read_host``: also check the values against this host (sysfs and the
    operator's provider files; libvirt is not opened). A host that cannot be
    read is not a config problem: the cycle reports it.
    ``need_upstream``: check what the mode needs (the service and
    ``--check-config``; not ``--dry-run``, which works without Placement).
    ``lenient_files``: a bad operator provider file is not a problem here
    (the service reports the rest and logs the file each cycle it is bad).
    """
    conf = parse_conf(args)
    problems = unknown_options(conf)
    settings, more = check_settings(conf)
    problems += more
    problems += logs.option_problems(conf)
    client = None
    if need_upstream:
        more, client = mode_problems(conf, settings)
        problems += more
    if not problems:  # a config problem is said before libvirt is asked
        settings = named_as_nova_names_it(conf, settings)
    desired = None
    if read_host:
        from node_agent.cycle.desired import compute_desired
        from node_agent.host.machine_id import identity

        try:
            identity(settings)  # every writer marks the root with it
        except ConfigError as exc:
            problems += exc.problems
        try:
            desired = compute_desired(settings, state=state, lenient_files=lenient_files)
        except ConfigError as exc:
            problems += exc.problems
        except DiscoveryError:
            pass  # not a config problem: the cycle reports it
        except Exception:
            if not problems:
                raise
            # A value already refused above (left at a default the host
            # read cannot use); the problems listed say what to fix.
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
    return Validated(conf, settings, desired, client)
