"""node-agent: a compute-node agent that reports the host to OpenStack Placement."""

from node_agent import deferred_imports

__version__ = "0.1.0"

deferred_imports.defer(*deferred_imports.DEFERRED)
