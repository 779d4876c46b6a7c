"""The long-running agent: the loop, signals and sd_notify, the daemon wiring, metrics."""
