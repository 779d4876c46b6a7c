"""How nova counts a guest's CPUs: its policy, and the VCPU and PCPU it holds. Pure.

nova decides a guest's CPU policy from the flavor's extra specs and the
image's properties (``nova.virt.hardware.get_cpu_policy_constraint``), and
its scheduler turns that into the classes it claims
(``nova.scheduler.utils.ResourceRequest._translate_pinning_policies``):

* ``dedicated``: every vCPU is a PCPU, plus one PCPU for the emulator
  threads under ``hw:emulator_threads_policy=isolate``;
* ``mixed``: the vCPUs of ``hw:cpu_dedicated_mask`` (or, without it, of
  the realtime mask) are PCPU, the rest VCPU, plus the emulator's PCPU;
* ``shared`` (or no policy): every vCPU is a VCPU.

An explicit ``resources:PCPU=N`` (nova refuses it beside a policy) makes
the guest dedicated with N PCPU; ``resources:VCPU=N`` makes it shared with
N VCPU, whatever the flavor's vCPU count (``numa_get_constraints``). A
numbered group's ``resourcesM:PCPU``/``resourcesM:VCPU`` counts the same,
and the amounts of all groups add up (``_get_vcpu_pcpu_resources``, and
the scheduler's ``merged_resources``). ``hw:cpu_realtime`` is a boolean as
oslo's ``bool_from_string`` reads it: ``on``, ``y`` and ``t`` are true too.

nova 34 writes the flavor's extra specs and the image's properties into
the domain's ``<nova:instance>`` metadata, which :mod:`node_agent.host.domain`
reads. A domain nova wrote before it did carries only its pins, and nova
writes a ``<vcpupin>`` for *every* vCPU of a guest with a NUMA topology: a
dedicated vCPU to exactly one host CPU, a floating one to the set of its
cell's CPUs. The pinning shape decides there. ``rule`` says which did.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from typing import Mapping, Optional

from node_agent.model.cpuset import CpuSet, CpuSetSyntaxError, parse_cpu_spec
from node_agent.model.snapshot import Guest

DEDICATED = "dedicated"
SHARED = "shared"
MIXED = "mixed"
POLICIES = (DEDICATED, SHARED, MIXED)

# Which input decided (``GuestCpu.rule``).
BY_EXTRA_SPECS = "flavor extra specs"
BY_IMAGE = "image properties"
BY_AGENT_METADATA = "node-agent metadata"
BY_PINNING = "pinning shape"
BY_NO_PINS = "no pins"

# Metadata keys of a Guest (host/domain.py writes them).
EXTRA_SPEC = "extra_spec:"
IMAGE_PROPERTY = "image:"
AGENT_POLICY = "hw:cpu_policy"  # the node-agent namespace's <na:cpu_policy>
EMULATORPIN = "libvirt:emulatorpin"
# Present when nova wrote <nova:extraSpecs>, even empty.
NOVA_SPECS = "nova:extra_specs"


@dataclass(frozen=True)
class GuestCpu:
    """One guest's CPUs as nova counts them."""

    policy: str
    # Guest vCPU numbers nova pins one to one (PCPU).
    dedicated_vcpus: frozenset[int]
    emulator_isolate: bool
    vcpu: int
    pcpu: int
    rule: str
    # Host CPUs the dedicated vCPUs (and an isolated emulator) run on.
    dedicated_cpus: CpuSet = CpuSet()

    @property
    def dedicated(self) -> bool:
        """The whole guest is pinned: what nova's VCPU -> PCPU reshape moves."""
        return self.policy == DEDICATED

    @property
    def pins(self) -> bool:
        """Some vCPU is dedicated: the guest needs ``cpu_dedicated_set``."""
        return self.pcpu > 0 or bool(self.dedicated_vcpus)

    def describe(self) -> str:
        parts = [f"{self.policy} ({self.rule})"]
        if self.policy == MIXED:
            parts.append(f"dedicated vCPUs {CpuSet(self.dedicated_vcpus)}")
        if self.emulator_isolate:
            parts.append("emulator threads isolated")
        return ", ".join(parts) + f": VCPU {self.vcpu}, PCPU {self.pcpu}"


