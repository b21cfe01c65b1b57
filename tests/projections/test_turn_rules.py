"""DOMAIN §6.2 (M-requirements) on the turn-tables fold, driven by event logs."""

from pathlib import Path

import pytest

from projections.projector import Projector
from reports.render_text import render_turn_text
from tests.logbuilder import LogBuilder, eph

X = eph("s1", 3)
GOLDEN = Path(__file__).parents[1] / "tables" / "golden" / "worked-example.txt"


def project(b):
    return Projector().apply_all(b.stored)


def open_turn(b, response_id="resp-a", ts=10.0, request_id=X):
    b.add("ResponseBegun", "s1", ts, response_id=response_id, turn_id=3, request_id=request_id)


def worked_example() -> LogBuilder:
    """DOMAIN §5.6 as events."""
    b = LogBuilder()
    b.add("TransferTx", "s1", 999.0, from_stage=0, to_stage=1, request_id=eph("s1", 2), size_bytes=4096, tx_time_ms=1.0)
    b.add("TurnCommitted", "s1", 1000.0, turn_id=3, create_response=True)
    b.add("ResponseBegun", "s1", 1000.01, response_id="resp-s1-0-9f2c41aa", turn_id=3, request_id=X)
    b.add(
        "StageMetricsReported",
        "s1",
        1000.4,
        stage_id=0,
        request_id=X,
        stage_submit_ts=1000.05,
        stats={
            "num_tokens_in": 120,
            "num_tokens_out": 5,
            "stage_gen_time_ms": 180,
            "vllm_ttft_ms": 95,
            "vllm_tpot_ms": 24,
            "vllm_itls_ms": [30, 22, 22, 22],
            "serving_time_to_first_output_ms": 1.757e12,
        },
    )
    b.add(
        "StageMetricsReported",
        "s1",
        1001.6,
        stage_id=1,
        request_id=X,
        stage_submit_ts=1000.42,
        stats={
            "num_tokens_in": 14,
            "num_tokens_out": 150,
            "stage_gen_time_ms": 650,
            "audio_generated_frames": 48000,
            "audio_sample_rate": 24000,
            "audio_duration_s": 2.0,
            "rx_transfer_bytes": 65536,
            "rx_decode_time_ms": 1.5,
            "rx_in_flight_time_ms": 0.5,
        },
    )
    b.add("TransferTx", "s1", 1001.0, from_stage=0, to_stage=1, request_id=X, size_bytes=65536, tx_time_ms=3.0)
    b.add(
        "StageMetricsReported",
        "s1",
        1001.3,
        stage_id=0,
        request_id=X,
        stage_submit_ts=1000.9,
        stats={
            "num_tokens_in": 16,
            "num_tokens_out": 9,
            "stage_gen_time_ms": 200,
            "vllm_ttft_ms": 40,
            "vllm_tpot_ms": 18,
            "vllm_itls_ms": [20] * 6 + [15, 15],
        },
    )
    b.add("ResponseEnded", "s1", 1001.7, response_id="resp-s1-0-9f2c41aa", cause="model")
    return b


def test_worked_example_through_the_fold_is_golden():
    p = project(worked_example())
    assert len(p.turn_tables) == 1
    assert render_turn_text(p.turn_tables[0]) == GOLDEN.read_text()


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("barge_in", "barge_in"),
        ("cancel", "cancel"),
        ("close", "close"),
        ("abort", "abort"),
        ("error", "error"),
        ("stop", "stop"),
        ("oops", "abort"),
    ],
)
def test_m1_reasons_pass_through(raw, expected):
    b = LogBuilder()
    open_turn(b)
    b.add("TurnFinalized", "s1", 11.0, response_id="resp-a", finished_reason=raw)
    (t,) = project(b).turn_tables
    assert t.finished_reason == expected
    if raw == "barge_in":
        assert "reason=barge_in" in render_turn_text(t)


