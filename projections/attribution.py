"""Attribution: which turn a stage fact joins (DOMAIN §5.7 D1, §5.3 buffering, M2/M12/M15/M21).

A fact — ``StageOutput``, ``StageMetricsReported``, ``StageRequestFinished``,
``StageRequestForwarded``, ``ResponseListened`` — joins a turn only when it names the turn's own
engine id *and* falls inside that id's current segment:

* a **segment** of id X opens at each accepted Stage0 submit of X (``initial`` or ``update``:
  the resources fold has already refused stale fences, other incarnations and older epochs)
  and ends when the turn bound to X is finalized, when X is aborted or its Stage0 binding
  released, at an epoch change and at close. A resident id serves many turns: the segment, not
  the id, decides, and an output whose ``model_turn_id`` names a turn the model already
  completed (``TurnCompleted``) never joins a later turn;
* facts of the open turn's id inside its live segment join the turn;
* with no turn bound to it, facts of the session's **current** id (the last Stage0 id
  submitted) inside its live segment are buffered (*buffer before begin*, §5.3) and replayed
  only into a turn that begins with that same id (:func:`bind`);
* every other fact joins nothing, changes no table and is one ``output_outside_segment``
  warning (D9). Facts of ids the session does not hold at all were already refused, with their
  warning, by the resources fold (the turns fold skips them). A late ``StageRequestFinished`` of
  a held id is a resource fact, not a warning: it only finalizes a turn (D11) inside the segment;
* once the log records forwards at all, a downstream stage's fact joins only after this
  segment's forward to that stage;
* logs that record no submits at all (a metrics-only log) attribute by the begin's id: an id
  the session never submitted joins the turn bound to it, and is buffered while the session
  has no current id. Non-duplex (chat) ids never open, buffer into or finalize a turn (M12).

**Ingest** — a ``StageMetricsReported`` is one segment accumulator
(:class:`projections.collapse.StageCollapse`; engine stamps of one clock fill a missing
TTFT/TPOT, CASE-08), folded into its stage's running accumulator; first-ts rule M2; one
collapsed pending row per stage before begin (M15); the same snapshot seen twice in a row counts
once (M21). Submits, forwards and outputs feed the stage's ledger-derived segment
(:mod:`projections.turn_finalize`).

The handlers have the fold's shape ``handler(fold, session, stored, event)``; they warn and
finalize through the fold (:class:`projections.turns.TurnsFold`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from events import ids as rid
from events.records import StoredEvent
from events.types import (
    ResponseListened,
    StageMetricsReported,
    StageOutput,
    StageRequestFinished,
    StageRequestForwarded,
    StageRequestSubmitted,
    TransferTx,
)
from projections.collapse import StageCollapse
from projections.intervals import tpot_ms, ttft_ms
from projections.turn_state import OpenTurn, SessionTurns, StageFacts, remember

if TYPE_CHECKING:
    from projections.turns import TurnsFold

TURN, PENDING, NOWHERE = "turn", "pending", "nowhere"
"""Where a fact goes: the open turn, the pre-begin buffer, or no turn."""

_OUTSIDE = "outside its id's current segment (turn ended, or not the session's current id); joins no turn"


def target(
    fold: TurnsFold,
    s: SessionTurns,
    st: StoredEvent,
    stage_id: int,
    request_id: str,
    what: str,
    model_turn_id: int | None = None,
    warn: bool = True,
    after_forward: bool = True,
) -> str:
    """Where a fact of ``request_id`` goes (module docstring): TURN, PENDING or NOWHERE. With
    ``after_forward``, a stage > 0 fact needs this segment's forward to its stage. A PENDING
    fact of another id than the buffer's starts a new buffer; a NOWHERE fact is one
    ``output_outside_segment`` warning when ``warn``."""
    turn = s.open
    if model_turn_id is not None and model_turn_id < s.completed_below:
        where = NOWHERE  # names a turn the model already completed
    elif request_id in s.live:  # (live ids are submitted ids)
        if turn is not None and turn.request_id == request_id:
            where = TURN
        else:
            where = PENDING if request_id == s.current_id else NOWHERE
    elif request_id in s.submitted:
        where = NOWHERE  # submitted, and its segment is over
    elif turn is not None and turn.request_id == request_id:
        where = TURN  # a log without submits: the begin's id
    else:
        where = NOWHERE if s.submits_seen else PENDING  # PENDING: a log without submits
    if where is not NOWHERE:
        if stage_id > 0 and after_forward and s.forward_seen and stage_id not in s.forwarded.get(request_id, ()):
            where = NOWHERE  # a downstream fact before this segment's forward to that stage
        elif where is PENDING and s.pending_request_id != request_id:
            s.clear_pending()
            s.pending_request_id = request_id
    if where is NOWHERE and warn:
        fold.warn(s, "output_outside_segment", stage_id, request_id, st, f"{what} {_OUTSIDE}")
    return where


def stage_facts(s: SessionTurns, where: str, stage_id: int) -> StageFacts:
    """The facts of ``stage_id`` in the open turn (TURN) or in the pre-begin buffer (PENDING)."""
    turn = s.open
    stages = turn.stages if where is TURN and turn is not None else s.pending
    facts = stages.get(stage_id)
    if facts is None:
        facts = stages[stage_id] = StageFacts()
    return facts


def bind(s: SessionTurns, turn: OpenTurn, request_id: str) -> None:
    """Bind the open turn to ``request_id``: it is built from that id's facts only (D1),
    including what was buffered for it before the begin (§5.3, M5, M11)."""
    if turn.request_id is not None:  # re-titled by its begin: drop what another id gave it
        turn.stages = {}
    turn.request_id = request_id
    if s.pending_request_id != request_id:
        return
    # Replay the buffer (M5). The turn holds no facts yet: facts join a turn only once it is
    # bound, and a re-titled turn was emptied above.
    turn.stages, s.pending = s.pending, {}
    s.pending_request_id = None


# ------------------------------------------------------------------ handlers
def submitted(fold: TurnsFold, s: SessionTurns, st: StoredEvent, e: StageRequestSubmitted) -> None:
    """A Stage0 submit opens a new segment of its id, the session's current id from now on
    (D1); a downstream submit is a forward."""
    request_id = e.request_id
    if not rid.is_duplex(request_id):
        return
    if e.stage_id != 0:
        forwarded(fold, s, st, e)
        return
    if s.current_id != request_id or s.pending_request_id not in (None, request_id):
        s.clear_pending()
    s.current_id = request_id
    s.submits_seen = True
    remember(s.submitted, request_id, s.live)
    s.live[request_id] = st.position
    s.forwarded[request_id] = set()  # a new segment: no downstream stage forwarded yet
    turn = s.open
    if turn is not None and turn.request_id is None:
        bind(s, turn, request_id)  # a turn pre-created at commit takes the first id submitted after
    if turn is not None and turn.request_id == request_id:
        facts = stage_facts(s, TURN, 0)
        facts.derived = True
        if facts.submit_ts is None:
            facts.submit_ts, facts.num_tokens_in, facts.submit_position = e.ts, e.num_tokens_in, st.position
        return
    s.pending_request_id = request_id
    stage_facts(s, PENDING, 0).restart_derived(e.ts, e.num_tokens_in, st.position)


def forwarded(
    fold: TurnsFold, s: SessionTurns, st: StoredEvent, e: StageRequestForwarded | StageRequestSubmitted
) -> None:
    request_id = e.request_id
    if not rid.is_duplex(request_id):
        return
    where = target(fold, s, st, e.stage_id, request_id, "forward", after_forward=False)
    if where is not NOWHERE:
        s.forward_seen = True
        s.forwarded.setdefault(request_id, set()).add(e.stage_id)
        facts = stage_facts(s, where, e.stage_id)
        facts.derived = True
        if facts.submit_ts is None:
            facts.submit_ts, facts.submit_position = e.ts, st.position


def output(fold: TurnsFold, s: SessionTurns, st: StoredEvent, e: StageOutput) -> None:
    """A ``StageOutput`` feeds its stage's ledger-derived segment; an engine abort of the
    turn's id ends the turn (D11)."""
    request_id = e.request_id
    if request_id not in s.live and not rid.is_duplex(request_id):  # live ids are duplex ids
        return
    stage_id = e.stage_id
    where = target(fold, s, st, stage_id, request_id, "output", e.model_turn_id)
    if where is NOWHERE:
        return
    stages = s.open.stages if where is TURN else s.pending  # type: ignore[union-attr]  # TURN: a turn is open
    facts = stages.get(stage_id)
    if facts is None:
        facts = stages[stage_id] = StageFacts()
    facts.derived = True
    position = st.position
    ts = facts.last_output_ts = e.ts
    facts.last_output_position = position
    if e.num_new_tokens > 0:
        if facts.first_token_ts is None:
            facts.first_token_ts, facts.first_token_position = ts, position
        facts.last_token_ts, facts.last_token_position = ts, position
        facts.num_tokens_out += e.num_new_tokens
    if where is TURN and e.finished and e.finish_reason == "abort":
        fold.finalize(s, st, "abort")  # the engine ended the turn's request (D11)


