"""``node-agent``: the command line. A table of contents of what the agent does.

    node-agent --once --dry-run [--output json]   show what would be reported
    node-agent --once                             one sync, then exit
    node-agent --check-config [--connect]         validate and show the CPU split
    node-agent                                    run as a service
    node-agent maintenance on|off|status          close/reopen the host; compare records
    node-agent audit [--output json]              allocations vs. local guests (reads only)
    node-agent decommission [--dry-run]           remove this host's providers
    node-agent ctl --host H COMMAND               ask a running agent over the bus

The arguments, their help and the exit codes are in one argparse tree,
:mod:`node_agent.cli.parser` (``node-agent --help``, docs/reference/cli.md).

With ``[agent] mode = companion`` (:mod:`node_agent.cycle.companion`)
``--once`` reads only and reports drift, the audit and nova-compute's next
restart instead of syncing.

Why one module over 400 lines: each command is a short function here and
they share the logging set-up and the mapping of
errors to exit codes; read together they are the agent's table of contents.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

from node_agent import logs
from node_agent.cli import render
from node_agent.cli.parser import EX_DRIFT, EX_NOT_IN_SYNC, parse
from node_agent.config.files import config_args, log_ignored, oslo_args, placement_configured
from node_agent.cycle.desired import compute_desired
from node_agent.errors import ConfigError, DiscoveryError, HostBusy, NodeAgentError
from node_agent.model.settings import CycleMode
from node_agent.placement.errors import NotFound
from node_agent.policy import device_maintenance as devmaint
from node_agent.policy import maintenance as maint
from node_agent.policy.partition import node_split
from node_agent.startup import validate
from node_agent.state import (
    DEVICE_MAINTENANCE,
    MAINTENANCE,
    PROVIDERS,
    ROOT_UUID,
    StateCorrupt,
    StateStore,
)

# Imported inside the functions that use them, and only there:
# node_agent.placement.client and node_agent.cycle.companion (keystoneauth1,
# requests), node_agent.service.metrics (prometheus_client),
# node_agent.remote.upstream (jsonschema, the wire schema); and the engine a
# dry-run without Placement never runs: the syncer, reconciler and audit, the
# bus (remote.messaging, remote.keys), the service (service.daemon) and the
# other subcommands (cli.ctl, cli.decommission). Loading them all costs a
# dry-run about a third more CPU and 3 MiB (BENCHMARKS.md, start-up; checked
# by tests/cli/test_start_cost.py).
LOG = logging.getLogger("node_agent")


def _setup_logging(debug: bool, reporting: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )

    logs.quiet_libraries()
    if not debug:
        if reporting:
            # --once, --dry-run and --check-config print the host's warnings
            # in their report; stderr keeps what goes wrong.
            logging.getLogger("node_agent.host.discover").setLevel(logging.ERROR)


def _setup_logging_from(conf, debug: bool, reporting: bool) -> None:
    """Logging as the config file says (oslo.log), once it is known valid."""

    logs.setup(conf, debug, reporting)
    if reporting and not conf.debug:
        # --once and --dry-run print the host's warnings in their report.
        logging.getLogger("node_agent.host.discover").setLevel(logging.ERROR)


def _setup_logging_before_the_host_is_read(files: Sequence[str], debug: bool) -> bool:
    """The service's logging as the files say, before its validation reads
    the host, so the host's warnings come in the configured format and
    place. False when the files or a log option are bad, or the logging
    cannot be set up: validation, then :func:`_setup_logging_from`, report
    that with the other problems."""
    from node_agent.config.files import parse_conf

    try:
        conf = parse_conf(files)
        if logs.option_problems(conf):
            return False
        _setup_logging_from(conf, debug, reporting=False)
    except ConfigError:
        return False
    return True


def _host_for_check(settings):
    """The host as ``--check-config`` judges it, and why its guests were not
    checked (None when they were). libvirt that cannot be reached skips the
    guest checks and says so; the rest is checked on sysfs alone."""
    if not settings.libvirt_uri:
        return compute_desired(settings), "[libvirt] connection_uri is empty: no guests to check"
    try:
        return compute_desired(settings), None
    except DiscoveryError as exc:
        without = compute_desired(replace(settings, libvirt_uri=""))  # sysfs: raises its own
        host = without.host
        kept = tuple(w for w in host.warnings if "connection_uri is empty" not in w)
        desired = replace(without, host=replace(host, warnings=kept))
        return desired, f"libvirt at {settings.libvirt_uri} cannot be reached ({exc})"


def _check_config(valid, output: str) -> int:
    """The partition per node; with libvirt, the guests judged against it
    (:mod:`node_agent.policy.guest_fit`, nova's counting): a guest the CPU
    sets leave without CPUs is a ConfigError (78), as the cycle refuses them."""
    from node_agent.policy.guest_fit import misfits, pinned_misfit

    if valid.desired is not None:
        desired, skipped = valid.desired, None
        if not valid.settings.libvirt_uri:
            skipped = "[libvirt] connection_uri is empty: no guests to check"
    else:
        desired, skipped = _host_for_check(valid.settings)  # raises what sysfs hit
    partition = desired.partition
    if skipped is None:
        refused = misfits(
            desired.host.guests, partition.dedicated, getattr(partition, "shared", None)
        )
        if refused:
            raise ConfigError(refused)
    if skipped:
        guests: dict = {"checked": False, "skipped": skipped}
    else:
        shared = getattr(partition, "shared", None)
        outside = sorted(
            g.name
            for g in desired.host.guests
            if pinned_misfit(g, partition.dedicated, shared) is not None
        )
        guests = {
            "checked": True,
            "count": len(desired.host.guests),
            "pinned_outside_dedicated": outside,
        }
    split = node_split(partition, desired.host)
    if output == "json":
        print(
            json.dumps(
                {
                    "nodes": split,
                    "warnings": list(desired.warnings),
                    "guests": guests,
                    "numa_stranded": desired.stranded,
                },
                indent=2,
                sort_keys=True,
            )
        )
        return 0
    print("Configuration is valid for this host. CPU partition of online CPUs:")
    for row in split:
        where = "host" if row["node"] is None else f"NUMA node {row['node']}"
        print(
            f"  {where}: dedicated [{row['dedicated']}]  shared [{row['shared']}]  "
            f"unused [{row['unused']}]"
        )
    if skipped:
        print(f"Guest checks skipped: {skipped}.")
    else:
        print(f"Guests: the {guests['count']} on this host have CPUs under these sets.")
        outside = guests["pinned_outside_dedicated"]
        if outside:
            print(
                f"  but {len(outside)} with dedicated vCPUs run outside cpu_dedicated_set "
                f"({', '.join(outside)}): see the warnings below."
            )
    for line in render.stranded_lines(desired.stranded)[1:]:
        print(line)
    for warning in desired.warnings:
        print(f"warning: {warning}")
    return 0


def _connect(valid) -> int:
    """``--check-config --connect``: Placement answers with these credentials
    at a microversion the agent can use (direct mode), or the broker accepts
    a connection (messaging mode). Raises PlacementError (75) otherwise."""
    if valid.settings.cycle_mode is CycleMode.VIA_APPLIER:
        from node_agent.remote import messaging

        where = messaging.check_broker(valid.conf)
        print(f"Broker answers: {where}")
        return 0
    client = valid.client
    newest = client.check_version()
    # GET / needs no credentials; this one does (and admin rights).
    client.providers_named(valid.settings.host)
    print(
        f"Placement answers: {client.endpoint} (microversion up to {newest}); "
        "the credentials are accepted."
    )
    return 0


def _reading_syncer(conf, settings):
    """A syncer of this host for ``node-agent audit``, which never writes:
    it judges no owner (this machine's identity is not read). The cycles
    build theirs in :func:`node_agent.runner.runner_for`."""

    from node_agent.cycle import provider_cache
    from node_agent.placement.client import PlacementClient
    from node_agent.placement.sync import TreeSyncer

    client = PlacementClient.from_conf(conf)
    client.check_version()
    syncer = TreeSyncer(
        client,
        StateStore(Path(settings.state_path)),
        full_verify_interval=settings.full_verify_interval,
    )
    provider_cache.restore(syncer)  # its first read verifies it
    return syncer


def _state_store(settings):
    return StateStore(Path(settings.state_path))


def _run_once(conf, settings, dry_run: bool, output: str, client=None) -> int:
    """``--once`` and ``--dry-run``, in every mode: the runner of the mode
    (:func:`node_agent.runner.runner_for`) runs or plans one cycle;
    this prints its report and maps it to an exit code. In companion mode
    exit 0 in sync, 3 drift or audit alarms, 1 no provider of the host's
    name; ``--dry-run`` exits 0 whatever it found."""
    from node_agent.runner import runner_for

    started = time.monotonic()
    # --once reports everything but a bad provider file, then exits 78 naming
    # it; --dry-run refuses the run, so the bad file is not missed.
    desired = compute_desired(
        settings, state=_state_store(settings).load_or_empty(LOG), lenient_files=not dry_run
    )
    runner = runner_for(conf, settings, client, guests_now=lambda: _guests(settings))
    try:
        report = runner.plan(desired) if dry_run else runner.run(desired)
    finally:
        runner.close()
    for error in report.errors:
        print(f"node-agent: {error}", file=sys.stderr)
    if not dry_run:
        for cut in report.below_usage or ():
            # Written, not refused: a warning, and no effect on the exit code.
            print(f"node-agent: warning: capacity published below usage: {cut}", file=sys.stderr)
    companion = report.companion
    if not dry_run and report.client is not None:
        from node_agent.service import metrics

        metrics.write_once(
            conf,
            report.desired,
            report.client,
            time.monotonic() - started,
            report.errors,
            audit=report.audit,
            companion=None if companion is None else companion.as_dict(),
            blocked=report.blocked,
            shared_storage=report.shared_storage,
        )
    desired = report.desired
    shown = render.report_dict(
        report.tree,
        desired.warnings,
        report.changes,
        report.reshape,
        report.capacity,
        report.errors,
        report.below_usage,
    )
    shown = (
        render.with_audit(shown, report.audit)
        if companion is None
        else render.with_companion(shown, companion)
    )
    shown = render.with_guests(shown, desired.host.guests)
    shown = render.with_stranded(shown, desired.stranded)
    shown = render.with_shared_storage(shown, report.shared_storage)
    print(render.as_json(shown) if output == "json" else render.as_text(shown), end="")
    if desired.refused_files:
        refused = ConfigError(list(desired.refused_files))
        print(_error_text(refused), file=sys.stderr)
        return refused.exit_code
    if companion is not None:
        return _companion_code(companion, report.client, dry_run)
    if report.busy:
        return HostBusy.exit_code  # 75: try again later
    return 0 if report.ok else EX_NOT_IN_SYNC


def _guests(settings):
    from node_agent.host.libvirt_facts import read_guests

    return read_guests(settings)


def _companion_code(found, client, dry_run: bool) -> int:
    from node_agent.cycle.companion import not_found_message

    if not found.found:
        print(f"node-agent: {not_found_message(found.host, client.endpoint)}", file=sys.stderr)
        return 0 if dry_run else EX_NOT_IN_SYNC
    if dry_run or found.in_sync:
        return 0
    return EX_DRIFT


def _audit_of(syncer, desired, settings, save: bool) -> dict:
    """The allocation audit against the tree the syncer has just read."""
    from node_agent.cycle.audit import Auditor

    return (
        Auditor(syncer, in_flight_grace=settings.audit_in_flight_grace)
        .run(desired, settings.host, settings.numa_in_placement, save=save)
        .as_dict()
    )


def _audit(conf, settings, output: str) -> int:
    """``node-agent audit``: read the tree and its allocations, compare them
    with the local guests, print the findings. Keeps its observations (first
    seen times) in the state file; never writes to Placement."""
    if not placement_configured(conf):
        raise ConfigError(
            "node-agent audit reads Placement, and none is configured: "
            "set [placement] auth_type (or endpoint_override)."
        )
    desired = compute_desired(settings, state=_state_store(settings).load_or_empty(LOG))
    if settings.cycle_mode is CycleMode.COMPANION:
        return _companion_audit(conf, settings, desired, output)
    syncer = _reading_syncer(conf, settings)
    syncer.plan(desired.tree)  # reads the tree (and writes nothing)
    if not syncer.cached_tree():
        print(
            f"node-agent: error: {settings.host} has no provider in Placement at "
            f"{syncer.client.endpoint} yet, so nothing can be allocated on it; "
            "run `node-agent --once` (or start the service) first.",
            file=sys.stderr,
        )
        return EX_NOT_IN_SYNC
    audit = _audit_of(syncer, desired, settings, save=True)
    if output == "json":
        print(render.as_json({"host": settings.host, "audit": audit}))
    else:
        print("\n".join(render.audit_lines(audit)))
    return EX_NOT_IN_SYNC if audit["alarms"] else 0


def _companion_audit(conf, settings, desired, output: str) -> int:
    """``node-agent audit`` in companion mode: the companion check (the same
    audit, through the read-only gateway, of the provider found by the
    host's name), as ``--once`` runs it."""
    from node_agent.cycle.companion import not_found_message
    from node_agent.runner import runner_for

    report = runner_for(conf, settings).run(desired)
    found = report.companion
    assert found is not None, "the companion runner reports its check"
    if not found.found or found.audit is None:
        print(
            f"node-agent: error: {not_found_message(settings.host, report.client.endpoint)}",
            file=sys.stderr,
        )
        return EX_NOT_IN_SYNC
    if output == "json":
        print(render.as_json({"host": settings.host, "audit": found.audit}))
    else:
        print("\n".join(render.audit_lines(found.audit)))
    return EX_NOT_IN_SYNC if found.alarms else 0


def service_maintenance_line(switch: str, host: str, answer: dict) -> str:
    """What ``maintenance on|off`` prints after the running service answered:
    applied only when the cycle it ran for it ended (``applied_in_cycle``)."""
    if answer.get("applied_in_cycle") is None:
        done = (
            "recorded it; the cycle that applies it had not ended when it answered "
            "(see `node-agent maintenance status`)"
        )
    else:
        done = "recorded it and applied it in a cycle"
    return f"maintenance {switch} for {host}: the running service {done}: " + json.dumps(
        answer, sort_keys=True
    )


def _maintenance(args) -> int:
    """``node-agent maintenance on|off|status``. ``on``/``off`` ask the
    running service over its control channel when one answers (it records
    the wish in its state file and applies it in a cycle at once); else they
    record it in the state file and the next cycle (the service's, or
    ``--once``) applies it to Placement, so the agent stays the one writer of
    its tree. ``status`` compares the state file with Placement.
    ``--provider NAME``: one child provider only
    (:mod:`node_agent.policy.device_maintenance`)."""

    provider = getattr(args, "provider", None) or None
    try:
        valid = validate(config_args(oslo_args(args)), read_host=False, need_upstream=False)
        conf, settings = valid.conf, valid.settings
        if args.switch == "status":
            return _maintenance_status(conf, settings, args.output)
        if settings.cycle_mode is CycleMode.COMPANION:
            raise ConfigError(
                f"maintenance {args.switch}: [agent] mode = companion never writes this "
                "host's provider, so node-agent has no maintenance to switch. Disable "
                "the compute service instead (`openstack compute service set --disable "
                f"{settings.host} nova-compute`), which sets COMPUTE_STATUS_DISABLED."
            )
        answer = _maintenance_via_service(
            conf, settings, args.switch == "on", args.reason, provider
        )
        if answer is not None and "error" in answer:
            print(f"node-agent: error: {answer['error']}", file=sys.stderr)
            return int(answer.get("exit_code", 1))
        if answer is not None:
            print(service_maintenance_line(args.switch, provider or settings.host, answer))
            return 0
        store = _state_store(settings)
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        record = maint.record(args.switch == "on", args.reason, now)
        if provider is None:
            store.put(MAINTENANCE, record)
        else:
            # The children this host publishes, as the next cycle builds them.
            desired = compute_desired(settings, state=store.load_or_empty(LOG))
            devmaint.check_name(desired.tree, provider)

            def put(state: dict) -> None:
                state[DEVICE_MAINTENANCE] = {
                    **(state.get(DEVICE_MAINTENANCE) or {}),
                    provider: record,
                }

            store.update(put)
    except (NodeAgentError, OSError) as exc:
        print(f"node-agent: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 1)
    if provider is not None:
        what = (
            f"its inventories get reserved = total and it gets {maint.TRAIT}"
            if args.switch == "on"
            else f"its configured reservations come back and {maint.TRAIT} is removed from it"
        )
    elif args.switch == "on":
        what = f"every inventory gets reserved = total and the root {maint.TRAIT}"
    else:
        what = f"the configured reservations come back and {maint.TRAIT} is removed"
    print(
        f"maintenance {args.switch} for {provider or settings.host}: {what} at the next cycle "
        "(run `node-agent --once` to apply it now)"
    )
    return 0


# How long `maintenance on|off` waits for a running service to answer before
# it writes the state file itself; a service answers in milliseconds.
SERVICE_PROBE_TIMEOUT = 5.0
SERVICE_CYCLE_TIMEOUT = 150.0


def _service_status(conf, settings) -> tuple[Optional[dict], Optional[str]]:
    """The running service's ``get_status`` over its control channel
    (``[DEFAULT] transport_url``), asked with a short timeout: (answer,
    None), or (None, why none answered); (None, None) without a channel."""
    from node_agent.remote import messaging

    if not messaging.urls(conf)[0]:
        return None, None
    om = messaging.oslo_messaging()
    try:
        messaging.check_broker(conf, timeout=SERVICE_PROBE_TIMEOUT)
        answer = messaging.client(conf, settings.host, timeout=SERVICE_PROBE_TIMEOUT).call(
            {}, "get_status"
        )
    except (messaging.MessagingUnavailable, om.MessagingTimeout) as exc:
        return None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return answer, None


def _maintenance_via_service(
    conf, settings, on: bool, reason: str, provider: Optional[str] = None
) -> Optional[dict]:
    """Ask the running service to set maintenance and apply it: the service
    writes its own state file, as its own user. None when no service
    answers (no transport, no broker, or no agent of this host on it): the
    caller then writes the file."""
    from node_agent.remote import messaging

    answer, why = _service_status(conf, settings)
    if answer is None:
        if why:
            LOG.info(
                "no running service answered for %s (%s); writing the state file",
                settings.host,
                why,
            )
        return None
    extra = {"provider": provider} if provider else {}
    return messaging.client(conf, settings.host, timeout=SERVICE_CYCLE_TIMEOUT).call(
        {}, "set_maintenance", on=on, reason=reason or None, **extra
    )


def _maintenance_status(conf, settings, output: str) -> int:
    store = _state_store(settings)
    state, error = {}, None
    try:
        state = store.load()
    except (StateCorrupt, OSError) as exc:
        error = str(exc)
    configured = placement_configured(conf)
    seen = _root_in_placement(conf, settings, state) if configured else None
    service = None if configured else _service_maintenance(conf, settings)
    report = maint.status(
        settings.host, str(store.path), state.get(MAINTENANCE), error, seen, service
    )
    report["devices"] = devmaint.placement_status(
        state.get(DEVICE_MAINTENANCE), report["placement"]["children"] if seen else None
    )
    if output == "json":
        print(render.as_json(report))
    else:
        print(
            maint.status_text(report)
            + "".join(f"{line}\n" for line in devmaint.status_lines(report["devices"])),
            end="",
        )
    return 0


def _service_maintenance(conf, settings) -> Optional[dict]:
    """Without Placement here (``upstream = messaging``), the running
    service's say: it hears from the applier what was applied. None
    without a control channel; ``{"error": ...}`` when no service answered."""
    answer, why = _service_status(conf, settings)
    if answer is None:
        return {"error": why} if why else None
    return dict(answer.get("maintenance") or {})


def _root_in_placement(conf, settings, state) -> dict:
    """The root's traits and inventories, found by the state file's uuid or
    else by the host's name (the state file may be gone), and every other
    provider of its tree: its inventories and whether it is the agent's
    (it carries the agent's child mark, or the state file lists it)."""
    from node_agent.placement.client import PlacementClient
    from node_agent.policy.child_owner import AGENT_CHILD_TRAIT

    client = PlacementClient.from_conf(conf)
    client.check_version()
    candidates = [state[ROOT_UUID]] if state.get(ROOT_UUID) else []
    found = client.providers_named(settings.host)
    candidates += [rp["uuid"] for rp in found]
    for uuid in candidates:
        try:
            traits = client.traits(uuid)["traits"]
            inventories = client.inventories(uuid)["inventories"]
            listed = client.providers_in_tree(uuid)
        except NotFound:
            continue
        reported = set((state.get(PROVIDERS) or {}).values())
        children = []
        for rp in sorted(listed, key=lambda rp: rp["name"]):
            if rp["uuid"] == uuid:
                continue
            try:
                child_traits = client.traits(rp["uuid"])["traits"]
                marked = AGENT_CHILD_TRAIT in child_traits
                held = client.inventories(rp["uuid"])["inventories"]
            except NotFound:
                continue  # deleted since the listing
            children.append(
                {
                    "name": rp["name"],
                    "uuid": rp["uuid"],
                    "agent": marked or rp["uuid"] in reported,
                    "inventories": held,
                    "traits": sorted(child_traits),
                }
            )
        return {
            "root_uuid": uuid,
            "traits": traits,
            "inventories": inventories,
            "children": children,
        }
    return {"root_uuid": None, "traits": [], "inventories": {}, "children": []}


# systemd/node-agent.service: RestartPreventExitStatus=78.
RESTART_AFTER_FIX = (
    "node-agent: systemd does not restart the service after a configuration "
    "error (exit 78): fix the file, check it with --check-config, then run "
    "`systemctl restart node-agent`."
)


def _a_systemd_service(args) -> bool:
    """The service (not a one-shot command) started by systemd, which sets
    INVOCATION_ID for each run of a unit."""
    one_shot = args.once or args.dry_run or args.check_config or args.command
    return not one_shot and bool(os.environ.get("INVOCATION_ID"))


def _error_text(exc: NodeAgentError) -> str:
    problems = getattr(exc, "problems", None) or (str(exc),)
    if len(problems) == 1:
        return f"node-agent: error: {problems[0]}"
    lines = [f"node-agent: error: {len(problems)} problems in the configuration:"]
    return "\n".join(lines + [f"  - {p}" for p in problems])


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)  # exits 2 on bad arguments
    if args.command in ("ctl", "maintenance", "decommission"):
        if args.debug:
            _setup_logging(True, reporting=True)
        if args.command == "ctl":
            from node_agent.cli import ctl

            return ctl.run(args)
        if args.command == "decommission":
            from node_agent.cli import decommission

            return decommission.run(args)
        return _maintenance(args)
    _setup_logging(
        args.debug, reporting=bool(args.once or args.dry_run or args.check_config or args.command)
    )
    try:
        files = config_args(oslo_args(args))
        if args.check_config:
            valid = validate(files)
            log_ignored(valid.conf)  # logging stays on stderr here
            code = _check_config(valid, args.output)
            return _connect(valid) if args.connect else code
        if args.command == "audit":
            valid = validate(files, read_host=False, need_upstream=False)
            _setup_logging_from(valid.conf, args.debug, reporting=True)
            return _audit(valid.conf, valid.settings, args.output)
        if args.once or args.dry_run:
            valid = validate(files, read_host=False, need_upstream=not args.dry_run)
            _setup_logging_from(valid.conf, args.debug, reporting=True)
            return _run_once(valid.conf, valid.settings, args.dry_run, args.output, valid.client)
        from node_agent.service import daemon

        early = _setup_logging_before_the_host_is_read(files, args.debug)
        loaded = daemon.load(files)
        if not early:
            _setup_logging_from(loaded.conf, args.debug, reporting=False)
        return daemon.run(files, loaded)
    except NodeAgentError as exc:
        print(_error_text(exc), file=sys.stderr)
        if isinstance(exc, ConfigError) and _a_systemd_service(args):
            print(RESTART_AFTER_FIX, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
