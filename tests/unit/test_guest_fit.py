"""Guests the CPU sets leave without CPUs are refused by name (pure)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from node_agent.host.domain import parse_domain
from node_agent.model.cpuset import CpuSet, parse_cpu_spec
from node_agent.model.snapshot import Guest
from node_agent.policy.guest_fit import (
    blocks_nova,
    guests_refused,
    misfits,
    nova_pinnable,
    warnings,
)

PINNED = Guest(
    "p-uuid",
    "pinned-vm",
    2,
    True,
    1024,
    vcpupin=((0, parse_cpu_spec("2")), (1, parse_cpu_spec("10"))),
)
DEDICATED_META = Guest(
    "m-uuid", "meta-vm", 2, True, 1024, metadata=(("hw:cpu_policy", "dedicated"),)
)
FLOATING = Guest("f-uuid", "floating-vm", 2, True, 1024)


def spec(text):
    return parse_cpu_spec(text) if text else CpuSet()


# A floating NUMA guest as nova writes it: every vCPU pinned to its cell's set.
FLOATING_NUMA = Guest(
    "n-uuid",
    "numa-vm",
    2,
    True,
    1024,
    vcpupin=((0, parse_cpu_spec("0-1")), (1, parse_cpu_spec("0-1"))),
    metadata=(("extra_spec:hw:numa_nodes", "1"), ("nova:extra_specs", "")),
)


@pytest.mark.parametrize(
    "guests,dedicated,shared,expected",
    [
        # Pinned CPUs all dedicated; floating guest has a shared set: fits.
        ((PINNED, FLOATING, FLOATING_NUMA), "2-5,10-13", "0-1", []),
        # Legacy host (no dedicated set): nothing is judged.
        ((PINNED, FLOATING), "", "0-15", []),
        # A pinned guest outside the dedicated set: nova warns, so no refusal.
        ((PINNED,), "2-9", "0-1,10-15", []),
        # Every CPU dedicated: the floating guests have nowhere to run.
        (
            (PINNED, FLOATING, FLOATING_NUMA),
            "0-15",
            "",
            [
                "shared guest floating-vm (f-uuid), not started by nova (no nova metadata), "
                "has no pinned CPU (it may run on any); nova counts 2 of its vCPUs as floating "
                "(no pins): VCPU 2. cpu_dedicated_set = '0-15' is set and cpu_shared_set is "
                "empty, so no VCPU is published for them while they use host CPUs "
                "(nova-compute does not know this guest). Set [compute] cpu_shared_set to the "
                "CPUs it runs on, pin each of its vCPUs to a CPU of its own, or stop it.",
                "shared guest numa-vm (n-uuid) runs on host CPUs 0-1; nova counts 2 of its "
                "vCPUs as floating (flavor extra specs): VCPU 2. cpu_dedicated_set = '0-15' is "
                "set and cpu_shared_set is empty, so nova has no CPU to run them on and "
                "nova-compute refuses to start. Set [compute] cpu_shared_set to the CPUs "
                "floating guests may use, or migrate the guest first.",
            ],
        ),
        # Dedicated by flavor but not pinned (yet): it fits.
        ((DEDICATED_META,), "0-15", "", []),
    ],
)
def test_guests_that_do_not_fit_are_named_with_their_cpus_and_the_option(
    guests, dedicated, shared, expected
):
    assert misfits(guests, spec(dedicated), spec(shared)) == expected


@pytest.mark.parametrize(
    "dedicated,shared,expected",
    [
        # CPU 10 moved to the shared set.
        (
            "2-9",
            "0-1,10-15",
            [
                "dedicated guest pinned-vm (p-uuid) has dedicated vCPUs on CPUs 2,10; CPUs 10 are "
                "outside cpu_dedicated_set = '2-9'; CPUs 10 are in cpu_shared_set = '0-1,10-15'. "
                "Not started by nova (no nova metadata), so nova-compute does not count it; add "
                "them to cpu_dedicated_set or migrate the guest."
            ],
        ),
        # CPU 10 in neither set.
        (
            "2-9",
            "0-1",
            [
                "dedicated guest pinned-vm (p-uuid) has dedicated vCPUs on CPUs 2,10; CPUs 10 are "
                "outside cpu_dedicated_set = '2-9'. Not started by nova (no nova metadata), so "
                "nova-compute does not count it; add them to cpu_dedicated_set or migrate the "
                "guest."
            ],
        ),
        ("2-13", "0-1", []),
    ],
)
def test_a_pinned_guest_outside_the_dedicated_set_is_a_warning_as_in_nova(
    dedicated, shared, expected
):
    assert warnings((PINNED, FLOATING_NUMA), spec(dedicated), spec(shared)) == expected


def test_a_floating_numa_guest_is_never_judged_as_pinned():
    """nova pins a floating NUMA guest's vCPUs to its cell's set: no warning,
    however the dedicated set lies."""
    assert warnings((FLOATING_NUMA,), spec("0-1"), spec("2-3")) == []


def test_without_the_shared_set_known_no_guest_is_refused():
    assert misfits((FLOATING,), spec("0-15"), None) == []
    assert misfits((PINNED, FLOATING), spec("3-9"), None) == []


# Started with virsh, not nova: both vCPUs pinned to host CPU 3, which they share.
OUTSIDE_NOVA = Guest(
    "o-uuid",
    "virsh-vm",
    2,
    True,
    1024,
    vcpupin=((0, parse_cpu_spec("3")), (1, parse_cpu_spec("3"))),
)


def test_a_pinned_guest_started_outside_nova_on_a_shared_cpu_is_named_with_its_cpus():
    """Issue 28: the refusal said the guest did not fit "the new CPU sets"
    (that had not changed) and that nova-compute would refuse to start (it
    does not know the guest). It names the guest, its CPUs and the reason."""
    refused = guests_refused(
        SimpleNamespace(
            host=SimpleNamespace(guests=(OUTSIDE_NOVA,)),
            partition=SimpleNamespace(dedicated=spec("2-15"), shared=CpuSet()),
        )
    )
    assert refused is not None
    text = str(refused)
    assert "new CPU sets" not in text and "nova-compute refuses" not in text
    assert "under cpu_dedicated_set and cpu_shared_set as configured" in text
    [reason] = refused.reasons
    assert reason.startswith(
        "shared guest virsh-vm (o-uuid), not started by nova (no nova metadata), "
        "runs on host CPUs 3; nova counts 2 of its vCPUs as floating (pinning shape)"
    )


# -- nova-compute's resource updates stop on a guest of its own pinned outside
# cpu_dedicated_set (domains nova 34's libvirt driver wrote: tests/data/nova_guests)

CORPUS = Path(__file__).resolve().parents[1] / "data" / "nova_guests"


def nova_guest(name):
    return parse_domain((CORPUS / "xml" / f"{name}.xml").read_text(), True)


def test_a_nova_guest_pinned_outside_the_dedicated_set_stops_novas_updates_named():
    guest = nova_guest("one-node--dedicated")  # pinned to 2,4-6 under 2-7
    assert blocks_nova((guest,), spec("2-7")) == []
    (reason,) = blocks_nova((guest,), spec("2-5"))
    assert reason == (
        f"dedicated guest {guest.name} ({guest.uuid}) is pinned to host CPUs 2,4-6; "
        "CPUs 6 are outside cpu_dedicated_set = '2-5'. nova-compute starts but every "
        "resource update fails (CPUPinningUnknown: nova pins its guests' dedicated "
        "vCPUs on these CPUs only), so it reports nothing and does not reshape. "
        "Add CPUs 6 to cpu_dedicated_set, or migrate or delete the guest before "
        "restarting nova-compute."
    )


def test_an_isolated_emulator_thread_outside_the_dedicated_set_stops_them_too():
    # nova pins the emulator thread like a vCPU: 2 vCPUs on 2,6, the emulator on 5.
    guest = nova_guest("one-node--dedicated-emulator-isolate")
    assert "CPUs 5 are outside" in blocks_nova((guest,), spec("2-4,6-7"))[0]


def test_the_dedicated_part_of_a_mixed_guest_counts_its_floating_part_not():
    guest = nova_guest("one-node--mixed-mask-exclude")  # vCPUs 2,3 on 2,6; 0,1 float
    assert blocks_nova((guest,), spec("2,6")) == []
    assert "CPUs 6 are outside" in blocks_nova((guest,), spec("2-5"))[0]


def test_floating_guests_and_guests_nova_did_not_start_never_stop_nova():
    floating = [nova_guest(n) for n in ("one-node--shared-numa1", "one-node--no-policy")]
    assert blocks_nova(floating, spec("7")) == []
    assert blocks_nova((PINNED,), spec("3-9")) == []  # virsh's guest: not nova's


def test_without_any_cpu_set_nothing_is_judged():
    assert blocks_nova((nova_guest("one-node--dedicated"),), CpuSet()) == []
    assert nova_pinnable(CpuSet(), None, None) is None  # nova pins on every online CPU


def test_legacy_vcpu_pin_set_is_where_nova_pins_without_a_dedicated_set():
    """nova's _get_host_numa_topology: no cpu_dedicated_set, so vcpu_pin_set's
    CPUs serve pinned guests too; a nova guest pinned outside it stops
    nova-compute's updates the same way."""
    guest = nova_guest("one-node--dedicated")  # pinned to 2,4-6
    cpus, where = nova_pinnable(CpuSet(), spec("0-7"), spec("2-5"))  # vcpu_pin_set wins
    assert (cpus, where) == (spec("2-5"), "vcpu_pin_set = '2-5' (no cpu_dedicated_set)")
    (reason,) = blocks_nova((guest,), cpus, where=where)
    assert "CPUs 6 are outside vcpu_pin_set = '2-5' (no cpu_dedicated_set)" in reason
    assert "Add CPUs 6 to vcpu_pin_set," in reason
    assert blocks_nova((guest,), *nova_pinnable(CpuSet(), None, spec("0-7"))[:1]) == []


