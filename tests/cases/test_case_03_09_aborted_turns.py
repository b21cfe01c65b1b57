"""CASE-03 and CASE-09: aborted and barge-in turns still get exactly one row; a turn with no
token has TTFT/TPOT None (never a zero/epoch sentinel, never the time to interruption)."""

from tests.cases.support import leak_tuples, project, turn
from tests.logbuilder import LogBuilder, eph

T0, T1, T2 = eph("S1", 0), eph("S1", 1), eph("S1", 2)
E = 1757000000.0


def case_03():
    b = LogBuilder()
    b.add("TurnCommitted", "S1", E + 0.0, turn_id=0, response_id="resp-1", create_response=True)
    b.add("StageRequestSubmitted", "S1", E + 0.02, stage_id=0, request_id=T0, num_tokens_in=200)
    b.add("ResponseBegun", "S1", E + 0.03, response_id="resp-1", turn_id=0, request_id=T0)
    b.add("AbortRequested", "S1", E + 0.4, request_ids=[T0], reason="abort")
    b.add("TurnFinalized", "S1", E + 0.4, response_id="resp-1", finished_reason="abort")
    b.add("AbortResult", "S1", E + 0.401, request_ids=[T0], stage_id=0, outcome="ok")
    b.add("TurnCommitted", "S1", E + 1.0, turn_id=1, response_id="resp-2", create_response=True)
    b.add("StageRequestSubmitted", "S1", E + 1.01, stage_id=0, request_id=T1, num_tokens_in=180)
    b.add("ResponseBegun", "S1", E + 1.02, response_id="resp-2", turn_id=1, request_id=T1)
    b.add("StageOutput", "S1", E + 1.25, stage_id=0, request_id=T1, num_new_tokens=1)
    b.add("StageOutput", "S1", E + 1.33, stage_id=0, request_id=T1, num_new_tokens=4)
    b.add("AbortRequested", "S1", E + 1.4, request_ids=[T1], reason="abort")
    b.add("TurnFinalized", "S1", E + 1.4, response_id="resp-2", finished_reason="abort")
    b.add("AbortResult", "S1", E + 1.401, request_ids=[T1], stage_id=0, outcome="ok")
    return b


def test_case_03_two_abort_rows(approx):
    p = project(case_03())
    assert len(p.turn_tables) == 2
    r1, r2 = turn(p, "resp-1"), turn(p, "resp-2")
    assert r1.finished_reason == r2.finished_reason == "abort"
    assert (r1.stages[0]["num_tokens_in"], r1.stages[0]["num_tokens_out"]) == (200, 0)
    assert r1.stages[0]["vllm_ttft_ms"] is None
    assert r1.stages[0]["vllm_tpot_ms"] is None
    assert r1.e2e["e2e_total_ms"] == approx(400.0)
    assert (r2.stages[0]["num_tokens_in"], r2.stages[0]["num_tokens_out"]) == (180, 5)
    assert r2.stages[0]["vllm_ttft_ms"] == approx(240.0)
    assert r2.stages[0]["vllm_tpot_ms"] == approx(20.0)
    assert r2.e2e["e2e_total_ms"] == approx(400.0)
    assert sum(t.stages[0]["num_tokens_in"] for t in p.turn_tables) == 380
    assert leak_tuples(p) == []
    assert p.resources.running() == 0


def case_09():
    b = LogBuilder()
    b.add("TurnCommitted", "S1", 80.0, turn_id=1, response_id="resp-2", create_response=True)
    b.add("StageRequestSubmitted", "S1", 80.02, stage_id=0, request_id=T1, num_tokens_in=70)
    b.add("ResponseBegun", "S1", 80.03, response_id="resp-2", turn_id=1, request_id=T1)
    b.add("AbortRequested", "S1", 80.12, request_ids=[T1], reason="barge_in")
    b.add("TurnFinalized", "S1", 80.12, response_id="resp-2", finished_reason="barge_in")
    b.add("AbortResult", "S1", 80.121, request_ids=[T1], stage_id=0, outcome="ok")
    b.add("TurnCommitted", "S1", 81.0, turn_id=2, response_id="resp-3", create_response=True)
    b.add("StageRequestSubmitted", "S1", 81.02, stage_id=0, request_id=T2, num_tokens_in=85)
    b.add("ResponseBegun", "S1", 81.03, response_id="resp-3", turn_id=2, request_id=T2)
    b.add("StageOutput", "S1", 81.3, stage_id=0, request_id=T2, num_new_tokens=1)
    b.add("StageOutput", "S1", 81.78, stage_id=0, request_id=T2, num_new_tokens=30)
    b.add("AbortRequested", "S1", 81.85, request_ids=[T2], reason="barge_in")
    b.add("TurnFinalized", "S1", 81.85, response_id="resp-3", finished_reason="barge_in")
    b.add("AbortResult", "S1", 81.851, request_ids=[T2], stage_id=0, outcome="ok")
    return b


def test_case_09_barge_in_before_first_token_has_no_ttft(approx):
    p = project(case_09())
    r2, r3 = turn(p, "resp-2"), turn(p, "resp-3")
    assert r2.finished_reason == r3.finished_reason == "barge_in"
    assert (r2.stages[0]["num_tokens_in"], r2.stages[0]["num_tokens_out"]) == (70, 0)
    assert r2.stages[0]["vllm_ttft_ms"] is None and r2.stages[0]["vllm_tpot_ms"] is None
    assert r2.e2e["e2e_total_ms"] == approx(120.0)
    assert (r3.stages[0]["num_tokens_in"], r3.stages[0]["num_tokens_out"]) == (85, 31)
    assert r3.stages[0]["vllm_ttft_ms"] == approx(280.0)
    assert r3.stages[0]["vllm_tpot_ms"] == approx(16.0)
    assert r3.e2e["e2e_total_ms"] == approx(850.0)
    ttfts = [t.stages[0]["vllm_ttft_ms"] for t in p.turn_tables if t.stages[0]["vllm_ttft_ms"] is not None]
    assert sum(ttfts) / len(ttfts) == approx(280.0)
    assert leak_tuples(p) == []
    assert p.resources.running() == 0
