"""``request_resources`` and stale-id cleanup as a pure fold (DOMAIN §3, §4).

:class:`ResourcesFold` applies stored events one at a time, in log order, and answers which
of them count (:class:`~projections.resource_gate.Verdict`). Its jobs live in one module each:

* :mod:`projections.resource_state` — the per-session state the session's decider reads
  (:class:`SessionResources`, :class:`Binding`, :class:`IdLife`, R4's :func:`stale_before_submit`);
* :mod:`projections.resource_gate` — the gate: writes after the end (D18), stale fences and
  facts of ids the session does not hold (D1/D9);
* :mod:`projections.resource_binding` — reserve, submit, update, forward, retarget (R4, R5);
* :mod:`projections.resource_cleanup` — releases, aborts and acks, lost and restored keys (R1–R3, D10);
* :mod:`projections.resource_audit` — the audit's findings: point findings at the event that
  proves them, state findings at an as-of point (:meth:`ResourcesFold.evaluate`).

This module holds the fold itself: one typed dispatch (:func:`projections.dispatch.dispatch_table`,
event class -> handler), the session lifecycle (open, close, epoch, turn, takeover) and the
fold-wide queries. The fold has no I/O and no clock: any "now" is the ``ts`` of an event. The
session engine makes its live decisions with this same fold. The names other modules import
from here (``Binding``, ``SessionResources``, ``StaleId``, ``stale_before_submit``,
``Verdict``…) stay importable from this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from events.records import StoredEvent
from events.types import (
    AbortRequested,
    AbortResult,
    ActiveRequestBound,
    CommandRejected,
    EpochAdvanced,
    InputAppended,
    ReleaseRequested,
    ReleaseResult,
    ResponseListened,
    SessionClosed,
    SessionOpened,
    SessionTakenOver,
    StageMetricsReported,
    StageOutput,
    StageRequestFinished,
    StageRequestForwarded,
    StageRequestLost,
    StageRequestReleased,
    StageRequestReserved,
    StageRequestRestored,
    StageRequestSubmitted,
    TurnCompleted,
)
from projections import resource_audit, resource_binding, resource_cleanup, resource_gate
from projections.dispatch import dispatch_table
from projections.findings import Finding
from projections.resource_audit import report
from projections.resource_gate import ACCEPTED, REFUSED, WRITES_AFTER_END, Verdict
from projections.resource_state import (
    FINISHED,
    RESERVED,
    RETIRED_IDS_KEPT,
    STAGE_CLOSED_WHY,
    SUBMITTED,
    Binding,
    IdLife,
    SessionResources,
    StaleId,
    stale_before_submit,
)

__all__ = [
    "ACCEPTED",
    "FINISHED",
    "REFUSED",
    "RESERVED",
    "RETIRED_IDS_KEPT",
    "STAGE_CLOSED_WHY",
    "SUBMITTED",
    "WRITES_AFTER_END",
    "Binding",
    "IdLife",
    "ResourcesFold",
    "SessionResources",
    "StaleId",
    "Verdict",
    "stale_before_submit",
]


class ResourcesFold:
    """Pure fold: ``apply(stored) -> Verdict``; queries: :meth:`request_resources`,
    :meth:`held`, :meth:`running`, :meth:`held_at_end`, :meth:`evaluate`."""

    closed_sessions: dict[str, tuple[int, float, int]]  # annotated: a checkpoint's copy is checked entry by entry

    def __init__(self) -> None:
        self.sessions: dict[str, SessionResources] = {}
        self.closed_sessions: dict[str, tuple[int, float, int]] = {}
        """Sessions forgotten closed (:meth:`forget_closed`) -> their ``SessionClosed`` (position,
        ts) and their incarnation: a fact arriving on one however late is still refused (DOMAIN
        §5.7 D18) until a new ``SessionOpened``, and that reopen must still advance the
        incarnation (DOMAIN §2.1, :func:`_opened`). One small entry per closed session; the
        working state is gone."""
        self.point_findings: list[Finding] = []
        self.position = 0
        self.ts = 0.0

    # ------------------------------------------------------------------ apply
    def apply(self, stored: StoredEvent) -> Verdict:
        """Apply one stored event (log order). Returns its :class:`Verdict`."""
        position = stored.position
        event = stored.event
        ts = event.ts
        self.position = position
        self.ts = ts
        session = self.sessions.get(event.session_id)
        if session is None:
            session = self._new_session(event.session_id)
        if session.pending_retarget is None and session.closed_at is None and session.taken_over_at is None:
            handler = _HANDLERS.get(type(event))
            verdict = ACCEPTED if handler is None else handler(self, session, stored, event)
        else:
            verdict = self._apply_watched(session, stored, event)
        session.last_position = position
        session.last_ts = ts
        return verdict

    def _new_session(self, session_id: str) -> SessionResources:
        session = self.sessions[session_id] = SessionResources(session_id)
        closed = self.closed_sessions.pop(session_id, None)
        if closed is not None:  # forgotten closed: back as it was, holding nothing (D18)
            position, ts, session.incarnation = closed
            session.closed_at = (position, ts)
        return session

    def _apply_watched(self, session: SessionResources, stored: StoredEvent, event: Any) -> Verdict:
        """:meth:`apply` for a session with a retarget pending (R5) or ended (D18)."""
        etype = event.type
        if session.pending_retarget is not None and etype != "ActiveRequestBound":
            resource_binding.check_retarget(self, session, stored)
        ended = session.closed_at or session.taken_over_at
        if ended is not None and etype in WRITES_AFTER_END and (etype != "SessionClosed" or session.closed_at):
            # (the new owner's own SessionClosed after its SessionTakenOver is the takeover's close)
            return resource_gate.after_end(self, session, stored, ended)
        handler = _HANDLERS.get(type(event))
        return ACCEPTED if handler is None else handler(self, session, stored, event)

    # ------------------------------------------------------------------ queries
    def request_resources(self, session_id: str | None = None) -> dict[str, dict[tuple[int, str], str]]:
        """``{session: {(stage_id, request_id): state}}`` for sessions holding anything (or the
        one asked, possibly empty)."""
        if session_id is not None:
            s = self.sessions.get(session_id)
            return {session_id: {k: b.state for k, b in sorted(s.bindings.items())} if s else {}}
        return {
            sid: {k: b.state for k, b in sorted(s.bindings.items())}
            for sid, s in sorted(self.sessions.items())
            if s.bindings
        }

    def held(self, session_id: str | None = None) -> int:
        """Orchestrator counter (DOMAIN §3.3): distinct ids with any binding, per session or
        global. Equals :meth:`running` unless finished ids are still held (R4/R6)."""
        sessions = (
            [self.sessions[session_id]]
            if session_id in self.sessions
            else ([] if session_id is not None else list(self.sessions.values()))
        )
        return sum(len({k[1] for k in s.bindings}) for s in sessions)

    def held_at_end(self) -> list[tuple[str, int, int, float]]:
        """See :func:`projections.resource_audit.held_at_end`."""
        return resource_audit.held_at_end(self.sessions)

    def running(self, session_id: str | None = None) -> int:
        """Running ids (distinct, submitted, not finished/aborted/released), per session or global."""
        if session_id is not None:
            s = self.sessions.get(session_id)
            return len(s.running_ids()) if s else 0
        return sum(len(s.running_ids()) for s in self.sessions.values())

    def evaluate(self, max_idle_s: float = 30.0, as_of_ts: float | None = None) -> list[Finding]:
        """All findings at the current point: the point findings so far plus the state
        findings at ``as_of_ts`` (default: ts of the last applied event), sorted."""
        now = self.ts if as_of_ts is None else as_of_ts
        return resource_audit.evaluate(self.sessions.values(), self.point_findings, now, max_idle_s)

    def forget_closed(self) -> list[str]:
        """Drop closed sessions that hold nothing (bounded memory); returns their ids. Each leaves
        only its close point in :attr:`closed_sessions` (DOMAIN §5.7 D18 outlives the state)."""
        gone = [sid for sid, s in self.sessions.items() if s.forgettable()]
        for sid in gone:
            session = self.sessions.pop(sid)
            assert session.closed_at is not None  # forgettable() says so
            self.closed_sessions[sid] = (*session.closed_at, session.incarnation)
        return gone


# ------------------------------------------------------------------ lifecycle handlers
def reopened_incarnation(previous: int, stated: int) -> int:
    """The incarnation a session reopened after a close (or a takeover) runs under: the stated
    one when it is above ``previous`` (the ended session's), else ``previous + 1``. DOMAIN §2.1:
    the incarnation goes up by one at every reopen "so ids of a closed session can never be
    accepted by its successor"; a reopen that states the same (or an older) incarnation is
    therefore judged as the next one, and every id and fence minted for an incarnation up to
    ``previous`` (the closed session's own, or any before it) is refused as stale (D9), even
    when the successor itself names them."""
    return stated if stated > previous else previous + 1


def _opened(fold: ResourcesFold, s: SessionResources, st: StoredEvent, e: SessionOpened) -> Verdict:
    """DOMAIN §2.1: a reopen after a close or a takeover runs under a higher incarnation than
    the ended session (:func:`reopened_incarnation`); one that does not state one is one
    ``incarnation_not_advanced`` warning. A first open takes the stated incarnation. An open
    of a session that is open (no ``SessionClosed`` or ``SessionTakenOver`` since its open:
    the engine never writes one) is refused: one ``open_while_open`` warning, and it opens,
    counts and changes nothing, whatever incarnation it states (the incarnation advances only
    through a close or a takeover, so it can never go back)."""
    if s.opened and s.closed_at is None and s.taken_over_at is None:
        report(
            fold,
            s,
            "open_while_open",
            None,
            None,
            st,
            [],
            f"open stating incarnation {e.incarnation} while incarnation {s.incarnation} is open (no close or "
            "takeover since its open): opens nothing; the open session's incarnation, fences and ids stand "
            "(DOMAIN §2.1)",
        )
        return REFUSED
    incarnation = e.incarnation
    if s.closed_at is not None or s.taken_over_at is not None:
        incarnation = reopened_incarnation(s.incarnation, e.incarnation)
        if incarnation != e.incarnation:
            report(
                fold,
                s,
                "incarnation_not_advanced",
                None,
                None,
                st,
                [],
                f"reopen states incarnation {e.incarnation}, not above the ended session's {s.incarnation}; "
                f"judged as incarnation {incarnation}: ids and fences of incarnation {s.incarnation} or "
                "older are refused (DOMAIN §2.1)",
            )
    if s.closed_at is not None and not s.holds_anything():
        # A reopen (new incarnation) of a closed session that holds nothing starts fresh.
        s = fold.sessions[e.session_id] = SessionResources(e.session_id)
    if incarnation != s.incarnation:
        s.epoch, s.turn_id, s.accepted_fence = 0, 0, (-1, -1)  # a new incarnation starts its own fences
    s.incarnation = incarnation
    s.capabilities = e.capabilities
    s.num_stages = e.num_stages
    s.opened = True
    s.closed_at = None
    s.taken_over_at = None
    return ACCEPTED


def _closed(fold: ResourcesFold, s: SessionResources, st: StoredEvent, e: SessionClosed) -> Verdict:
    s.closed_at = (st.position, e.ts)
    return ACCEPTED


def _epoch_advanced(fold: ResourcesFold, s: SessionResources, st: StoredEvent, e: EpochAdvanced) -> Verdict:
    """DOMAIN §2.1: outputs, appends, submits and forwards of an older epoch are dropped from
    here on; the accepted fence moves to (new epoch, 0) at least."""
    new_epoch = e.new_epoch
    if new_epoch > s.epoch:
        s.epoch = new_epoch
        s.accepted_fence = max(s.accepted_fence, (new_epoch, 0))
    return ACCEPTED


def _turn_completed(fold: ResourcesFold, s: SessionResources, st: StoredEvent, e: TurnCompleted) -> Verdict:
    """DOMAIN §2.2: the session's turn moves to ``new_turn_id`` (never back); the next
    ephemeral Stage0 id is minted under it."""
    s.turn_id = max(s.turn_id, e.new_turn_id)
    return ACCEPTED


def _taken_over(fold: ResourcesFold, s: SessionResources, st: StoredEvent, e: SessionTakenOver) -> Verdict:
    """Issue 14: the owner died and another replica closed the session; reported (a
    warning naming both replicas), its ids are settled by the events that follow."""
    previous = "no replica" if e.previous_replica_id is None else f"{e.previous_replica_id}#{e.previous_incarnation}"
    report(
        fold,
        s,
        "session_taken_over",
        None,
        None,
        st,
        [],
        f"owner {previous} dead ({e.detected}); taken over by {e.replica_id}#{e.replica_incarnation}",
    )
    if s.closed_at is None:
        s.taken_over_at = (st.position, e.ts)  # the old owner's later writes count nowhere (D18)
    return ACCEPTED


def _rejected(fold: ResourcesFold, s: SessionResources, st: StoredEvent, e: CommandRejected) -> Verdict:
    report(fold, s, "command_rejected", None, e.request_id, st, [], f"{e.command}: {e.error_code}: {e.message}")
    return ACCEPTED


Handler = Callable[[ResourcesFold, SessionResources, StoredEvent, Any], Verdict]

_HANDLERS: dict[type, Handler] = dispatch_table(
    {
        SessionOpened: _opened,
        SessionClosed: _closed,
        EpochAdvanced: _epoch_advanced,
        TurnCompleted: _turn_completed,
        SessionTakenOver: _taken_over,
        CommandRejected: _rejected,
        StageRequestReserved: resource_binding.reserved,
        StageRequestSubmitted: resource_binding.submitted,
        StageRequestForwarded: resource_binding.forwarded,
        ActiveRequestBound: resource_binding.active_bound,
        StageOutput: resource_gate.output,
        StageRequestFinished: resource_gate.finished,
        StageMetricsReported: resource_gate.metrics,
        ResponseListened: resource_gate.listened,
        InputAppended: resource_gate.appended,
        StageRequestReleased: resource_cleanup.released,
        StageRequestRestored: resource_cleanup.restored,
        StageRequestLost: resource_cleanup.lost,
        AbortRequested: resource_cleanup.abort_requested,
        AbortResult: resource_cleanup.abort_result,
        ReleaseRequested: resource_cleanup.release_requested,
        ReleaseResult: resource_cleanup.release_result,
    }
)
"""The one dispatch of the fold: event struct -> its handler,
``handler(fold, session, stored, event) -> Verdict``. A class without one is accepted as is.
Module-level, so a fold's state holds no wiring (checkpoints carry data only)."""
