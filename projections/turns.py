"""Per-turn metric tables as a pure fold (DOMAIN §5.3–§5.5, §5.7).

One assistant turn = one ``response_id`` = one table set, built when the turn is finalized.
The offline fold works on every session whatever its ``log_stats`` (M14 decision: offline
re-projection covers sessions that ran with log_stats off); the live engine's fold
(``TurnsFold(live=True)``) opens nothing for a session with log_stats off (M14).

**Attribution (DOMAIN §5.7 D1).** A fact — ``StageOutput``, ``StageMetricsReported``,
``StageRequestFinished``, ``StageRequestForwarded``, ``ResponseListened`` — joins a turn only
when it names the turn's own engine id *and* falls inside that id's current segment:

* a **segment** of id X opens at each accepted Stage0 submit of X (``initial`` or ``update``:
  the resources fold has already refused stale fences, other incarnations and older epochs)
  and ends when the turn bound to X is finalized, when X is aborted or its Stage0 binding
  released, at an epoch change and at close. A resident id serves many turns: the segment, not
  the id, decides, and an output whose ``model_turn_id`` names a turn the model already
  completed (``TurnCompleted``) never joins a later turn;
* facts of the open turn's id inside its live segment join the turn;
* with no turn bound to it, facts of the session's **current** id (the last Stage0 id
  submitted) inside its live segment are buffered (*buffer before begin*, §5.3) and replayed
  only into a turn that begins with that same id;
* every other fact joins nothing, changes no table and is one ``output_outside_segment``
  warning (D9). Facts of ids the session does not hold at all were already refused, with their
  warning, by the resources fold; ``accepted=False`` skips them here. A late
  ``StageRequestFinished`` of a held id is a resource fact, not a warning: it only finalizes a
  turn (D11) inside the segment;
* logs that record no submits at all (a metrics-only log) attribute by the begin's id, as
  before: an id the session never submitted joins the turn bound to it, and is buffered
  while the session has no current id.

**Open** — ``TurnCommitted`` carrying a ``response_id`` (pre-created at commit, §2.3) opens the
turn with no engine id yet; the first Stage0 submit after it binds it, and ``ResponseBegun``
names the id and the turn for every title (D7: for an ephemeral id ``turn=`` is the id's
``_t<N>``). Opening another response while one is open finalizes the open one with ``abort``
(superseded, M21). Non-duplex ids never open, buffer into or finalize a turn (M12).

**Ingest** — a ``StageMetricsReported`` becomes one segment accumulator
(:class:`projections.collapse.StageCollapse`; engine stamps of one clock fill a missing
TTFT/TPOT, CASE-08); first-ts rule M2; one collapsed pending row per stage before begin (M15).
A stage with no snapshot in the turn gets one **ledger-derived** segment from its submit or
forward (ts, ``num_tokens_in``) and its ``StageOutput`` token deltas, computed on integer
microseconds: ``vllm_ttft_ms`` = first token − this turn's submit (None without a token),
``vllm_tpot_ms`` = (last − first token) / (n_out − 1) (None for n_out < 2),
``stage_gen_time_ms`` = last output − submit. Its stats are "received" at the finalize, so its
wall time runs to the turn's end (decision, CASE-18).

**Arrival** (§5.3, CASE-12, M16) — the caller's commit ts, else the pending stamp (first
accepted append/commit while none is pending, or the first buffered snapshot's submit ts /
receipt), else the begin ts. Begin consumes the stamp; finalize never erases a later stamp.

**Finalize** (§5.5) — ``ResponseEnded`` (cause beats status, CASE-13), ``TurnFinalized``,
``CancelRequested`` (§2.4), an ``AbortRequested`` naming the turn's id, an engine abort
``StageRequestFinished(finish_reason=abort)`` of the turn's id in its segment (D11),
``SessionClosed`` (``close``), or a superseding begin (``abort``). The first wins; end ts = that
event's ts (CASE-09). A terminal event naming a finalized response is part of the same
terminal when it repeats its reason with a kind not yet seen (the engine's ResponseEnded +
TurnFinalized pair); any other is one ``stale_finalize`` warning (D9). A turn that ends before
any engine request still gets a row, with ``request_id`` None (D8).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from events import ids as rid
from events.records import StoredEvent
from events.structs import struct_type
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
from projections.collapse import EMPTY, StageCollapse
from projections.dispatch import dispatch_table
from projections.findings import Finding, severity_of
from projections.intervals import gen_ms, tpot_ms, ttft_ms
from projections.reasons import reason_for, reason_for_cancel_source, reason_for_end
from projections.turn_tables import TurnTables, build_turn_tables

Edge = tuple[int, int]
TURN, PENDING, NOWHERE = "turn", "pending", "nowhere"


@dataclass(slots=True)
class DerivedStage:
    """Ledger-derived segment accumulator for one stage of one turn (wall clock, seconds)."""

    request_id: str | None = None
    submit_ts: float | None = None
    num_tokens_in: int | None = None
    num_tokens_out: int = 0
    first_token_ts: float | None = None
    last_token_ts: float | None = None
    last_ts: float | None = None
    # log positions of the stamps above (D17: a span that comes out negative names both)
    submit_position: int = 0
    first_token_position: int = 0
    last_token_position: int = 0
    last_position: int = 0

    def stepped_back(self) -> list[tuple[str, int, float, int, float]]:
        """The spans of this segment whose end stamp is earlier than their start (the host's
        clock stepped back, D17), as (name, start position, start ts, end position, end ts); the
        segment's durations clamp them to 0 (:mod:`projections.intervals`)."""
        spans = (
            ("vllm_ttft_ms", self.submit_position, self.submit_ts, self.first_token_position, self.first_token_ts),
            (
                "vllm_tpot_ms",
                self.first_token_position,
                self.first_token_ts,
                self.last_token_position,
                self.last_token_ts,
            ),
            ("stage_gen_time_ms", self.submit_position, self.submit_ts, self.last_position, self.last_ts),
        )
        return [(n, a, ta, b, tb) for n, a, ta, b, tb in spans if ta is not None and tb is not None and tb < ta]

    def to_segment(self) -> StageCollapse:
        """One segment of the stage (DOMAIN §5.3 decision; CASE-03/09/10), durations in ms from
        integer microseconds."""
        return StageCollapse.from_values(
            num_tokens_in=self.num_tokens_in,
            num_tokens_out=self.num_tokens_out,
            stage_gen_time_ms=gen_ms(self.submit_ts, self.last_ts),
            vllm_ttft_ms=ttft_ms(self.submit_ts, self.first_token_ts),
            vllm_tpot_ms=tpot_ms(self.first_token_ts, self.last_token_ts, self.num_tokens_out),
        )


