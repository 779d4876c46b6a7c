"""Pure decisions: CPU partition, maintenance, operator provider files, the capacity invariant."""
