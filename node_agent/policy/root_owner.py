"""Who manages a root provider, and whether this agent may write it. Pure.

A compute node's root provider has one writer. nova-compute marks every
provider it manages with os-traits' ``OWNER_NOVA`` (nova's scheduler asks
for it); two writers of one provider would overwrite each other's inventory
every cycle. The same happens when two machines are configured with one
``host`` name (a cloned image, a copied config).

node-agent marks the root it manages with one trait in the same ``OWNER_*``
namespace, as a custom trait (os-traits reserves its own names):
``CUSTOM_OWNER_NODE_AGENT_<ID>``. ``<ID>`` identifies the machine: an
HMAC-SHA256 of ``/etc/machine-id`` with this module's key, cut to 128 bits.
machine-id(5) asks that the id itself not be published; a keyed hash is what
systemd's ``sd_id128_get_machine_app_specific`` does for the same reason. A
trait is kept by Placement with the provider, listed by
``openstack resource provider trait list``, and changes the provider's
generation, so a writer that raced us learns it at its next write.

:func:`judge` decides from the root's traits as Placement holds them:

* no root yet, or a root with our mark: ours, write it (and mark it);
* a root without any owner mark (made by an older node-agent, or by hand)
  and named as this host: adopt it and mark it;
* a root without any owner mark that the state file names under another
  name (a state file copied from another host, a cloned image): refused,
  since nothing says it is ours and renaming it would take another host's
  provider;
* ``OWNER_NOVA``: nova-compute's; refused;
* another machine's mark: refused.

The refusals hold unless the operator asks to take over
(``[agent] take_over_provider``): then our mark replaces another machine's.
``OWNER_NOVA`` is never removed: it is nova's trait and its scheduler relies
on it.

One machine has one root: when the state file does not name the root and
another root already carries this machine's mark (the host was renamed
while its state file was lost, or this machine is a clone that kept
/etc/machine-id), the agent creates nothing and says what to run
(:func:`second_root_refusal`). It does not rename that root itself: the
mark cannot tell a renamed host from a running clone, and renaming a
clone's root would take that machine's provider and allocations.

Creation races (two machines with one host name starting together) are
closed by the writer: it sets the mark with a compare-and-set on the
root's generation before any other write, and reads it back
(:mod:`node_agent.placement.tree_writer`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Optional

import os_traits

from node_agent.errors import ConfigError
from node_agent.model.provider_tree import ProviderTree

NOVA = os_traits.OWNER_NOVA
MARK_PREFIX = "CUSTOM_OWNER_NODE_AGENT_"
# Changing the key changes every machine's mark: every agent would then see
# its own root as another machine's. It is part of the mark's definition.
_KEY = b"node-agent root provider owner"
_MACHINE_ID = re.compile(r"^[0-9a-f]{32}$")

MINE, ABSENT, UNMARKED, OWNED_BY_NOVA, OTHER_MACHINE, NAMED_ELSEWHERE = (
    "mine",
    "absent",
    "unmarked",
    "nova",
    "other machine",
    "unmarked, another name",
)


def parse_machine_id(text: str, source: str) -> str:
    """The id in a machine-id file's text (32 lowercase hex digits, one line)."""
    value = text.strip()
    if not _MACHINE_ID.match(value):
        raise ConfigError(
            f"[agent] machine_id_path = {source}: {value[:40]!r} is not a machine id "
            "(32 hexadecimal digits, see machine-id(5)). Run "
            "`systemd-machine-id-setup`, or point machine_id_path at the right file."
        )
    return value


def mark_for(machine_id: str) -> str:
    """This machine's owner trait."""
    digest = hmac.new(_KEY, machine_id.encode("ascii"), hashlib.sha256).hexdigest()
    return MARK_PREFIX + digest[:32].upper()


def marks_in(traits: Iterable[str]) -> set[str]:
    return {t for t in traits if t.startswith(MARK_PREFIX)}


@dataclass(frozen=True)
class Identity:
    """Which mark is ours. ``mark`` None: a writer that cannot tell its
    machine (an agent too old to send one, on the applier); it adopts only
    unmarked roots and marks nothing."""

    mark: Optional[str]
    take_over: bool = False


@dataclass(frozen=True)
class Verdict:
    owner: str  # MINE, ABSENT, UNMARKED, OWNED_BY_NOVA, OTHER_MACHINE, NAMED_ELSEWHERE
    may_write: bool
    # The root's traits this agent decides on: its mark on, and with a take
    # over, the other machine's mark off.
    traits: Mapping[str, bool] = field(default_factory=dict)
    others: tuple[str, ...] = ()  # other machines' marks found


def judge(
    traits: Optional[Iterable[str]], identity: Identity, named_elsewhere: bool = False
) -> Verdict:
    """May this agent write the root whose traits are ``traits`` (None: no
    root in Placement yet)? ``named_elsewhere``: the root is the state
    file's, and Placement holds it under another name than this host's."""
    own = {identity.mark: True} if identity.mark else {}
    if traits is None:
        return Verdict(ABSENT, True, own)
    traits = set(traits)
    others = tuple(sorted(marks_in(traits) - {identity.mark}))
    if NOVA in traits:
        owner = OWNED_BY_NOVA
    elif others:
        owner = OTHER_MACHINE
    elif identity.mark and identity.mark in traits:
        return Verdict(MINE, True, own)
    elif named_elsewhere:
        owner = NAMED_ELSEWHERE
    else:
        return Verdict(UNMARKED, True, own)
    if identity.take_over and identity.mark:
        return Verdict(owner, True, {**own, **{m: False for m in others}}, others)
    return Verdict(owner, False, {}, others)


