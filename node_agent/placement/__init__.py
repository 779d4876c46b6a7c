"""Talking to Placement: the HTTP gateway, microversions, the sync planner and syncer, the reshape engine (pure) and the reshaper shell."""
