"""``node-agent ctl``: the operator's client of the agent's control RPC.

    node-agent ctl --host H status
    node-agent ctl --host H sync-now
    node-agent ctl --host H maintenance on --reason "disk swap"
    node-agent ctl --host H maintenance off

The bus comes from the config files (``[DEFAULT] transport_url``) or
``--transport-url``; the arguments are parsed in :mod:`node_agent.cli.parser`.
Answers are printed as JSON. Exit codes: 0 answered; the refusal's code
when the agent answered with one (``error``, ``exit_code``: 69 when it
cannot write its state file); 78 no transport configured; 75 the agent did
not answer in time.
"""

from __future__ import annotations

import argparse
import json
import sys

from node_agent.config.files import load_conf, oslo_args
from node_agent.errors import ConfigError
from node_agent.remote import messaging

EX_TEMPFAIL = 75


def call(client, command: str, args: argparse.Namespace) -> dict:
    if command == "status":
        return client.call({}, "get_status")
    if command == "sync-now":
        return client.call({}, "sync_now")
    extra = {"provider": args.provider} if getattr(args, "provider", None) else {}
    return client.call({}, "set_maintenance", on=args.state == "on", reason=args.reason, **extra)


def run(args: argparse.Namespace) -> int:
    """``node-agent ctl``, its arguments parsed by :mod:`node_agent.cli.parser`."""
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
        answer = call(client, args.ctl_command, args)
    except om.MessagingTimeout:
        print(
            f"node-agent ctl: no answer from the agent on {args.host} within "
            f"{args.timeout:g}s (is it running, with this transport_url?)",
            file=sys.stderr,
        )
        return EX_TEMPFAIL
    print(json.dumps(answer, indent=2, sort_keys=True))
    return int(answer.get("exit_code", 1)) if "error" in answer else 0
