"""How long the controller waits before it tries again what failed: a batch's fold (`commit`), a
deadline's re-arm (`deadlines`), a child's index write (`children`, `indexwriter`)."""

from __future__ import annotations

__all__ = ["MAX_RETRY_DELAY_S", "RETRY_DELAY_S", "retry_delay"]

RETRY_DELAY_S = 1.0
MAX_RETRY_DELAY_S = 30.0


def retry_delay(attempt: int) -> float:
    """How long the controller waits before it tries again what failed `attempt` times in a row: 1 s after
    the first attempt, doubling to at most 30 s. A cause that lasts (a bucket deleted, a bug) costs one
    attempt and one log line every 30 s, not every second; a brief one (NATS failing over) is retried
    soon."""
    return min(MAX_RETRY_DELAY_S, RETRY_DELAY_S * 2.0 ** max(0, attempt - 1))
