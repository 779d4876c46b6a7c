"""The syncer's cache kept in the state file, so that a new syncer (a
restart, ``--once``, a SIGHUP's reload) starts from what the last one saw.

Without it a new process reads the whole tree (the listing, then each
provider's inventories and traits) before anything else, and a reshape
after a config change paid that on top of its own reads. With it, the first
read is a verify: the listing, then only the providers whose generation
moved since the cache was kept. The cache is a hint, never the reference:
Placement's generations decide what is read again.
"""

from __future__ import annotations

from node_agent.state import PROVIDER_CACHE as CACHE_KEY


def restore(syncer) -> bool:
    """Give ``syncer`` the cache the last run kept; its first read verifies
    it. False (the tree is read) when there is none."""
    return syncer.import_cache(syncer.state.get(CACHE_KEY), verify_now=True)


def carry_over(old, new) -> bool:
    """``new`` (a reload's syncer, same host and state file) takes ``old``'s
    cache as it is, full-verify schedule included: same process, same clock."""
    return new.import_cache(old.export_cache())


def keep(syncer) -> None:
    """Save the syncer's cache in its state file when it changed (a write or
    a full verify); a cache left suspect by a failed sync is saved as none."""
    syncer.remember(CACHE_KEY, syncer.export_cache())
