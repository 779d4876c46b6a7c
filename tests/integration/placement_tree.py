"""What the real Placement holds for one host's tree, read back for tests."""

from __future__ import annotations


def tree_by_name(client, host: str) -> dict[str, dict]:
    """name -> {uuid, parent, inventories, traits} of every provider in the
    tree whose root is called ``host``."""
    root = client.get(f"/resource_providers?name={host}")["resource_providers"][0]
    out = {}
    for rp in client.get(f"/resource_providers?in_tree={root['uuid']}")["resource_providers"]:
        base = f"/resource_providers/{rp['uuid']}"
        out[rp["name"]] = {
            "uuid": rp["uuid"],
            "parent": rp["parent_provider_uuid"],
            "inventories": client.get(f"{base}/inventories")["inventories"],
            "traits": set(client.get(f"{base}/traits")["traits"]),
        }
    return out