def finished(fold: TurnsFold, s: SessionTurns, st: StoredEvent, e: StageRequestFinished) -> None:
    if e.request_id not in s.live and not rid.is_duplex(e.request_id):
        return
    where = target(fold, s, st, e.stage_id, e.request_id, "finish", e.model_turn_id, warn=False)
    if where is TURN and e.finish_reason == "abort":
        fold.finalize(s, st, "abort")  # engine abort of the turn's id (D11, CASE-21)


def listened(fold: TurnsFold, s: SessionTurns, st: StoredEvent, e: ResponseListened) -> None:
    if e.request_id is not None and rid.is_duplex(e.request_id):
        target(fold, s, st, 0, e.request_id, "listen unit")


def metrics(fold: TurnsFold, s: SessionTurns, st: StoredEvent, e: StageMetricsReported) -> None:
    """A snapshot joins its stage's accumulator in the turn, or in the buffer (one collapsed
    pending row per stage, M15, whose first stamp is an arrival stamp, §5.3)."""
    if e.request_id not in s.live and not rid.is_duplex(e.request_id):
        return  # chat ids never buffer (M12)
    segment = snapshot_segment(e)
    if segment is None:
        detail = "engine stamps from different clocks; snapshot ignored"
        fold.warn(s, "clock_domain_mismatch", e.stage_id, e.request_id, st, detail)
        return
    where = target(fold, s, st, e.stage_id, e.request_id, "metrics snapshot")
    if where is NOWHERE:
        return
    first = e.stage_submit_ts if e.stage_submit_ts is not None else e.ts
    facts = stage_facts(s, where, e.stage_id)
    if where is TURN:
        key = (e.request_id, segment, e.stage_submit_ts)
        if facts.last_snapshot == key:
            return  # the same snapshot seen on a second path is counted once (M21)
        facts.last_snapshot = key
    if facts.snapshot is None:
        facts.snapshot, facts.first_ts, facts.last_ts = segment, first, e.ts
    else:
        facts.snapshot = facts.snapshot.combine(segment)
        facts.last_ts = max(facts.last_ts, e.ts)  # type: ignore[type-var]  # set with the snapshot
    if where is PENDING:
        s.stamp(first, st.position)


