"""CASE-12 (arrival stamp from this turn's own events, surviving the previous finalize) and
CASE-13 (finished_reason from the recorded cause, status only as fallback)."""

from collections import Counter

from tests.cases.support import project, turn
from tests.logbuilder import LogBuilder, eph

T1, T2, T3 = eph("S1", 1), eph("S1", 2), eph("S1", 3)


def case_12():
    b = LogBuilder()
    for t in (110.0, 110.2, 110.4, 110.6, 110.8):
        b.add("InputAppended", "S1", t, size_bytes=3200, duration_ms=200)
    b.add("TurnCommitted", "S1", 110.9, turn_id=1, response_id="resp-1", create_response=True)
    b.add("StageRequestSubmitted", "S1", 110.91, stage_id=0, request_id=T1, num_tokens_in=80)
    b.add("ResponseBegun", "S1", 110.92, response_id="resp-1", turn_id=1, request_id=T1)
    b.add("StageOutput", "S1", 111.1, stage_id=0, request_id=T1, num_new_tokens=1)
    b.add("StageOutput", "S1", 111.4, stage_id=0, request_id=T1, num_new_tokens=15)
    b.add("ResponseEnded", "S1", 111.5, response_id="resp-1", status="completed")
    b.add("TurnCommitted", "S1", 150.0, turn_id=2, response_id="resp-2", create_response=True)
    b.add("StageRequestSubmitted", "S1", 150.01, stage_id=0, request_id=T2, num_tokens_in=20)
    b.add("ResponseBegun", "S1", 150.02, response_id="resp-2", turn_id=2, request_id=T2)
    b.add("StageOutput", "S1", 150.2, stage_id=0, request_id=T2, num_new_tokens=1)
    b.add("StageOutput", "S1", 150.5, stage_id=0, request_id=T2, num_new_tokens=15)
    b.add("InputAppended", "S1", 150.65, size_bytes=3200, duration_ms=200)
    b.add("ResponseEnded", "S1", 150.7, response_id="resp-2", status="completed")
    b.add("TurnFinalized", "S1", 150.7, response_id="resp-2", finished_reason="stop")
    b.add("InputAppended", "S1", 150.85, size_bytes=3200, duration_ms=200)
    b.add("InputAppended", "S1", 151.05, size_bytes=3200, duration_ms=200)
    b.add("StageRequestSubmitted", "S1", 151.1, stage_id=0, request_id=T3, num_tokens_in=45)
    b.add("ResponseBegun", "S1", 151.12, response_id="resp-3", turn_id=3, request_id=T3)
    b.add("StageOutput", "S1", 151.3, stage_id=0, request_id=T3, num_new_tokens=1)
    b.add("StageOutput", "S1", 151.6, stage_id=0, request_id=T3, num_new_tokens=15)
    b.add("ResponseEnded", "S1", 151.7, response_id="resp-3", status="completed")
    return b


def test_case_12_arrival_stamps(approx):
    p = project(case_12())
    expected = {"resp-1": (110.9, 600.0, 190.0), "resp-2": (150.0, 700.0, 190.0), "resp-3": (150.65, 1050.0, 200.0)}
    for response_id, (arrival, e2e, ttft) in expected.items():
        row = turn(p, response_id)
        assert row.finished_reason == "stop"
        assert row.arrival_ts == approx(arrival)
        assert row.e2e["e2e_total_ms"] == approx(e2e)
        assert row.stages[0]["vllm_ttft_ms"] == approx(ttft)
        assert row.stages[0]["vllm_tpot_ms"] == approx(20.0)
        assert row.arrival_ts <= row.finalize_ts


CASE_13 = [  # response, terminal event, cause/reason, status, expected
    ("resp-10", "ResponseEnded", "model", "completed", "stop"),
    ("resp-11", "TurnFinalized", "barge_in", "cancelled", "barge_in"),
    ("resp-12", "TurnFinalized", "input.cancel", "cancelled", "cancel"),
    ("resp-13", "TurnFinalized", "response.cancel", "cancelled", "cancel"),
    ("resp-14", "TurnFinalized", "timeout", "cancelled", "cancel"),
    ("resp-15", "TurnFinalized", "new_response", "cancelled", "cancel"),
    ("resp-16", "TurnFinalized", "session_close", "cancelled", "close"),
    ("resp-17", "TurnFinalized", "disconnect_grace_expired", "cancelled", "close"),
    ("resp-18", "TurnFinalized", "engine_error", "failed", "error"),
    ("resp-19", "TurnFinalized", "abort", "cancelled", "abort"),
    ("resp-20", "ResponseEnded", "barge_in", "incomplete", "barge_in"),
    ("resp-21", "ResponseEnded", None, "failed", "error"),
]


def case_13():
    b = LogBuilder()
    for i, (response_id, terminal, cause, status, _) in enumerate(CASE_13):
        session = f"S{1 + i % 3}"
        ts = 200.0 + i
        rid = eph(session, i)
        b.add("TurnCommitted", session, ts - 0.5, turn_id=i, response_id=response_id, create_response=True)
        b.add("StageRequestSubmitted", session, ts - 0.4, stage_id=0, request_id=rid, num_tokens_in=10)
        b.add("ResponseBegun", session, ts - 0.3, response_id=response_id, turn_id=i, request_id=rid)
        if terminal == "ResponseEnded":
            b.add("ResponseEnded", session, ts, response_id=response_id, status=status, cause=cause)
        else:
            b.add("TurnFinalized", session, ts, response_id=response_id, finished_reason=cause)
        if response_id == "resp-12":
            b.add("SessionClosed", session, 202.5, reason="session_close")
            b.add("SessionOpened", session, 202.6, incarnation=1)
    return b


def test_case_13_reason_from_cause():
    p = project(case_13())
    got = {t.response_id: t.finished_reason for t in p.turn_tables}
    assert got == {r: expected for r, *_, expected in CASE_13}
    assert len(p.turn_tables) == 12
    assert Counter(got.values()) == {"stop": 1, "barge_in": 2, "cancel": 4, "close": 2, "error": 2, "abort": 1}
