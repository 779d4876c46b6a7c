"""node-agent: a compute-node agent that reports the host to OpenStack Placement."""

__version__ = "0.1.0"
