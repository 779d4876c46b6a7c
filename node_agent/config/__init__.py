"""oslo.config options, config-file loading and the frozen Settings the core receives."""
