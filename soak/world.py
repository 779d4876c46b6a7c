"""Placement as the scheduler and the operator use it, and the checks the
soak makes after each cycle."""

from __future__ import annotations

import uuid
from typing import Mapping

from node_agent.placement.client import GenerationConflict, PlacementClient
from soak.model import Record, same_record

OPERATOR_TRAIT = "CUSTOM_SOAK_OPERATOR_RACK"
PROJECT = "33333333000040008000000000000009"
USER = "22222222000040008000000000000009"


class SoakFailure(AssertionError):
    """Placement differs from the model."""


class World:
    def __init__(self, url: str, host: str):
        self.client = PlacementClient.for_endpoint(url, retries=3, backoff=0.1)
        self.host = host
        self.root: str | None = None
        self.allocations: dict[str, dict[str, int]] = {}  # consumer -> resources on root
        self.freed: list[str] = []
        self.traits: frozenset[str] = frozenset()  # the agent's, after the first cycle

    def find_root(self) -> str:
        found = self.client.get(f"/resource_providers?name={self.host}")["resource_providers"]
        if len(found) != 1:
            raise SoakFailure(f"{len(found)} providers named {self.host}")
        self.root = found[0]["uuid"]
        return self.root

    def usages(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for resources in self.allocations.values():
            for rc, amount in resources.items():
                used[rc] = used.get(rc, 0) + amount
        return used

    # -- the scheduler

    def allocate(self, consumer: str, resources: Mapping[str, int]) -> None:
        self.client.put(
            f"/allocations/{consumer}",
            {
                "allocations": {self.root: {"resources": dict(resources)}},
                "project_id": PROJECT,
                "user_id": USER,
                "consumer_generation": None,
            },
        )
        self.allocations[consumer] = dict(resources)
        if consumer in self.freed:  # a fixture guest placed again
            self.freed.remove(consumer)

    def free(self, consumer: str) -> None:
        self.client.delete(f"/allocations/{consumer}")
        del self.allocations[consumer]
        self.freed = (self.freed + [consumer])[-5:]

    def new_consumer(self) -> str:
        return str(uuid.uuid4())

    # -- the operator

    def add_operator_trait(self) -> None:
        self.client.put(f"/traits/{OPERATOR_TRAIT}", None)
        for _ in range(10):
            got = self.client.get(f"/resource_providers/{self.root}/traits")
            try:
                self.client.put(
                    f"/resource_providers/{self.root}/traits",
                    {
                        "resource_provider_generation": got["resource_provider_generation"],
                        "traits": sorted(set(got["traits"]) | {OPERATOR_TRAIT}),
                    },
                )
                return
            except GenerationConflict:
                continue
        raise SoakFailure("could not add the operator trait")

    def remember_traits(self) -> None:
        held = set(self.client.get(f"/resource_providers/{self.root}/traits")["traits"])
        if "COMPUTE_NODE" not in held:
            raise SoakFailure(f"the agent's root has no COMPUTE_NODE trait: {sorted(held)}")
        self.traits = frozenset(held - {OPERATOR_TRAIT})

    # -- checks

    def check(self, records: Mapping[str, Record]) -> int:
        """Placement == model; returns how many facts were compared."""
        checked = 0
        if self.find_root() is None:
            raise SoakFailure("root provider gone")
        held = self.client.get(f"/resource_providers/{self.root}/inventories")["inventories"]
        if set(held) != set(records):
            raise SoakFailure(f"classes {sorted(held)} != model {sorted(records)}")
        for rc, expected in records.items():
            if not same_record(held[rc], expected):
                raise SoakFailure(f"{rc}: Placement {held[rc]} != model {dict(expected)}")
            checked += 1
        traits = set(self.client.get(f"/resource_providers/{self.root}/traits")["traits"])
        if traits != self.traits | {OPERATOR_TRAIT}:
            raise SoakFailure(
                f"traits {sorted(traits)} != agent's {sorted(self.traits)} + {OPERATOR_TRAIT}"
            )
        checked += 1
        usages = self.client.get(f"/resource_providers/{self.root}/usages")["usages"]
        expected_use = self.usages()
        for rc in set(usages) | set(expected_use):
            if usages.get(rc, 0) != expected_use.get(rc, 0):
                raise SoakFailure(
                    f"usage of {rc}: Placement {usages.get(rc, 0)} != "
                    f"allocations made {expected_use.get(rc, 0)}"
                )
            checked += 1
        for consumer, resources in self.allocations.items():
            got = self.client.get(f"/allocations/{consumer}")["allocations"]
            if {rp: a["resources"] for rp, a in got.items()} != {self.root: resources}:
                raise SoakFailure(f"allocation of {consumer} is {got}, made {resources}")
            checked += 1
        for consumer in self.freed:
            if self.client.get(f"/allocations/{consumer}")["allocations"]:
                raise SoakFailure(f"freed consumer {consumer} has allocations again")
            checked += 1
        return checked
