"""``node-agent-applier``, on a control node: applies the trees agents
with ``[agent] upstream = messaging`` send (:mod:`node_agent.applier.applier`),
and serves its metrics (:mod:`node_agent.applier.metrics`).

A shell of its own, above the bus (:mod:`node_agent.remote`) and the cycle
(:mod:`node_agent.cycle`) it uses; neither the agent's service nor the bus
imports it.
"""
