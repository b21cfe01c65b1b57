"""CASE-06: an abort of X fans out to every stage; (1, X) must not be left behind, and
bindings stay until an abort succeeds."""

from tests.cases.support import leak_tuples, project, turn
from tests.logbuilder import LogBuilder, eph

X = eph("S1", 0)


def build(variant: str):
    b = LogBuilder()
    b.add("TurnCommitted", "S1", 50.0, turn_id=0, response_id="resp-1", create_response=True)
    after_submit = b.add("StageRequestSubmitted", "S1", 50.01, stage_id=0, request_id=X, num_tokens_in=150).position
    b.add("ResponseBegun", "S1", 50.02, response_id="resp-1", turn_id=0, request_id=X)
    b.add("StageOutput", "S1", 50.2, stage_id=0, request_id=X, num_new_tokens=1)
    after_forward = b.add("StageRequestForwarded", "S1", 50.3, stage_id=1, request_id=X).position
    b.add("StageOutput", "S1", 50.45, stage_id=1, request_id=X, audio_frames=1920)
    b.add("StageOutput", "S1", 50.58, stage_id=0, request_id=X, num_new_tokens=19)
    b.add("AbortRequested", "S1", 50.8, request_ids=[X], reason="barge_in")
    b.add("TurnFinalized", "S1", 50.8, response_id="resp-1", finished_reason="barge_in")
    if variant == "main":
        b.add("AbortResult", "S1", 50.801, request_ids=[X], stage_id=0, outcome="ok")
        b.add("AbortResult", "S1", 50.801, request_ids=[X], stage_id=1, outcome="ok")
    elif variant == "v1":
        b.add("AbortResult", "S1", 50.801, request_ids=[X], stage_id=0, outcome="ok")
    else:
        b.add("AbortResult", "S1", 50.801, request_ids=[X], stage_id=0, outcome="failed")
        b.add("AbortResult", "S1", 50.801, request_ids=[X], stage_id=1, outcome="failed")
    after_results = b.position
    b.add("SessionClosed", "S1", 51.5, reason="session_close")
    return b, after_submit, after_forward, after_results


def test_main_path_full_drop(approx):
    b, sub, fwd, res = build("main")
    assert project(b, until=sub).resources.request_resources("S1") == {"S1": {(0, X): "submitted"}}
    p = project(b, until=fwd)
    assert p.resources.request_resources("S1") == {"S1": {(0, X): "submitted", (1, X): "submitted"}}
    assert p.resources.running() == 1
    p = project(b, until=res)
    assert p.resources.request_resources("S1") == {"S1": {}}
    assert p.resources.running() == 0
    p = project(b)
    assert leak_tuples(p) == []
    row = turn(p, "resp-1")
    assert row.finished_reason == "barge_in"
    s0 = row.stages[0]
    assert (s0["num_tokens_in"], s0["num_tokens_out"]) == (150, 20)
    assert s0["vllm_ttft_ms"] == approx(190.0)
    assert s0["vllm_tpot_ms"] == approx(20.0)
    assert row.e2e["e2e_total_ms"] == approx(800.0)


def test_v1_downstream_not_acknowledged_is_a_leak():
    b, *_ = build("v1")
    assert leak_tuples(project(b)) == [("S1", 1, X, "downstream_left_after_abort")]


def test_v2_failed_abort_keeps_both_bindings():
    b, _, _, res = build("v2")
    assert project(b, until=res).resources.request_resources("S1") == {"S1": {(0, X): "submitted", (1, X): "submitted"}}
    p = project(b)
    assert leak_tuples(p) == [("S1", 0, X, "abort_failed"), ("S1", 1, X, "abort_failed")]
    assert [t.finished_reason for t in p.turn_tables] == ["barge_in"]
