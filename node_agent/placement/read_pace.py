"""How many reads the agent keeps in flight against Placement at once.

A fixed number is wrong both ways: a Placement with many workers answers
more reads at once than 8, a small one on two busy cores answers them no
faster and only queues them. The limit grows by one after each round of
answers whose latency holds (within ``tolerance`` of the best seen), eases
by one when latency grows past it, and halves on a 5xx or a timeout: the
additive-increase, multiplicative-decrease rule TCP uses for the same
question. Pure: the caller measures and reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ReadPace:
    limit: int = 4
    floor: int = 1
    ceiling: int = 32
    tolerance: float = 1.5
    best: float = field(default=float("inf"))
    _held: int = 0  # answers within tolerance since the limit last moved

    def answered(self, latency: float) -> None:
        """A read answered in ``latency`` seconds."""
        self.best = min(self.best, latency)
        if latency <= self.best * self.tolerance:
            self._held += 1
            if self._held >= self.limit:  # a whole round held: one more
                self.limit = min(self.ceiling, self.limit + 1)
                self._held = 0
        else:
            self.limit = max(self.floor, self.limit - 1)
            self._held = 0

    def overloaded(self) -> None:
        """A 5xx or a timeout: Placement is past what it sustains."""
        self.limit = max(self.floor, self.limit // 2)
        self._held = 0
