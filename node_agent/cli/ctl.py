"""``node-agent ctl``: the operator's client of the agent's control RPC.

    node-agent ctl --host H status
    node-agent ctl --host H sync-now
    node-agent ctl --host H maintenance on --reason "disk swap"
    node-agent ctl --host H maintenance off

The bus comes from the config files (``[DEFAULT] transport_url``) or
``--transport-url``. Answers are printed as JSON. Exit codes: 0 answered;
78 no transport configured; 75 the agent did not answer in time.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from node_agent.remote import messaging
from node_agent.config.files import load_conf, oslo_args
from node_agent.errors import ConfigError

EX_TEMPFAIL = 75


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="node-agent ctl",
                                     description="Talk to the node-agent of one host.")
    parser.add_argument("--host", required=True, help="the agent's [DEFAULT] host")
    parser.add_argument("--config-file", action="append", default=[], metavar="FILE")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR")
    parser.add_argument("--transport-url", help="overrides [DEFAULT] transport_url")
    parser.add_argument("--timeout", type=float, default=150,
                        help="seconds to wait for the answer (sync-now waits for a "
                             "whole cycle)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="tree summary, last sync, maintenance, warnings")
    sub.add_parser("sync-now", help="run a cycle now and wait for it")
    maint = sub.add_parser("maintenance", help="set or clear the maintenance flag")
    maint.add_argument("state", choices=["on", "off"])
    maint.add_argument("--reason", help="why, shown in status")
    return parser


def call(client, command: str, args) -> dict:
    if command == "status":
        return client.call({}, "get_status")
    if command == "sync-now":
        return client.call({}, "sync_now")
    return client.call({}, "set_maintenance", on=args.state == "on", reason=args.reason)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        conf = load_conf(oslo_args(args))
        messaging.register(conf)
        if args.transport_url:
            conf.set_override("transport_url", args.transport_url)
        client = messaging.client(conf, args.host, timeout=args.timeout)
    except ConfigError as exc:
        print(f"node-agent ctl: error: {exc}", file=sys.stderr)
        return exc.exit_code
    om = messaging.oslo_messaging()
    try:
        answer = call(client, args.command, args)
    except om.MessagingTimeout:
        print(f"node-agent ctl: no answer from the agent on {args.host} within "
              f"{args.timeout:g}s (is it running, with this transport_url?)",
              file=sys.stderr)
        return EX_TEMPFAIL
    print(json.dumps(answer, indent=2, sort_keys=True))
    return 0