def transfer(fold: TurnsFold, s: SessionTurns, st: StoredEvent, e: TransferTx) -> None:
    """Connector TX totals of the session (a turn's share is its delta since its begin)."""
    total = s.tx_totals.get((e.from_stage, e.to_stage))
    if total is None:
        total = s.tx_totals[(e.from_stage, e.to_stage)] = [0.0, 0, False]
    total[0] += e.tx_time_ms
    total[1] += e.size_bytes
    total[2] = total[2] or e.used_shm


def snapshot_segment(e: Any) -> StageCollapse | None:
    """The snapshot of a ``StageMetricsReported`` (a struct: attribute access
    only) as one segment accumulator, with TTFT/TPOT filled from engine stamps when the stats
    lack them; None when its stamps mix clock domains (CASE-08: never subtract a monotonic
    engine stamp from a wall-clock one)."""
    stats = e.stats
    submit, first, last = e.engine_submit_ts, e.engine_first_token_ts, e.engine_last_token_ts
    if submit is None and first is None and last is None:
        return StageCollapse.from_snapshot(stats)
    if len({v.clock for v in (submit, first, last) if v is not None}) > 1:
        return None
    submit_s = submit.s if submit is not None else None
    first_s = first.s if first is not None else None
    last_s = last.s if last is not None else None
    overrides: dict[str, float] = {}
    if stats.vllm_ttft_ms is None and (ttft := ttft_ms(submit_s, first_s)) is not None:
        overrides["vllm_ttft_ms"] = ttft
    if stats.vllm_tpot_ms is None and (tpot := tpot_ms(first_s, last_s, stats.num_tokens_out)) is not None:
        overrides["vllm_tpot_ms"] = tpot
    return StageCollapse.from_snapshot(stats, overrides)