def extra_specs(guest: Guest) -> dict[str, str]:
    return {k[len(EXTRA_SPEC) :]: v for k, v in guest.metadata if k.startswith(EXTRA_SPEC)}


def image_properties(guest: Guest) -> dict[str, str]:
    return {k[len(IMAGE_PROPERTY) :]: v for k, v in guest.metadata if k.startswith(IMAGE_PROPERTY)}


def classify(guest: Guest) -> GuestCpu:
    """``guest``'s policy and classes, by nova's rules (see the module)."""
    meta = dict(guest.metadata)
    specs, image = extra_specs(guest), image_properties(guest)
    flavor_policy = specs.get("hw:cpu_policy")
    image_policy = image.get("hw_cpu_policy")
    explicit_pcpu = _requested(specs, "PCPU")
    explicit_vcpu = _requested(specs, "VCPU")
    if flavor_policy in POLICIES:
        return _from_specs(guest, flavor_policy, specs, image, BY_EXTRA_SPECS)
    if image_policy in POLICIES:
        return _from_specs(guest, image_policy, specs, image, BY_IMAGE)
    if explicit_pcpu is not None:
        found = _from_specs(guest, DEDICATED, specs, image, BY_EXTRA_SPECS)
        return replace(found, pcpu=explicit_pcpu, vcpu=0)
    if explicit_vcpu is not None:
        return replace(_from_specs(guest, SHARED, specs, image, BY_EXTRA_SPECS), vcpu=explicit_vcpu)
    if meta.get(AGENT_POLICY) in POLICIES:
        return _from_specs(guest, meta[AGENT_POLICY], specs, image, BY_AGENT_METADATA)
    if _has_nova_specs(guest) or not guest.vcpupin:
        # nova wrote the specs and set no policy: shared, pinned or not
        # (a floating NUMA guest's vCPUs are pinned to its cell's set).
        rule = BY_EXTRA_SPECS if _has_nova_specs(guest) else BY_NO_PINS
        return _from_specs(guest, SHARED, specs, image, rule)
    return _from_shape(guest)


# Metadata keys host/domain.py reads from nova's <nova:instance> only.
_NOVA_KEYS = ("nova:", "flavor:", "owner:", EXTRA_SPEC, IMAGE_PROPERTY)


def by_nova(guest: Guest) -> bool:
    """nova wrote this domain (its ``<nova:instance>`` metadata is there): a
    guest started outside nova is not one nova-compute checks at start."""
    return any(key.startswith(_NOVA_KEYS) for key, _ in guest.metadata)


def _has_nova_specs(guest: Guest) -> bool:
    # host/domain.py records that nova wrote an <extraSpecs> element (even
    # an empty one) with this key, so "no policy" is nova's word.
    return any(k == NOVA_SPECS for k, _ in guest.metadata)


def _from_specs(
    guest: Guest, policy: str, specs: Mapping[str, str], image: Mapping[str, str], rule: str
) -> GuestCpu:
    vcpus = guest.vcpus
    isolate = policy in (DEDICATED, MIXED) and specs.get("hw:emulator_threads_policy") == "isolate"
    if policy == DEDICATED:
        dedicated = frozenset(range(vcpus))
    elif policy == MIXED:
        dedicated = frozenset(
            _mask(specs.get("hw:cpu_dedicated_mask"), vcpus) or _realtime(specs, image, vcpus)
        )
    else:
        dedicated = frozenset()
    pcpu = len(dedicated) + (1 if isolate else 0) if policy != SHARED else 0
    return GuestCpu(
        policy,
        dedicated,
        isolate,
        vcpus - len(dedicated),
        pcpu,
        rule,
        _host_cpus(guest, dedicated, isolate),
    )


