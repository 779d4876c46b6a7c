"""nova 34's scheduler, conductor and compute code, for the scenario tests of
tests/integration/test_nova_scheduler.py. Runs under ``.venv-nova``'s Python,
never under the agent's: it imports nova and the standard library only,
never ``node_agent`` or ``tests``.

Protocol (the one of tests/conformance/nova_side.py): one JSON object per
line on stdin, ``{"op": NAME, "args": {...}}``; one per line on stdout,
``{"ok": RESULT}`` or ``{"error": "Type: message"}``. End it by closing stdin.

What is nova's own code here, called as nova calls it:

* scheduling (``select``): a ``RequestSpec`` built from a ``Flavor`` and an
  ``ImageMeta``, the request filters that need no database
  (``nova.scheduler.request_filter``), ``utils.resources_from_request_spec``
  (``ResourceRequest.from_request_spec``), the report client's
  ``get_allocation_candidates``, and for a pinned flavor with
  ``[workarounds] disable_fallback_pcpu_query = False`` the second query
  with ``enable_pinning_translate=False`` merged into the first, exactly as
  ``SchedulerManager.select_destinations`` does. Choosing among the
  candidates (filters and weighers, which need the host manager's database)
  is the caller's: it names the hosts it accepts, the way a resize excludes
  its source, and asks ``fits`` (the NUMATopologyFilter's
  ``numa_fit_instance_to_host`` on the scheduler's view of the host), which
  is what turns away a pinned flavor's fallback VCPU candidate on a host
  whose dedicated CPUs are all pinned.
* claims and moves: ``scheduler.utils.claim_resources`` (``PUT
  /allocations`` through ``SchedulerReportClient.claim_resources``),
  ``SchedulerReportClient.move_allocations`` (a resize's instance ->
  migration on the source, and back on revert) and
  ``delete_allocation_for_instance`` (confirm).
* the compute's claim of a guest's CPUs: the host's NUMA topology is
  ``LibvirtDriver._get_host_numa_topology`` on the libvirt capabilities the
  caller built from the host's sysfs tree, with ``[compute]
  cpu_dedicated_set``/``cpu_shared_set`` as the host's config has them; its
  usage is ``hardware.numa_usage_from_instance_numa`` of the guests the
  host runs, and the new guest's pinning ``hardware.numa_fit_instance_to_host``
  (what ``ResourceTracker.instance_claim`` runs). When nova's fit fails, the
  host has no CPUs left for a guest Placement let the scheduler claim.
* the guest's domain XML: ``LibvirtDriver._get_guest_config_meta`` (the
  ``<nova:instance>`` metadata with flavor, extra specs, image properties
  and owner) and ``LibvirtDriver._get_guest_numa_config`` (``<vcpu
  cpuset>``, ``<cputune>`` with a ``<vcpupin>`` per vCPU of a NUMA guest,
  ``<numatune>``, the guest CPU's NUMA cells) put into a
  ``LibvirtConfigGuest`` formatted by nova. The rest of
  ``_get_guest_config`` (disks, devices, features, the CPU model) is not
  run: it needs a hypervisor, and the agent reads none of it. The domain's
  type is set to ``test`` and a ``<test:runstate>`` added, so libvirt's
  test driver loads it.

The owner_nova_filter is not run: nova 34 adds ``root_required=OWNER_NOVA``
only once every compute reports a high enough service version, and the
agent's roots do not carry OWNER_NOVA (the agent marks its own owner), so a
deployment of agent hosts runs with it inactive.
"""

import json
import logging
import sys
import traceback
import warnings
from typing import ClassVar

warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)

import nova.conf  # noqa: E402  (after the warning filters)
from nova import context as nova_context  # noqa: E402
from nova import objects  # noqa: E402

objects.register_all()

from nova.network import model as network_model  # noqa: E402
from nova.scheduler import request_filter  # noqa: E402
from nova.scheduler import utils as scheduler_utils  # noqa: E402
from nova.scheduler.client import report  # noqa: E402
from nova.virt import driver as virt_driver  # noqa: E402
from nova.virt import hardware  # noqa: E402
from nova.virt.libvirt import config as vconfig  # noqa: E402
from nova.virt.libvirt import driver as libvirt_driver  # noqa: E402

