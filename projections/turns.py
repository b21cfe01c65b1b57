"""Per-turn metric tables as a pure fold (DOMAIN §5.3–§5.5, §5.7).

One assistant turn = one ``response_id`` = one table set, built when the turn is finalized.
The offline fold works on every session whatever its ``log_stats`` (M14 decision: offline
re-projection covers sessions that ran with log_stats off); the live engine's fold
(``TurnsFold(live=True)``) opens nothing for a session with log_stats off (M14).

The fold is three jobs in three modules, over the records of :mod:`projections.turn_state`:

* **attribution** (:mod:`projections.attribution`, D1) — which turn a stage fact joins: the
  open turn, the pre-begin buffer, or none (one ``output_outside_segment`` warning);
* **turns** (this module) — a turn's open, arrival and end;
* **finalization** (:mod:`projections.turn_finalize`) — the turn's tables at its end.

Each event kind has one handler, found by one typed dispatch (:func:`projections.dispatch.dispatch_table`):
``handler(fold, session, stored, event)``.

**Open** — ``TurnCommitted`` carrying a ``response_id`` (pre-created at commit, §2.3) opens the
turn with no engine id yet; the first Stage0 submit after it binds it, and ``ResponseBegun``
names the id and the turn for every title (D7: for an ephemeral id ``turn=`` is the id's
``_t<N>``). Opening another response while one is open finalizes the open one with ``abort``
(superseded, M21). Non-duplex ids never open, buffer into or finalize a turn (M12).

**Arrival** (§5.3, CASE-12, M16) — the caller's commit ts, else the pending stamp (first
accepted append/commit while none is pending, or the first buffered snapshot's submit ts /
receipt), else the begin ts. Begin consumes the stamp; finalize never erases a later stamp.

**Finalize** (§5.5) — ``ResponseEnded`` (cause beats status, CASE-13), ``TurnFinalized``,
``CancelRequested`` (§2.4), an ``AbortRequested`` naming the turn's id, an engine abort
``StageRequestFinished(finish_reason=abort)`` of the turn's id in its segment (D11),
``SessionClosed`` (``close``), or a superseding begin (``abort``). The first wins; end ts = that
event's ts (CASE-09). A terminal event naming a finalized response is part of the same
terminal when it repeats its reason with a kind not yet seen (the engine's ResponseEnded +
TurnFinalized pair); any other is one ``stale_finalize`` warning (D9). A response stays
finalized for good (DOMAIN §2.1: ids are not reused), however many responses follow and across a
close, a reopen and a sweep: a begin or terminal naming it is stale, never a new turn; past the
latest ``KEPT_PER_SESSION`` terminals only its reason is forgotten ("reason no longer kept").
A turn that ends before any engine request still gets a row, with ``request_id`` None (D8).
"""

from __future__ import annotations

import functools

from events import ids as rid
from events.records import StoredEvent
from events.types import (
    AbortRequested,
    CancelRequested,
    EpochAdvanced,
    InputAppended,
    InputCleared,
    ResponseBegun,
    ResponseEnded,
    ResponseListened,
    SessionClosed,
    SessionOpened,
    StageMetricsReported,
    StageOutput,
    StageRequestFinished,
    StageRequestForwarded,
    StageRequestLost,
    StageRequestReleased,
    StageRequestSubmitted,
    TransferTx,
    TurnCommitted,
    TurnCompleted,
    TurnFinalized,
)
from projections import attribution
from projections.attribution import bind
from projections.dispatch import dispatch_table
from projections.findings import Finding
from projections.reasons import reason_for, reason_for_cancel_source, reason_for_end
from projections.turn_finalize import finalize_turn
from projections.turn_findings import clock_stepped_back, warning
from projections.turn_state import (
    KEPT_PER_SESSION,
    FinalizedResponses,
    OpenTurn,
    SessionTurns,
    Terminal,
    remember,
)
from projections.turn_tables import TurnTables

__all__ = ["KEPT_PER_SESSION", "TurnsFold"]

_NOTHING_PINNED: dict[str, None] = {}  # finalized responses are forgotten oldest first, none pinned


