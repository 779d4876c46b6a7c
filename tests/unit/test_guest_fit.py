"""Guests the CPU sets leave without CPUs are refused by name (pure)."""

import pytest

from node_agent.model.cpuset import CpuSet, parse_cpu_spec
from node_agent.policy.guest_fit import misfits
from node_agent.model.snapshot import Guest

PINNED = Guest("p-uuid", "pinned-vm", 2, True, 1024,
               vcpupin=((0, parse_cpu_spec("2")), (1, parse_cpu_spec("10"))))
DEDICATED_META = Guest("m-uuid", "meta-vm", 2, True, 1024,
                       metadata=(("hw:cpu_policy", "dedicated"),))
FLOATING = Guest("f-uuid", "floating-vm", 2, True, 1024)


def spec(text):
    return parse_cpu_spec(text) if text else CpuSet()


@pytest.mark.parametrize("guests,dedicated,shared,expected", [
    # Pinned CPUs all dedicated; floating guest has a shared set: fits.
    ((PINNED, FLOATING), "2-5,10-13", "0-1", []),
    # Legacy host (no dedicated set): nothing is judged.
    ((PINNED, FLOATING), "", "0-15", []),
    # CPU 10 moved to the shared set.
    ((PINNED,), "2-9", "0-1,10-15",
     ["pinned guest pinned-vm (p-uuid) runs on CPUs 2,10; CPUs 10 are outside "
      "cpu_dedicated_set = '2-9'; CPUs 10 are in cpu_shared_set = '0-1,10-15'. "
      "Add them to cpu_dedicated_set or migrate the guest first."]),
    # CPU 10 in neither set.
    ((PINNED,), "2-9", "0-1",
     ["pinned guest pinned-vm (p-uuid) runs on CPUs 2,10; CPUs 10 are outside "
      "cpu_dedicated_set = '2-9'. Add them to cpu_dedicated_set or migrate the "
      "guest first."]),
    # Every CPU dedicated: the floating guest has nowhere to run.
    ((PINNED, FLOATING), "0-15", "",
     ["floating guest floating-vm (f-uuid) has no pinned CPUs, but cpu_dedicated_set = "
      "'0-15' is set and cpu_shared_set is empty, so nova has no CPU to run it on. Set "
      "[compute] cpu_shared_set to the CPUs floating guests may use, or migrate the "
      "guest first."]),
    # Dedicated by flavor but not pinned (yet): its CPUs are unknown, it fits.
    ((DEDICATED_META,), "0-15", "", []),
])
def test_guests_that_do_not_fit_are_named_with_their_cpus_and_the_option(
        guests, dedicated, shared, expected):
    assert misfits(guests, spec(dedicated), spec(shared)) == expected


def test_without_the_shared_set_known_only_pinned_guests_are_judged():
    assert misfits((FLOATING,), spec("0-15"), None) == []
    assert len(misfits((PINNED, FLOATING), spec("3-9"), None)) == 1
