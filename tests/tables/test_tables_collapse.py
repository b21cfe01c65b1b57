"""Collapse rules of DOMAIN §5.4 and pending buffering (§5.3, M3, M7, M15)."""

from __future__ import annotations

import logging

import pytest

from events.stats import STAT_FIELDS
from events.stats import StageRequestStats as S
from projections.collapse import StageCollapse, collapse_segments, merge_into_pending

from .conftest import worked_example_kwargs


def test_m7_tpot_is_token_weighted():
    row = collapse_segments([S(num_tokens_out=4, vllm_tpot_ms=10.0), S(num_tokens_out=6, vllm_tpot_ms=20.0)])
    assert row["vllm_tpot_ms"] == pytest.approx(16.25)  # not 20.0 (last wins) nor 16.0 (weight = out)


def test_tpot_weight_floor_is_one_and_zero_tpot_segments_are_skipped():
    row = collapse_segments(
        [
            S(num_tokens_out=1, vllm_tpot_ms=30.0),
            S(num_tokens_out=0, vllm_tpot_ms=0.0),
            S(num_tokens_out=3, vllm_tpot_ms=12.0),
        ]
    )
    assert row["vllm_tpot_ms"] == pytest.approx((30 * 1 + 12 * 2) / 3)


def test_tpot_none_positive_takes_first_segment_value():
    row = collapse_segments([S(num_tokens_out=1, vllm_tpot_ms=0.0), S(num_tokens_out=1, vllm_tpot_ms=None)])
    assert row["vllm_tpot_ms"] == 0.0


def test_worked_example_stage0_intermediate_values():
    segs = worked_example_kwargs()["segments"]
    row = collapse_segments(segs[0])
    assert (row["num_tokens_in"], row["num_tokens_out"]) == (136, 14)
    assert row["stage_gen_time_ms"] == pytest.approx(380.0)
    assert row["vllm_ttft_ms"] == 95.0
    assert row["vllm_tpot_ms"] == pytest.approx(20.0)  # (24*4 + 18*8) / 12
    assert len(row["vllm_itls_ms"]) == 12
    assert sum(row["vllm_itls_ms"]) / 12 == pytest.approx(20.5)
    assert row["vllm_itl_ms"] == pytest.approx(20.5)
    assert row["serving_time_to_first_output_ms"] == 1.757e12
    assert row["inter_output_latencies_ms"] == []
    assert row["inter_output_latency_ms"] is None


def test_worked_example_stage1_single_segment_unchanged():
    (b,) = worked_example_kwargs()["segments"][1]
    row = collapse_segments([b])
    for name in STAT_FIELDS:
        if name not in ("vllm_itls_ms", "inter_output_latencies_ms"):
            assert row[name] == getattr(b, name), name
    assert row["vllm_itls_ms"] == [] and row["inter_output_latencies_ms"] == []


def test_single_segment_keeps_its_own_itl_mean():
    row = collapse_segments([S(vllm_itls_ms=[10.0, 20.0], vllm_itl_ms=99.0)])
    assert row["vllm_itl_ms"] == 99.0


def test_sum_none_rules():
    row = collapse_segments([S(num_tokens_out=3), S(num_tokens_out=None, postprocess_time_ms=None)])
    assert row["num_tokens_out"] == 3  # None counts as 0 ...
    assert row["postprocess_time_ms"] is None  # ... but None everywhere stays None


def test_tokenless_stage_has_no_ttft_or_tpot():
    row = collapse_segments([S(num_tokens_in=200, num_tokens_out=0, vllm_ttft_ms=0.0, vllm_tpot_ms=0.0)])
    assert row["vllm_ttft_ms"] is None and row["vllm_tpot_ms"] is None
    assert row["num_tokens_out"] == 0


def test_first_positive_last_positive_last_non_none_first_segment():
    row = collapse_segments(
        [
            S(
                vllm_ttft_ms=0.0,
                audio_sample_rate=None,
                denoise_step_latency_ms=5.0,
                finish_reason="length",
                batch_id=7,
            ),
            S(vllm_ttft_ms=40.0, audio_sample_rate=24000, denoise_step_latency_ms=0.0, finish_reason=None, batch_id=8),
            S(vllm_ttft_ms=50.0, audio_sample_rate=16000, denoise_step_latency_ms=None, output_unit_type="audio"),
        ]
    )
    assert row["vllm_ttft_ms"] == 40.0 and row["audio_sample_rate"] == 24000
    assert row["denoise_step_latency_ms"] == 5.0
    assert row["finish_reason"] == "length" and row["output_unit_type"] == "audio"
    assert row["batch_id"] == 7


def test_time_per_output_unit_multi_segment_formula():
    segs = [
        S(
            stage_gen_time_ms=100.0,
            output_unit_count=3,
            serving_time_to_first_output_ms=40.0,
            time_per_output_unit_ms=1.0,
        ),
        S(stage_gen_time_ms=60.0, output_unit_count=2),
    ]
    assert collapse_segments(segs)["time_per_output_unit_ms"] == pytest.approx((160 - 40) / 4)
    assert collapse_segments(segs[:1])["time_per_output_unit_ms"] == 1.0
    assert collapse_segments([S(output_unit_count=1), S()])["time_per_output_unit_ms"] == 0.0


def test_m3_audio_frames_maps_other_extra_keys_logged_at_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="projections.collapse")
    row = collapse_segments([S(audio_generated_frames=100, extra={"audio_frames": 20, "mystery_key": 1})])
    assert row["audio_generated_frames"] == 120
    assert "mystery_key" not in row
    hits = [r for r in caplog.records if "mystery_key" in r.getMessage()]
    assert hits and all(r.levelno == logging.DEBUG for r in hits)


def test_m15_thousand_buffered_snapshots_are_one_pending_entry():
    pending: dict[int, StageCollapse] = {}
    for i in range(1000):
        pending[0] = merge_into_pending(
            pending.get(0), S(num_tokens_out=1, stage_gen_time_ms=1.0, vllm_itls_ms=[float(i)])
        )
    assert list(pending) == [0]
    assert isinstance(pending[0], StageCollapse) and pending[0].segments == 1000
    row = pending[0].row()
    assert row["num_tokens_out"] == 1000 and row["stage_gen_time_ms"] == pytest.approx(1000.0)
    assert len(row["vllm_itls_ms"]) == 1000


def test_pending_replayed_into_turn_equals_collapse_of_all_snapshots():
    snaps = [S(num_tokens_out=4, vllm_tpot_ms=10.0, vllm_itls_ms=[1.0]), S(num_tokens_out=6, vllm_tpot_ms=20.0)]
    later = S(num_tokens_out=2, vllm_tpot_ms=30.0, vllm_itls_ms=[3.0], vllm_itl_ms=3.0)
    pending = None
    for s in snaps:
        pending = merge_into_pending(pending, s)
    assert collapse_segments([pending, later]) == collapse_segments([*snaps, later])
    # one buffered snapshot replayed keeps its own single-segment values
    assert collapse_segments([merge_into_pending(None, later)]) == collapse_segments([later])


def test_merge_does_not_mutate_its_input():
    p1 = merge_into_pending(None, S(num_tokens_out=1))
    p2 = merge_into_pending(p1, S(num_tokens_out=2))
    assert p1.row()["num_tokens_out"] == 1 and p2.row()["num_tokens_out"] == 3


def test_empty_segments_raise():
    with pytest.raises(ValueError):
        collapse_segments([])
