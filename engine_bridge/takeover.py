"""Taking over one session whose owner is dead (crash recovery, issue 14; DOMAIN §4.2 R7).

:func:`take_over_session` re-reads the session's stream, checks it still belongs to the dead
owner it was judged by, and then, written ahead of any engine call:

1. ``SessionTakenOver`` (new owner, previous owner) and ``SessionClosed(recovered_after_crash)``
   — durably, at the stream version just read: from then on the old owner's appends (at an
   older version) are refused (fencing by ``expected_version``). A stream that moved meanwhile
   (the old owner wrote once more, or another replica took it first) raises nothing: it is
   re-read and judged again;
2. every id it still holds: aborted on every pool when it runs on one of this replica's
   engines or the dead owner's engines are shared with this replica (``shared``); else
   ``StageRequestLost`` (a submitted id: its engines died with its replica) or
   ``StageRequestReleased`` (a reserved id) with cause ``recovered_after_crash``;
3. an abort the dead owner logged but never saw answered is answered the same way: sent again
   and ``AbortResult`` per pending pool, or ``StageRequestLost`` per pending pool.

A session that is already closed but still holds ids (a failed close cleanup) gets step 2 only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine_bridge.cleanup import CleanupFailed, cleanup_id
from engine_bridge.messages import SessionError
from engine_bridge.ports import AbortFailed, StagePort
from engine_bridge.session_log import FlushTicker, SessionLog, SessionLogBroken
from events.records import StoredEvent
from events.store.errors import ConcurrencyError
from events.store.owners import Owner, lifecycle_of
from events.store.store import EventStore
from events.types import (
    AbortRequested,
    AbortResult,
    Outcome,
    ReleaseRequested,
    ReleaseResult,
    SessionClosed,
    SessionTakenOver,
    StageRequestLost,
    StageRequestReleased,
)
from projections.projector import Projector

TAKEN_OVER = "session_taken_over"  # SessionError code of a refused append (the stream moved on)


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
    the owner's engines are this replica's too. Raises SessionError ``session_taken_over`` when
    the stream kept moving for ``attempts`` reads. ``on_applied``: fed every event written (the
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
        state = projector.session_resources(session_id)
        if not life.open and not (state and state.holds_anything()):  # keys, or an abort unanswered
            return False
        log = SessionLog(store, session_id, len(history), projector=projector, ticker=ticker, on_applied=on_applied)
        try:
            if life.open:
                now = time.time()
                await log.emit(
                    SessionTakenOver(
                        session_id=session_id,
                        ts=now,
                        replica_id=me.replica_id or "?",
                        replica_incarnation=me.incarnation or 0,
                        previous_replica_id=life.owner.replica_id,
                        previous_incarnation=life.owner.incarnation,
                        detected=detected,
                    ),
                    SessionClosed(session_id=session_id, ts=now, reason="recovered_after_crash"),
                )
                report.closed_sessions.append(session_id)
                report.taken_over.append((session_id, str(life.owner)))
            await _clean(log, ports, shared(life.owner), report)
            await log.close()
        except (SessionError, SessionLogBroken) as exc:
            if not _stream_moved(exc):
                raise
            continue  # the stream moved between our read and our append: judge it again
        return True
    raise SessionError(TAKEN_OVER, f"stream kept moving during takeover ({attempts} tries)", session_id=session_id)


def _stream_moved(exc: BaseException) -> bool:
    """Another writer appended to the stream under us: refused at an awaited append
    (SessionError ``session_taken_over``), or at a background flush, after which the log
    refuses further events (SessionLogBroken caused by a ConcurrencyError)."""
    if isinstance(exc, SessionError):
        return exc.code == TAKEN_OVER
    return isinstance(exc.__cause__, ConcurrencyError)


async def _clean(log: SessionLog, ports: Sequence[StagePort], shared: bool, report: RecoveryReport) -> None:
    sid = log.session_id
    live: set[str] = set().union(*(port.live_request_ids() for port in ports)) if ports else set()
    state = log.projector.session_resources(sid)
    held = dict(state.bindings) if state is not None else {}  # snapshot: cleanup changes the fold's
    for request_id in sorted({k[1] for k in held}):
        if request_id in live or (shared and any(b.submitted for k, b in held.items() if k[1] == request_id)):
            try:
                await cleanup_id(log, ports, request_id, cause="recovered_after_crash", force_abort=True)
                report.aborted.append((sid, request_id))
            except CleanupFailed as exc:
                report.failed.append(str(exc))
            continue
        for stage_id, _ in sorted(k for k in held if k[1] == request_id):
            binding = held[(stage_id, request_id)]
            event_cls = StageRequestLost if binding.submitted else StageRequestReleased
            log.emit_later(
                event_cls(
                    session_id=sid,
                    ts=time.time(),
                    stage_id=stage_id,
                    request_id=request_id,
                    cause="recovered_after_crash",
                )
            )
            if binding.submitted:
                report.lost.append((sid, stage_id, request_id))
    await _settle_interrupted_aborts(log, ports, shared, live, report)


async def _settle_interrupted_aborts(
    log: SessionLog, ports: Sequence[StagePort], shared: bool, live: set[str], report: RecoveryReport
) -> None:
    """An id whose keys the dead owner dropped but whose cleanup it never saw through: an
    abort it logged and never saw answered (it died between ``AbortRequested`` and
    ``AbortResult``), or one a pool answered ``failed``. On engines this replica reaches the
    abort is sent again, under a new ``AbortRequested`` for the failed pools (an answer only
    answers its own intent, DOMAIN §5.7 D10), and answered per pool; on the dead owner's own
    engines the id is recorded lost on each of those pools. A failed release (pool ``-1``,
    no engine call) is released again."""
    sid = log.session_id
    state = log.projector.session_resources(sid)
    if state is None:
        return
    for request_id, life in sorted(state.lives.items()):
        if life.cleanup_ok or state.keys_of(request_id):
            continue
        pending = {stage_id for stage_id in life.abort_pending if stage_id >= 0}
        failed = {stage_id for stage_id in life.abort_failed if stage_id >= 0} - pending
        if -1 in life.abort_failed:  # the release pool: bookkeeping, no engine call
            now = time.time()
            log.emit_later(
                ReleaseRequested(session_id=sid, ts=now, request_ids=[request_id], cause="recovered_after_crash"),
                ReleaseResult(session_id=sid, ts=now, request_ids=[request_id], outcome="ok"),
            )
        stages = sorted(pending | failed)
        if not stages:
            continue
        if request_id in live or shared:
            if failed:
                log.emit_later(
                    AbortRequested(
                        session_id=sid,
                        ts=time.time(),
                        request_ids=[request_id],
                        stage_ids=sorted(failed),
                        reason="recovered_after_crash",
                    )
                )
            for port in ports:
                if port.stage_id not in stages:
                    continue
                outcome: Outcome
                error: str | None
                try:
                    await port.abort([request_id])
                    outcome, error = "ok", None
                    report.aborted.append((sid, request_id))
                except AbortFailed as exc:
                    outcome, error = "failed", str(exc)
                    report.failed.append(str(exc))
                log.emit_later(
                    AbortResult(
                        session_id=sid,
                        ts=time.time(),
                        request_ids=[request_id],
                        stage_id=port.stage_id,
                        outcome=outcome,
                        error=error,
                    )
                )
            continue
        for stage_id in stages:
            log.emit_later(
                StageRequestLost(
                    session_id=sid,
                    ts=time.time(),
                    stage_id=stage_id,
                    request_id=request_id,
                    cause="recovered_after_crash",
                )
            )
            report.lost.append((sid, stage_id, request_id))
