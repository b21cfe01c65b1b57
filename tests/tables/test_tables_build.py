"""build_turn_tables: TX/RX edges (§5.3, M18), e2e and summary (§5.1, §5.5), reasons (M1)."""

from __future__ import annotations

import json

import pytest

from events.stats import StageRequestStats as S
from projections.turn_tables import TransferEdge, build_turn_tables

from .conftest import ENGINE_ID, worked_example_kwargs


def _turn(**over):
    kw = dict(
        session_id="s1",
        response_id="resp-a",
        request_id=ENGINE_ID,
        turn_id=0,
        finished_reason="stop",
        arrival_ts=10.0,
        finalize_ts=12.0,
        segments={},
        stage_first_ts={},
        stage_last_ts={},
        tx_delta={},
        edge_order=[],
    )
    kw.update(over)
    return build_turn_tables(**kw)


def test_worked_example_e2e_summary_and_transfer(worked):
    assert worked.transfers == (TransferEdge(0, 1, 65536, 3.0, 1.5, 0.5, False),)
    assert worked.e2e == {
        "e2e_total_ms": 1700.0,
        "e2e_total_tokens": 300,
        "transfers_total_time_ms": 5.0,
        "transfers_total_bytes": 65536,
    }
    assert list(worked.summary) == [
        "e2e_requests",
        "e2e_wall_time_ms",
        "e2e_total_tokens",
        "e2e_avg_time_per_request_ms",
        "e2e_avg_tokens_per_s",
        "e2e_stage_0_wall_time_ms",
        "e2e_stage_1_wall_time_ms",
    ]
    assert worked.summary["e2e_avg_tokens_per_s"] == pytest.approx(300 / 1.7)
    assert worked.summary["e2e_stage_0_wall_time_ms"] == 1250.0
    assert worked.summary["e2e_stage_1_wall_time_ms"] == 1280.0  # last ts raised to finalize
    assert worked.preprocess_ms is None


def test_m18_tx_delta_copied_with_rx_from_stage1_snapshot():
    t = _turn(
        segments={0: [S(num_tokens_out=3)], 1: [S(rx_decode_time_ms=1.0, rx_in_flight_time_ms=0.5)]},
        tx_delta={(0, 1): (10.5 - 3.0, 2048, True)},
        edge_order=[(0, 1)],
    )
    (edge,) = t.transfers
    assert (edge.tx_time_ms, edge.rx_decode_time_ms, edge.in_flight_time_ms) == (7.5, 1.0, 0.5)
    assert edge.used_shm is True
    assert edge.size_bytes == 2048  # RX reported no size, so the TX delta gives it
    assert t.e2e["transfers_total_time_ms"] == 9.0


def test_rx_size_wins_over_tx_size_and_negative_tx_delta_counts_zero():
    t = _turn(segments={1: [S(rx_transfer_bytes=100, rx_decode_time_ms=2.0)]}, tx_delta={(0, 1): (-4.0, 999, False)})
    assert t.transfers == (TransferEdge(0, 1, 100, 0.0, 2.0, 0.0, False),)


def test_edges_in_first_seen_order_then_rx_only_edges():
    t = _turn(
        segments={2: [S(rx_decode_time_ms=1.0)]},
        tx_delta={(0, 1): (1.0, 0, False), (1, 3): (2.0, 0, False)},
        edge_order=[(1, 3), (0, 1)],
    )
    assert [e.edge for e in t.transfers] == ["1->3", "0->1", "1->2"]
    assert t.transfers[0].size_bytes is None


def test_two_turns_two_summaries_keyed_by_response():
    a = _turn(response_id="resp-a")
    b = _turn(response_id="resp-b", arrival_ts=15.0, finalize_ts=16.0)
    assert [t.response_id for t in (a, b)] == ["resp-a", "resp-b"]
    assert b.summary["e2e_wall_time_ms"] == 1000.0


@pytest.mark.parametrize(
    "reason,want",
    [
        ("stop", "stop"),
        ("barge_in", "barge_in"),
        ("cancel", "cancel"),
        ("close", "close"),
        ("abort", "abort"),
        ("error", "error"),
        ("oops", "abort"),
    ],
)
def test_m1_reasons_pass_through_unknown_becomes_abort(reason, want):
    assert _turn(finished_reason=reason).finished_reason == want


def test_tokenless_aborted_turn_case03():
    t = _turn(
        finished_reason="abort",
        arrival_ts=1757000000.0,
        finalize_ts=1757000000.4,
        segments={0: [S(num_tokens_in=200, num_tokens_out=0)]},
        stage_first_ts={0: 1757000000.02},
        stage_last_ts={0: 1757000000.02},
    )
    assert t.e2e["e2e_total_ms"] == pytest.approx(400.0, abs=1e-3)
    assert t.e2e["e2e_total_tokens"] == 200
    stage0 = t.to_dict()["stages"][0]
    assert stage0["vllm_ttft_ms"] is None and stage0["vllm_tpot_ms"] is None
    assert json.loads(json.dumps(t.to_dict()))["stages"][0]["vllm_ttft_ms"] is None


def test_preprocess_from_any_stage_for_summary():
    t = _turn(segments={0: [S(pipeline_timings={"preprocess_ms": 57.0})], 1: [S()]})
    assert t.preprocess_ms == 57.0
    assert list(t.summary)[5] == "input_preprocess_time_ms"


def test_no_segments_at_all_still_builds():
    t = _turn(finished_reason="barge_in")
    assert t.stages == {} and t.transfers == () and t.e2e["e2e_total_tokens"] == 0


def test_to_dict_units_in_names(worked):
    d = worked.to_dict()
    assert d["arrival_ts_s"] == 1000.0 and d["finalize_ts_s"] == 1001.7
    assert d["stages"][1]["audio_sample_rate_hz"] == 24000 and "audio_sample_rate" not in d["stages"][1]
    assert d["transfers"][0]["size_bytes"] == 65536
    json.dumps(d, allow_nan=False)


def test_worked_kwargs_are_not_mutated():
    kw = worked_example_kwargs()
    build_turn_tables(**kw)
    assert kw == worked_example_kwargs()
