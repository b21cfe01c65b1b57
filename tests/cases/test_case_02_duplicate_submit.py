"""CASE-02: a second submit of a still-held id is refused and flagged; it never corrupts the
turn's metrics (no negative TTFT, no doubled tokens)."""

from tests.cases.support import leak_tuples, project, turn
from tests.logbuilder import LogBuilder, eph

X, Y = eph("S1", 0), eph("S1", 1)


def part_a(b: LogBuilder) -> int:
    b.add("TurnCommitted", "S1", 19.9, turn_id=0, response_id="resp-1", create_response=True)
    b.add("StageRequestSubmitted", "S1", 20.0, stage_id=0, request_id=X, num_tokens_in=120)
    b.add("ResponseBegun", "S1", 20.01, response_id="resp-1", turn_id=0, request_id=X)
    b.add("StageOutput", "S1", 20.3, stage_id=0, request_id=X, num_new_tokens=1)
    dup = b.add("StageRequestSubmitted", "S1", 20.5, stage_id=0, request_id=X, num_tokens_in=120).position
    b.add("StageOutput", "S1", 21.0, stage_id=0, request_id=X, num_new_tokens=40)
    b.add("StageRequestFinished", "S1", 21.0, stage_id=0, request_id=X)
    b.add("ResponseEnded", "S1", 21.05, response_id="resp-1", status="completed")
    return dup


def duplicates(p):
    return [(f.session_id, f.stage_id, f.request_id, f.last_ts) for f in p.findings() if f.kind == "duplicate_submit"]


def test_part_a_duplicate_refused_and_flagged(approx):
    b = LogBuilder()
    dup = part_a(b)
    p = project(b, until=dup)
    assert p.resources.running() == 1
    assert p.resources.request_resources("S1") == {"S1": {(0, X): "submitted"}}
    p = project(b)
    assert duplicates(p) == [("S1", 0, X, 20.5)]
    row = turn(p, "resp-1")
    s0 = row.stages[0]
    assert row.finished_reason == "stop"
    assert s0["num_tokens_in"] == 120
    assert s0["num_tokens_out"] == 41
    assert s0["vllm_ttft_ms"] == approx(300.0)
    assert s0["vllm_tpot_ms"] == approx(17.5)
    assert row.e2e["e2e_total_ms"] == approx(1150.0)


def test_part_b_bad_resubmit_flagged_and_resp1_unchanged():
    b = LogBuilder()
    part_a(b)
    b.add("TurnCommitted", "S1", 21.1, turn_id=0, response_id="resp-2", create_response=True)
    b.add("StageRequestSubmitted", "S1", 21.12, stage_id=0, request_id=X, num_tokens_in=30)
    p = project(b)
    assert duplicates(p) == [("S1", 0, X, 20.5), ("S1", 0, X, 21.12)]
    row = turn(p, "resp-1")
    assert row.stages[0]["num_tokens_in"] == 120
    assert len([t for t in p.turn_tables if t.response_id == "resp-1"]) == 1


def test_part_b_good_release_then_new_id_is_clean():
    b = LogBuilder()
    b.add("TurnCommitted", "S1", 19.9, turn_id=0, response_id="resp-1", create_response=True)
    b.add("StageRequestSubmitted", "S1", 20.0, stage_id=0, request_id=X, num_tokens_in=120)
    b.add("ResponseBegun", "S1", 20.01, response_id="resp-1", turn_id=0, request_id=X)
    b.add("StageOutput", "S1", 20.3, stage_id=0, request_id=X, num_new_tokens=1)
    b.add("StageOutput", "S1", 21.0, stage_id=0, request_id=X, num_new_tokens=40)
    b.add("StageRequestFinished", "S1", 21.0, stage_id=0, request_id=X)
    b.add("ResponseEnded", "S1", 21.05, response_id="resp-1", status="completed")
    b.add("TurnCommitted", "S1", 21.1, turn_id=1, response_id="resp-2", create_response=True)
    b.add("StageRequestReleased", "S1", 21.11, stage_id=0, request_id=X)
    b.add("StageRequestSubmitted", "S1", 21.12, stage_id=0, request_id=Y, num_tokens_in=30)
    p = project(b)
    assert p.resources.request_resources("S1") == {"S1": {(0, Y): "submitted"}}
    assert leak_tuples(p) == []
    assert duplicates(p) == []
    assert turn(p, "resp-1").stages[0]["num_tokens_in"] == 120


def test_reuse_after_release_is_a_fresh_binding():
    b = LogBuilder()
    b.add("StageRequestSubmitted", "S1", 1.0, stage_id=0, request_id=X, num_tokens_in=5)
    b.add("StageRequestFinished", "S1", 2.0, stage_id=0, request_id=X)
    b.add("StageRequestReleased", "S1", 3.0, stage_id=0, request_id=X)
    b.add("StageRequestSubmitted", "S1", 4.0, stage_id=0, request_id=X, num_tokens_in=5)
    p = project(b)
    assert duplicates(p) == []
    assert p.resources.request_resources("S1") == {"S1": {(0, X): "submitted"}}
