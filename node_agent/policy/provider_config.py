"""Operator provider files (``[compute] provider_config_location``), nova's
provider.yaml schema 1.0::

    meta:
      schema_version: '1.0'
    providers:
      - identification:
          uuid: $COMPUTE_NODE        # or uuid: <uuid>, or name: <provider name>
        inventories:
          additional:
            - CUSTOM_LICENSE:
                total: 4
                reserved: 0          # optional, like min_unit, max_unit,
                                     # step_size and allocation_ratio
        traits:
          additional:
            - CUSTOM_GOLD

Only ``CUSTOM_`` classes and traits are accepted, and none of neutron's
(``NET_BW_*``, ``NET_PACKET_RATE_*``, ``CUSTOM_VNIC_TYPE_*``: refused with a
message naming neutron). ``$COMPUTE_NODE`` means
the root provider; an entry naming the same provider explicitly replaces
the ``$COMPUTE_NODE`` entry for it, as in nova. Schema versions 1.x are
read; keys unknown to 1.0 are refused in 1.0 documents and ignored in later
minor versions, whose additions this agent does not know.

Parsing is pure (text in, records out): the JSON Schema of
:mod:`node_agent.policy.provider_schema` checks the format, the functions
here the rules between values. It reports every problem with the file and
the path inside the document
(``providers[0].inventories.additional[1].CUSTOM_FOO.total``). Reading the
directory is the only side effect, in
:func:`node_agent.config.provider_files.load_provider_configs`.

Applying (:func:`apply_provider_configs`) adds the inventories and sets the
traits True on the named providers of the desired tree. The agent does not
remember by itself what it applied: the caller passes ``previously_applied``
(provider name -> traits the files added last time, kept by the sync state),
and every such trait no longer in the files is set False so it is removed.
Entries naming a provider that is not in the tree (a foreign provider, or a
uuid not known yet) are left out; :func:`unmatched` lists them for a warning.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import AbstractSet, Any, Mapping, Optional, Sequence, Set

from node_agent.errors import ConfigError
from node_agent.model.hugepages import PAGE_CLASS_PREFIX
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree

COMPUTE_NODE = "$COMPUTE_NODE"
_VERSION = re.compile(r"^1\.(\d+)$")
_PATH_PART = re.compile(r"\[(\d+)\]|([^.\[\]]+)")
# Classes the agent reports itself on some provider, refused wherever they appear.
_AGENT_PREFIXES = (PAGE_CLASS_PREFIX,)
# What neutron's agents publish on their own providers (the bandwidth and
# packet-rate classes, SR-IOV's included, and the vnic-type traits) and its
# server matches against ports' requests: a compute-side copy would offer the
# same bandwidth twice and lie about which agent can bind the port.
NEUTRON_CLASS_PREFIXES = ("NET_BW_", "NET_PACKET_RATE_")
NEUTRON_TRAIT_PREFIXES = ("CUSTOM_VNIC_TYPE_",)
NEUTRON_WHY = (
    "belongs to neutron: its agents publish bandwidth, packet rates and vnic "
    "types on their own providers (resource_provider_bandwidths, "
    "resource_provider_packet_processing_*). Configure it in neutron's agent"
)
_NEUTRON_WHY = NEUTRON_WHY + ", not in a node-agent provider file"


@dataclass(frozen=True)
class ProviderConfig:
    """One entry of ``providers``."""

    source: str  # "<file> providers[N]"
    name: Optional[str] = None
    uuid: Optional[str] = None  # a uuid, or None
    compute_node: bool = False  # identified by $COMPUTE_NODE
    inventories: Mapping[str, Inventory] = field(default_factory=dict)
    traits: frozenset[str] = frozenset()

    @property
    def identity(self) -> str:
        return COMPUTE_NODE if self.compute_node else (self.name or self.uuid or "")


def _entry_problems(
    entry: Any, path: str, wrong: Set[str], refused: Set[str]
) -> list[tuple[str, str]]:
    """(path, message) for what the schema cannot see in the entry at
    ``path``: rules between two values, and classes the agent reports
    itself. Skipped: what the schema found ``wrong`` (the paths of its
    problems) and the inventories it ``refused`` (those paths and their
    parents)."""
    inventories = f"{path}.inventories"
    if {path, inventories, f"{inventories}.additional"} & wrong:
        return []
    found = []
    classes: set[str] = set()
    for i, item in enumerate(entry.get("inventories", {}).get("additional", [])):
        if f"{path}.inventories.additional[{i}]" in refused:
            continue
        ((rc, data),) = item.items()
        path_rc = f"{path}.inventories.additional[{i}].{rc}"
        if rc.startswith(_AGENT_PREFIXES):
            found.append((path_rc, f"{rc} is a class the agent reports itself"))
        elif rc in classes:
            found.append((path_rc, "is listed twice"))
        elif data.get("reserved", 0) > data["total"]:
            found.append(
                (f"{path_rc}.reserved", f"{data['reserved']} is above total {data['total']}")
            )
        elif data.get("min_unit", 1) > data.get("max_unit", math.inf):
            found.append(
                (
                    f"{path_rc}.min_unit",
                    f"{data.get('min_unit', 1)} is above max_unit {data['max_unit']}",
                )
            )
        classes.add(rc)
    return found


def _neutron_problems(entries: Any) -> list[tuple[str, str]]:
    """(path, refusal) for every class or trait of neutron's in ``entries``,
    whatever else is wrong with them."""
    found = []
    for i, entry in enumerate(entries if isinstance(entries, list) else ()):
        if not isinstance(entry, dict):
            continue
        inventories = entry.get("inventories")
        additional = inventories.get("additional") if isinstance(inventories, dict) else None
        for j, item in enumerate(additional if isinstance(additional, list) else ()):
            for rc in item if isinstance(item, dict) else ():
                if isinstance(rc, str) and rc.startswith(NEUTRON_CLASS_PREFIXES):
                    found.append(
                        (f"providers[{i}].inventories.additional[{j}].{rc}", f"{rc} {_NEUTRON_WHY}")
                    )
        traits = entry.get("traits")
        additional = traits.get("additional") if isinstance(traits, dict) else None
        for j, trait in enumerate(additional if isinstance(additional, list) else ()):
            if isinstance(trait, str) and trait.startswith(NEUTRON_TRAIT_PREFIXES):
                found.append((f"providers[{i}].traits.additional[{j}]", f"{trait} {_NEUTRON_WHY}"))
    return found


def _config(entry: dict, source: str) -> ProviderConfig:
    """The record of one entry the schema and :func:`_entry_problems` accepted."""
    ((key, text),) = ((k, v) for k, v in entry["identification"].items() if k in ("name", "uuid"))
    if text == COMPUTE_NODE:
        # nova accepts the sentinel under name too (its own
        # example_provider.yaml writes name: $COMPUTE_NODE).
        ident: dict[str, Any] = {"compute_node": True}
    elif key == "name":
        ident = {"name": text}
    else:
        import uuid  # loaded where a value is one: start-up cost, test_start_cost.py

        ident = {"uuid": str(uuid.UUID(text))}
    inventories = {}
    for item in entry.get("inventories", {}).get("additional", []):
        ((rc, data),) = item.items()
        inventories[rc] = Inventory(
            total=data["total"],
            reserved=data.get("reserved", 0),
            min_unit=data.get("min_unit", 1),
            max_unit=data.get("max_unit"),
            step_size=data.get("step_size", 1),
            allocation_ratio=float(data.get("allocation_ratio", 1.0)),
        )
    traits = frozenset(entry.get("traits", {}).get("additional", []))
    return ProviderConfig(source=source, inventories=inventories, traits=traits, **ident)


def _prefixes(path: str) -> list[str]:
    """``a[0].b`` -> ``a``, ``a[0]``, ``a[0].b``."""
    return [path[:i] for i, c in enumerate(path) if c in ".["] + [path]


def _document_order(problem: tuple[str, str]) -> tuple:
    return tuple(
        (bool(key), int(index) if index else key) for index, key in _PATH_PART.findall(problem[0])
    )


def _minor(version: Any) -> Optional[int]:
    """The minor of a 1.x version, None for any other version."""
    match = _VERSION.match(str(version)) if isinstance(version, (str, float)) else None
    return int(match.group(1)) if match else None


def parse_provider_config(text: str, source: str) -> tuple[ProviderConfig, ...]:
    """One YAML document, checked against the schema
    (:mod:`node_agent.policy.provider_schema`) and then the rules between
    values. Raises ConfigError listing every problem, each as
    ``<source>: <path in the document>: <what is wrong>``."""
    import yaml  # here: a host without provider files never pays for yaml

    from node_agent.policy import provider_schema  # nor for jsonschema

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f": line {mark.line + 1}" if mark else ""
        raise ConfigError(
            f"{source}{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}"
        ) from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: must be a mapping, not {type(doc).__name__}")
    meta = doc.get("meta")
    version = meta.get("schema_version") if isinstance(meta, dict) else None
    minor = _minor(version)
    if minor is None:  # before the schema: the version says which one applies
        raise ConfigError(
            f"{source}: meta.schema_version: {version!r} is not a supported "
            "version; write schema_version: '1.0'"
        )
    neutron = _neutron_problems(doc.get("providers"))
    # neutron's refusal replaces the schema's for the same field (a standard
    # class is also "not CUSTOM_"), so the operator reads who owns it.
    problems = [
        (provider_schema.where(path), message)
        for path, message in provider_schema.problems(doc, strict=minor == 0)
        if provider_schema.where(path) not in {where for where, _ in neutron}
    ] + neutron
    wrong = {path for path, _ in problems}
    refused = {prefix for path in wrong for prefix in _prefixes(path)}
    configs = []
    entries = doc.get("providers", [])
    for i, entry in enumerate(entries if isinstance(entries, list) else ()):
        path = f"providers[{i}]"
        entry_problems = _entry_problems(entry, path, wrong, refused)
        problems += entry_problems
        if path not in refused and not entry_problems:
            configs.append(_config(entry, f"{source} {path}"))
    if problems:
        raise ConfigError(
            [
                f"{source}: {path + ': ' if path else ''}{message}"
                for path, message in sorted(problems, key=_document_order)
            ]
        )
    return tuple(configs)


def check_unique(configs: Sequence[ProviderConfig]) -> None:
    """A provider may be identified once across all files (nova refuses too)."""
    seen: dict[str, str] = {}
    problems = []
    for config in configs:
        key = config.identity
        if key in seen:
            problems.append(
                f"{config.source}: identification {key} is already used by "
                f"{seen[key]}. Merge the two entries."
            )
        seen.setdefault(key, config.source)
    if problems:
        raise ConfigError(problems)


def config_for(
    provider: Provider, is_root: bool, configs: Sequence[ProviderConfig]
) -> Optional[ProviderConfig]:
    """The explicit entry naming ``provider``, else $COMPUTE_NODE for the root.
    An explicit entry without inventories or traits does not hide $COMPUTE_NODE.
    Two entries reaching one provider (by name and by uuid) are a ConfigError,
    as nova's ``_merge_provider_configs`` refuses them."""
    named = [
        config
        for config in configs
        if (
            (config.name is not None and config.name == provider.name)
            or (config.uuid is not None and config.uuid == provider.uuid)
        )
        and (config.inventories or config.traits)
    ]
    if len(named) > 1:
        raise ConfigError(
            f"{named[1].source} and {named[0].source} both name provider "
            f"'{provider.name}' ({provider.uuid or 'uuid not known yet'}), by "
            f"{'name' if named[0].name else 'uuid'} and by "
            f"{'name' if named[1].name else 'uuid'}. Merge the two entries into one."
        )
    if named:
        return named[0]
    if is_root:
        return next((c for c in configs if c.compute_node), None)
    return None


