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

Only ``CUSTOM_`` classes and traits are accepted. ``$COMPUTE_NODE`` means
the root provider; an entry naming the same provider explicitly replaces
the ``$COMPUTE_NODE`` entry for it, as in nova. Schema versions 1.x are
read; keys unknown to 1.0 are refused in 1.0 documents and ignored in later
minor versions, whose additions this agent does not know.

Parsing is pure (text in, records out) and reports every problem with the
file and the path inside the document
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
import uuid as uuid_mod
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence, Set

import yaml

from node_agent.errors import ConfigError
from node_agent.model.hugepages import PAGE_CLASS_PREFIX
from node_agent.model.provider_tree import Inventory, Provider, ProviderTree

COMPUTE_NODE = "$COMPUTE_NODE"
_CUSTOM = re.compile(r"^CUSTOM_[A-Z0-9_]+$")
# Placement's limits: trait and class names 255 characters, provider names 200.
_MAX_CUSTOM = 255
_MAX_NAME = 200
_VERSION = re.compile(r"^1\.(\d+)$")
# Classes the agent reports itself on some provider, refused wherever they appear.
_AGENT_PREFIXES = (PAGE_CLASS_PREFIX,)
# Placement stores inventory fields as 32-bit signed integers.
_PLACEMENT_MAX_INT = 2 ** 31 - 1
_INT_FIELDS = {"total": 1, "reserved": 0, "min_unit": 1, "max_unit": 1, "step_size": 1}


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


class _Problems:
    def __init__(self, source: str):
        self.source = source
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        where = f"{self.source}: {path}" if path else self.source
        self.items.append(f"{where}: {message}")


def _mapping(value: Any, path: str, problems: _Problems, allowed: Sequence[str],
             strict: bool) -> Optional[dict]:
    if not isinstance(value, dict):
        problems.add(path, f"must be a mapping, not {type(value).__name__}")
        return None
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown and strict:
        problems.add(path, f"unknown key(s) {', '.join(unknown)} (allowed: "
                           f"{', '.join(allowed)})")
    return value


def _identification(value: Any, path: str, problems: _Problems, strict: bool) -> dict:
    ident = _mapping(value, path, problems, ("name", "uuid"), strict)
    if ident is None:
        return {}
    given = [k for k in ("name", "uuid") if k in ident]
    if len(given) != 1:
        problems.add(path, "give exactly one of name or uuid")
        return {}
    key = given[0]
    text = ident[key]
    if not isinstance(text, str) or not text.strip():
        problems.add(f"{path}.{key}", "must be a non-empty string")
        return {}
    if text == COMPUTE_NODE:
        # nova accepts the sentinel under name too (its own
        # example_provider.yaml writes name: $COMPUTE_NODE).
        return {"compute_node": True}
    if key == "name":
        if len(text) > _MAX_NAME:
            problems.add(f"{path}.name", f"is {len(text)} characters long; Placement "
                                         f"takes at most {_MAX_NAME}")
            return {}
        return {"name": text}
    try:
        return {"uuid": str(uuid_mod.UUID(text))}
    except ValueError:
        problems.add(f"{path}.uuid", f"'{text}' is neither a uuid nor {COMPUTE_NODE}")
        return {}


def _custom_name(name: Any, path: str, what: str, problems: _Problems) -> bool:
    if not isinstance(name, str) or not _CUSTOM.match(name):
        problems.add(path, f"{what} '{name}' must be CUSTOM_ followed by A-Z, 0-9 "
                           "and _ (standard ones are the agent's to report)")
        return False
    if len(name) > _MAX_CUSTOM:
        problems.add(path, f"{what} {name[:40]}... is {len(name)} characters long; "
                           f"Placement takes at most {_MAX_CUSTOM}. Shorten it.")
        return False
    if what == "resource class" and name.startswith(_AGENT_PREFIXES):
        problems.add(path, f"{name} is a class the agent reports itself")
        return False
    return True