# nova's resource request keys: unnumbered or numbered groups
# (hardware._get_vcpu_pcpu_resources matches them with re.match).
_RESOURCES = re.compile(r"resources([1-9][0-9]*)?:(VCPU|PCPU)$")
# oslo_utils.strutils.bool_from_string's true words (nova's is_realtime_enabled).
_TRUE = ("1", "t", "true", "on", "y", "yes")


def _requested(specs: Mapping[str, str], resource_class: str) -> Optional[int]:
    """The amount of ``resource_class`` the flavor asks for in all its
    request groups, or None when no group names it (with a valid amount)."""
    amounts = [
        _int(value)
        for key, value in specs.items()
        if (m := _RESOURCES.match(key)) and m.group(2) == resource_class
    ]
    valid = [a for a in amounts if a is not None and a >= 0]
    return sum(valid) if valid else None


def _int(value: Optional[str]) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _mask(mask: Optional[str], vcpus: int) -> set[int]:
    """nova's vCPU mask grammar: ``^`` entries exclude from all vCPUs."""
    if not mask or not mask.strip():
        return set()
    spec = f"0-{vcpus - 1},{mask}" if mask.strip().startswith("^") else mask
    try:
        return {v for v in parse_cpu_spec(spec) if v < vcpus}
    except CpuSetSyntaxError:
        return set()


def _realtime(specs: Mapping[str, str], image: Mapping[str, str], vcpus: int) -> set[int]:
    if specs.get("hw:cpu_realtime", "").strip().lower() not in _TRUE:
        return set()
    mask = image.get("hw_cpu_realtime_mask") or specs.get("hw:cpu_realtime_mask")
    return _mask(mask, vcpus) if mask else set(range(vcpus))


def _host_cpus(guest: Guest, dedicated: frozenset[int], isolate: bool) -> CpuSet:
    pins = dict(guest.vcpupin)
    cpus = CpuSet()
    for vcpu in dedicated:
        cpus = cpus | pins.get(vcpu, CpuSet())
    emulator = emulatorpin(guest)
    if isolate and emulator is not None:
        cpus = cpus | emulator
    return cpus


def emulatorpin(guest: Guest) -> Optional[CpuSet]:
    value = dict(guest.metadata).get(EMULATORPIN)
    if value is None:
        return None
    try:
        return parse_cpu_spec(value)
    except CpuSetSyntaxError:
        return None


def _from_shape(guest: Guest) -> GuestCpu:
    """A domain without nova's specs: a vCPU pinned alone to one host CPU is
    dedicated, one pinned to a set (or sharing its CPU with another vCPU)
    floats."""
    pins = dict(guest.vcpupin)
    shared_by = Counter(cpu for cpus in pins.values() for cpu in cpus)
    dedicated = frozenset(
        vcpu
        for vcpu in range(guest.vcpus)
        if len(pins.get(vcpu, CpuSet())) == 1 and all(shared_by[cpu] == 1 for cpu in pins[vcpu])
    )
    if not dedicated:
        policy = SHARED
    elif len(dedicated) == guest.vcpus:
        policy = DEDICATED
    else:
        policy = MIXED
    emulator = emulatorpin(guest)
    pinned = CpuSet(cpu for v in dedicated for cpu in pins[v])
    # nova pins an isolated emulator thread to one host CPU of its own.
    isolate = (
        policy != SHARED
        and emulator is not None
        and len(emulator) == 1
        and not (emulator & pinned)
        and shared_by[next(iter(emulator))] == 0
    )
    return GuestCpu(
        policy,
        dedicated,
        isolate,
        guest.vcpus - len(dedicated),
        len(dedicated) + (1 if isolate else 0),
        BY_PINNING,
        _host_cpus(guest, dedicated, isolate),
    )