class TurnsFold:
    """Pure fold: ``apply(stored, accepted)``; finalized turns accumulate in
    :attr:`finalized` (drain with :meth:`take_finalized`); warnings in :attr:`findings`.

    ``live=True`` (the session engine's own fold): sessions opened with ``log_stats`` off get
    no state at all — no turn aggregator, nothing buffered, no table built (M14)."""

    def __init__(self, live: bool = False) -> None:
        self.live = live
        self.sessions: dict[str, SessionTurns] = {}
        self.silent: set[str] = set()  # live mode: sessions with log_stats off
        self.finalized: list[TurnTables] = []
        self.findings: list[Finding] = []
        self.closed_responses: dict[str, FinalizedResponses] = {}
        """Sessions forgotten closed (:meth:`forget_closed`) -> the responses they finalized: a
        late terminal is judged against them, and a reopen keeps them known (no id reused,
        DOMAIN §2.1), exactly as if the session had never been forgotten. Per closed session at
        most ``KEPT_PER_SESSION`` terminals and every finalized id; the rest of the working
        state is gone."""

    def apply(self, stored: StoredEvent, accepted: bool = True) -> None:
        """Apply one event; ``accepted`` False (refused by the resources fold) is skipped, except
        that a refused Stage0 submit still says the log records submits (D1: facts then need a
        live segment, whatever was refused)."""
        event = stored.event
        handler = _HANDLERS.get(type(event))
        if handler is None:
            return
        if not accepted:
            if handler is attribution.submitted and event.stage_id == 0:  # type: ignore[attr-defined]
                s = self.sessions.get(event.session_id)
                if s is not None:
                    s.submits_seen = True
            return
        sid = event.session_id
        if self.live:
            if event.type == "SessionOpened":  # type: ignore[attr-defined]
                if not event.log_stats:  # type: ignore[attr-defined]
                    self.silent.add(sid)
                    self.sessions.pop(sid, None)
                    return
                self.silent.discard(sid)
            elif sid in self.silent:
                if event.type == "SessionClosed":  # type: ignore[attr-defined]
                    self.silent.discard(sid)
                return
        s = self.sessions.get(sid)
        if s is None:
            kept = self.closed_responses.pop(sid, None)
            if kept is None:
                s = self.sessions[sid] = SessionTurns(sid)
            else:  # forgotten closed: back closed, with what later events are judged by
                s = self.sessions[sid] = SessionTurns(
                    sid, terminals=kept.terminals, finalized_earlier=kept.finalized_earlier, closed=True
                )
        handler(self, s, stored, event)

    def take_finalized(self) -> list[TurnTables]:
        out, self.finalized = self.finalized, []
        return out

    def forget_closed(self) -> list[str]:
        """Drop closed sessions (bounded memory); returns their ids. Each keeps only its
        finalized responses in :attr:`closed_responses`."""
        gone = [sid for sid, s in self.sessions.items() if s.closed and s.open is None]
        for sid in gone:
            s = self.sessions.pop(sid)
            self.closed_responses[sid] = FinalizedResponses(s.terminals, s.finalized_earlier)
        return gone

    def warn(
        self, s: SessionTurns, kind: str, stage_id: int | None, request_id: str | None, st: StoredEvent, detail: str
    ) -> None:
        """One point warning of ``kind`` at ``st`` (D9)."""
        self.findings.append(warning(s.session_id, kind, stage_id, request_id, st, detail))

    # ------------------------------------------------------------------ lifecycle
    def _opened(self, s: SessionTurns, st: StoredEvent, e: SessionOpened) -> None:
        if s.closed:  # a new incarnation: fresh state, but its responses stay known (no id reused)
            s = self.sessions[s.session_id] = SessionTurns(
                s.session_id, terminals=s.terminals, finalized_earlier=s.finalized_earlier
            )
        s.num_stages = e.num_stages
        s.opened_at = (st.position, e.ts)

    def _closed(self, s: SessionTurns, st: StoredEvent, e: SessionClosed) -> None:
        if s.open is not None:
            self.finalize(s, st, "close")
        if s.opened_at is not None and e.ts < s.opened_at[1]:  # session wall time (metrics, rollup)
            what = "session wall time (SessionOpened -> SessionClosed)"
            self.findings.append(clock_stepped_back(s.session_id, None, None, s.opened_at, (st.position, e.ts), what))
        s.closed = True
        s.live.clear()
        s.current_id = None
        s.clear_pending()

    def _epoch_advanced(self, s: SessionTurns, st: StoredEvent, e: EpochAdvanced) -> None:
        """DOMAIN §2.1: every id of the older epoch leaves its segment; nothing buffered survives."""
        s.live.clear()
        s.current_id = None
        s.clear_pending()

    def _released(self, s: SessionTurns, st: StoredEvent, e: StageRequestReleased | StageRequestLost) -> None:
        if e.stage_id == 0:
            s.end_segment(e.request_id)

    def _turn_completed(self, s: SessionTurns, st: StoredEvent, e: TurnCompleted) -> None:
        s.completed_below = max(s.completed_below, e.completed_turn_id + 1)

    # ------------------------------------------------------------------ arrival
    def _appended(self, s: SessionTurns, st: StoredEvent, e: InputAppended) -> None:
        if s.pending_stamp is None:
            s.pending_stamp, s.pending_stamp_position, s.pending_stamp_uncommitted = e.ts, st.position, True

    def _input_cleared(self, s: SessionTurns, st: StoredEvent, e: InputCleared) -> None:
        """input_audio_buffer.clear drops the uncommitted appends: an arrival stamp they set
        goes with them (committed input keeps its stamp)."""
        if s.pending_stamp_uncommitted:
            s.pending_stamp, s.pending_stamp_uncommitted = None, False

    def _committed(self, s: SessionTurns, st: StoredEvent, e: TurnCommitted) -> None:
        s.pending_stamp_uncommitted = False
        if e.response_id is not None and e.create_response and e.action != "START_AUTO_RESPONSE":
            # Pre-created at commit (DOMAIN §2.3): the turn opens now, arrival = commit ts (M6).
            s.pending_stamp = None
            self._begin(s, st, e.response_id, None, e.turn_id, e.ts)
            return
        if e.create_response and e.action != "START_AUTO_RESPONSE":
            s.pending_commit_ts, s.pending_commit_position = e.ts, st.position
        s.stamp(e.ts, st.position)

    # ------------------------------------------------------------------ open
    def _begun(self, s: SessionTurns, st: StoredEvent, e: ResponseBegun) -> None:
        if e.request_id is not None and not rid.is_duplex(e.request_id):
            return  # chat ids never open a turn (M12)
        self._begin(s, st, e.response_id, e.request_id, e.turn_id, e.commit_ts)

    def _begin(
        self,
        s: SessionTurns,
        st: StoredEvent,
        response_id: str,
        request_id: str | None,
        turn_id: int,
        commit_ts: float | None,
    ) -> None:
        if s.closed:  # the session is closed: no turn opens until it is opened again (D9)
            self.warn(
                s,
                "after_close",
                None,
                response_id,
                st,
                f"begin of response {response_id!r} after the session closed; ignored",
            )
            return
        if request_id is not None and s.submits_seen and request_id not in s.live:
            # A log that records submits names an id with no live segment (never submitted,
            # aborted, released, older epoch): D19 — the begin opens nothing, binds nothing and
            # ends nothing (a response pre-created at commit stays open as it was); one warning.
            self.warn(
                s,
                "begin_of_unheld_id",
                0,
                request_id,
                st,
                f"begin of response {response_id!r} names an id the session does not hold; ignored",
            )
            return
        turn = s.open
        if turn is not None:
            if turn.response_id == response_id:  # the begin of a turn pre-created at commit (D7)
                if request_id is not None and request_id != turn.request_id:
                    bind(s, turn, request_id)
                turn.turn_id = _title_turn(request_id or turn.request_id, turn_id)
                return
            self.finalize(s, st, "abort", end_segment=turn.request_id != request_id)  # superseded (M21)
        if s.finalized(response_id):  # however long ago (module doc: finalized for good)
            self.warn(
                s,
                "stale_finalize",
                None,
                response_id,
                st,
                f"{_opening(st)} of response {response_id!r}, already finalized; ignored",
            )
            return
        if commit_ts is not None:
            arrival, arrival_position = commit_ts, st.position
        elif s.pending_commit_ts is not None:
            arrival, arrival_position = s.pending_commit_ts, s.pending_commit_position
        elif s.pending_stamp is not None:
            arrival, arrival_position = s.pending_stamp, s.pending_stamp_position
        else:
            arrival, arrival_position = st.event.ts, st.position
        s.pending_commit_ts = None
        s.pending_stamp, s.pending_stamp_uncommitted = None, False
        turn = OpenTurn(response_id, None, _title_turn(request_id, turn_id), arrival, st.position, arrival_position)
        turn.tx_baseline = {edge: tuple(v) for edge, v in s.tx_totals.items()}  # type: ignore[misc]
        s.open = turn
        if request_id is None and st.event.type == "ResponseBegun":
            # A begin that names no id: the buffered id, else the current id in its segment.
            request_id = s.pending_request_id or (s.current_id if s.current_id in s.live else None)
        if request_id is not None:
            bind(s, turn, request_id)

    # ------------------------------------------------------------------ finalize
    def _ended(self, s: SessionTurns, st: StoredEvent, e: ResponseEnded) -> None:
        self._terminal(s, st, e.response_id, reason_for_end(e.cause, e.status))

    def _turn_finalized(self, s: SessionTurns, st: StoredEvent, e: TurnFinalized) -> None:
        self._terminal(s, st, e.response_id, reason_for(e.finished_reason))

    def _cancel(self, s: SessionTurns, st: StoredEvent, e: CancelRequested) -> None:
        reason = reason_for_cancel_source(e.source)
        if e.response_id is not None:
            self._terminal(s, st, e.response_id, reason)
        elif s.open is not None:
            self.finalize(s, st, reason)

    def _abort(self, s: SessionTurns, st: StoredEvent, e: AbortRequested) -> None:
        if s.open is not None and s.open.request_id is not None and s.open.request_id in e.request_ids:
            self.finalize(s, st, reason_for(e.reason) if e.reason is not None else "abort")
        for request_id in e.request_ids:
            s.end_segment(request_id)

    def _terminal(self, s: SessionTurns, st: StoredEvent, response_id: str, reason: str) -> None:
        """A terminal event naming ``response_id`` (D9: a second terminal is one warning)."""
        if s.open is not None and s.open.response_id == response_id:
            self.finalize(s, st, reason)
            return
        kind = st.event.type  # type: ignore[attr-defined]
        done = s.terminals.get(response_id)
        if done is None and response_id in s.finalized_earlier:
            # Finalized before the terminals kept: stale all the same, its reason unknown; the
            # record holds this terminal as the stale one (its pair's other half joins it).
            done = s.terminals[response_id] = Terminal(None)
            s.finalized_earlier.update(remember(s.terminals, None, _NOTHING_PINNED))
        if done is not None and done.reason == reason and kind not in done.kinds:
            done.kinds.add(kind)  # the rest of the same terminal (e.g. ResponseEnded + TurnFinalized)
            return
        if done is not None and done.stale_reason == reason and kind not in done.stale_kinds:
            done.stale_kinds.add(kind)  # the rest of the stale terminal already reported
            return
        if done is not None:
            done.stale_reason, done.stale_kinds = reason, {kind}  # the finalized reason stays
            was = done.reason if done.reason is not None else "reason no longer kept"
            detail = f"{kind} ({reason}) of response {response_id!r}, already finalized ({was})"
        else:
            detail = f"{kind} ({reason}) of response {response_id!r}, which the session does not hold"
        self.warn(s, "stale_finalize", None, response_id, st, detail)  # the id field names the response

    def finalize(self, s: SessionTurns, st: StoredEvent, reason: str, end_segment: bool = True) -> None:
        """End the open turn at ``st`` with ``reason`` (the first terminal wins, §5.5): its id's
        segment ends (unless a superseding begin names the same id) and its tables are built."""
        turn = s.open
        assert turn is not None
        s.open = None
        s.terminals[turn.response_id] = Terminal(reason, {st.event.type})  # type: ignore[attr-defined]
        if len(s.terminals) > KEPT_PER_SESSION:  # the oldest terminal goes; its id stays finalized
            s.finalized_earlier.update(remember(s.terminals, None, _NOTHING_PINNED))
        if end_segment:
            s.end_segment(turn.request_id)
        if turn.request_id is not None and not rid.is_duplex(turn.request_id):
            return
        self.finalized.append(finalize_turn(s, turn, st, reason, self.findings))