def _inventory(value: Any, path: str, problems: _Problems, strict: bool
               ) -> Optional[Inventory]:
    allowed = tuple(_INT_FIELDS) + ("allocation_ratio",)
    data = _mapping(value, path, problems, allowed, strict)
    if data is None:
        return None
    if "total" not in data:
        problems.add(f"{path}.total", "is required")
        return None
    ok = True
    for key, minimum in _INT_FIELDS.items():
        v = data.get(key)
        if key in data and (not isinstance(v, int) or isinstance(v, bool) or v < minimum):
            problems.add(f"{path}.{key}", f"{v!r} must be a whole number >= {minimum}")
            ok = False
        elif v is not None and v > _PLACEMENT_MAX_INT:
            problems.add(f"{path}.{key}", f"{v!r} is above Placement's limit "
                                          f"{_PLACEMENT_MAX_INT}")
            ok = False
    ratio = data.get("allocation_ratio", 1.0)
    if (isinstance(ratio, bool) or not isinstance(ratio, (int, float))
            or not math.isfinite(ratio) or ratio <= 0):
        problems.add(f"{path}.allocation_ratio", f"{ratio!r} must be a number > 0")
        ok = False
    if not ok:
        return None
    inv = Inventory(total=data["total"], reserved=data.get("reserved", 0),
                    min_unit=data.get("min_unit", 1), max_unit=data.get("max_unit"),
                    step_size=data.get("step_size", 1), allocation_ratio=float(ratio))
    if inv.reserved > inv.total:
        problems.add(f"{path}.reserved", f"{inv.reserved} is above total {inv.total}")
        return None
    if inv.max_unit is not None and inv.min_unit > inv.max_unit:
        problems.add(f"{path}.min_unit", f"{inv.min_unit} is above max_unit {inv.max_unit}")
        return None
    return inv


def _additional(section: Any, path: str, problems: _Problems, strict: bool) -> list:
    data = _mapping(section, path, problems, ("additional",), strict)
    if data is None:
        return []
    items = data.get("additional", [])
    if not isinstance(items, list):
        problems.add(f"{path}.additional", "must be a list")
        return []
    return items


def _inventories(section: Any, path: str, problems: _Problems, strict: bool
                 ) -> dict[str, Inventory]:
    found: dict[str, Inventory] = {}
    for i, item in enumerate(_additional(section, path, problems, strict)):
        item_path = f"{path}.additional[{i}]"
        if not isinstance(item, dict) or len(item) != 1:
            problems.add(item_path, "must be a mapping of one resource class to its inventory")
            continue
        (rc, value), = item.items()
        if not _custom_name(rc, f"{item_path}.{rc}", "resource class", problems):
            continue
        if rc in found:
            problems.add(f"{item_path}.{rc}", "is listed twice")
            continue
        inv = _inventory(value, f"{item_path}.{rc}", problems, strict)
        if inv is not None:
            found[rc] = inv
    return found


def _traits(section: Any, path: str, problems: _Problems, strict: bool) -> frozenset[str]:
    found = set()
    for i, trait in enumerate(_additional(section, path, problems, strict)):
        if _custom_name(trait, f"{path}.additional[{i}]", "trait", problems):
            found.add(trait)
    return frozenset(found)


def _provider(value: Any, path: str, source: str, problems: _Problems,
              strict: bool) -> Optional[ProviderConfig]:
    entry = _mapping(value, path, problems, ("identification", "inventories", "traits"),
                     strict)
    if entry is None:
        return None
    if "identification" not in entry:
        problems.add(f"{path}.identification", "is required")
        return None
    ident = _identification(entry["identification"], f"{path}.identification",
                            problems, strict)
    inventories = _inventories(entry.get("inventories", {}), f"{path}.inventories",
                               problems, strict)
    traits = _traits(entry.get("traits", {}), f"{path}.traits", problems, strict)
    if not ident:
        return None
    return ProviderConfig(source=f"{source} {path}", inventories=inventories,
                          traits=traits, **ident)


def parse_provider_config(text: str, source: str) -> tuple[ProviderConfig, ...]:
    """One YAML document. Raises ConfigError listing every problem."""
    problems = _Problems(source)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        problems.add(where, f"not valid YAML: {getattr(exc, 'problem', None) or exc}")
        raise ConfigError(problems.items)
    doc = _mapping(doc, "", problems, ("meta", "providers"), False)
    if doc is None:
        raise ConfigError(problems.items)
    meta = doc.get("meta")
    version = meta.get("schema_version") if isinstance(meta, dict) else None
    match = _VERSION.match(str(version)) if isinstance(version, (str, float)) else None
    if match is None:
        problems.add("meta.schema_version", f"{version!r} is not a supported version; "
                                            "write schema_version: '1.0'")
        raise ConfigError(problems.items)
    strict = match.group(1) == "0"
    if strict:
        _mapping(doc, "", problems, ("meta", "providers"), True)
    providers = doc.get("providers", [])
    if not isinstance(providers, list):
        problems.add("providers", "must be a list")
        raise ConfigError(problems.items)
    found = [_provider(p, f"providers[{i}]", source, problems, strict)
             for i, p in enumerate(providers)]
    if problems.items:
        raise ConfigError(problems.items)
    return tuple(p for p in found if p is not None)


