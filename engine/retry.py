"""Backoff for the engine's retrying loops.

A loop that fails (the metadata database is gone, say) retries after a delay that doubles
with every failure in a row, up to a cap, so that an outage is said clearly a few times
rather than twenty times a second, and work resumes within the cap once it is over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

RETRY_MAX_S: Final = 5.0


@dataclass(slots=True)
class Backoff:
    """Failures in a row of one loop, and the delay before its next try."""

    base_s: float
    max_s: float = RETRY_MAX_S
    failures: int = 0

    def failed(self) -> float:
        """Count one more failure in a row; returns the delay before the next try."""
        self.failures += 1
        return float(min(self.base_s * 2**self.failures, self.max_s))

    def succeeded(self) -> int:
        """Reset; returns how many failures in a row this success ends."""
        failures, self.failures = self.failures, 0
        return failures