CONF = nova.conf.CONF
CONF([], project="nova", default_config_files=[])
# [neutron_tunnel] and the per-physnet groups, as nova-compute's start-up does.
nova.conf.neutron.register_dynamic_opts(CONF)
# The scheduler's fallback query for hosts still reporting pinned CPUs as
# VCPU (nova.conf.workarounds; the default, spelled out).
CONF.set_override("disable_fallback_pcpu_query", False, group="workarounds")

# The request filters that change the query without a database: every
# ALL_REQUEST_FILTERS entry but those reading aggregates, services or
# ports (their config switches are off by default anyway: tenant and AZ
# aggregates, image type support, isolate aggregates, routed networks,
# remote-managed ports) and owner_nova_filter (see the module docstring).
FILTERS = (
    request_filter.compute_status_filter,
    request_filter.transform_image_metadata,
    request_filter.accelerators_filter,
    request_filter.packed_virtqueue_filter,
    request_filter.ephemeral_encryption_filter,
    request_filter.virtio_sound_filter,
    request_filter.tpm_secret_security_filter,
)

TEST_NS = "http://libvirt.org/schemas/domain/test/1.0"


class _State:
    client = None
    context = None
    # host name -> {"caps": xml, "options": {...}, "guests": {uuid: topology primitive}}
    hosts: ClassVar[dict] = {}


def _flavor(spec):
    return objects.Flavor(
        name=spec["name"],
        flavorid=spec["name"],
        memory_mb=spec["memory_mb"],
        vcpus=spec["vcpus"],
        root_gb=spec.get("root_gb", 0),
        ephemeral_gb=spec.get("ephemeral_gb", 0),
        swap=spec.get("swap", 0),
        extra_specs=dict(spec.get("extra_specs", {})),
    )


def _image(props):
    return objects.ImageMeta.from_dict(
        {
            "id": "c0ffee00-0000-4000-8000-000000000001",
            "name": "cirros",
            "disk_format": "qcow2",
            "container_format": "bare",
            "properties": dict(props or {}),
        }
    )


def _request_spec(args):
    flavor = _flavor(args["flavor"])
    spec = objects.RequestSpec(
        flavor=flavor,
        image=_image(args.get("image_properties")),
        project_id=args["project_id"],
        user_id=args["user_id"],
        num_instances=1,
        is_bfv=False,
        instance_uuid=args["instance"],
        requested_resources=[],
        request_level_params=objects.RequestLevelParams(),
        scheduler_hints={},
        force_hosts=[],
        force_nodes=[],
        ignore_hosts=[],
        pci_requests=objects.InstancePCIRequests(requests=[]),
    )
    spec.numa_topology = hardware.numa_get_constraints(flavor, spec.image)
    return spec


def init(args):
    from keystoneauth1 import adapter, session, token_endpoint

    auth = token_endpoint.Token(args["url"], "admin")
    ksa = adapter.Adapter(
        session.Session(auth=auth),
        service_type="placement",
        endpoint_override=args["url"],
        raise_exc=False,
    )
    _State.client = report.SchedulerReportClient(adapter=ksa)
    _State.context = nova_context.get_admin_context()
    _State.hosts = {}
    return {}


def select(args):
    """``select_destinations``' queries: the allocation requests of both
    queries merged, and each query string (what Placement was asked)."""
    ctx, client = _State.context, _State.client
    spec = _request_spec(args)
    for flt in FILTERS:
        flt(ctx, spec)
    resources = scheduler_utils.resources_from_request_spec(
        ctx, spec, None, enable_pinning_translate=True
    )
    queries = [resources.to_querystring()]
    alloc_reqs, summaries, version = client.get_allocation_candidates(ctx, resources)
    alloc_reqs, summaries = alloc_reqs or [], summaries or {}
    first = len(alloc_reqs)
    if resources.cpu_pinning_requested and not CONF.workarounds.disable_fallback_pcpu_query:
        resources = scheduler_utils.resources_from_request_spec(
            ctx, spec, None, enable_pinning_translate=False
        )
        queries.append(resources.to_querystring())
        res = client.get_allocation_candidates(ctx, resources)
        if res and res[0] is not None:
            alloc_reqs.extend(res[0])
            summaries.update(res[1])
    return {
        "allocation_requests": alloc_reqs,
        "from_first_query": first,
        "version": version,
        "queries": queries,
    }


