"""Reads the machine: the sysfs and libvirt gateways, and the pure parsers of what they return; discover() builds the HostSnapshot."""
