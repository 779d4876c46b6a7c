"""``node-agent decommission [--dry-run]``: remove this host's providers
from Placement when nothing is allocated on them.

Reads the root (the state file's uuid, else the provider named like the
host), judges its owner as every write does
(:mod:`node_agent.policy.root_owner`), lists the tree with each provider's
allocations, and lets :func:`node_agent.policy.decommission.plan` decide.
Exit codes: 0 removed (or nothing to remove); 1 refused, nothing deleted
(allocations remain, or a provider under the root is not the agent's);
75 Placement; 78 configuration, or the root is another writer's.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Optional

from node_agent.config.files import config_args, oslo_args, placement_configured
from node_agent.errors import ConfigError, NodeAgentError, ProviderOwned
from node_agent.host.machine_id import identity
from node_agent.model.settings import CycleMode
from node_agent.placement.errors import NotFound, PlacementError
from node_agent.policy import root_owner
from node_agent.policy.child_owner import ListedChild
from node_agent.policy.decommission import plan
from node_agent.startup import validate
from node_agent.state import APPLIED, OWNED_CHILDREN, PROVIDERS, ROOT_UUID, StateStore

LOG = logging.getLogger(__name__)
EX_REFUSED = 1
# The syncer's keys of the state file: they describe providers that are gone.
_PROVIDER_KEYS = (ROOT_UUID, PROVIDERS, OWNED_CHILDREN, APPLIED)


def _root(client, host: str, state: dict) -> Optional[dict]:
    if state.get(ROOT_UUID):
        try:
            return client.provider(state[ROOT_UUID])
        except NotFound:
            pass
    found = client.providers_named(host)
    return found[0] if found else None


def _listed(client, root_uuid: str) -> tuple[list[ListedChild], dict]:
    listing = client.providers_in_tree(root_uuid)
    listed, consumers = [], {}
    for rp in listing:
        traits = frozenset(client.traits(rp["uuid"])["traits"])
        listed.append(ListedChild(rp["uuid"], rp["name"], rp.get("parent_provider_uuid"), traits))
        allocations = client.provider_allocations(rp["uuid"])["allocations"]
        consumers[rp["uuid"]] = {c: a["resources"] for c, a in allocations.items()}
    return listed, consumers


def _decommission(conf, settings, dry_run: bool, output: str) -> int:
    # keystoneauth1 and requests: `node-agent` imports this module on every run.
    from node_agent.placement.client import PlacementClient

    if settings.cycle_mode is CycleMode.COMPANION:
        raise ConfigError(
            "decommission: [agent] mode = companion never writes this host's "
            "providers; nova-compute owns them. Delete the compute service "
            f"(`openstack compute service delete` for {settings.host}) instead."
        )
    if not placement_configured(conf):
        raise ConfigError(
            "node-agent decommission removes providers from Placement, and "
            "none is configured: set [placement] auth_type (or "
            "endpoint_override) with credentials that may delete providers."
        )
    owner = identity(settings)
    client = PlacementClient.from_conf(conf)
    client.check_version()
    store = StateStore(Path(settings.state_path))
    state = store.load_or_empty(LOG)
    host = settings.host
    root = _root(client, host, state)
    if root is None:
        _print(
            output,
            {"host": host, "root": None, "deleted": [], "refused": []},
            f"{host} has no provider in Placement at {client.endpoint}: nothing to remove.",
        )
        return 0
    if root.get("parent_provider_uuid"):
        raise ProviderOwned(
            f"provider {host} ({root['uuid']}) is a child in another tree "
            f"(root {root.get('root_provider_uuid')}), not this host's root; "
            "nothing was removed."
        )
    traits = client.traits(root["uuid"])["traits"]
    verdict = root_owner.judge(traits, owner)
    if not verdict.may_write:
        raise ProviderOwned(root_owner.refusal(verdict, host, root["uuid"]))
    listed, consumers = _listed(client, root["uuid"])
    owned = set(state.get(OWNED_CHILDREN, [])) | set(state.get(PROVIDERS, {}).values())
    decision = plan(host, root["uuid"], listed, consumers, owned)
    record = {
        "host": host,
        "root": root["uuid"],
        "dry_run": dry_run,
        "deletes": [{"uuid": u, "name": n} for u, n in decision.deletes],
        "refused": list(decision.blocking),
        "deleted": [],
    }
    if not decision.ok:
        _print(
            output,
            record,
            "\n".join(
                [f"node-agent: decommission of {host} refused, nothing was removed:"]
                + [f"  - {why}" for why in decision.blocking]
            ),
            stream=sys.stderr,
        )
        return EX_REFUSED
    if dry_run:
        _print(
            output,
            record,
            "\n".join(
                [f"Would remove {len(decision.deletes)} provider(s) of {host}, in order:"]
                + [f"  delete provider {n} ({u})" for u, n in decision.deletes]
            ),
        )
        return 0
    for uuid, name in decision.deletes:
        try:
            client.delete_provider(uuid)
        except NotFound:
            pass
        except PlacementError as exc:
            if getattr(exc, "status", None) != 409:
                raise
            record["refused"].append(f"cannot delete provider {name}: {exc}")
            _print(
                output,
                record,
                "\n".join(
                    [
                        f"node-agent: decommission of {host} stopped: provider {name} ({uuid}) "
                        f"could not be deleted ({exc}); something was allocated or created on "
                        "it meanwhile. Removed so far: "
                        + (", ".join(d["name"] for d in record["deleted"]) or "nothing")
                        + ". Run it again once that is gone."
                    ]
                ),
                stream=sys.stderr,
            )
            return EX_REFUSED
        record["deleted"].append({"uuid": uuid, "name": name})

    def forget_providers(saved: dict) -> None:
        for key in _PROVIDER_KEYS:
            saved.pop(key, None)

    store.update(forget_providers)
    _print(
        output,
        record,
        "\n".join(
            [f"Removed {len(record['deleted'])} provider(s) of {host}:"]
            + [f"  deleted provider {d['name']} ({d['uuid']})" for d in record["deleted"]]
            + [
                "Stop and disable the node-agent service on this host, or it creates them "
                "again at its next cycle."
            ]
        ),
    )
    return 0


def _print(output: str, record: dict, text: str, stream=None) -> None:
    if output == "json":
        print(json.dumps(record, indent=2, sort_keys=True))
    else:
        print(text, file=stream or sys.stdout)


def run(args: argparse.Namespace) -> int:
    """``node-agent decommission``, its arguments parsed by
    :mod:`node_agent.cli.parser`."""
    try:
        valid = validate(config_args(oslo_args(args)), read_host=False, need_upstream=False)
        return _decommission(valid.conf, valid.settings, args.dry_run, args.output)
    except NodeAgentError as exc:
        print(f"node-agent: error: {exc}", file=sys.stderr)
        return exc.exit_code
