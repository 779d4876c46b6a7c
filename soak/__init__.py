"""``make soak``: the real agent service run for thousands of cycles while
its host, its configuration and the scheduler's allocations change at
random; Placement is checked against an independent model after every
cycle. See :mod:`soak.run`.
"""
