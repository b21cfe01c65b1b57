"""Write-ahead cleanup of request ids on the stage ports (DOMAIN §4.2 R1–R3, R7): the hand that
executes :func:`projections.session_rules.cleanup.plan_cleanup`.

A release is recorded without an engine call; an abort's intent is durable before any engine
call, so a crash in between leaves evidence the audit sees (an abort with no result); each
pool's answer is recorded after it, and a failed abort restores the dropped keys and raises
:class:`CleanupFailed` (R3) — the caller fails its operation and submits nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from engine_bridge.ports import AbortFailed, StagePort
from engine_bridge.session_log import SessionLog
from events.types import EventBase
from projections.session_rules.cleanup import plan_cleanup


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
        try:
            await port.abort([request_id])
            results.append(plan.abort_result(port.stage_id, time.time()))
        except AbortFailed as exc:
            errors.append(f"stage {port.stage_id}: {exc}")
            results.append(plan.abort_result(port.stage_id, time.time(), str(exc)))
    if errors:
        log.emit_later(*results, *plan.restored(time.time()))
        raise CleanupFailed(request_id, errors)
    log.emit_later(*results)
