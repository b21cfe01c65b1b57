"""Taking over one session whose owner is dead (crash recovery, issue 14; DOMAIN §4.2 R7): the
I/O shell around :func:`decider.recovery.plan_recovery`.

:func:`take_over_session` re-reads the session's stream, checks it still belongs to the dead
owner it was judged by, and then:

1. an open session: writes ``SessionTakenOver`` (new owner, previous owner) and
   ``SessionClosed(recovered_after_crash)`` durably, as
   :func:`~decider.recovery.plan_takeover` says, at the stream version just read: from
   then on the old owner's appends (at an older version) are refused (fencing by
   ``expected_version``). A stream that moved meanwhile (the old owner wrote once more, or
   another replica took it first: :class:`StreamTakenOver`) raises nothing: it is re-read and
   judged again;
2. asks the engines which ids run on them, has the pure recovery rules plan what becomes of
   every id still held and every abort left unanswered, and hands the plan to the cleanup
   executor (:func:`engine_bridge.cleanup.execute_recovery`). It decides nothing itself.

A session that is already closed but still holds ids (a failed close cleanup) gets step 2 only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from decider.recovery import plan_recovery, plan_takeover
from engine_bridge.cleanup import RecoveryOutcome, execute_recovery
from engine_bridge.messages import StreamTakenOver
from engine_bridge.ports import StagePort
from engine_bridge.session_log import FlushTicker, SessionLog, SessionLogBroken
from events.records import StoredEvent
from events.store.errors import ConcurrencyError
from events.store.owners import Owner, lifecycle_of
from events.store.store import EventStore
from projections.projector import Projector


@dataclass
class RecoveryReport:
    """What recovery (at start, or a periodic takeover scan) found and did.
    ``taken_over``: (session, previous owner); ``skipped``: (session, live owner) — sessions of
    live replicas, left alone."""

    closed_sessions: list[str] = field(default_factory=list)
    aborted: list[tuple[str, str]] = field(default_factory=list)  # (session, request_id)
    lost: list[tuple[str, int, str]] = field(default_factory=list)  # (session, stage, request_id)
    failed: list[str] = field(default_factory=list)
    taken_over: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


async def take_over_session(
    store: EventStore,
    ports: Sequence[StagePort],
    session_id: str,
    *,
    me: Owner,
    judge: Callable[[Owner], str | None],
    shared: Callable[[Owner], bool],
    ticker: FlushTicker,
    report: RecoveryReport,
    attempts: int = 5,
    on_applied: Callable[[StoredEvent], None] | None = None,
) -> bool:
    """Take over ``session_id`` (see the module doc). ``judge(owner)``: why that owner is dead
    (``SessionTakenOver.detected``), or None when it is alive — then nothing is written and
    False is returned (also when the session holds nothing to do). ``shared(owner)``: whether
    the owner's engines are this replica's too. Raises :class:`StreamTakenOver` when the stream
    kept moving for ``attempts`` reads. ``on_applied``: fed every event written (the
    engine's Prometheus fold, issue 16)."""
    for _ in range(attempts):
        history = await store.read_stream(session_id)
        life = lifecycle_of(session_id, (e.event for e in history))
        if life is None:
            return False
        detected = judge(life.owner)
        if detected is None:
            report.skipped.append((session_id, str(life.owner)))
            return False
        projector = Projector(live=True).apply_all(history)
        closing = plan_takeover(
            projector.session_resources(session_id),
            session_id,
            session_open=life.open,
            replica_id=me.replica_id or "?",
            replica_incarnation=me.incarnation or 0,
            previous_replica_id=life.owner.replica_id,
            previous_incarnation=life.owner.incarnation,
            detected=detected,
            ts=time.time(),
        )
        if closing is None:  # closed, holding nothing (no key, no abort unanswered)
            return False
        log = SessionLog(store, session_id, len(history), projector=projector, ticker=ticker, on_applied=on_applied)
        try:
            if closing:
                await execute_recovery(log, ports, closing)
                report.closed_sessions.append(session_id)
                report.taken_over.append((session_id, str(life.owner)))
            await _clean(log, ports, shared(life.owner), report)
            await log.close()
        except StreamTakenOver:
            continue  # the stream moved between our read and our append: judge it again
        except SessionLogBroken as exc:
            if not isinstance(exc.__cause__, ConcurrencyError):
                raise
            continue  # refused at a background flush: the log refuses further events; judge again
        return True
    raise StreamTakenOver(f"stream kept moving during takeover ({attempts} tries)", session_id=session_id)


async def _clean(log: SessionLog, ports: Sequence[StagePort], shared: bool, report: RecoveryReport) -> None:
    """Gather the inputs (the fold, the ids live on the engines), plan, execute, report."""
    sid = log.session_id
    live: set[str] = set().union(*(port.live_request_ids() for port in ports)) if ports else set()
    steps = plan_recovery(log.projector.session_resources(sid), live, shared, ts=time.time())
    done: RecoveryOutcome = await execute_recovery(log, ports, steps)
    report.aborted.extend((sid, request_id) for request_id in done.aborted)
    report.lost.extend((sid, stage_id, request_id) for stage_id, request_id in done.lost)
    report.failed.extend(done.failed)
