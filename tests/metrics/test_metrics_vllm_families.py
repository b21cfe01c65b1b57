"""Issue 22 part B: the families vLLM users chart (TTFT, request TPOT, ITL histograms; running and
waiting gauges) from the same fold, and every model's children present from its first session."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine_bridge.prometheus import LedgerMetrics
from projections.metrics import MetricsFold, TallySink
from projections.projector import Projector
from tests.logbuilder import LogBuilder, eph
from tests.metrics.test_metrics_fold import MODEL, S, opened, turn

HISTOGRAMS = (
    "vllm_omni:e2e_request_latency_s",
    "vllm_omni:time_to_first_token_s",
    "vllm_omni:request_time_per_output_token_s",
    "vllm_omni:inter_token_latency_s",
)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_every_model_child_exists_with_zero_samples_from_its_first_session():
    b = LogBuilder()
    opened(b)
    got = samples(LedgerMetrics().apply_all(b.stored).exposition())
    label = (("model_name", MODEL),)
    for name in HISTOGRAMS:
        assert got[(f"{name}_count", label)] == 0.0
    assert got[("vllm_omni:num_requests_running", label)] == 0.0
    assert got[("vllm_omni:num_requests_waiting", label)] == 0.0
    assert not any(name == "duplex_ledger:abort_failures_total" for name, _ in got)
    b.add("StageRequestSubmitted", S, 1.0, stage_id=0, request_id=eph(S, 0), num_tokens_in=5)
    got = samples(LedgerMetrics().apply_all(b.stored).exposition())
    assert got[("duplex_ledger:abort_failures_total", (("stage", "0"),))] == 0.0
    assert got[("vllm_omni:audio_ttfp_s_count", (("model_name", MODEL), ("stage", "0")))] == 0.0


def test_ttft_tpot_and_itls_are_the_turn_tables_stage0_figures():
    b = LogBuilder()
    opened(b)
    x = eph(S, 0)
    b.add("TurnCommitted", S, 10.0, turn_id=0, create_response=True, response_id="resp-0")
    b.add("StageRequestSubmitted", S, 10.01, stage_id=0, request_id=x, num_tokens_in=5)
    b.add("ResponseBegun", S, 10.02, response_id="resp-0", turn_id=0, request_id=x)
    for i, ts in enumerate((10.1, 10.13, 10.18, 10.2)):
        b.add("StageOutput", S, ts, stage_id=0, request_id=x, num_new_tokens=1 + i % 2)
    stats = {"num_tokens_in": 5, "num_tokens_out": 6, "vllm_ttft_ms": 90.0, "vllm_tpot_ms": 25.0}
    stats["vllm_itls_ms"] = [30.0, 20.0, 25.0]
    b.add("StageMetricsReported", S, 10.3, stage_id=0, request_id=x, stats=stats)
    b.add("ResponseEnded", S, 11.0, response_id="resp-0", cause="model")
    turn(b, 1, "barge_in", t0=20.0)
    (first, second) = Projector().apply_all(b.stored).turn_tables
    sink = TallySink()
    MetricsFold(sink).apply_all(b.stored)
    obs = sink.observations
    ttfts = [t.stages[0]["vllm_ttft_ms"] / 1000 for t in (first, second)]
    assert obs[("vllm_omni:time_to_first_token_s", (MODEL,))] == pytest.approx(ttfts)
    itls = [v / 1000 for t in (first, second) for v in t.stages[0]["vllm_itls_ms"] or []]
    assert len(itls) >= 3 and obs[("vllm_omni:inter_token_latency_s", (MODEL,))] == pytest.approx(itls)
    tpots = [t.stages[0]["vllm_tpot_ms"] / 1000 for t in (first, second) if (t.stages[0]["vllm_tpot_ms"] or 0) > 0]
    assert tpots and obs[("vllm_omni:request_time_per_output_token_s", (MODEL,))] == pytest.approx(tpots)


def test_running_and_waiting_follow_submit_first_output_and_release():
    b = LogBuilder()
    opened(b)
    opened(b, session="s2")
    seen: list[tuple[float, float]] = []
    sink = TallySink()
    fold = MetricsFold(sink)

    def step() -> None:
        fold.apply(b.stored[-1])
        seen.append(
            (
                sink.values[("vllm_omni:num_requests_running", (MODEL,))],
                sink.values[("vllm_omni:num_requests_waiting", (MODEL,))],
            )
        )

    fold.apply_all(b.stored)
    x, y = eph(S, 0), eph("s2", 0)
    b.add("TurnCommitted", S, 10.0, turn_id=0, create_response=True, response_id="r0")
    step()
    b.add("StageRequestSubmitted", S, 10.01, stage_id=0, request_id=x, num_tokens_in=5)
    step()
    b.add("StageRequestSubmitted", "s2", 10.02, stage_id=0, request_id=y, num_tokens_in=5)
    step()
    b.add("StageOutput", S, 10.1, stage_id=0, request_id=x, num_new_tokens=2)
    step()
    b.add("StageRequestFinished", S, 10.5, stage_id=0, request_id=x, finish_reason="stop")
    step()
    b.add("AbortRequested", "s2", 10.6, request_ids=[y])
    b.add("AbortResult", "s2", 10.61, request_ids=[y], outcome="ok", stage_id=0)
    fold.apply(b.stored[-2])
    step()
    assert seen == [(0, 0), (0, 1), (0, 2), (1, 1), (0, 1), (0, 0)]


def test_offline_exposition_of_the_new_families_equals_a_fold_of_the_same_events_twice():
    b = LogBuilder()
    opened(b)
    turn(b, 0, "stop", t0=10.0, audio_at=0.3)
    turn(b, 1, "abort", t0=20.0)
    one = samples(LedgerMetrics().apply_all(b.stored).exposition())
    two = samples(LedgerMetrics().apply_all(list(b.stored)).exposition())
    assert one == two
    assert one[("vllm_omni:time_to_first_token_s_count", (("model_name", MODEL),))] == 2