def unmatched(tree: ProviderTree, configs: Sequence[ProviderConfig]) -> list[ProviderConfig]:
    """Entries naming no provider of the tree (foreign, or uuid not yet known)."""
    return [
        c
        for c in configs
        if not c.compute_node
        and tree.by_name(c.name or "") is None
        and not any(p.uuid == c.uuid for p in tree.providers if c.uuid)
    ]


def _apply_one(
    provider: Provider, config: Optional[ProviderConfig], previous: Set[str]
) -> Provider:
    wanted = config.traits if config else frozenset()
    inventories = dict(provider.inventories)
    traits = dict(provider.traits)
    problems = []
    if config:
        for rc, inv in config.inventories.items():
            if rc in inventories:
                problems.append(
                    f"{config.source}: {rc} on provider '{provider.name}' is a "
                    "class the agent reports itself. Remove it from the file."
                )
            inventories[rc] = inv
        for trait in wanted:
            if trait in traits:
                problems.append(
                    f"{config.source}: trait {trait} on provider "
                    f"'{provider.name}' is one the agent decides itself. "
                    "Remove it from the file."
                )
    if problems:
        raise ConfigError(problems)
    for trait in set(previous) - wanted:
        traits.setdefault(trait, False)
    traits.update({trait: True for trait in wanted})
    return replace(provider, inventories=inventories, traits=traits)