def test_m2_first_ts_rule():
    for submit_ts, expected_first in ((100.0, 100.0), (None, 200.0)):
        b = LogBuilder()
        open_turn(b, ts=50.0)
        b.add(
            "StageMetricsReported",
            "s1",
            200.0,
            stage_id=0,
            request_id=X,
            stage_submit_ts=submit_ts,
            stats={"num_tokens_out": 1},
        )
        b.add("StageMetricsReported", "s1", 250.0, stage_id=1, request_id=X, stats={"num_tokens_out": 1})
        b.add("ResponseEnded", "s1", 300.0, response_id="resp-a")
        (first,) = project(b).turn_tables
        # stage 0 is not the final stage, so its wall time is last receipt (200) - first ts
        assert first.summary["e2e_stage_0_wall_time_ms"] == pytest.approx((200.0 - expected_first) * 1000)


@pytest.mark.parametrize(
    "source, reason",
    [
        ("session_close", "close"),
        ("timeout", "cancel"),
        ("new_response", "cancel"),
        ("disconnect", "close"),
        ("disconnect_grace_expired", "close"),
        ("input.cancel", "cancel"),
        ("response.cancel", "cancel"),
        ("barge_in", "barge_in"),
        ("output_audio_buffer_clear", "cancel"),
        ("something_new", "cancel"),
    ],
)
def test_m4_cancel_source_mapping_and_one_table(source, reason):
    b = LogBuilder()
    open_turn(b)
    b.add("CancelRequested", "s1", 11.0, source=source, response_id="resp-a")
    b.add("SessionClosed", "s1", 12.0, reason="session_close")
    tables = project(b).turn_tables
    assert [t.finished_reason for t in tables] == [reason]


def test_m5_auto_response_buffer_before_begin():
    b = LogBuilder()
    b.add("SessionOpened", "s1", 40.0, auto_response=True)
    b.add(
        "StageMetricsReported",
        "s1",
        60.0,
        stage_id=0,
        request_id=X,
        stage_submit_ts=50.0,
        stats={"num_tokens_out": 7, "stage_gen_time_ms": 30},
    )
    p = Projector()
    for s in b.stored:
        p.apply(s)
    assert p.turns.sessions["s1"].pending_stamp == 50.0
    open_turn(b, ts=70.0)
    p.apply(b.stored[-1])
    session = p.turns.sessions["s1"]
    assert session.pending_rows == {} and session.pending_stamp is None
    b.add("ResponseEnded", "s1", 80.0, response_id="resp-a")
    p.apply(b.stored[-1])
    (t,) = p.turns.take_finalized()
    assert t.arrival_ts == 50.0
    assert (t.stages[0]["num_tokens_out"], t.stages[0]["stage_gen_time_ms"]) == (7, 30.0)


def test_m6_response_required_e2e_from_commit_ts():
    b = LogBuilder()
    b.add("TurnCommitted", "s1", 5.0, turn_id=3, response_id="resp-a", create_response=True)
    open_turn(b, ts=6.0)
    b.add("ResponseEnded", "s1", 7.0, response_id="resp-a")
    (t,) = project(b).turn_tables
    assert t.arrival_ts == 5.0 and t.e2e["e2e_total_ms"] == pytest.approx(2000.0)


def test_m11_listen_only_emits_nothing_and_listen_snapshots_count_in_the_speak_turn():
    b = LogBuilder()
    b.add("StageMetricsReported", "s1", 1.0, stage_id=0, request_id=X, stats={"num_tokens_out": 2})
    b.add("ResponseListened", "s1", 1.1, turn_id=3, request_id=X)
    assert project(b).turn_tables == []
    b.add("StageMetricsReported", "s1", 2.0, stage_id=0, request_id=X, stats={"num_tokens_out": 3})
    open_turn(b, ts=2.1)
    b.add("ResponseEnded", "s1", 3.0, response_id="resp-a")
    (t,) = project(b).turn_tables
    assert t.stages[0]["num_tokens_out"] == 5


def test_m12_chat_ids_never_buffer_or_open():
    b = LogBuilder()
    b.add("StageMetricsReported", "s1", 1.0, stage_id=0, request_id="chatcmpl-1", stats={"num_tokens_out": 2})
    p = project(b)
    assert p.turns.sessions["s1"].pending_rows == {} and p.turns.sessions["s1"].pending_stamp is None
    open_turn(b, ts=2.0, request_id="chatcmpl-1")
    b.add("TurnFinalized", "s1", 3.0, response_id="resp-a")
    assert project(b).turn_tables == []


