"""A turn's tables at its end (DOMAIN §5.3–§5.5): from what the turns fold gathered for one
turn (:class:`projections.turn_state.OpenTurn`) to one frozen
:class:`projections.turn_tables.TurnTables`.

* a stage the engine reported (``StageMetricsReported``) shows its snapshots collapsed
  (§5.4); its stats were received at its last snapshot;
* a stage with no snapshot in the turn gets one **ledger-derived** segment from its submit or
  forward (ts, ``num_tokens_in``) and its ``StageOutput`` token deltas, computed on integer
  microseconds: ``vllm_ttft_ms`` = first token − this turn's submit (None without a token),
  ``vllm_tpot_ms`` = (last − first token) / (n_out − 1) (None for n_out < 2),
  ``stage_gen_time_ms`` = last output − submit. Its stats are "received" at the finalize, so
  its wall time runs to the turn's end (decision, CASE-18);
* the connector TX of the turn is the session's totals less their value at the begin;
* a span whose end stamp is earlier than its start (the host's clock stepped back) is 0, with
  one ``clock_stepped_back`` finding per distinct pair of positions (D17).
"""

from __future__ import annotations

from events.records import StoredEvent
from projections.collapse import StageCollapse
from projections.findings import Finding
from projections.intervals import gen_ms, tpot_ms, ttft_ms
from projections.turn_findings import clock_stepped_back
from projections.turn_state import Edge, OpenTurn, SessionTurns, StageFacts
from projections.turn_tables import TurnTables, turn_tables_from_rows


def finalize_turn(s: SessionTurns, turn: OpenTurn, st: StoredEvent, reason: str, findings: list[Finding]) -> TurnTables:
    """The tables of ``turn`` of session ``s``, ended by the event ``st`` with ``reason``;
    D17 findings are appended to ``findings``. Reads the state, changes none of it."""
    finalize_ts = st.event.ts
    if finalize_ts < turn.arrival_ts:
        findings.append(
            clock_stepped_back(
                s.session_id,
                None,
                turn.response_id,
                (turn.arrival_position, turn.arrival_ts),
                (st.position, finalize_ts),
                "e2e_total_ms (arrival -> end)",
            )
        )
    rows = {}
    first_ts: dict[int, float] = {}
    last_ts: dict[int, float] = {}
    reported = []
    for stage_id, facts in turn.stages.items():
        snapshot = facts.snapshot
        if snapshot is not None:  # the engine reported this stage: its metrics win
            rows[stage_id] = snapshot.row()
            first_ts[stage_id] = facts.first_ts  # type: ignore[assignment]  # set with the snapshot
            last_ts[stage_id] = facts.last_ts  # type: ignore[assignment]
            reported.append(stage_id)
        elif facts.derived:
            _stepped_back(s, stage_id, turn.response_id, facts, findings)
            rows[stage_id] = derived_segment(facts).row()
            first_ts[stage_id] = facts.submit_ts if facts.submit_ts is not None else finalize_ts
            last_ts[stage_id] = finalize_ts  # a ledger-derived row is "received" at the finalize
    return turn_tables_from_rows(
        session_id=s.session_id,
        response_id=turn.response_id,
        request_id=turn.request_id,
        turn_id=turn.turn_id,
        finished_reason=reason,
        arrival_ts=turn.arrival_ts,
        finalize_ts=finalize_ts,
        stages=dict(sorted(rows.items())) if len(rows) > 1 else rows,
        stage_first_ts=first_ts,
        stage_last_ts=last_ts,
        tx_delta=tx_delta(s.tx_totals, turn.tx_baseline),
        edge_order=list(s.tx_totals),
        num_stages=s.num_stages,
        snapshot_stages=frozenset(reported),
    )


def tx_delta(
    totals: dict[Edge, list[float | int | bool]], baseline: dict[Edge, tuple[float, int, bool]]
) -> dict[Edge, tuple[float, int, bool]]:
    """Each edge's (tx_time_ms, size_bytes, used_shm) since ``baseline``, for edges that moved."""
    delta: dict[Edge, tuple[float, int, bool]] = {}
    for edge, (tx_ms, size, shm) in totals.items():
        base = baseline.get(edge, (0.0, 0, False))
        d_tx, d_size = tx_ms - base[0], size - base[1]
        if d_tx > 0 or d_size > 0:
            delta[edge] = (max(d_tx, 0.0), max(d_size, 0), shm)  # type: ignore[call-overload,assignment]
    return delta


def derived_segment(facts: StageFacts) -> StageCollapse:
    """The ledger-derived segment of a stage (DOMAIN §5.3 decision; CASE-03/09/10), durations in
    ms from integer microseconds."""
    return StageCollapse.from_values(
        num_tokens_in=facts.num_tokens_in,
        num_tokens_out=facts.num_tokens_out,
        stage_gen_time_ms=gen_ms(facts.submit_ts, facts.last_output_ts),
        vllm_ttft_ms=ttft_ms(facts.submit_ts, facts.first_token_ts),
        vllm_tpot_ms=tpot_ms(facts.first_token_ts, facts.last_token_ts, facts.num_tokens_out),
    )


def _stepped_back(s: SessionTurns, stage_id: int, response_id: str, f: StageFacts, findings: list[Finding]) -> None:
    """D17 for a ledger-derived row: one finding per distinct pair of positions whose span
    came out negative (TTFT, TPOT, generation time)."""
    spans = (
        ("vllm_ttft_ms", f.submit_position, f.submit_ts, f.first_token_position, f.first_token_ts),
        ("vllm_tpot_ms", f.first_token_position, f.first_token_ts, f.last_token_position, f.last_token_ts),
        ("stage_gen_time_ms", f.submit_position, f.submit_ts, f.last_output_position, f.last_output_ts),
    )
    seen: set[tuple[int, int]] = set()
    for name, a, ta, b, tb in spans:
        if ta is None or tb is None or not tb < ta or (a, b) in seen:
            continue
        seen.add((a, b))
        findings.append(
            clock_stepped_back(s.session_id, stage_id, response_id, (a, ta), (b, tb), f"stage {stage_id} {name}")
        )
