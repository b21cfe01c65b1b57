"""The session gauges of :class:`~projections.metrics.MetricsFold` (issue 16):
``duplex_ledger:sessions_admitted`` (opened, not closed), ``sessions_cleanup_pending`` (closed,
but the resources fold still holds something of it: a failed close cleanup keeps the slot
pending, not closed) and ``sessions_closed_total{reason}`` (+1 when a closed session holds
nothing any more). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from projections.metrics_rollup import SessionTally
from projections.metrics_sinks import MetricsSink


def holds_slot(resources: Any) -> bool:
    """Does a session (``projections.resources.SessionResources``) still hold engine work: a
    binding, an abort in flight or failed, or an id whose keys were dropped and whose cleanup
    was not yet acknowledged (close drops the keys before it asks for the abort, R1)?"""
    if resources.holds_anything():
        return True
    return any(
        life.submitted
        and not life.cleanup_ok
        and life.keys_dropped_at is not None
        and not (0 in life.finished_stages and not life.abort_failed and not life.abort_pending)
        for life in resources.lives.values()
    )


class SessionGauges:
    """Admitted and cleanup-pending sessions (``admitted``, ``cleanup_pending``) on one
    :class:`MetricsSink`, and the closed sessions that settled, by reason."""

    __slots__ = ("sink", "admitted", "cleanup_pending")

    def __init__(self, sink: MetricsSink) -> None:
        self.sink = sink
        self.admitted = 0
        self.cleanup_pending = 0
        sink.set("duplex_ledger:sessions_admitted", (), 0)
        sink.set("duplex_ledger:sessions_cleanup_pending", (), 0)

    def opened(self, previous: SessionTally) -> None:
        """A ``SessionOpened`` after ``previous`` (the session's earlier incarnation, or a fresh
        record): a session reopened without a close in the log leaves its old slot."""
        if previous.admitted:
            self.admitted -= 1
        self.admitted += 1
        self.sink.set("duplex_ledger:sessions_admitted", (), self.admitted)

    def closed(self, s: SessionTally, reason: str) -> None:
        """A ``SessionClosed`` of ``s``: its slot is no longer admitted; it is pending until
        :meth:`settle` finds it holds nothing."""
        if s.admitted:
            s.admitted = False
            self.admitted -= 1
            self.sink.set("duplex_ledger:sessions_admitted", (), self.admitted)
        if s.close_reason is None:
            self.cleanup_pending += 1
            self.sink.set("duplex_ledger:sessions_cleanup_pending", (), self.cleanup_pending)
        s.close_reason = reason

    def settle(self, s: SessionTally, held: Any) -> None:
        """A closed session ``s`` whose resources (``held``: ``SessionResources`` or None) hold
        nothing any more frees its slot."""
        if held is not None and holds_slot(held):
            return
        self.sink.inc("duplex_ledger:sessions_closed_total", (s.close_reason or "",), 1)
        s.close_reason = None
        self.cleanup_pending -= 1
        self.sink.set("duplex_ledger:sessions_cleanup_pending", (), self.cleanup_pending)