def _opening(st: StoredEvent) -> str:
    """How the event at ``st`` opens a turn, for a warning's words: a commit that pre-creates
    its response (DOMAIN §2.3), else a begin."""
    return "commit (pre-created)" if st.event.type == "TurnCommitted" else "begin"  # type: ignore[attr-defined]


def _title_turn(request_id: str | None, turn_id: int) -> int:
    """D7: the turn a title names — an ephemeral id's ``_t<N>``, else the begin's turn id."""
    named = _ephemeral_turn(request_id) if request_id is not None else None
    return named if named is not None else turn_id


@functools.lru_cache(maxsize=4096)
def _ephemeral_turn(request_id: str) -> int | None:
    """The ``_t<N>`` of an ephemeral id; None for any other id (parsed once per id)."""
    parsed = rid.try_parse(request_id)
    stage_turn = parsed.ephemeral_stage_turn if parsed is not None else None
    return stage_turn[1] if stage_turn is not None else None


_HANDLERS = dispatch_table(
    {
        InputAppended: TurnsFold._appended,
        InputCleared: TurnsFold._input_cleared,
        TurnCommitted: TurnsFold._committed,
        ResponseBegun: TurnsFold._begun,
        ResponseEnded: TurnsFold._ended,
        TurnFinalized: TurnsFold._turn_finalized,
        CancelRequested: TurnsFold._cancel,
        AbortRequested: TurnsFold._abort,
        SessionClosed: TurnsFold._closed,
        SessionOpened: TurnsFold._opened,
        EpochAdvanced: TurnsFold._epoch_advanced,
        StageRequestReleased: TurnsFold._released,
        StageRequestLost: TurnsFold._released,
        TurnCompleted: TurnsFold._turn_completed,
        StageRequestSubmitted: attribution.submitted,
        StageRequestForwarded: attribution.forwarded,
        StageOutput: attribution.output,
        StageRequestFinished: attribution.finished,
        StageMetricsReported: attribution.metrics,
        ResponseListened: attribution.listened,
        TransferTx: attribution.transfer,
    }
)
"""Event class (model and read-side struct) -> ``handler(fold, session, stored, event)``."""
