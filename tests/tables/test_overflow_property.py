"""Property (hostile L13, N1, N2): a number no format carries is shown as an overflow in every
format, and so is every figure derived from one; nothing else is.

Turns are generated with stage values anywhere in the stored range (every one storable: int64,
finite), several segments per stage, so sums can leave the range; the rendered JSON, CSV and
text are then checked against the raw tables."""

from __future__ import annotations

import csv
import io
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from events.limits import INT64_MAX, overflows
from events.stats import StageRequestStats
from projections.turn_tables import build_turn_tables
from reports.overflow import overflow_paths
from reports.render_formats import render_csv, render_json
from reports.render_text import e2e_table, summary_table, transfer_table

_int = st.none() | st.integers(0, 1000) | st.integers(INT64_MAX // 2, INT64_MAX)
_float = st.none() | st.floats(0, 1e4) | st.floats(1e307, 1.7e308)
snapshots = st.builds(
    StageRequestStats,
    num_tokens_in=_int,
    num_tokens_out=_int,
    output_unit_count=_int,
    stage_gen_time_ms=_float,
    serving_time_to_first_output_ms=_float,
    vllm_tpot_ms=st.none() | st.floats(0, 1e4),
)
edges = st.tuples(st.floats(0, 1e4) | st.floats(1e307, 1.7e308), _int.map(lambda v: v or 0), st.booleans())


def _turn(segments: dict[int, list[StageRequestStats]], tx: dict[tuple[int, int], tuple[float, int, bool]]):
    return build_turn_tables(
        session_id="s1",
        response_id="resp-s1-0-9f2c41aa",
        request_id="duplex-s.czE.i.0.e.0.r.stage0_t3",
        turn_id=3,
        finished_reason="stop",
        arrival_ts=1000.0,
        finalize_ts=1001.7,
        segments=segments,
        stage_first_ts={0: 1000.05, 1: 1000.42},
        stage_last_ts={0: 1001.3, 1: 1001.6},
        tx_delta=tx,
        edge_order=list(tx),
    )


def _cell(table, field: str, column: int = 0) -> str | None:
    """A text table's cell; None for a row the table hides (all zero)."""
    row = dict(table.rows).get(field)
    return None if row is None else row[column]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(snapshots, min_size=1, max_size=4),
    st.lists(snapshots, max_size=3),
    st.dictionaries(st.sampled_from([(0, 1), (1, 2)]), edges, max_size=2),
)
def test_overflows_and_what_derives_from_them_are_never_shown_as_numbers(stage0, stage1, tx) -> None:
    t = _turn({0: stage0, 1: stage1}, tx)
    raw = t.to_dict()
    paths = overflow_paths(raw)

    # derived figures overflow with their inputs (N1)
    if overflows(raw["e2e"]["e2e_total_tokens"]):
        assert "summary.e2e_avg_tokens_per_s" in paths
        assert _cell(summary_table(t), "e2e_avg_tokens_per_s") == "overflow"
    assert (_cell(e2e_table(t), "transfers_total_kbytes") == "overflow") is overflows(
        raw["e2e"]["transfers_total_bytes"]
    )
    for i, edge in enumerate(t.transfers):
        assert (_cell(transfer_table(t), "size_kbytes", i) == "overflow") is overflows(edge.size_bytes)
    for i, row in enumerate(raw["stages"]):
        if len((stage0, stage1)[i]) > 1 and (
            overflows(row["output_unit_count"]) and (row["output_unit_count"] or 0) > 1
        ):
            assert f"stages[{i}].time_per_output_unit_ms" in paths

    # JSON: strict, overflowed numbers null and named; no other null added (N2)
    doc = json.loads(render_json([t]), parse_constant=lambda c: (_ for _ in ()).throw(AssertionError(c)))
    turn = doc["turns"][0]
    assert turn.get("overflowed", []) == paths
    assert ("overflowed" in turn) is bool(paths)
    without = {k: v for k, v in turn.items() if k != "overflowed"}
    assert overflow_paths(without) == []

    # CSV: an overflow is "overflow", never an empty cell (that is "not reported")
    rows = list(csv.DictReader(io.StringIO(render_csv([t]))))
    assert sum(r["value"] == "overflow" for r in rows) == len(paths)
    for r in rows:
        if r["value"] not in ("", "overflow", "true", "false") and not r["value"].startswith("["):
            assert not overflows(json.loads(r["value"]))