def refusal(
    verdict: Verdict, host: str, uuid: str, held_name: str = "", state_file: str = ""
) -> str:
    """Why the agent does not write ``host``'s root, and what to do
    (``held_name``: the name Placement holds the root under; ``state_file``:
    where the state file is, when it is one)."""
    if verdict.owner == NAMED_ELSEWHERE:
        return (
            f"the state file names provider {held_name} ({uuid}) as this host's root, but "
            f"it is not named {host} and carries no node-agent owner mark: it may be "
            "another host's (a state file copied with a cloned image or directory). "
            "Nothing was written. If it is another host's, remove this host's state file "
            f"({state_file or 'state.json in [DEFAULT] state_path'}) and run again: the "
            f"agent then finds or creates {host}. If it is this host's, renamed, set "
            "[agent] take_over_provider = true once"
        )
    if verdict.owner == OWNED_BY_NOVA:
        return (
            f"provider {host} ({uuid}) carries {NOVA}: nova-compute manages it, and two "
            "writers would overwrite each other's inventory. Nothing was written. On a "
            "nova host let nova-compute report it and run node-agent in companion mode "
            "([agent] mode = companion: it reads and reports, never writes). If nova-compute "
            "no longer runs here, remove OWNER_NOVA from the provider, or set [agent] "
            "take_over_provider = true"
        )
    return (
        f"provider {host} ({uuid}) is managed by node-agent on another machine (its "
        f"mark {', '.join(verdict.others)}; this machine's is different): two machines "
        "are configured with [DEFAULT] host = " + host + " (a cloned image?). Nothing "
        "was written. Give this machine its own host name; if the other machine is "
        "gone (this one replaces it), set [agent] take_over_provider = true once"
    )


def second_root_refusal(
    host: str, marked: Iterable[tuple[str, str]], mark: str, existing: Optional[str] = None
) -> str:
    """Why the agent does not create or write ``host``'s root when other
    roots (``marked``: (name, uuid)) carry this machine's ``mark``, and what
    to run. ``existing``: the uuid of a root already named ``host``."""
    marked = sorted(marked)
    names = ", ".join(f"{name} ({uuid})" for name, uuid in marked)
    name, uuid = marked[0]
    if existing is None:
        fix = (
            f"If this host was renamed from {name}, rename its provider so that its "
            f"allocations stay: `openstack resource provider set --name {host} {uuid}`, "
            "then run the agent again."
        )
    else:
        fix = (
            f"If this host was renamed from {name}, its old root is published beside "
            f"{host} ({existing}): once nothing is allocated on it, delete it "
            f"(`openstack resource provider delete {uuid}`) and run the agent again."
        )
    return (
        f"this machine's owner mark {mark} is already on root provider {names}, and the "
        f"state file does not say which root is {host}'s: publishing {host} too would "
        f"count this machine twice. Nothing was written. {fix} If {name} is another "
        "machine cloned from this one (same /etc/machine-id), give this machine its own "
        "id instead: `rm /etc/machine-id && systemd-machine-id-setup`"
    )


def claimed(tree: ProviderTree, verdict: Verdict) -> ProviderTree:
    """``tree`` with the root's owner traits as ``verdict`` decides."""
    if not verdict.traits:
        return tree
    root = tree.root
    return ProviderTree(
        (replace(root, traits={**root.traits, **verdict.traits}),) + tree.providers[1:]
    )


def identity_of_tree(tree: ProviderTree) -> Identity:
    """The identity an agent sent with its tree (its mark among the root's
    wanted traits), for the central applier."""
    marks = sorted(marks_in(tree.root.wanted_traits))
    return Identity(marks[0] if len(marks) == 1 else None)


def marked(tree: ProviderTree, identity: Identity) -> ProviderTree:
    """``tree`` with this machine's mark on the root (what an agent sends to
    the central applier, which judges it there)."""
    return claimed(tree, judge(None, identity))


def unschedulable_by_nova(root_name: str, nova_roots: int) -> Optional[str]:
    """What owner mode must say when ``nova_roots`` providers of this
    Placement carry ``OWNER_NOVA``: nova-compute 34 reports it, and once every
    nova-compute runs at service version 73 or later nova's scheduler adds
    ``root_required=OWNER_NOVA`` to every request (``owner_nova_filter``, no
    option turns it off), so it never picks a root the agent writes. The
    agent does not add the trait: it would make two writers of one provider."""
    if nova_roots <= 0:
        return None
    return (
        f"nova-compute manages {nova_roots} provider(s) in this Placement "
        f"(OWNER_NOVA): a nova 34 scheduler requires OWNER_NOVA on the root "
        f"(owner_nova_filter), so it will not schedule onto {root_name}, which this "
        "agent writes. On a nova cloud run the agent beside nova-compute in "
        "companion mode ([agent] mode = companion); owner mode is for Placement "
        "consumers other than nova"
    )