def test_cpu_shared_set_alone_leaves_nova_no_cpu_to_pin_a_guest_on():
    guest = nova_guest("one-node--dedicated")
    cpus, where = nova_pinnable(CpuSet(), spec("0-7"), None)
    (reason,) = blocks_nova((guest,), cpus, where=where)
    assert "CPUs 2,4-6 are outside cpu_dedicated_set (unset: with cpu_shared_set" in reason
    assert "Add CPUs 2,4-6 to cpu_dedicated_set," in reason
    floating = nova_guest("one-node--no-policy")
    assert blocks_nova((floating,), cpus, where=where) == []


def test_thread_policy_isolate_needs_the_pinned_cpus_siblings_dedicated_too():
    guest = Guest(
        "i-uuid",
        "isolate-vm",
        1,
        True,
        1024,
        vcpupin=((0, parse_cpu_spec("2")),),
        metadata=(
            ("extra_spec:hw:cpu_policy", "dedicated"),
            ("extra_spec:hw:cpu_thread_policy", "isolate"),
            ("nova:extra_specs", ""),
        ),
    )
    siblings = {2: parse_cpu_spec("2,8"), 8: parse_cpu_spec("2,8")}
    assert blocks_nova((guest,), spec("2-5,8"), siblings) == []
    (reason,) = blocks_nova((guest,), spec("2-5"), siblings)
    assert "pinned to host CPUs 2 (with their SMT siblings, thread policy isolate: 2,8)" in reason
    assert "CPUs 8 are outside" in reason
