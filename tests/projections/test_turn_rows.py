"""``tables_json``, the ``rm_turn_tables`` text of a turn (projections.shell.turn_rows): lossless
in both forms (the compact one of fold version 12, read with its row's columns, and the whole
one older folds wrote), every decoded stage row in ``STAT_FIELDS`` order (the text tables print
in it)."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.stats import STAT_FIELDS
from projections.collapse import LIST_MEAN_FIELDS
from projections.shell.turn_rows import SPARSE_STAGES_KEY, turn_from_json, turn_row, turn_to_json
from projections.turn_tables import TransferEdge, TurnTables, build_turn_tables
from reports.render_formats import render_json
from tests.tables.conftest import worked_example_kwargs


def whole_form(t: TurnTables) -> str:
    """The text an older fold (version 11) wrote: every stage row whole, under ``"stages"``."""
    d = {f.name: getattr(t, f.name) for f in fields(TurnTables)}
    d["stages"] = {str(k): v for k, v in t.stages.items()}
    d["transfers"] = [{f.name: getattr(e, f.name) for f in fields(TransferEdge)} for e in t.transfers]
    return json.dumps(d, separators=(",", ":"))


def round_trip(t: TurnTables) -> TurnTables:
    """``t`` written as its ``rm_turn_tables`` row and read back from that row."""
    row = turn_row(t, 7)
    return turn_from_json(row["tables_json"], row)


def assert_same(back: TurnTables, t: TurnTables) -> None:
    assert back == t
    for sid, row in t.stages.items():
        assert list(back.stages[sid]) == list(row), sid  # key order: the print order


def test_the_worked_example_is_written_sparse_and_read_back_whole() -> None:
    t = build_turn_tables(**worked_example_kwargs())
    text = turn_to_json(t)
    stored = json.loads(text)
    assert "stages" not in stored
    sparse = stored[SPARSE_STAGES_KEY]
    assert set(sparse) == {"0", "1"}
    for row in sparse.values():
        assert None not in row.values() and [] not in row.values()
    assert sparse["1"]["audio_sample_rate"] == 24000 and "vllm_ttft_ms" not in sparse["1"]
    assert t.stages[1]["vllm_itls_ms"] == [] and "vllm_itls_ms" not in sparse["1"]
    assert len(text) * 2 < len(whole_form(t))
    for name in ("session_id", "response_id", "request_id", "turn_id", "finished_reason"):
        assert name not in stored  # the row's columns hold them
    assert stored["edges"] == [[0, 1, 65536, 3.0, 1.5, 0.5, False]]  # TransferEdge field order
    assert_same(round_trip(t), t)
    with pytest.raises(ValueError, match="with its row's columns"):
        turn_from_json(text)


def test_a_row_an_older_fold_wrote_decodes_the_same() -> None:
    t = build_turn_tables(**worked_example_kwargs())
    old = whole_form(t)
    assert_same(turn_from_json(old), t)
    assert render_json([turn_from_json(old)]) == render_json([round_trip(t)])


@pytest.mark.parametrize("request_id", [None, ""])
def test_a_turn_without_an_engine_request_keeps_its_request_id(request_id) -> None:
    """D8: a turn that ended before any engine request; its column holds "" for None and ""."""
    t = replace(build_turn_tables(**worked_example_kwargs()), request_id=request_id)
    assert turn_row(t, 7)["request_id"] == ""
    assert_same(round_trip(t), t)


def test_a_list_field_holding_none_stays_none() -> None:
    t = build_turn_tables(**worked_example_kwargs())
    row = dict(t.stages[0])
    row["inter_output_latencies_ms"] = None
    odd = replace(t, stages={0: row, 1: t.stages[1]})
    assert json.loads(turn_to_json(odd))[SPARSE_STAGES_KEY]["0"]["inter_output_latencies_ms"] is None
    assert_same(round_trip(odd), odd)


@pytest.mark.parametrize(
    "row",
    [
        {"num_tokens_out": 5, "vllm_ttft_ms": None},  # a subset of the keys
        {**dict.fromkeys(STAT_FIELDS), "not_a_stat": None},  # a key outside STAT_FIELDS
        dict.fromkeys(reversed(STAT_FIELDS)),  # another order
    ],
)
def test_a_row_that_is_not_a_collapsed_row_is_written_whole(row) -> None:
    t = build_turn_tables(**worked_example_kwargs())
    odd = replace(t, stages={**t.stages, 2: row})
    stored = json.loads(turn_to_json(odd))
    assert SPARSE_STAGES_KEY not in stored and stored["stages"]["2"] == row
    assert stored["session_id"] == "s1"  # the whole form, readable on its own
    assert_same(turn_from_json(turn_to_json(odd)), odd)


def test_a_compact_text_that_does_not_fit_is_refused() -> None:
    row = turn_row(build_turn_tables(**worked_example_kwargs()), 7)
    stored = json.loads(row["tables_json"])
    stored[SPARSE_STAGES_KEY]["0"]["num_tokens_outt"] = 1
    with pytest.raises(ValueError, match="num_tokens_outt"):
        turn_from_json(json.dumps(stored), row)
    stored = json.loads(row["tables_json"])
    stored["edges"][0].append(1)
    with pytest.raises(ValueError, match="an edge of 8 values, not 7"):
        turn_from_json(json.dumps(stored), row)


values = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False),
    st.booleans(),
    st.text(max_size=4),
    st.lists(st.floats(allow_nan=False), max_size=3),
    st.dictionaries(st.text(max_size=3), st.floats(allow_nan=False), max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(STAT_FIELDS), values), min_size=1, max_size=3))
def test_any_collapsed_row_round_trips(overrides) -> None:
    """Rows of every ``STAT_FIELDS`` key (list fields [] unless set, as a collapse gives them)
    with any JSON value: the decoded turn equals the written one, key order included."""
    t = build_turn_tables(**worked_example_kwargs())
    stages = {}
    for sid, over in enumerate(overrides):
        row = dict.fromkeys(STAT_FIELDS)
        row.update({name: [] for name in LIST_MEAN_FIELDS})
        row.update(over)
        stages[sid] = row
    odd = replace(t, stages=stages)
    assert SPARSE_STAGES_KEY in json.loads(turn_to_json(odd))
    assert_same(round_trip(odd), odd)
    assert round_trip(odd) == turn_from_json(whole_form(odd))


def test_a_turn_with_no_stage_row_round_trips() -> None:
    """D8: a turn that ended before any engine request has no stage row and no edge."""
    t = replace(build_turn_tables(**worked_example_kwargs()), request_id=None, stages={}, transfers=())
    stored = json.loads(turn_row(t, 7)["tables_json"])
    assert stored[SPARSE_STAGES_KEY] == {} and stored["edges"] == [] and stored["request_id"] is None
    assert_same(round_trip(t), t)
