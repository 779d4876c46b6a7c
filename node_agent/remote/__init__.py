"""The message bus: notifications and control RPC, the agent's upstream sender and wire format, the central applier."""