def apply_provider_configs(
    tree: ProviderTree,
    configs: Sequence[ProviderConfig],
    previously_applied: Mapping[str, Set[str]],
) -> ProviderTree:
    """The tree with the operator's inventories and traits added.

    ``previously_applied``: provider name -> traits the files set last
    time; those no longer in the files become False (removed). Raises
    ConfigError when a file adds a class or trait the agent manages there.
    """
    if not configs and not previously_applied:
        return tree
    providers = tuple(
        _apply_one(p, config_for(p, i == 0, configs), previously_applied.get(p.name, set()))
        for i, p in enumerate(tree.providers)
    )
    return ProviderTree(providers)


def file_added_traits(
    listed: Mapping[str, Sequence[str]],
    previous: Mapping[str, Sequence[str]],
    before: Mapping[str, AbstractSet[str]],
) -> dict[str, list[str]]:
    """Which of the traits the files list now (``listed``, by provider) the
    files added, to remember as next cycle's ``previously_applied``.

    A trait is the files' when they added it before (``previous``), or when
    its provider did not carry it in Placement before this cycle's sync
    (``before``: provider name -> its traits then; a provider missing there
    is new). A trait the provider already carried when a file first listed
    it was the operator's, and stays when the file stops listing it."""
    out = {}
    for name, traits in listed.items():
        had = before.get(name, set())
        kept = sorted(t for t in traits if t in previous.get(name, ()) or t not in had)
        if kept:
            out[name] = kept
    return out