@dataclass(slots=True)
class OpenTurn:
    response_id: str
    request_id: str | None
    turn_id: int
    arrival_ts: float
    opened_position: int = 0
    arrival_position: int = 0  # the event that set arrival_ts (D17)
    segments: dict[int, list[StageCollapse]] = field(default_factory=dict)
    first_ts: dict[int, float] = field(default_factory=dict)
    last_ts: dict[int, float] = field(default_factory=dict)
    derived: dict[int, DerivedStage] = field(default_factory=dict)
    tx_baseline: dict[Edge, tuple[float, int, bool]] = field(default_factory=dict)
    last_snapshot: dict[int, tuple[str, StageCollapse, float | None]] = field(default_factory=dict)


@dataclass(slots=True)
class Terminal:
    """How a finalized response ended: its reason and the event kinds of that terminal, and the
    last stale terminal seen after it (its reason and kinds: the second half of an engine pair
    such as ResponseEnded + TurnFinalized joins it without a second warning)."""

    reason: str
    kinds: set[str] = field(default_factory=set)
    stale_reason: str | None = None
    stale_kinds: set[str] = field(default_factory=set)


@dataclass(slots=True)
class SessionTurns:
    session_id: str
    num_stages: int = 2
    open: OpenTurn | None = None
    completed_below: int = 0  # the model completed every turn below this (TurnCompleted)
    current_id: str | None = None  # the last Stage0 id submitted
    live: dict[str, int] = field(default_factory=dict)  # id -> position of the submit opening its live segment
    submitted: dict[str, None] = field(default_factory=dict)  # ids submitted, oldest first (bounded)
    pending_request_id: str | None = None  # the id every pending fact belongs to (D1)
    pending_rows: dict[int, StageCollapse] = field(default_factory=dict)
    pending_first_ts: dict[int, float] = field(default_factory=dict)
    pending_last_ts: dict[int, float] = field(default_factory=dict)
    pending_derived: dict[int, DerivedStage] = field(default_factory=dict)
    pending_stamp: float | None = None
    pending_stamp_uncommitted: bool = False  # the stamp is an append's since the last commit
    pending_commit_ts: float | None = None
    pending_stamp_position: int = 0
    pending_commit_position: int = 0
    opened_at: tuple[int, float] | None = None  # SessionOpened (position, ts): session wall time (D17)
    tx_totals: dict[Edge, list[Any]] = field(default_factory=dict)
    terminals: dict[str, Terminal] = field(default_factory=dict)
    closed: bool = False
    # Downstream stages (> 0) each live id was forwarded to in its current segment; once the log
    # records forwards at all (forward_seen), a downstream fact joins only after its forward (D1).
    forwarded: dict[str, set[int]] = field(default_factory=dict)
    forward_seen: bool = False
    submits_seen: bool = False  # the log records Stage0 submits (accepted or refused)

    def clear_pending(self) -> None:
        self.pending_request_id = None
        self.pending_rows, self.pending_first_ts, self.pending_last_ts, self.pending_derived = {}, {}, {}, {}

    def end_segment(self, request_id: str | None) -> None:
        if request_id is None:
            return
        self.live.pop(request_id, None)
        self.forwarded.pop(request_id, None)
        if self.pending_request_id == request_id:
            self.clear_pending()


