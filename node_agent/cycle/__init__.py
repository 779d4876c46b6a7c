"""One cycle: the desired tree from the host (desired), then Placement brought to it (reconcile)."""
