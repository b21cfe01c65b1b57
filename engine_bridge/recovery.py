"""Recovery at an engine's start and before an open (issue 14: only what is dead): the sessions
of dead owners are found in the log and taken over (:mod:`engine_bridge.takeover` executes
what :mod:`decider.recovery` plans)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from engine_bridge.messages import SessionError
from engine_bridge.replicas import Replica, SessionOwnedElsewhere
from engine_bridge.takeover import RecoveryReport
from events.records import StoredEvent
from events.store.owners import lifecycle_of
from events.store.store import EventStore
from projections.shell.runner import project_as_of

logger = logging.getLogger("engine_bridge.engine")


async def claimable_history(store: EventStore, replica: Replica, session_id: str) -> list[StoredEvent]:
    """The stream, once it is closed: an open session of a dead owner is taken over first;
    one of a live owner raises SessionOwnedElsewhere (this replica: SessionError
    ``session_exists``)."""
    history = await store.read_stream(session_id)
    life = lifecycle_of(session_id, (e.event for e in history))
    if life is None or not life.open:
        return history
    if life.owner == replica.me:
        raise SessionError("session_exists", "session is open in the log (recover first)", session_id=session_id)
    judge = await replica.judge()
    if judge.dead_reason(life.owner) is None:
        raise SessionOwnedElsewhere(session_id, life.owner)
    await replica.take_over(session_id, judge, RecoveryReport())
    return await claimable_history(store, replica, session_id)


async def recover_dead_sessions(
    store: EventStore, replica: Replica, *, serves: Callable[[str], bool]
) -> RecoveryReport:
    """Reconcile the log with the live engines after a crash (issue 14: only what is dead).
    Every session left open or holding ids whose owner is dead (lease expired, released or
    superseded, process gone, or no owner recorded) is taken over
    (:mod:`engine_bridge.takeover`): ``SessionTakenOver`` and ``SessionClosed`` with reason
    ``recovered_after_crash``; its ids still live on an engine (or on engines shared with
    the owner) are aborted on every pool; ids no engine has are recorded as lost
    (``StageRequestLost``); reserved keys are released. Sessions ``serves`` answers True for,
    and sessions of live replicas (listed in ``skipped``), are not touched. A session whose
    recovery fails is listed in ``failed`` (and logged); the others are still recovered."""
    report = RecoveryReport()
    projector = await project_as_of(store)
    judge = await replica.judge()
    for sid, state in projector.sessions_resources():
        if serves(sid):
            continue
        if state.closed_at is not None and not state.holds_anything():  # keys, or an abort unanswered
            continue
        try:
            await replica.take_over(sid, judge, report)
        except Exception as exc:  # noqa: BLE001 - one session's failure never stops a start
            logger.warning("recovery of session %r failed: %s: %s", sid, type(exc).__name__, exc)
            report.failed.append(f"{sid}: {type(exc).__name__}: {exc}")
    return report