_SUBMITS: frozenset[type] = frozenset({struct_type(StageRequestSubmitted)})


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
        self._handlers = dispatch_table(
            {
                InputAppended: self._appended,
                InputCleared: self._input_cleared,
                TurnCommitted: self._committed,
                ResponseBegun: self._begun,
                ResponseEnded: self._ended,
                TurnFinalized: self._turn_finalized,
                CancelRequested: self._cancel,
                AbortRequested: self._abort,
                SessionClosed: self._closed,
                SessionOpened: self._opened,
                StageRequestSubmitted: self._submitted,
                StageRequestForwarded: self._forwarded,
                StageOutput: self._output,
                StageRequestFinished: self._finished,
                StageMetricsReported: self._metrics,
                ResponseListened: self._listened,
                StageRequestReleased: self._released,
                StageRequestLost: self._released,
                EpochAdvanced: self._epoch_advanced,
                TransferTx: self._transfer,
                TurnCompleted: self._turn_completed,
            }
        )

    def apply(self, stored: StoredEvent, accepted: bool = True) -> None:
        """Apply one event; ``accepted`` False (refused by the resources fold) is skipped, except
        that a refused Stage0 submit still says the log records submits (D1: facts then need a
        live segment, whatever was refused)."""
        event = stored.event
        if not accepted:
            if type(event) in _SUBMITS and event.stage_id == 0:  # type: ignore[attr-defined]
                s = self.sessions.get(event.session_id)
                if s is not None:
                    s.submits_seen = True
            return
        handler = self._handlers.get(type(event))
        if handler is None:
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
            s = self.sessions[sid] = SessionTurns(sid)
        handler(s, stored, event)

    def take_finalized(self) -> list[TurnTables]:
        out, self.finalized = self.finalized, []
        return out

    def forget_closed(self) -> list[str]:
        gone = [sid for sid, s in self.sessions.items() if s.closed and s.open is None]
        for sid in gone:
            del self.sessions[sid]
        return gone

    def _warn(
        self, s: SessionTurns, kind: str, stage_id: int | None, request_id: str | None, st: StoredEvent, detail: str
    ) -> None:
        self.findings.append(_finding(s.session_id, kind, stage_id, request_id, st, detail))

    def _stepped_back(
        self,
        s: SessionTurns,
        stage_id: int | None,
        response_id: str | None,
        start: tuple[int, float],
        st: StoredEvent,
        what: str,
        end: tuple[int, float] | None = None,
    ) -> None:
        """DOMAIN §5.7 D17: a span between two wall-clock stamps came out negative (the host's
        clock stepped back); it is shown and observed as 0; one warning naming both positions."""
        end_position, end_ts = end if end is not None else (st.position, st.event.ts)
        self.findings.append(
            Finding(
                s.session_id,
                stage_id,
                response_id,
                "clock_stepped_back",
                start[0],
                start[1],
                end_position,
                end_ts,
                tuple(sorted({start[0], end_position})),
                f"{what}: {start[1]!r} at position {start[0]} -> {end_ts!r} at position {end_position}; clamped to 0",
                severity_of("clock_stepped_back"),
            )
        )

    def _stepped_back_segment(
        self, s: SessionTurns, stage_id: int, response_id: str, d: DerivedStage, st: StoredEvent
    ) -> None:
        """D17 for a ledger-derived row: one warning per distinct pair of positions whose span
        came out negative (TTFT, TPOT, generation time)."""
        seen: set[tuple[int, int]] = set()
        for name, a, ta, b, tb in d.stepped_back():
            if (a, b) not in seen:
                seen.add((a, b))
                self._stepped_back(s, stage_id, response_id, (a, ta), st, f"stage {stage_id} {name}", (b, tb))

    # ------------------------------------------------------------------ lifecycle
    def _opened(self, s: SessionTurns, st: StoredEvent, e: SessionOpened) -> None:
        if s.closed:  # a new incarnation: fresh state, but its responses stay known (no id reused)
            s = self.sessions[s.session_id] = SessionTurns(s.session_id, terminals=s.terminals)
        s.num_stages = e.num_stages
        s.opened_at = (st.position, e.ts)

    def _closed(self, s: SessionTurns, st: StoredEvent, e: SessionClosed) -> None:
        if s.open is not None:
            self._finalize(s, st, "close")
        if s.opened_at is not None and e.ts < s.opened_at[1]:  # session wall time (metrics, rollup)
            self._stepped_back(s, None, None, s.opened_at, st, "session wall time (SessionOpened -> SessionClosed)")
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
    @staticmethod
    def _stamp(s: SessionTurns, ts: float, position: int) -> None:
        if s.pending_stamp is None:
            s.pending_stamp, s.pending_stamp_position = ts, position

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
        self._stamp(s, e.ts, st.position)

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
            self._warn(
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
            self._warn(
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
                    self._bind(s, turn, request_id)
                turn.turn_id = _title_turn(request_id or turn.request_id, turn_id)
                return
            self._finalize(s, st, "abort", end_segment=turn.request_id != request_id)  # superseded (M21)
        if response_id in s.terminals:
            self._warn(
                s,
                "stale_finalize",
                None,
                response_id,
                st,
                f"begin of response {response_id!r}, already finalized; ignored",
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
        turn.tx_baseline = {edge: (v[0], v[1], v[2]) for edge, v in s.tx_totals.items()}
        s.open = turn
        if request_id is None and st.event.type == "ResponseBegun":
            # A begin that names no id: the buffered id, else the current id in its segment.
            request_id = s.pending_request_id or (s.current_id if s.current_id in s.live else None)
        if request_id is not None:
            self._bind(s, turn, request_id)

    def _bind(self, s: SessionTurns, turn: OpenTurn, request_id: str) -> None:
        """Bind the open turn to ``request_id``: it is built from that id's facts only (D1),
        including what was buffered for it before the begin (§5.3, M5, M11)."""
        if turn.request_id is not None:  # re-titled by its begin: drop what another id gave it
            turn.segments, turn.first_ts, turn.last_ts, turn.derived = {}, {}, {}, {}
            turn.last_snapshot = {}
        turn.request_id = request_id
        if s.pending_request_id != request_id:
            return
        for stage_id, row in s.pending_rows.items():  # replay the buffered pre-begin row (M5)
            turn.segments[stage_id] = [row]
            turn.first_ts[stage_id] = s.pending_first_ts[stage_id]
            turn.last_ts[stage_id] = s.pending_last_ts[stage_id]
        turn.derived.update(s.pending_derived)
        s.clear_pending()

    # ------------------------------------------------------------------ attribution (D1)
    def _route(self, s: SessionTurns, request_id: str, model_turn_id: int | None = None) -> str:
        """Where a fact of ``request_id`` goes: the open turn, the pre-begin buffer, or nowhere."""
        if model_turn_id is not None and model_turn_id < s.completed_below:
            return NOWHERE  # names a turn the model already completed
        known = request_id in s.submitted
        turn = s.open
        if turn is not None and turn.request_id == request_id:
            return TURN if (not known or request_id in s.live) else NOWHERE
        if known:
            return PENDING if request_id == s.current_id and request_id in s.live else NOWHERE
        return NOWHERE if s.submits_seen else PENDING  # PENDING: a log without submits

    def _target(
        self,
        s: SessionTurns,
        st: StoredEvent,
        stage_id: int,
        request_id: str,
        what: str,
        model_turn_id: int | None = None,
        warn: bool = True,
    ) -> str:
        where = self._route(s, request_id, model_turn_id)
        if (
            where != NOWHERE
            and stage_id > 0
            and what != "forward"
            and s.forward_seen
            and stage_id not in s.forwarded.get(request_id, ())
        ):
            where = NOWHERE  # a downstream fact before this segment's forward to that stage
        if where == PENDING and s.pending_request_id != request_id:
            s.clear_pending()
            s.pending_request_id = request_id
        if where == NOWHERE and warn:
            self._warn(
                s,
                "output_outside_segment",
                stage_id,
                request_id,
                st,
                f"{what} outside its id's current segment (turn ended, or not the session's current id); joins no turn",
            )
        return where

    def _derived(self, s: SessionTurns, where: str, stage_id: int, request_id: str) -> DerivedStage:
        target = s.open.derived if where == TURN and s.open is not None else s.pending_derived
        derived = target.get(stage_id)
        if derived is None:
            derived = target[stage_id] = DerivedStage(request_id)
        return derived

    # ------------------------------------------------------------------ ingest
    def _submitted(self, s: SessionTurns, st: StoredEvent, e: StageRequestSubmitted) -> None:
        if not rid.is_duplex(e.request_id):
            return
        if e.stage_id != 0:
            self._forwarded(s, st, e)
            return
        # A new segment of this id (DOMAIN §5.7 D1): the session's current id from now on.
        if s.current_id != e.request_id or s.pending_request_id not in (None, e.request_id):
            s.clear_pending()
        s.current_id = e.request_id
        s.submits_seen = True
        remember(s.submitted, e.request_id, s.live)
        s.live[e.request_id] = st.position
        s.forwarded[e.request_id] = set()  # a new segment: no downstream stage forwarded yet
        turn = s.open
        if turn is not None and turn.request_id is None:
            self._bind(s, turn, e.request_id)  # a turn pre-created at commit takes the first id submitted after
        if turn is not None and turn.request_id == e.request_id:
            d = turn.derived.setdefault(0, DerivedStage(e.request_id))
            if d.submit_ts is None:
                d.submit_ts, d.num_tokens_in, d.submit_position = e.ts, e.num_tokens_in, st.position
            return
        s.pending_request_id = e.request_id
        s.pending_derived[0] = DerivedStage(e.request_id, e.ts, e.num_tokens_in, submit_position=st.position)

    def _forwarded(self, s: SessionTurns, st: StoredEvent, e: StageRequestForwarded | StageRequestSubmitted) -> None:
        if not rid.is_duplex(e.request_id):
            return
        where = self._target(s, st, e.stage_id, e.request_id, "forward")
        if where != NOWHERE:
            s.forward_seen = True
            s.forwarded.setdefault(e.request_id, set()).add(e.stage_id)
            d = self._derived(s, where, e.stage_id, e.request_id)
            if d.submit_ts is None:
                d.submit_ts, d.submit_position = e.ts, st.position

    def _output(self, s: SessionTurns, st: StoredEvent, e: StageOutput) -> None:
        if not rid.is_duplex(e.request_id):
            return
        where = self._target(s, st, e.stage_id, e.request_id, "output", e.model_turn_id)
        if where == NOWHERE:
            return
        d = self._derived(s, where, e.stage_id, e.request_id)
        d.last_ts, d.last_position = e.ts, st.position
        if e.num_new_tokens > 0:
            if d.first_token_ts is None:
                d.first_token_ts, d.first_token_position = e.ts, st.position
            d.last_token_ts, d.last_token_position = e.ts, st.position
            d.num_tokens_out += e.num_new_tokens
        if where == TURN and e.finished and e.finish_reason == "abort":
            self._finalize(s, st, "abort")  # the engine ended the turn's request (D11)

    def _finished(self, s: SessionTurns, st: StoredEvent, e: StageRequestFinished) -> None:
        if not rid.is_duplex(e.request_id):
            return
        where = self._target(s, st, e.stage_id, e.request_id, "finish", e.model_turn_id, warn=False)
        if where == TURN and e.finish_reason == "abort":
            self._finalize(s, st, "abort")  # engine abort of the turn's id (D11, CASE-21)

    def _listened(self, s: SessionTurns, st: StoredEvent, e: ResponseListened) -> None:
        if e.request_id is not None and rid.is_duplex(e.request_id):
            self._target(s, st, 0, e.request_id, "listen unit")

    def _metrics(self, s: SessionTurns, st: StoredEvent, e: StageMetricsReported) -> None:
        if not rid.is_duplex(e.request_id):
            return  # chat ids never buffer (M12)
        segment = snapshot_segment(e)
        if segment is None:
            self._warn(
                s,
                "clock_domain_mismatch",
                e.stage_id,
                e.request_id,
                st,
                "engine stamps from different clocks; snapshot ignored",
            )
            return
        where = self._target(s, st, e.stage_id, e.request_id, "metrics snapshot")
        if where == NOWHERE:
            return
        first = e.stage_submit_ts if e.stage_submit_ts is not None else e.ts
        if where == TURN:
            turn = s.open
            assert turn is not None
            key = (e.request_id, segment, e.stage_submit_ts)
            if turn.last_snapshot.get(e.stage_id) == key:
                return  # the same snapshot seen on a second path is counted once (M21)
            turn.last_snapshot[e.stage_id] = key
            turn.segments.setdefault(e.stage_id, []).append(segment)
            turn.first_ts.setdefault(e.stage_id, first)
            turn.last_ts[e.stage_id] = max(turn.last_ts.get(e.stage_id, e.ts), e.ts)
            return
        # Buffer before begin: one collapsed pending row per stage (M15).
        s.pending_rows[e.stage_id] = s.pending_rows.get(e.stage_id, EMPTY).combine(segment)
        s.pending_first_ts.setdefault(e.stage_id, first)
        s.pending_last_ts[e.stage_id] = max(s.pending_last_ts.get(e.stage_id, e.ts), e.ts)
        self._stamp(s, first, st.position)

    def _transfer(self, s: SessionTurns, st: StoredEvent, e: TransferTx) -> None:
        edge = (e.from_stage, e.to_stage)
        total = s.tx_totals.setdefault(edge, [0.0, 0, False])
        total[0] += e.tx_time_ms
        total[1] += e.size_bytes
        total[2] = total[2] or e.used_shm

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
            self._finalize(s, st, reason)

    def _abort(self, s: SessionTurns, st: StoredEvent, e: AbortRequested) -> None:
        if s.open is not None and s.open.request_id is not None and s.open.request_id in e.request_ids:
            self._finalize(s, st, reason_for(e.reason) if e.reason is not None else "abort")
        for request_id in e.request_ids:
            s.end_segment(request_id)

    def _terminal(self, s: SessionTurns, st: StoredEvent, response_id: str, reason: str) -> None:
        """A terminal event naming ``response_id`` (D9: a second terminal is one warning)."""
        if s.open is not None and s.open.response_id == response_id:
            self._finalize(s, st, reason)
            return
        kind = st.event.type  # type: ignore[attr-defined]
        done = s.terminals.get(response_id)
        if done is not None and done.reason == reason and kind not in done.kinds:
            done.kinds.add(kind)  # the rest of the same terminal (e.g. ResponseEnded + TurnFinalized)
            return
        if done is not None and done.stale_reason == reason and kind not in done.stale_kinds:
            done.stale_kinds.add(kind)  # the rest of the stale terminal already reported
            return
        if done is not None:
            done.stale_reason, done.stale_kinds = reason, {kind}  # the finalized reason stays
            detail = f"{kind} ({reason}) of response {response_id!r}, already finalized ({done.reason})"
        else:
            detail = f"{kind} ({reason}) of response {response_id!r}, which the session does not hold"
        self._warn(s, "stale_finalize", None, response_id, st, detail)  # the id field names the response

    def _finalize(self, s: SessionTurns, st: StoredEvent, reason: str, end_segment: bool = True) -> None:
        turn = s.open
        assert turn is not None
        s.open = None
        s.terminals[turn.response_id] = Terminal(reason, {st.event.type})  # type: ignore[attr-defined]
        remember(s.terminals, None, {})
        if end_segment:
            s.end_segment(turn.request_id)
        if turn.request_id is not None and not rid.is_duplex(turn.request_id):
            return
        finalize_ts = st.event.ts
        if finalize_ts < turn.arrival_ts:
            self._stepped_back(
                s, None, turn.response_id, (turn.arrival_position, turn.arrival_ts), st, "e2e_total_ms (arrival -> end)"
            )
        segments = {k: list(v) for k, v in turn.segments.items()}
        first_ts, last_ts = dict(turn.first_ts), dict(turn.last_ts)
        for stage_id, d in turn.derived.items():
            if stage_id in segments:
                continue  # the engine reported this stage: its metrics win
            self._stepped_back_segment(s, stage_id, turn.response_id, d, st)
            segments[stage_id] = [d.to_segment()]
            first_ts[stage_id] = d.submit_ts if d.submit_ts is not None else finalize_ts
            last_ts[stage_id] = finalize_ts  # a ledger-derived row is "received" at the finalize
        tx_delta: dict[Edge, tuple[float, int, bool]] = {}
        for edge, (tx_ms, size, shm) in s.tx_totals.items():
            base = turn.tx_baseline.get(edge, (0.0, 0, False))
            d_tx, d_size = tx_ms - base[0], size - base[1]
            if d_tx > 0 or d_size > 0:
                tx_delta[edge] = (max(d_tx, 0.0), max(d_size, 0), shm)
        self.finalized.append(
            build_turn_tables(
                session_id=s.session_id,
                response_id=turn.response_id,
                request_id=turn.request_id,
                turn_id=turn.turn_id,
                finished_reason=reason,
                arrival_ts=turn.arrival_ts,
                finalize_ts=finalize_ts,
                segments=segments,
                stage_first_ts=first_ts,
                stage_last_ts=last_ts,
                tx_delta=tx_delta,
                edge_order=list(s.tx_totals),
                num_stages=s.num_stages,
                snapshot_stages=frozenset(turn.segments),
            )
        )


KEPT_PER_SESSION = 256
"""Submitted ids and finalized responses a session remembers (to tell a late fact or a second
terminal from an unknown one); older ones are forgotten, so memory stays flat."""


def remember(kept: dict[Any, Any], key: Any, pinned: dict[Any, Any]) -> None:
    """Add ``key`` (None: nothing) to the insertion-ordered ``kept`` and drop its oldest entries
    beyond :data:`KEPT_PER_SESSION`, except those in ``pinned`` (ids with a live segment)."""
    if key is not None:
        kept.pop(key, None)
        kept[key] = None
    if len(kept) <= KEPT_PER_SESSION:
        return  # the usual case: nothing to forget, no copy of the keys
    for old in list(kept)[: len(kept) - KEPT_PER_SESSION]:
        if old not in pinned:
            del kept[old]


def _title_turn(request_id: str | None, turn_id: int) -> int:
    """D7: the turn a title names — an ephemeral id's ``_t<N>``, else the begin's turn id."""
    parsed = rid.try_parse(request_id) if request_id is not None else None
    stage_turn = parsed.ephemeral_stage_turn if parsed is not None else None
    return stage_turn[1] if stage_turn is not None else turn_id


def snapshot_segment(e: Any) -> StageCollapse | None:
    """The snapshot of a ``StageMetricsReported`` (model or read-side twin: attribute access
    only) as one segment accumulator, with TTFT/TPOT filled from engine stamps when the stats
    lack them; None when its stamps mix clock domains (CASE-08: never subtract a monotonic
    engine stamp from a wall-clock one)."""
    stats = e.stats
    stamps = {"submit": e.engine_submit_ts, "first": e.engine_first_token_ts, "last": e.engine_last_token_ts}
    present = {k: v for k, v in stamps.items() if v is not None}
    if len({v.clock for v in present.values()}) > 1:
        return None
    overrides: dict[str, float] = {}

    def stamp(name: str) -> float | None:
        return present[name].s if name in present else None

    if stats.vllm_ttft_ms is None and (ttft := ttft_ms(stamp("submit"), stamp("first"))) is not None:
        overrides["vllm_ttft_ms"] = ttft
    if (
        stats.vllm_tpot_ms is None
        and (tpot := tpot_ms(stamp("first"), stamp("last"), stats.num_tokens_out)) is not None
    ):
        overrides["vllm_tpot_ms"] = tpot
    return StageCollapse.from_snapshot(stats, overrides)


def _finding(
    session_id: str, kind: str, stage_id: int | None, request_id: str | None, st: StoredEvent, detail: str
) -> Finding:
    return Finding(
        session_id,
        stage_id,
        request_id,
        kind,
        st.position,
        st.event.ts,
        st.position,
        st.event.ts,
        (st.position,),
        detail,
        severity_of(kind),
    )
