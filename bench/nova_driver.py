"""Drive nova's report client the way nova-compute's resource tracker does.

Runs INSIDE ``.venv-nova`` (nova from the package index), never imports
node_agent. It reads one JSON command per line on stdin and answers one
JSON line on stdout, so ``bench/run.py`` can count the Placement requests of
each command from the server's request log, the same way for both agents.

A cycle is what ``ResourceTracker._update_available_resource`` of the
installed nova sends, minus the virt driver and the database:
``_update_to_placement`` (get_provider_subtree_and_ensure_root,
get_allocations_for_provider_tree, the driver's edits of the ProviderTree,
update_from_provider_tree; repeated up to 4 times on a generation conflict,
as the resource tracker's ``retrying`` decorator does), then
``_remove_deleted_instances_allocations``' read of the root's allocations
(every consumer there is a tracked instance, so it deletes nothing). A
reshape cycle is the start-up path where the driver raised ReshapeNeeded:
the allocations read at the top are edited and passed to
update_from_provider_tree, which sends POST /reshaper.

The report client refreshes a provider's inventories, aggregates, traits and
sharing providers when ``[compute] resource_provider_association_refresh``
(300 s) has passed since its last refresh, by ``time.time()``. The bench's
clock is simulated: ``advance`` (seconds, default 60) ages every refresh
stamp by that much before the cycle, so the refresh fires on the cycle where
nova's would.

Commands::

    {"op": "init", "url": "http://127.0.0.1:PORT"}
    {"op": "cycle", "tree": [PROVIDER, ...], "advance": 60}
    {"op": "restart"}                         (a fresh nova-compute: empty cache)
    {"op": "reshape", "tree": [...], "consumers": [uuid, ...],
     "from": "VCPU", "to": "PCPU"}          (start-up: empty cache)
    {"op": "quit"}

PROVIDER: {"name", "uuid", "parent_uuid", "inventories": {rc: record},
"traits": [..]}; the first is the root.
"""

import json
import sys
import time


def _client(url):
    from keystoneauth1 import adapter, session, token_endpoint
    from nova.scheduler.client import report

    auth = token_endpoint.Token(url, "admin")
    # raise_exc=False: nova's own adapter factory does the same; the report
    # client reads status codes itself.
    ksa = adapter.Adapter(
        session.Session(auth=auth), service_type="placement", endpoint_override=url, raise_exc=False
    )
    return report.SchedulerReportClient(adapter=ksa)


def _apply_tree(prov_tree, providers):
    """What a virt driver's update_provider_tree does: ensure the children,
    set every provider's inventory and traits."""
    for provider in providers[1:]:
        if not prov_tree.exists(provider["uuid"]):
            prov_tree.new_child(provider["name"], provider["parent_uuid"], uuid=provider["uuid"])
    for provider in providers:
        prov_tree.update_inventory(provider["uuid"], provider["inventories"])
        prov_tree.update_traits(provider["uuid"], provider["traits"])


def _move(allocs, root_uuid, consumers, from_rc, to_rc):
    """The driver's reshape: from_rc of these consumers becomes to_rc."""
    for consumer in consumers:
        resources = allocs[consumer]["allocations"][root_uuid]["resources"]
        resources[to_rc] = resources.pop(from_rc)


class Driver:
    def __init__(self):
        self.client = None
        self.context = None

    def init(self, cmd):
        from nova import conf, context

        conf.CONF([], project="nova", default_config_files=[])
        self.client = _client(cmd["url"])
        self.context = context.get_admin_context()
        return {}

    def _once(self, providers, reshape):
        root = providers[0]
        prov_tree = self.client.get_provider_subtree_and_ensure_root(
            self.context, root["uuid"], name=root["name"]
        )
        allocs = self.client.get_allocations_for_provider_tree(self.context, root["name"])
        if reshape:
            _move(allocs, root["uuid"], reshape["consumers"], reshape["from"], reshape["to"])
        _apply_tree(prov_tree, providers)
        self.client.update_from_provider_tree(
            self.context, prov_tree, allocations=allocs if reshape else None
        )

    def _advance(self, seconds):
        stamps = self.client._association_refresh_time
        for uuid in stamps:
            stamps[uuid] -= seconds

    def _remove_deleted_instances_allocations(self, root_uuid):
        """The resource tracker's read after _update: nothing to delete."""
        self.client.get_allocations_for_resource_provider(self.context, root_uuid)

    def _with_retries(self, providers, reshape=None):
        from nova import exception

        conflicts = (exception.ResourceProviderUpdateConflict, exception.PlacementReshapeConflict)
        for attempt in range(1, 5):
            try:
                self._once(providers, reshape)
                return {"attempts": attempt}
            except conflicts as exc:
                error = repr(exc)
        return {"attempts": 4, "error": error}

    def _cycle(self, providers, reshape=None):
        reply = self._with_retries(providers, reshape)
        self._remove_deleted_instances_allocations(providers[0]["uuid"])
        return reply

    def cycle(self, cmd):
        self._advance(cmd.get("advance", 60))
        return self._cycle(cmd["tree"])

    def restart(self, cmd):
        self.client.clear_provider_cache()
        return {}

    def reshape(self, cmd):
        # nova reshapes only at service start-up, with an empty cache.
        self.client.clear_provider_cache()
        return self._cycle(cmd["tree"], cmd)


def main():
    import logging

    # The report client logs every 409 it recovers from at ERROR: the bench
    # counts them from Placement's log instead.
    logging.basicConfig(level=logging.CRITICAL, stream=sys.stderr)
    driver = Driver()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        start = time.perf_counter()
        try:
            reply = getattr(driver, cmd["op"])(cmd)
        except Exception as exc:  # noqa: BLE001 - reported, never fatal: benchmarks report
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        reply["seconds"] = time.perf_counter() - start
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