def applied_inventories(
    configs: Sequence[ProviderConfig], tree: ProviderTree
) -> dict[str, dict[str, dict]]:
    """The inventories :func:`apply_provider_configs` adds, by provider name
    and class, as Placement spells them: what :func:`held_inventories` keeps
    while a file is refused."""
    return {
        p.name: {rc: inv.as_placement() for rc, inv in config.inventories.items()}
        for i, p in enumerate(tree.providers)
        for config in [config_for(p, i == 0, configs)]
        if config and config.inventories
    }


def held_inventories(
    tree: ProviderTree, previous: Mapping[str, Mapping[str, Mapping]]
) -> ProviderTree:
    """The tree with the inventories the files gave at the last cycle
    (``previous``, from :func:`applied_inventories`) kept where no file
    gives them now: while one file is refused, it may be the one that gave
    them, and its typo must not take its classes out of Placement. A class
    the tree itself reports is the tree's."""
    if not previous:
        return tree
    providers = []
    for p in tree.providers:
        held = {
            rc: Inventory.from_placement(record)
            for rc, record in previous.get(p.name, {}).items()
            if rc not in p.inventories
        }
        providers.append(replace(p, inventories={**p.inventories, **held}) if held else p)
    return ProviderTree(tuple(providers))


def applied_traits(configs: Sequence[ProviderConfig], tree: ProviderTree) -> dict[str, set[str]]:
    """What :func:`apply_provider_configs` adds, by provider name: the value to
    remember and pass as ``previously_applied`` next cycle."""
    return {
        p.name: set(config.traits)
        for i, p in enumerate(tree.providers)
        for config in [config_for(p, i == 0, configs)]
        if config and config.traits
    }