def check_unique(configs: Sequence[ProviderConfig]) -> None:
    """A provider may be identified once across all files (nova refuses too)."""
    seen: dict[str, str] = {}
    problems = []
    for config in configs:
        key = config.identity
        if key in seen:
            problems.append(f"{config.source}: identification {key} is already used by "
                            f"{seen[key]}. Merge the two entries.")
        seen.setdefault(key, config.source)
    if problems:
        raise ConfigError(problems)


def config_for(provider: Provider, is_root: bool,
               configs: Sequence[ProviderConfig]) -> Optional[ProviderConfig]:
    """The explicit entry naming ``provider``, else $COMPUTE_NODE for the root.
    An explicit entry without inventories or traits does not hide $COMPUTE_NODE.
    Two entries reaching one provider (by name and by uuid) are a ConfigError,
    as nova's ``_merge_provider_configs`` refuses them."""
    named = [config for config in configs
             if ((config.name is not None and config.name == provider.name)
                 or (config.uuid is not None and config.uuid == provider.uuid))
             and (config.inventories or config.traits)]
    if len(named) > 1:
        raise ConfigError(
            f"{named[1].source} and {named[0].source} both name provider "
            f"'{provider.name}' ({provider.uuid or 'uuid not known yet'}), by "
            f"{'name' if named[0].name else 'uuid'} and by "
            f"{'name' if named[1].name else 'uuid'}. Merge the two entries into one.")
    if named:
        return named[0]
    if is_root:
        return next((c for c in configs if c.compute_node), None)
    return None


def unmatched(tree: ProviderTree, configs: Sequence[ProviderConfig]) -> list[ProviderConfig]:
    """Entries naming no provider of the tree (foreign, or uuid not yet known)."""
    return [c for c in configs if not c.compute_node
            and tree.by_name(c.name or "") is None
            and not any(p.uuid == c.uuid for p in tree.providers if c.uuid)]


def _apply_one(provider: Provider, config: Optional[ProviderConfig],
               previous: Set[str]) -> Provider:
    wanted = config.traits if config else frozenset()
    inventories = dict(provider.inventories)
    traits = dict(provider.traits)
    problems = []
    if config:
        for rc, inv in config.inventories.items():
            if rc in inventories:
                problems.append(f"{config.source}: {rc} on provider '{provider.name}' is a "
                                "class the agent reports itself. Remove it from the file.")
            inventories[rc] = inv
        for trait in wanted:
            if trait in traits:
                problems.append(f"{config.source}: trait {trait} on provider "
                                f"'{provider.name}' is one the agent decides itself. "
                                "Remove it from the file.")
    if problems:
        raise ConfigError(problems)
    for trait in set(previous) - wanted:
        traits.setdefault(trait, False)
    traits.update({trait: True for trait in wanted})
    return replace(provider, inventories=inventories, traits=traits)


def apply_provider_configs(tree: ProviderTree, configs: Sequence[ProviderConfig],
                           previously_applied: Mapping[str, Set[str]]) -> ProviderTree:
    """The tree with the operator's inventories and traits added.

    ``previously_applied``: provider name -> traits the files set last
    time; those no longer in the files become False (removed). Raises
    ConfigError when a file adds a class or trait the agent manages there.
    """
    if not configs and not previously_applied:
        return tree
    providers = tuple(
        _apply_one(p, config_for(p, i == 0, configs), previously_applied.get(p.name, set()))
        for i, p in enumerate(tree.providers))
    return ProviderTree(providers)


def file_added_traits(listed: Mapping[str, Sequence[str]],
                      previous: Mapping[str, Sequence[str]],
                      before: Mapping[str, Set[str]]) -> dict[str, list[str]]:
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
        kept = sorted(t for t in traits
                      if t in previous.get(name, ()) or t not in had)
        if kept:
            out[name] = kept
    return out


def applied_traits(configs: Sequence[ProviderConfig], tree: ProviderTree
                   ) -> dict[str, set[str]]:
    """What :func:`apply_provider_configs` adds, by provider name: the value to
    remember and pass as ``previously_applied`` next cycle."""
    return {p.name: set(config.traits)
            for i, p in enumerate(tree.providers)
            for config in [config_for(p, i == 0, configs)] if config and config.traits}
