"""``node-agent``: the command line. A table of contents of what the agent does.

    node-agent --once --dry-run [--output json]   show what would be reported
    node-agent --once                             one sync, then exit
    node-agent --check-config                     validate and show the CPU split
    node-agent                                    run as a service

Exit codes: 0 success; 78 bad configuration; 69 the host could not be read;
75 Placement refused or was unreachable; 1 Placement does not match the host
after a sync.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Optional, Sequence

from node_agent import render
from node_agent.configfile import load_conf, oslo_args
from node_agent.cycle import APPLIED_KEY, MAINTENANCE_KEY, compute_desired
from node_agent.errors import NodeAgentError
from node_agent.partition import node_split
from node_agent.settings import load_settings

LOG = logging.getLogger("node_agent")
EX_NOT_IN_SYNC = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="node-agent",
        description="Report this compute node's resources to OpenStack Placement.",
        epilog="Config files: --config-file FILE (repeatable) or --config-dir DIR; "
               "default /etc/node-agent/node-agent.conf.")
    parser.add_argument("--config-file", action="append", default=[], metavar="FILE",
                        help="config file; repeat to layer several (later ones win)")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                        help="directory of *.conf files, read after --config-file")
    parser.add_argument("--once", action="store_true", help="run one cycle and exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="write nothing anywhere; print the tree and the planned requests")
    parser.add_argument("--output", choices=["text", "json"], default="text",
                        help="output format of --dry-run and --check-config")
    parser.add_argument("--check-config", action="store_true",
                        help="validate the configuration against this host and print "
                             "the CPU partition per NUMA node")
    parser.add_argument("--debug", action="store_true", help="log at DEBUG level")
    return parser


def _setup_logging(debug: bool, reporting: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr)
    if not debug:
        logging.getLogger("oslo_service").setLevel(logging.WARNING)
        if reporting:
            # --once, --dry-run and --check-config print the host's warnings
            # in their report; stderr keeps what goes wrong.
            logging.getLogger("node_agent.discover").setLevel(logging.ERROR)


def _placement_configured(conf) -> bool:
    group = conf.placement
    return bool(group.auth_type or group.endpoint_override)


def _check_config(settings, output: str) -> int:
    desired = compute_desired(settings)
    split = node_split(desired.partition, desired.host)
    if output == "json":
        print(json.dumps({"nodes": split, "warnings": list(desired.warnings)},
                         indent=2, sort_keys=True))
        return 0
    print("Configuration is valid for this host. CPU partition of online CPUs:")
    for row in split:
        where = "host" if row["node"] is None else f"NUMA node {row['node']}"
        print(f"  {where}: dedicated [{row['dedicated']}]  shared [{row['shared']}]  "
              f"unused [{row['unused']}]")
    for warning in desired.warnings:
        print(f"warning: {warning}")
    return 0


def _syncer(conf, settings):
    from pathlib import Path

    from node_agent.placement import PlacementClient
    from node_agent.state import StateStore
    from node_agent.sync import TreeSyncer

    client = PlacementClient.from_conf(conf)
    client.check_version()
    return TreeSyncer(client, StateStore(Path(settings.state_path)),
                      full_verify_interval=settings.full_verify_interval)


def _state_store(settings):
    from pathlib import Path

    from node_agent.state import StateStore
    return StateStore(Path(settings.state_path))


def _run_once(conf, settings, dry_run: bool, output: str) -> int:
    from node_agent.reconcile import Reconciler

    desired = compute_desired(settings, state=_state_store(settings).load_or_empty(LOG))
    changes = reshape = None
    tree = desired.tree
    code = 0
    if settings.upstream == "messaging":
        # --dry-run shows the tree only: it must work without the bus, and
        # the applier, not this host, is the one that reads Placement.
        if not dry_run:
            tree, changes, reshape, code = _send_once(conf, settings, desired)
    elif _placement_configured(conf):
        syncer = _syncer(conf, settings)
        reconciler = Reconciler(syncer.client, syncer)
        if dry_run:
            tree, changes, reshape = reconciler.plan(desired)
        else:
            outcome = reconciler.apply(desired)
            tree = outcome.report.tree or tree
            changes = outcome.report.applied
            reshape = _reshape_record(outcome.reshape)
            for error in outcome.errors:
                print(f"node-agent: {error}", file=sys.stderr)
            if outcome.ok:
                syncer.remember(APPLIED_KEY, desired.applied)
            else:
                code = EX_NOT_IN_SYNC
    elif not dry_run:
        raise NodeAgentError("no Placement is configured ([placement] auth_type); "
                             "use --dry-run to only show the tree")
    report = render.report_dict(tree, desired.warnings, changes, reshape)
    print(render.as_json(report) if output == "json" else render.as_text(report), end="")
    return code


def _send_once(conf, settings, desired):
    """``--once`` with ``[agent] upstream = messaging``: one call to
    node-agent-applier. Returns (tree, changes, reshape, exit code)."""
    from node_agent import upstream

    sender = upstream.MessagingUpstream(conf, settings.host, settings.upstream_topic,
                                        settings.upstream_timeout)
    try:
        report = sender.send(desired)
    finally:
        sender.close()
    upstream.remember(_state_store(settings), report, desired)
    for error in report.errors:
        print(f"node-agent: {error}", file=sys.stderr)
    return (desired.tree.with_uuids(report.uuids), report.applied, report.reshape,
            0 if report.ok else EX_NOT_IN_SYNC)


def _reshape_record(outcome) -> Optional[dict]:
    """The ``reshape`` key after a real run: what was moved, or why not."""
    if outcome is None:
        return None
    if isinstance(outcome, NodeAgentError):
        return {"refused": [str(outcome)], "lines": [f"REFUSED: {outcome}"]}
    if not outcome.reshaped:
        return None
    record = outcome.reshape.as_dict()
    record["request_id"] = outcome.request_id
    return record


def _maintenance(argv: list[str]) -> int:
    """``node-agent maintenance on|off [--reason TEXT]``: a flag in the state
    file; the next cycle reserves every inventory (on) or releases it (off)."""
    import datetime

    parser = argparse.ArgumentParser(prog="node-agent maintenance")
    parser.add_argument("switch", choices=["on", "off"])
    parser.add_argument("--reason", default="")
    parser.add_argument("--config-file", action="append", default=[], metavar="FILE")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(load_conf(oslo_args(args)))
        store = _state_store(settings)
        state = store.load_or_empty(LOG)
        if args.switch == "on":
            state[MAINTENANCE_KEY] = {
                "reason": args.reason,
                "since": datetime.datetime.now(datetime.timezone.utc).isoformat()}
        else:
            state.pop(MAINTENANCE_KEY, None)
        store.save(state)
    except (NodeAgentError, OSError) as exc:
        print(f"node-agent: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 1)
    print(f"maintenance {args.switch} for {settings.host}; it takes effect on the next "
          "cycle (run `node-agent --once` to apply it now)")
    return 0


def _error_text(exc: NodeAgentError) -> str:
    problems = getattr(exc, "problems", None) or (str(exc),)
    if len(problems) == 1:
        return f"node-agent: error: {problems[0]}"
    lines = [f"node-agent: error: {len(problems)} problems in the configuration:"]
    return "\n".join(lines + [f"  - {p}" for p in problems])


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["ctl"]:
        from node_agent import ctl
        return ctl.main(argv[1:])
    if argv[:1] == ["maintenance"]:
        return _maintenance(argv[1:])
    if argv[:1] == ["check-config"]:
        argv = argv[1:] + ["--check-config"]
    args = _parser().parse_args(argv)
    _setup_logging(args.debug, reporting=args.once or args.dry_run or args.check_config)
    try:
        conf = load_conf(oslo_args(args))
        settings = load_settings(conf)
        if args.check_config:
            return _check_config(settings, args.output)
        if args.once or args.dry_run:
            return _run_once(conf, settings, args.dry_run, args.output)
        from node_agent import daemon
        return daemon.run(oslo_args(args))
    except NodeAgentError as exc:
        print(_error_text(exc), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
