"""CASE-08 Part A: one clock per duration. Engine monotonic stamps are only subtracted from
each other; a snapshot mixing clocks is flagged and contributes nothing."""

from tests.cases.support import project, turn
from tests.logbuilder import LogBuilder, eph

X = eph("S1", 0)
W = 1757000010.0


def mono(s):
    return {"clock": "engine_monotonic", "s": s}


def test_mixed_clock_domains(approx):
    b = LogBuilder()
    b.add("TurnCommitted", "S1", W, turn_id=0, response_id="resp-1", create_response=True)
    b.add("StageRequestSubmitted", "S1", W + 0.015, stage_id=0, request_id=X, num_tokens_in=40)
    b.add(
        "StageMetricsReported",
        "S1",
        W + 0.84,
        stage_id=0,
        request_id=X,
        stats={"num_tokens_in": 40, "num_tokens_out": 25},
        engine_submit_ts=mono(8234.52),
        engine_first_token_ts=mono(8234.75),
        engine_last_token_ts=mono(8235.23),
    )
    b.add(
        "StageMetricsReported",
        "S1",
        W + 0.845,
        stage_id=0,
        request_id=X,
        stats={"num_tokens_out": 3},
        engine_submit_ts={"clock": "wall", "s": W + 0.9},
        engine_first_token_ts=mono(8235.4),
    )
    b.add("ResponseEnded", "S1", W + 0.85, response_id="resp-1", status="completed")
    p = project(b)
    row = turn(p, "resp-1")
    s0 = row.stages[0]
    assert row.e2e["e2e_total_ms"] == approx(850.0)
    assert s0["vllm_ttft_ms"] == approx(230.0)
    assert s0["vllm_tpot_ms"] == approx(20.0)
    assert s0["num_tokens_out"] == 25  # the malformed segment contributed nothing
    for value in (row.e2e["e2e_total_ms"], s0["vllm_ttft_ms"], s0["vllm_tpot_ms"], s0["stage_gen_time_ms"] or 0):
        assert 0 <= value < 1e6
    assert [f.kind for f in p.findings()] == ["clock_domain_mismatch"]
