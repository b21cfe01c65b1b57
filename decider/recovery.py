"""Recovery of a session whose owner is dead, pure (DOMAIN §4.2 R7, §5.7 D10, D18; issue 14):
whether the session is taken over and closed, what becomes of every id it still holds and of
every abort the dead owner logged and never saw answered. The takeover shell (``engine_bridge.takeover``) gathers the inputs — the
folded session, the ids live on the engines this replica reaches, whether the dead owner's
engines are shared with it — and the cleanup executor (``engine_bridge.cleanup``) plays the
steps; neither decides anything.

:func:`plan_takeover` — an open session is closed first, durably and before anything else
(``SessionTakenOver`` naming both owners, ``SessionClosed(recovered_after_crash)``): from then
on the dead owner's appends are refused (fencing). A closed one is only cleaned, and only when
it still holds something (keys, or an abort unanswered or failed); else there is nothing to do.

:func:`plan_recovery` — the ids still held, each in id order:

* one that runs on an engine this replica reaches (live), or a submitted one on shared
  engines: :class:`Cleanup` with ``force_abort`` (every pool, write-ahead, R2), a failed abort
  collected (R3: its keys are restored, the session stays holding them);
* else each key is recorded ended, cause ``recovered_after_crash``: ``StageRequestLost`` for a
  submitted one (its engines died with their replica), ``StageRequestReleased`` for a
  reserved one;

then :class:`Then` :class:`SettleAborts`, decided by :func:`settle_aborts` on the state as the
cleanups left it (an abort that failed just now restored keys, so it is not settled twice).

:func:`settle_aborts` — each id whose keys are gone but whose cleanup was never acknowledged:

* a failed release (pool ``-1``, bookkeeping) is released again;
* the pools with an abort pending (no answer) or failed: on engines this replica reaches
  (live or shared) :class:`Reabort` on those pools, under a new ``AbortRequested`` for the
  failed ones (an answer only answers its own intent, D10); else ``StageRequestLost`` per pool.

No I/O, no clock: ``ts`` comes in as an argument.
"""

from __future__ import annotations

from collections.abc import Collection

from decider.commands import Cleanup, Reabort, Record, SettleAborts, Then
from events.types import (
    AbortRequested,
    EventBase,
    ReleaseRequested,
    ReleaseResult,
    SessionClosed,
    SessionTakenOver,
    StageRequestLost,
    StageRequestReleased,
)
from projections.resource_state import SessionResources

RECOVERED = "recovered_after_crash"  # the cause and abort reason of everything recovery records

RecoveryStep = Record | Cleanup | Reabort | Then
"""A step of a recovery plan (``Then`` carries a :class:`SettleAborts`)."""


def plan_takeover(
    state: SessionResources | None,
    session_id: str,
    *,
    session_open: bool,
    replica_id: str,
    replica_incarnation: int,
    previous_replica_id: str | None,
    previous_incarnation: int | None,
    detected: str,
    ts: float,
) -> list[RecoveryStep] | None:
    """The takeover's close of one session whose owner is dead (module doc): None when there
    is nothing to do (closed, holding nothing), ``[]`` when it is closed but still holds
    something, else one durable :class:`Record`. ``replica_*``: the new owner; ``previous_*``:
    the dead one (None: written before replicas existed); ``detected``: why it is judged dead
    (``SessionTakenOver.detected``); ``ts``: wall-clock seconds."""
    if not session_open:
        return [] if state is not None and state.holds_anything() else None
    sid = session_id
    return [
        Record(
            (
                SessionTakenOver(
                    session_id=sid,
                    ts=ts,
                    replica_id=replica_id,
                    replica_incarnation=replica_incarnation,
                    previous_replica_id=previous_replica_id,
                    previous_incarnation=previous_incarnation,
                    detected=detected,
                ),
                SessionClosed(session_id=sid, ts=ts, reason=RECOVERED),
            ),
            durable=True,
        )
    ]


def plan_recovery(
    state: SessionResources | None, live_ids: Collection[str], shared: bool, *, ts: float
) -> list[RecoveryStep]:
    """The recovery of one session (module doc). ``state``: its folded resources (None: the
    fold never saw it); ``live_ids``: ids running on the engines this replica reaches;
    ``shared``: the dead owner's engines are this replica's too; ``ts``: the events' time
    (wall-clock seconds). Deterministic: the same inputs give the same steps."""
    live = frozenset(live_ids)
    steps: list[RecoveryStep] = []
    if state is None:
        return [Then(SettleAborts(ts, live, shared), collect=True)]
    sid, bindings = state.session_id, state.bindings
    for request_id in sorted({key[1] for key in bindings}):
        keys = sorted((stage_id, b) for (stage_id, rid), b in bindings.items() if rid == request_id)
        if request_id in live or (shared and any(b.submitted for _, b in keys)):
            steps.append(Cleanup(request_id, RECOVERED, force_abort=True, collect=True))
            continue
        steps.append(
            Record(
                tuple(
                    (StageRequestLost if b.submitted else StageRequestReleased)(
                        session_id=sid, ts=ts, stage_id=stage_id, request_id=request_id, cause=RECOVERED
                    )
                    for stage_id, b in keys
                )
            )
        )
    steps.append(Then(SettleAborts(ts, live, shared), collect=True))
    return steps


def settle_aborts(state: SessionResources | None, command: SettleAborts) -> list[RecoveryStep]:
    """Answer the aborts the dead owner never saw answered, release again what it failed to
    release (module doc), on ``state`` as it is now. Deterministic, in id order."""
    if state is None:
        return []
    sid, ts = state.session_id, command.ts
    steps: list[RecoveryStep] = []
    for request_id, life in sorted(state.lives.items()):
        if life.cleanup_ok or state.keys_of(request_id):
            continue
        pending = {stage_id for stage_id in life.abort_pending if stage_id >= 0}
        failed = {stage_id for stage_id in life.abort_failed if stage_id >= 0} - pending
        if -1 in life.abort_failed:  # the release pool: bookkeeping, no engine call
            steps.append(
                Record(
                    (
                        ReleaseRequested(session_id=sid, ts=ts, request_ids=[request_id], cause=RECOVERED),
                        ReleaseResult(session_id=sid, ts=ts, request_ids=[request_id], outcome="ok"),
                    )
                )
            )
        stages = tuple(sorted(pending | failed))
        if not stages:
            continue
        if request_id in command.live_ids or command.shared:
            if failed:
                intent: tuple[EventBase, ...] = (
                    AbortRequested(
                        session_id=sid, ts=ts, request_ids=[request_id], stage_ids=sorted(failed), reason=RECOVERED
                    ),
                )
                steps.append(Record(intent))
            steps.append(Reabort(request_id, stages))
            continue
        steps.append(
            Record(
                tuple(
                    StageRequestLost(session_id=sid, ts=ts, stage_id=stage_id, request_id=request_id, cause=RECOVERED)
                    for stage_id in stages
                )
            )
        )
    return steps


__all__ = ["RECOVERED", "RecoveryStep", "plan_recovery", "plan_takeover", "settle_aborts"]
