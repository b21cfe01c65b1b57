"""Write-ahead cleanup of request ids: release and abort (DOMAIN §4.2 R1–R3, R7).

Order, for one id X of a session:

1. ``StageRequestReleased`` for EVERY key ``(s, X)`` the session holds (R1 full drop);
2. finished ids: ``ReleaseRequested`` → ``ReleaseResult`` (no engine call: vLLM already freed
   a finished request); unfinished ids: ``AbortRequested`` (all pools, R2) → one abort per
   stage port → one ``AbortResult`` per pool;
3. on a failed abort: ``StageRequestRestored`` for exactly the dropped keys, and
   :class:`CleanupFailed` is raised (R3) — the caller fails its operation and submits nothing.

The intent is durable before any engine call, so a crash in between leaves evidence the audit
sees (an abort with no result).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from engine_bridge.ports import AbortFailed, StagePort
from engine_bridge.session_log import SessionLog
from events.types import (
    AbortRequested,
    AbortResult,
    EventBase,
    Fence,
    ReleaseRequested,
    ReleaseResult,
    StageRequestReleased,
    StageRequestRestored,
)
from projections.resources import SessionResources


class CleanupFailed(RuntimeError):
    """An abort failed; the keys were restored (R3)."""

    def __init__(self, request_id: str, errors: list[str]) -> None:
        super().__init__(f"abort of {request_id} failed on {len(errors)} pool(s): {'; '.join(errors)}")
        self.request_id = request_id
        self.errors = errors


def _keys(state: SessionResources | None, request_id: str) -> list[tuple[int, Fence | None, bool]]:
    if state is None:
        return []
    return [
        (
            stage_id,
            Fence(incarnation=b.fence[0], epoch=b.fence[1], turn_id=b.fence[2]) if b.fence else None,
            b.submitted,
        )
        for (stage_id, rid_), b in sorted(state.bindings.items())
        if rid_ == request_id
    ]


def _finished(state: SessionResources | None, request_id: str) -> bool:
    if state is None:
        return False
    bindings = [b for (_, r), b in state.bindings.items() if r == request_id and b.submitted]
    return bool(bindings) and all(b.finished for b in bindings)


async def cleanup_id(
    log: SessionLog, ports: Sequence[StagePort], request_id: str, *, cause: str, force_abort: bool = False
) -> None:
    """Release or abort ``request_id`` (see module doc). ``force_abort`` aborts even a
    finished id, or one the log holds only reserved (an engine runs it: a pipelined intent that
    was lost, takeover on shared engines). Raises CleanupFailed after restoring the keys when
    an abort fails."""
    sid = log.session_id
    state = log.projector.resources.sessions.get(sid)
    keys = _keys(state, request_id)
    finished = _finished(state, request_id)
    submitted = any(sub for _, _, sub in keys)
    now = time.time()
    released: list[EventBase] = [
        StageRequestReleased(session_id=sid, ts=now, stage_id=s, request_id=request_id, cause=cause) for s, _, _ in keys
    ]
    if not force_abort and (not submitted or finished):  # forced: aborted even if the log saw no submit
        log.emit_later(*released, ReleaseRequested(session_id=sid, ts=now, request_ids=[request_id], cause=cause))
        log.emit_later(ReleaseResult(session_id=sid, ts=time.time(), request_ids=[request_id], outcome="ok"))
        return
    await log.emit(*released, AbortRequested(session_id=sid, ts=now, request_ids=[request_id], reason=cause))
    results: list[EventBase] = []
    errors: list[str] = []
    for port in ports:
        try:
            await port.abort([request_id])
            results.append(
                AbortResult(
                    session_id=sid, ts=time.time(), request_ids=[request_id], stage_id=port.stage_id, outcome="ok"
                )
            )
        except AbortFailed as exc:
            errors.append(f"stage {port.stage_id}: {exc}")
            results.append(
                AbortResult(
                    session_id=sid,
                    ts=time.time(),
                    request_ids=[request_id],
                    stage_id=port.stage_id,
                    outcome="failed",
                    error=str(exc),
                )
            )
    if errors:
        restored = [
            StageRequestRestored(
                session_id=sid,
                ts=time.time(),
                stage_id=s,
                request_id=request_id,
                fence=fence,
                submitted=sub,
                cause="abort_failed",
            )
            for s, fence, sub in keys
        ]
        log.emit_later(*results, *restored)
        raise CleanupFailed(request_id, errors)
    log.emit_later(*results)
