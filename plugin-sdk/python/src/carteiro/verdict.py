"""What a handler decided about its message: :class:`Verdict`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

Kind = Literal["ack", "retry", "dead_letter"]


@dataclass(frozen=True)
class Verdict:
    """The handler's decision. Build one with :meth:`ack`, :meth:`retry` or :meth:`dead_letter`.

    The host acts on it: effects (kv writes, events) commit only on ack.
    """

    kind: Kind
    #: Why (retry and dead-letter); ``None`` for ack.
    reason: str | None = None
    #: Retry no sooner than this many milliseconds; ``None`` uses the route's backoff.
    delay_ms: int | None = None

    @classmethod
    def ack(cls) -> Verdict:
        """Done: commit this message's kv writes and events, then ack the delivery."""
        return cls("ack")

    @classmethod
    def retry(cls, reason: str, delay: float | timedelta | None = None) -> Verdict:
        """Transient failure: discard the effects and try again later.

        ``delay`` (seconds, or a :class:`~datetime.timedelta`) asks for at least that long a
        wait; the host picks the smallest configured backoff tier that is long enough.
        """
        if delay is None:
            return cls("retry", str(reason))
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"retry delay must be a finite, non-negative time, not {delay!r}")
        return cls("retry", str(reason), math.ceil(seconds * 1000))

    @classmethod
    def dead_letter(cls, reason: str) -> Verdict:
        """Permanent failure: discard the effects and move the message to the dead-letter queue."""
        return cls("dead_letter", str(reason))

    @property
    def is_ack(self) -> bool:
        """True for an ack."""
        return self.kind == "ack"

    @property
    def is_retry(self) -> bool:
        """True for a retry."""
        return self.kind == "retry"

    @property
    def is_dead_letter(self) -> bool:
        """True for a dead-letter."""
        return self.kind == "dead_letter"

    @property
    def delay(self) -> timedelta | None:
        """The requested retry delay, if any."""
        return None if self.delay_ms is None else timedelta(milliseconds=self.delay_ms)

    def __repr__(self) -> str:
        if self.kind == "ack":
            return "Verdict.ack()"
        if self.kind == "dead_letter":
            return f"Verdict.dead_letter({self.reason!r})"
        if self.delay_ms is None:
            return f"Verdict.retry({self.reason!r})"
        return f"Verdict.retry({self.reason!r}, delay={self.delay_ms / 1000!r})"