def test_m13_abort_emits_exactly_one_table_and_second_finalize_is_noop():
    b = LogBuilder()
    open_turn(b)
    b.add("AbortRequested", "s1", 11.0, request_ids=[X])
    b.add("TurnFinalized", "s1", 11.0, response_id="resp-a", finished_reason="abort")
    b.add("AbortRequested", "s1", 12.0, request_ids=["chatcmpl-9"])
    p = project(b)
    assert [t.finished_reason for t in p.turn_tables] == ["abort"]


def test_m14_log_stats_off_still_reprojects_offline():
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, log_stats=False)
    open_turn(b, ts=2.0)
    b.add("ResponseEnded", "s1", 3.0, response_id="resp-a")
    assert len(project(b).turn_tables) == 1


def test_m16_arrival_survives_finalize():
    b = LogBuilder()
    open_turn(b, response_id="A", ts=9.0)
    b.add("InputAppended", "s1", 10.0)
    b.add("ResponseEnded", "s1", 12.0, response_id="A")
    open_turn(b, response_id="B", ts=15.0)
    b.add("ResponseEnded", "s1", 16.0, response_id="B")
    _, second = project(b).turn_tables
    assert second.arrival_ts == 10.0


def test_m18_two_turns_and_tx_delta():
    b = LogBuilder()
    b.add("TransferTx", "s1", 1.0, from_stage=0, to_stage=1, request_id=X, tx_time_ms=3.0, size_bytes=100)
    open_turn(b, response_id="resp-a", ts=2.0)
    b.add(
        "StageMetricsReported",
        "s1",
        3.0,
        stage_id=1,
        request_id=X,
        stats={"num_tokens_out": 4, "rx_decode_time_ms": 1.0, "rx_in_flight_time_ms": 0.5, "rx_transfer_bytes": 2048},
    )
    b.add("TransferTx", "s1", 3.5, from_stage=0, to_stage=1, request_id=X, tx_time_ms=7.5, size_bytes=2048)
    b.add("ResponseEnded", "s1", 4.0, response_id="resp-a")
    open_turn(b, response_id="resp-b", ts=5.0)
    b.add("ResponseEnded", "s1", 6.0, response_id="resp-b")
    a, second = project(b).turn_tables
    assert (a.response_id, second.response_id) == ("resp-a", "resp-b")
    (edge,) = a.transfers
    assert (edge.tx_time_ms, edge.rx_decode_time_ms, edge.in_flight_time_ms) == (7.5, 1.0, 0.5)


def test_m21_same_snapshot_on_two_paths_counted_once_and_superseded_turn_aborts():
    b = LogBuilder()
    open_turn(b, response_id="resp-a")
    for _ in range(2):
        b.add(
            "StageMetricsReported",
            "s1",
            11.0,
            stage_id=0,
            request_id=X,
            stage_submit_ts=10.5,
            stats={"num_tokens_in": 10, "num_tokens_out": 4, "stage_gen_time_ms": 15},
        )
    open_turn(b, response_id="resp-b", ts=12.0)
    b.add("ResponseEnded", "s1", 13.0, response_id="resp-b")
    a, second = project(b).turn_tables
    assert (a.stages[0]["num_tokens_in"], a.stages[0]["num_tokens_out"]) == (10, 4)
    assert a.finished_reason == "abort" and second.finished_reason == "stop"


def test_m15_thousand_pre_begin_snapshots_one_pending_entry():
    b = LogBuilder()
    for i in range(1000):
        b.add(
            "StageMetricsReported",
            "s1",
            1.0 + i * 0.001,
            stage_id=0,
            request_id=X,
            stats={"num_tokens_out": 1, "stage_gen_time_ms": 1.0},
        )
    p = project(b)
    assert list(p.turns.sessions["s1"].pending_rows) == [0]
    open_turn(b, ts=5.0)
    b.add("ResponseEnded", "s1", 6.0, response_id="resp-a")
    (t,) = project(b).turn_tables
    assert t.stages[0]["num_tokens_out"] == 1000
