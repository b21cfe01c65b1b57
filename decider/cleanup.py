"""The cleanup rule for one request id, pure (DOMAIN §4.2 R1–R3, R7): which keys are dropped,
whether the id is released or aborted, and the events that record each outcome. The session
engine (``engine_bridge.cleanup``) executes the plan on the stage ports; it decides nothing.

* every key ``(s, X)`` the session holds is dropped first (``StageRequestReleased``, R1);
* a finished or never-submitted id is released (``ReleaseRequested`` → ``ReleaseResult``: vLLM
  already freed a finished request); an unfinished one, or any id when ``force_abort``, is
  aborted on every pool (``AbortRequested`` durable before the engine calls, R2), then one
  ``AbortResult`` per pool;
* a failed abort restores exactly the dropped keys (``StageRequestRestored``, R3).
"""

from __future__ import annotations

from dataclasses import dataclass

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
from projections.resource_state import SessionResources


@dataclass(frozen=True, slots=True)
class HeldKey:
    """One key of the id as the fold holds it: stage, the fence it was bound under, submitted."""

    stage_id: int
    fence: Fence | None
    submitted: bool


@dataclass(frozen=True, slots=True)
class CleanupPlan:
    """What cleaning ``request_id`` up means now. ``abort``: the engine must be asked (and
    ``intent`` is durable before it is); else ``intent`` plus :meth:`released` is the whole
    cleanup, with no engine call."""

    session_id: str
    request_id: str
    cause: str
    keys: tuple[HeldKey, ...]
    abort: bool
    intent: tuple[EventBase, ...]

    def released(self, ts: float) -> ReleaseResult:
        """The release's result (no engine call: nothing runs)."""
        return ReleaseResult(session_id=self.session_id, ts=ts, request_ids=[self.request_id], outcome="ok")

    def abort_result(self, stage_id: int, ts: float, error: str | None = None) -> AbortResult:
        """One pool's answer to the abort: ``ok``, or ``failed`` with the port's ``error``."""
        return abort_result(self.session_id, self.request_id, stage_id, ts, error)

    def restored(self, ts: float) -> list[StageRequestRestored]:
        """A failed abort puts back exactly the keys the plan dropped (R3)."""
        return [
            StageRequestRestored(
                session_id=self.session_id,
                ts=ts,
                stage_id=k.stage_id,
                request_id=self.request_id,
                fence=k.fence,
                submitted=k.submitted,
                cause="abort_failed",
            )
            for k in self.keys
        ]


def abort_result(session_id: str, request_id: str, stage_id: int, ts: float, error: str | None = None) -> AbortResult:
    """One pool's answer to an abort of ``request_id``: ``ok``, or ``failed`` with the port's
    ``error`` (DOMAIN §4.2 R2, R3)."""
    return AbortResult(
        session_id=session_id,
        ts=ts,
        request_ids=[request_id],
        stage_id=stage_id,
        outcome="ok" if error is None else "failed",
        error=error,
    )


def held_keys(state: SessionResources | None, request_id: str) -> tuple[HeldKey, ...]:
    """The keys of ``request_id`` the session holds, by stage."""
    if state is None:
        return ()
    return tuple(
        HeldKey(
            stage_id,
            Fence(incarnation=b.fence[0], epoch=b.fence[1], turn_id=b.fence[2]) if b.fence else None,
            b.submitted,
        )
        for (stage_id, rid_), b in sorted(state.bindings.items())
        if rid_ == request_id
    )


def plan_cleanup(
    state: SessionResources | None,
    session_id: str,
    request_id: str,
    *,
    cause: str,
    ts: float,
    force_abort: bool = False,
) -> CleanupPlan:
    """The cleanup of ``request_id`` (module doc). ``force_abort`` aborts even a finished id, or
    one the log holds only reserved (an engine runs it: a pipelined intent that was lost,
    takeover on shared engines)."""
    keys = held_keys(state, request_id)
    submitted = [b for (_, r), b in (state.bindings.items() if state else ()) if r == request_id and b.submitted]
    finished = bool(submitted) and all(b.finished for b in submitted)
    abort = force_abort or (bool(submitted) and not finished)
    dropped = tuple(
        StageRequestReleased(session_id=session_id, ts=ts, stage_id=k.stage_id, request_id=request_id, cause=cause)
        for k in keys
    )
    if abort:
        intent: tuple[EventBase, ...] = (
            *dropped,
            AbortRequested(session_id=session_id, ts=ts, request_ids=[request_id], reason=cause),
        )
    else:
        intent = (*dropped, ReleaseRequested(session_id=session_id, ts=ts, request_ids=[request_id], cause=cause))
    return CleanupPlan(session_id, request_id, cause, keys, abort, intent)
