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

import json
import logging

from node_agent.state import PROVIDER_CACHE as CACHE_KEY

LOG = logging.getLogger(__name__)


def restore(syncer) -> bool:
    """Give ``syncer`` the cache the last run kept; its first read verifies
    it. False (the tree is read) when there is none."""
    syncer.cache_seen = _text(syncer.state.get(CACHE_KEY))
    return syncer.import_cache(syncer.state.get(CACHE_KEY), verify_now=True)


def follow(syncer) -> bool:
    """Take the state file's state and cache when another run of this host
    kept a cache there since ``syncer`` kept its own (``sudo node-agent
    --once`` beside the service, which changed Placement behind this
    syncer's cache); the first read verifies it. True when followed.

    Between full verifications a cycle believes its cache: without this, a
    maintenance the command ended kept the service closing the tree and
    refusing reshapes until its next verify. A missing file is not
    followed: this syncer's next write makes it again."""
    saved = syncer.store.load_or_empty(LOG)
    # Against the cache this syncer (or the one it carries over from) last
    # kept or took, not the state it read when it was made: a reload's
    # syncer reads the file then, after the other run.
    found = _text(saved.get(CACHE_KEY))
    if not saved or found == syncer.cache_seen:
        return False
    LOG.info(
        "another run of this host wrote Placement and %s since this process's "
        "last cycle; this cycle reads Placement's changes first",
        getattr(syncer.store, "path", "the state file"),
    )
    syncer.follow_state(saved)
    syncer.cache_seen = found
    syncer.import_cache(saved.get(CACHE_KEY), verify_now=True)
    return True


def _text(cache) -> str:
    # As the file holds it: through JSON (ours may hold tuples), keys sorted.
    return json.dumps(cache, sort_keys=True)


def carry_over(old, new) -> bool:
    """``new`` (a reload's syncer, same host and state file) takes ``old``'s
    cache as it is, full-verify schedule included: same process, same clock."""
    new.cache_seen = old.cache_seen
    return new.import_cache(old.export_cache())


def keep(syncer) -> None:
    """Save the syncer's cache in its state file when it changed (a write or
    a full verify); a cache left suspect by a failed sync is saved as none."""
    cache = syncer.export_cache()
    syncer.remember(CACHE_KEY, cache)
    syncer.cache_seen = _text(cache)
