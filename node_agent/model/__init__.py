"""Pure data: the host snapshot, the provider tree, CPU sets, huge-page classes, PCI device specs. Reads nothing."""
