"""Per-turn metric tables as a pure fold (DOMAIN §5.3–§5.5).

One assistant turn = one ``response_id`` = one table set, built when the turn is finalized.
The fold works on every session whatever its ``log_stats`` (M14 decision: offline
re-projection covers sessions that ran with log_stats off); live printing is the engine's
business.

Accumulation per session:

* **open** — a turn opens at a response begin: ``TurnCommitted`` carrying a ``response_id``
  (pre-created at commit, DOMAIN §2.3) or ``ResponseBegun``; only for duplex engine ids
  (M12). Opening the open response again returns it; opening another first finalizes the
  open one with ``abort`` (superseded, M21).
* **ingest** — ``StageMetricsReported`` for the turn's engine id becomes one segment
  (first-ts rule M2). Before any begin, snapshots are collapsed into one pending row per
  stage (M15) and replayed at begin (M5, M11).
* **ledger-derived segment** — a stage that reported no metrics in the turn (vLLM reports
  nothing for aborted requests) gets one segment from the ledger's own events: its submit
  (``StageRequestSubmitted``/``StageRequestForwarded``, ts and ``num_tokens_in``) and its
  ``StageOutput`` token deltas. ``vllm_ttft_ms`` = first token ts − this turn's submit ts
  (None without a token, CASE-03/09/10), ``vllm_tpot_ms`` = (last − first token ts) /
  (n_out − 1) (None for n_out < 2), ``stage_gen_time_ms`` = last output ts − submit ts.
  All wall-clock, one clock per duration.
* **arrival_ts** (§5.3, CASE-12, M16) — the caller's commit ts, else the pending stamp (set
  by the first append/commit while none is pending, or by the first buffered snapshot's
  ``stage_submit_ts``/receipt), else the begin ts. Begin consumes the stamp; finalize never
  erases a stamp set after the finalized turn opened.
* **finalize** (§5.5) — ``ResponseEnded`` (cause beats status, CASE-13), ``TurnFinalized``,
  ``CancelRequested`` (§2.4 mapping), an ``AbortRequested`` naming the turn's engine id,
  ``SessionClosed`` (``close``), or a superseding begin (``abort``). Idempotent: the first
  one wins; end ts = that event's ts (CASE-09: the decision, not the abort ack).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from events import ids as rid
from events.records import StoredEvent
from events.stats import StageRequestStats

from projections.collapse import merge_into_pending
from projections.findings import Finding, severity_of
from projections.reasons import reason_for, reason_for_cancel_source, reason_for_end
from projections.turn_tables import TurnTables, build_turn_tables

Edge = tuple[int, int]


@dataclass(slots=True)
class DerivedStage:
    """Ledger-derived segment accumulator for one stage of one turn."""

    request_id: str | None = None
    submit_ts: float | None = None
    num_tokens_in: int | None = None
    num_tokens_out: int = 0
    first_token_ts: float | None = None
    last_token_ts: float | None = None
    last_ts: float | None = None

    def to_stats(self) -> StageRequestStats:
        ttft = tpot = gen = None
        if self.first_token_ts is not None and self.submit_ts is not None:
            ttft = (self.first_token_ts - self.submit_ts) * 1000.0
        if self.num_tokens_out >= 2 and self.first_token_ts is not None and self.last_token_ts is not None:
            tpot = (self.last_token_ts - self.first_token_ts) * 1000.0 / (self.num_tokens_out - 1)
        if self.submit_ts is not None and self.last_ts is not None:
            gen = max(self.last_ts - self.submit_ts, 0.0) * 1000.0
        return StageRequestStats(num_tokens_in=self.num_tokens_in, num_tokens_out=self.num_tokens_out,
                                 stage_gen_time_ms=gen, vllm_ttft_ms=ttft, vllm_tpot_ms=tpot)


@dataclass(slots=True)
class OpenTurn:
    response_id: str
    request_id: str | None
    turn_id: int
    arrival_ts: float
    segments: dict[int, list[StageRequestStats]] = field(default_factory=dict)
    first_ts: dict[int, float] = field(default_factory=dict)
    last_ts: dict[int, float] = field(default_factory=dict)
    derived: dict[int, DerivedStage] = field(default_factory=dict)
    tx_baseline: dict[Edge, tuple[float, int, bool]] = field(default_factory=dict)
    last_snapshot: dict[int, Any] = field(default_factory=dict)


@dataclass(slots=True)
class SessionTurns:
    session_id: str
    open: OpenTurn | None = None
    turn_id: int = 0
    pending_rows: dict[int, StageRequestStats] = field(default_factory=dict)
    pending_first_ts: dict[int, float] = field(default_factory=dict)
    pending_last_ts: dict[int, float] = field(default_factory=dict)
    pending_derived: dict[int, DerivedStage] = field(default_factory=dict)
    pending_stamp: float | None = None
    pending_commit_ts: float | None = None
    stage0_request_id: str | None = None
    tx_totals: dict[Edge, list[Any]] = field(default_factory=dict)
    finalized: set[str] = field(default_factory=set)
    closed: bool = False


class TurnsFold:
    """Pure fold: ``apply(stored, accepted)``; finalized turns accumulate in
    :attr:`finalized` (drain with :meth:`take_finalized`)."""

    def __init__(self) -> None:
        self.sessions: dict[str, SessionTurns] = {}
        self.finalized: list[TurnTables] = []
        self.findings: list[Finding] = []
        self._handlers = {
            "InputAppended": self._appended,
            "TurnCommitted": self._committed,
            "ResponseBegun": self._begun,
            "ResponseEnded": self._ended,
            "TurnFinalized": self._turn_finalized,
            "CancelRequested": self._cancel,
            "AbortRequested": self._abort,
            "SessionClosed": self._closed,
            "SessionOpened": self._opened,
            "StageRequestSubmitted": self._submitted,
            "StageRequestForwarded": self._forwarded,
            "StageOutput": self._output,
            "StageMetricsReported": self._metrics,
            "TransferTx": self._transfer,
            "TurnCompleted": self._turn_completed,
        }

    def apply(self, stored: StoredEvent, accepted: bool = True) -> None:
        """Apply one event; ``accepted`` False (refused by the resources fold) is skipped."""
        if not accepted:
            return
        handler = self._handlers.get(stored.event.type)  # type: ignore[attr-defined]
        if handler is None:
            return
        s = self.sessions.get(stored.event.session_id)
        if s is None:
            s = self.sessions[stored.event.session_id] = SessionTurns(stored.event.session_id)
        handler(s, stored)

    def take_finalized(self) -> list[TurnTables]:
        out, self.finalized = self.finalized, []
        return out

    def forget_closed(self) -> list[str]:
        gone = [sid for sid, s in self.sessions.items() if s.closed and s.open is None]
        for sid in gone:
            del self.sessions[sid]
        return gone

    # ------------------------------------------------------------------ arrival
    def _stamp(self, s: SessionTurns, ts: float) -> None:
        if s.pending_stamp is None:
            s.pending_stamp = ts

    def _appended(self, s: SessionTurns, st: StoredEvent) -> None:
        self._stamp(s, st.event.ts)

    def _opened(self, s: SessionTurns, st: StoredEvent) -> None:
        if s.closed:
            self.sessions[s.session_id] = SessionTurns(s.session_id)

    def _committed(self, s: SessionTurns, st: StoredEvent) -> None:
        e = st.event
        s.turn_id = e.turn_id
        if e.response_id is not None and e.create_response and e.action != "START_AUTO_RESPONSE":
            # Pre-created at commit (DOMAIN §2.3): the turn opens now, arrival = commit ts (M6).
            s.pending_stamp = None
            self._begin(s, st, e.response_id, None, e.turn_id, e.ts)
            return
        if e.create_response and e.action != "START_AUTO_RESPONSE":
            s.pending_commit_ts = e.ts
        self._stamp(s, e.ts)

    # ------------------------------------------------------------------ open
    def _begun(self, s: SessionTurns, st: StoredEvent) -> None:
        e = st.event
        if e.request_id is not None and not rid.is_duplex(e.request_id):
            return  # chat ids never open a turn (M12)
        self._begin(s, st, e.response_id, e.request_id, e.turn_id, e.commit_ts)

    def _begin(self, s: SessionTurns, st: StoredEvent, response_id: str, request_id: str | None,
               turn_id: int, commit_ts: float | None) -> None:
        ts = st.event.ts
        if s.open is not None:
            if s.open.response_id == response_id:
                if request_id is not None and s.open.request_id is None:
                    s.open.request_id = request_id
                return
            self._finalize(s, st, "abort")  # superseded
        if response_id in s.finalized:
            return
        caller_ts = commit_ts if commit_ts is not None else s.pending_commit_ts
        if caller_ts is not None:
            arrival = caller_ts
        elif s.pending_stamp is not None:
            arrival = s.pending_stamp
        else:
            arrival = ts
        s.pending_commit_ts = None
        s.pending_stamp = None
        turn = OpenTurn(response_id, request_id, turn_id, arrival)
        turn.tx_baseline = {edge: (v[0], v[1], v[2]) for edge, v in s.tx_totals.items()}
        for stage_id, row in s.pending_rows.items():  # replay the buffered pre-begin row (M5)
            turn.segments[stage_id] = [row]
            turn.first_ts[stage_id] = s.pending_first_ts[stage_id]
            turn.last_ts[stage_id] = s.pending_last_ts[stage_id]
        for stage_id, derived in s.pending_derived.items():
            if request_id is None or derived.request_id == request_id:
                turn.derived[stage_id] = derived
                turn.request_id = turn.request_id or derived.request_id
        s.pending_rows, s.pending_first_ts, s.pending_last_ts, s.pending_derived = {}, {}, {}, {}
        if turn.request_id is None and s.stage0_request_id is not None and rid.is_duplex(s.stage0_request_id):
            turn.request_id = s.stage0_request_id if not rid.is_ephemeral(s.stage0_request_id) else None
        s.open = turn

    # ------------------------------------------------------------------ ingest
    @staticmethod
    def _belongs_to_open(s: SessionTurns, request_id: str, adopt: bool = False) -> bool:
        """Does ``request_id`` feed the open turn? A turn opened at commit has no engine id
        yet: it adopts the first Stage0 id submitted while it is open (``adopt``)."""
        turn = s.open
        if turn is None:
            return False
        if turn.request_id is None and adopt:
            turn.request_id = request_id
        return turn.request_id == request_id

    def _submitted(self, s: SessionTurns, st: StoredEvent) -> None:
        e = st.event
        if not rid.is_duplex(e.request_id):
            return
        if e.stage_id == 0:
            s.stage0_request_id = e.request_id
        turn = s.open
        if turn is not None and self._belongs_to_open(s, e.request_id, adopt=e.stage_id == 0) and (
                e.stage_id not in turn.derived or turn.derived[e.stage_id].submit_ts is None):
            target = turn.derived
        else:
            target = s.pending_derived
            if e.stage_id in target and target[e.stage_id].request_id != e.request_id:
                del target[e.stage_id]
        d = target.setdefault(e.stage_id, DerivedStage(e.request_id))
        d.submit_ts, d.num_tokens_in = e.ts, e.num_tokens_in

    def _derived_for(self, s: SessionTurns, stage_id: int, request_id: str) -> DerivedStage:
        """The ledger-derived accumulator an event of ``request_id`` feeds: the open turn's, or
        the pre-begin pending one."""
        turn = s.open
        target = turn.derived if turn is not None and self._belongs_to_open(s, request_id) else s.pending_derived
        derived = target.get(stage_id)
        if derived is None:
            derived = target[stage_id] = DerivedStage(request_id)
        return derived

    def _forwarded(self, s: SessionTurns, st: StoredEvent) -> None:
        e = st.event
        if not rid.is_duplex(e.request_id):
            return
        d = self._derived_for(s, e.stage_id, e.request_id)
        if d.submit_ts is None:
            d.submit_ts = e.ts

    def _output(self, s: SessionTurns, st: StoredEvent) -> None:
        e = st.event
        if not rid.is_duplex(e.request_id):
            return
        d = self._derived_for(s, e.stage_id, e.request_id)
        d.last_ts = e.ts
        if e.num_new_tokens > 0:
            if d.first_token_ts is None:
                d.first_token_ts = e.ts
            d.last_token_ts = e.ts
            d.num_tokens_out += e.num_new_tokens

    def _metrics(self, s: SessionTurns, st: StoredEvent) -> None:
        e = st.event
        if not rid.is_duplex(e.request_id):
            return  # chat ids never buffer (M12)
        stats = effective_stats(e)
        if stats is None:
            self.findings.append(_finding(s.session_id, "clock_domain_mismatch", e.stage_id, e.request_id, st,
                                          "engine stamps from different clocks; snapshot ignored"))
            return
        first = e.stage_submit_ts if e.stage_submit_ts is not None else e.ts
        turn = s.open
        if turn is not None and self._belongs_to_open(s, e.request_id):
            key = (e.request_id, stats, e.stage_submit_ts)
            if turn.last_snapshot.get(e.stage_id) == key:
                return  # the same snapshot seen on a second path is counted once (M21)
            turn.last_snapshot[e.stage_id] = key
            turn.segments.setdefault(e.stage_id, []).append(stats)
            turn.first_ts.setdefault(e.stage_id, first)
            turn.last_ts[e.stage_id] = max(turn.last_ts.get(e.stage_id, e.ts), e.ts)
            return
        # Buffer before begin: one collapsed pending row per stage (M15).
        s.pending_rows[e.stage_id] = merge_into_pending(s.pending_rows.get(e.stage_id), stats)
        s.pending_first_ts.setdefault(e.stage_id, first)
        s.pending_last_ts[e.stage_id] = max(s.pending_last_ts.get(e.stage_id, e.ts), e.ts)
        self._stamp(s, first)

    def _transfer(self, s: SessionTurns, st: StoredEvent) -> None:
        e = st.event
        edge = (e.from_stage, e.to_stage)
        total = s.tx_totals.setdefault(edge, [0.0, 0, False])
        total[0] += e.tx_time_ms
        total[1] += e.size_bytes
        total[2] = total[2] or e.used_shm

    def _turn_completed(self, s: SessionTurns, st: StoredEvent) -> None:
        s.turn_id = st.event.new_turn_id

    # ------------------------------------------------------------------ finalize
    def _ended(self, s: SessionTurns, st: StoredEvent) -> None:
        e = st.event
        self._finalize_response(s, st, e.response_id, reason_for_end(e.cause, e.status))

    def _turn_finalized(self, s: SessionTurns, st: StoredEvent) -> None:
        e = st.event
        self._finalize_response(s, st, e.response_id, reason_for(e.finished_reason))

    def _cancel(self, s: SessionTurns, st: StoredEvent) -> None:
        e = st.event
        if s.open is not None and (e.response_id is None or e.response_id == s.open.response_id):
            self._finalize(s, st, reason_for_cancel_source(e.source))

    def _abort(self, s: SessionTurns, st: StoredEvent) -> None:
        e = st.event
        if s.open is not None and s.open.request_id in e.request_ids:
            self._finalize(s, st, reason_for(e.reason) if e.reason is not None else "abort")

    def _closed(self, s: SessionTurns, st: StoredEvent) -> None:
        if s.open is not None:
            self._finalize(s, st, "close")
        s.closed = True
        s.pending_rows, s.pending_first_ts, s.pending_last_ts, s.pending_derived = {}, {}, {}, {}

    def _finalize_response(self, s: SessionTurns, st: StoredEvent, response_id: str, reason: str) -> None:
        if s.open is not None and s.open.response_id == response_id:
            self._finalize(s, st, reason)
        elif response_id not in s.finalized:
            self.findings.append(_finding(s.session_id, "stale_finalize", None, None, st,
                                          f"finalize of response {response_id!r} with no open turn"))

    def _finalize(self, s: SessionTurns, st: StoredEvent, reason: str) -> None:
        turn = s.open
        assert turn is not None
        s.open = None
        s.finalized.add(turn.response_id)
        if turn.request_id is not None and not rid.is_duplex(turn.request_id):
            return
        segments = {k: list(v) for k, v in turn.segments.items()}
        first_ts, last_ts = dict(turn.first_ts), dict(turn.last_ts)
        for stage_id, d in turn.derived.items():
            if stage_id in segments:
                continue  # the engine reported this stage: its metrics win
            segments[stage_id] = [d.to_stats()]
            if d.submit_ts is not None:
                first_ts[stage_id] = d.submit_ts
            last_ts[stage_id] = d.last_ts if d.last_ts is not None else (d.submit_ts or st.event.ts)
        tx_delta: dict[Edge, tuple[float, int, bool]] = {}
        for edge, (tx_ms, size, shm) in s.tx_totals.items():
            base = turn.tx_baseline.get(edge, (0.0, 0, False))
            d_tx, d_size = tx_ms - base[0], size - base[1]
            if d_tx > 0 or d_size > 0:
                tx_delta[edge] = (max(d_tx, 0.0), max(d_size, 0), shm)
        self.finalized.append(build_turn_tables(
            session_id=s.session_id, response_id=turn.response_id, request_id=turn.request_id or "",
            turn_id=turn.turn_id, finished_reason=reason, arrival_ts=turn.arrival_ts, finalize_ts=st.event.ts,
            segments=segments, stage_first_ts=first_ts, stage_last_ts=last_ts, tx_delta=tx_delta,
            edge_order=list(s.tx_totals)))


def effective_stats(e: Any) -> StageRequestStats | None:
    """The snapshot with TTFT/TPOT filled from engine stamps when the stats lack them, or None
    when its stamps mix clock domains (CASE-08: never subtract a monotonic engine stamp from a
    wall-clock one)."""
    stats: StageRequestStats = e.stats
    stamps = {"submit": e.engine_submit_ts, "first": e.engine_first_token_ts, "last": e.engine_last_token_ts}
    present = {k: v for k, v in stamps.items() if v is not None}
    if len({v.clock for v in present.values()}) > 1:
        return None
    update: dict[str, float] = {}
    if stats.vllm_ttft_ms is None and "submit" in present and "first" in present:
        update["vllm_ttft_ms"] = (present["first"].s - present["submit"].s) * 1000.0
    n_out = stats.num_tokens_out or 0
    if stats.vllm_tpot_ms is None and "first" in present and "last" in present and n_out >= 2:
        update["vllm_tpot_ms"] = (present["last"].s - present["first"].s) * 1000.0 / (n_out - 1)
    return stats.model_copy(update=update) if update else stats


def _finding(session_id: str, kind: str, stage_id: int | None, request_id: str | None, st: StoredEvent,
             detail: str) -> Finding:
    return Finding(session_id, stage_id, request_id, kind, st.position, st.event.ts, st.position, st.event.ts,
                   (st.position,), detail, severity_of(kind))
