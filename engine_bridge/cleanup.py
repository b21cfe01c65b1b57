"""Write-ahead cleanup of request ids on the stage ports (DOMAIN §4.2 R1–R3, R7): the hand that
executes :func:`decider.cleanup.plan_cleanup`, and the steps of a recovery
plan (:func:`decider.recovery.plan_recovery`) with :func:`execute_recovery`.

A release is recorded without an engine call; an abort's intent is durable before any engine
call, so a crash in between leaves evidence the audit sees (an abort with no result); each
pool's answer is recorded after it, and a failed abort restores the dropped keys and raises
:class:`CleanupFailed` (R3) — the caller fails its operation and submits nothing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from decider.cleanup import abort_result, plan_cleanup
from decider.commands import Cleanup, Reabort, Record, SettleAborts, Then
from decider.recovery import RecoveryStep, settle_aborts
from engine_bridge.ports import AbortFailed, StagePort
from engine_bridge.session_log import SessionLog
from events.types import EventBase, StageRequestLost


class CleanupFailed(RuntimeError):
    """An abort failed; the keys were restored (R3)."""

    def __init__(self, request_id: str, errors: list[str]) -> None:
        super().__init__(f"abort of {request_id} failed on {len(errors)} pool(s): {'; '.join(errors)}")
        self.request_id = request_id
        self.errors = errors


async def cleanup_id(
    log: SessionLog, ports: Sequence[StagePort], request_id: str, *, cause: str, force_abort: bool = False
) -> None:
    """Release or abort ``request_id`` as the plan says (module doc). ``force_abort`` aborts
    even a finished id, or one the log holds only reserved. Raises CleanupFailed after
    restoring the keys when an abort fails."""
    sid = log.session_id
    plan = plan_cleanup(
        log.projector.session_resources(sid), sid, request_id, cause=cause, ts=time.time(), force_abort=force_abort
    )
    if not plan.abort:
        log.emit_later(*plan.intent, plan.released(time.time()))
        return
    await log.emit(*plan.intent)
    results: list[EventBase] = []
    errors: list[str] = []
    for port in ports:
        error = await _abort(port, request_id)
        if error is not None:
            errors.append(f"stage {port.stage_id}: {error}")
        results.append(plan.abort_result(port.stage_id, time.time(), error))
    if errors:
        log.emit_later(*results, *plan.restored(time.time()))
        raise CleanupFailed(request_id, errors)
    log.emit_later(*results)


async def _abort(port: StagePort, request_id: str) -> str | None:
    """Ask one pool to abort ``request_id``: None when it did, else its error."""
    try:
        await port.abort([request_id])
    except AbortFailed as exc:
        return str(exc)
    return None


@dataclass
class RecoveryOutcome:
    """What :func:`execute_recovery` did: ``aborted`` request ids (one per cleanup, one per pool
    that answered a re-sent abort ``ok``), ``lost`` (stage, request id) recorded lost,
    ``failed`` the messages of aborts that failed (collected, not raised)."""

    aborted: list[str] = field(default_factory=list)
    lost: list[tuple[int, str]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


async def execute_recovery(
    log: SessionLog, ports: Sequence[StagePort], steps: Sequence[RecoveryStep], outcome: RecoveryOutcome | None = None
) -> RecoveryOutcome:
    """Play a recovery plan's steps in order on ``log`` and ``ports``: a :class:`Record` is
    buffered (``emit_later``; ``durable``: committed first), a :class:`Cleanup` runs
    :func:`cleanup_id` (a failure collected when ``collect``, else raised), a :class:`Reabort`
    asks each named pool and records its ``AbortResult``, a :class:`Then` of a
    :class:`SettleAborts` is decided on the state as it is then (restamped with this clock)
    and played. Raises TypeError for any other step."""
    done = outcome if outcome is not None else RecoveryOutcome()
    sid = log.session_id
    for step in steps:
        match step:
            case Record(events=events, durable=durable):
                if durable:
                    await log.emit(*events)
                else:
                    log.emit_later(*events)
                done.lost.extend((e.stage_id, e.request_id) for e in events if isinstance(e, StageRequestLost))
            case Cleanup(request_id=request_id, cause=cause, force_abort=force_abort, collect=collect):
                try:
                    await cleanup_id(log, ports, request_id, cause=cause, force_abort=force_abort)
                    done.aborted.append(request_id)
                except CleanupFailed as exc:
                    if not collect:
                        raise
                    done.failed.append(str(exc))
            case Reabort(request_id=request_id, stage_ids=stage_ids):
                for port in ports:
                    if port.stage_id not in stage_ids:
                        continue
                    error = await _abort(port, request_id)
                    if error is None:
                        done.aborted.append(request_id)
                    else:
                        done.failed.append(error)
                    log.emit_later(abort_result(sid, request_id, port.stage_id, time.time(), error))
            case Then(command=SettleAborts() as command):
                then = dataclasses.replace(command, ts=time.time())
                await execute_recovery(log, ports, settle_aborts(log.projector.session_resources(sid), then), done)
            case _:
                raise TypeError(f"not a recovery step: {step!r}")
    return done