def claim(args):
    """``scheduler.utils.claim_resources`` for a new instance consumer."""
    spec = _request_spec(args)
    return scheduler_utils.claim_resources(
        _State.context,
        _State.client,
        spec,
        args["instance"],
        args["allocation_request"],
        args["version"],
    )


def move(args):
    """``move_allocations``: True, or False / the exception's name."""
    try:
        return _State.client.move_allocations(_State.context, args["source"], args["target"])
    except Exception as exc:  # nova raising is an answer here
        return f"{type(exc).__name__}: {exc}"


def delete(args):
    return _State.client.delete_allocation_for_instance(
        _State.context, args["consumer"], consumer_type=args.get("type", "instance"), force=True
    )


# ------------------------------------------------------------------ compute


class _Host:
    """What the libvirt driver asks of ``self._host``."""

    def __init__(self, caps_xml, online):
        caps = vconfig.LibvirtConfigCaps()
        caps.parse_str(caps_xml)
        self._caps, self._online = caps, set(online)

    def get_capabilities(self):
        return self._caps

    def has_min_version(self, *args, **kwargs):
        return True

    def get_online_cpus(self):
        return set(self._online)

    def get_available_cpus(self):
        return set(self._online)


class _Driver(libvirt_driver.LibvirtDriver):
    """nova's LibvirtDriver without its __init__ (no hypervisor to open):
    every method used is nova's, on the host given."""

    def __init__(self, host):  # (nova's __init__ connects)
        self._host = host
        self._reserved_hugepages = {}


_OPTIONS = {
    "cpu_dedicated_set": "compute",
    "cpu_shared_set": "compute",
    "vcpu_pin_set": None,
    "cpu_allocation_ratio": None,
}


def _configure(options):
    for name, group in _OPTIONS.items():
        CONF.clear_override(name, group=group)
    for name, value in (options or {}).items():
        if value is not None:
            CONF.set_override(name, value, group=_OPTIONS[name])


def _host_topology(name):
    host = _State.hosts[name]
    _configure(host["options"])
    drv = _Driver(_Host(host["caps"], host["online"]))
    topology = drv._get_host_numa_topology()
    for primitive in host["guests"].values():
        guest = objects.InstanceNUMATopology.obj_from_primitive(primitive)
        topology = hardware.numa_usage_from_instance_numa(topology, guest)
    return drv, topology


def host_config(args):
    """A host's libvirt capabilities and its CPU options (nova.conf of the
    compute); guests it runs are kept."""
    old = _State.hosts.get(args["host"], {})
    _State.hosts[args["host"]] = {
        "caps": args["caps"],
        "online": args["online"],
        "options": args.get("options") or {},
        "guests": old.get("guests", {}),
    }
    return {}


def _limits(name):
    options = _State.hosts[name]["options"]
    return objects.NUMATopologyLimits(
        cpu_allocation_ratio=options.get("cpu_allocation_ratio") or 4.0, ram_allocation_ratio=1.0
    )


def fits(args):
    """The NUMATopologyFilter's verdict on one host: the scheduler's copy of
    the host's topology (with the pins of the guests it runs) and
    ``numa_fit_instance_to_host``, what ``NUMATopologyFilter.host_passes``
    asks. A flavor with no NUMA topology always passes."""
    wanted = hardware.numa_get_constraints(
        _flavor(args["flavor"]), _image(args.get("image_properties"))
    )
    if wanted is None:
        return True
    _drv, topology = _host_topology(args["host"])
    if topology is None:
        return True
    return (
        hardware.numa_fit_instance_to_host(topology, wanted, None, limits=_limits(args["host"]))
        is not None
    )


