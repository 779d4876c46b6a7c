"""Pure: the desired provider tree (root, NUMA, GPU, SR-IOV, CPU traits) from a snapshot, a partition and settings."""
