"""Developer tools, not shipped: an embedded Placement for tests and the make-run demo."""