def spawn(args):
    """The compute's claim and the domain nova defines. Returns
    ``{"xml": ..., "pins": {vcpu: host cpu}}`` or ``{"refused": ...}`` when
    nova's NUMA fit finds no room (the claim would fail on the host)."""
    name = args["host"]
    flavor, image = _flavor(args["flavor"]), _image(args.get("image_properties"))
    wanted = hardware.numa_get_constraints(flavor, image)
    drv, topology = _host_topology(name)
    fitted = None
    if wanted is not None:
        fitted = hardware.numa_fit_instance_to_host(topology, wanted, None, limits=_limits(name))
        if fitted is None:
            return {
                "refused": f"numa_fit_instance_to_host: no room on {name} for "
                f"{flavor.name} ({flavor.vcpus} vCPUs)"
            }
        _State.hosts[name]["guests"][args["instance"]] = fitted.obj_to_primitive()
    numa = drv._get_guest_numa_config(fitted, flavor, image)
    guest = vconfig.LibvirtConfigGuest()
    guest.virt_type = "kvm"
    guest.name = args["name"]
    guest.uuid = args["instance"]
    guest.memory = flavor.memory_mb * 1024
    guest.vcpus = flavor.vcpus
    guest.os_type = "hvm"
    guest.iothreads = drv._get_guest_iothread()  # as _get_guest_config sets it
    guest.cpuset = numa.cpuset
    guest.cputune = numa.cputune
    guest.numatune = numa.numatune
    if numa.numaconfig is not None:
        guest.cpu = vconfig.LibvirtConfigGuestCPU()
        guest.cpu.numa = numa.numaconfig
    owner = args["owner"]
    dmeta = virt_driver.InstanceDriverMetadata(
        root_type="image",
        root_id=image.id,
        instance_meta=virt_driver.NovaInstanceMeta(
            name=args["display_name"], uuid=args["instance"]
        ),
        owner=virt_driver.OwnerMeta(
            userid=owner["user_id"],
            username="demo",
            projectid=owner["project_id"],
            projectname="demo",
        ),
        image=virt_driver.ImageMeta(
            id=image.id,
            name=image.name,
            container_format="bare",
            disk_format="qcow2",
            min_disk=0,
            min_ram=0,
            properties=dict(args.get("image_properties") or {}),
        ),
        flavor=virt_driver.FlavorMeta(
            name=flavor.name,
            flavorid=flavor.flavorid,
            memory_mb=flavor.memory_mb,
            vcpus=flavor.vcpus,
            root_gb=flavor.root_gb,
            ephemeral_gb=flavor.ephemeral_gb,
            extra_specs=dict(flavor.extra_specs),
            swap=flavor.swap,
        ),
        network_info=network_model.NetworkInfo([]),
    )
    guest.metadata.append(drv._get_guest_config_meta(dmeta))
    xml = guest.to_xml()
    # libvirt's test driver loads test domains only.
    xml = xml.replace('<domain type="kvm">', f'<domain type="test" xmlns:test="{TEST_NS}">', 1)
    runstate = args.get("runstate", 1)
    xml = xml.replace("</domain>", f"<test:runstate>{runstate}</test:runstate></domain>")
    pins = {}
    if numa.cputune is not None:
        for pin in numa.cputune.vcpupin:
            pins[pin.id] = sorted(pin.cpuset)
    return {"xml": xml, "pins": pins}


def destroy(args):
    """The guest leaves the host (confirm on the source, revert on the
    destination, delete): its CPUs are free for nova's next fit."""
    _State.hosts[args["host"]]["guests"].pop(args["instance"], None)
    return {}


OPS = {
    f.__name__: f for f in (init, select, claim, move, delete, host_config, fits, spawn, destroy)
}


def main():
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = {"ok": OPS[request["op"]](request.get("args", {}))}
        except Exception as exc:  # reported to the caller, the process lives on
            answer = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
