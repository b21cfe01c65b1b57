"""CASE-10: on a resident (resumable) request TTFT is measured per turn from that turn's own
submit ts (not the record time, not the initial submit); tokens are per turn."""

from tests.cases.support import project, turn
from tests.logbuilder import LogBuilder, resident

R = resident("S1")


def build():
    b = LogBuilder()
    b.add("SessionOpened", "S1", 89.0, capabilities={"supports_core_resumable_request": True})
    b.add("StageRequestReserved", "S1", 89.0, stage_id=0, request_id=R)
    plan = [  # commit, submit, kind, tokens_in, begin, first, last, end
        (90.0, 90.01, "initial", 100, 90.02, 90.21, 90.51, 90.6),
        (95.0, 95.005, "update", 40, 95.01, 95.155, 95.455, 95.5),
        (99.0, 99.002, "update", 35, 99.01, 99.352, 99.652, 99.7),
    ]
    for n, (commit, submit, kind, tin, begin, first, last, end) in enumerate(plan):
        b.add("TurnCommitted", "S1", commit, turn_id=n, response_id=f"resp-{n}", create_response=True)
        b.add(
            "StageRequestSubmitted",
            "S1",
            submit,
            stage_id=0,
            request_id=R,
            kind=kind,
            resumable=True,
            num_tokens_in=tin,
        )
        b.add("ResponseBegun", "S1", begin, response_id=f"resp-{n}", turn_id=n, request_id=R)
        b.add("StageOutput", "S1", first, stage_id=0, request_id=R, num_new_tokens=1)
        b.add("StageOutput", "S1", last, stage_id=0, request_id=R, num_new_tokens=15, model_turn_id=n, end_of_turn=True)
        b.add("ResponseEnded", "S1", end, response_id=f"resp-{n}", status="completed")
    return b


def test_ttft_per_turn_on_resident_request(approx):
    p = project(build())
    expected = {"resp-0": (200.0, 600.0, 100), "resp-1": (150.0, 500.0, 40), "resp-2": (350.0, 700.0, 35)}
    assert sorted(t.response_id for t in p.turn_tables) == sorted(expected)
    for response_id, (ttft, e2e, tin) in expected.items():
        row = turn(p, response_id)
        s0 = row.stages[0]
        assert row.finished_reason == "stop"
        assert s0["vllm_ttft_ms"] == approx(ttft)
        assert s0["vllm_tpot_ms"] == approx(20.0)
        assert row.e2e["e2e_total_ms"] == approx(e2e)
        assert (s0["num_tokens_in"], s0["num_tokens_out"]) == (tin, 16)


def test_one_binding_for_the_whole_session():
    b = build()
    for upto in range(3, b.position + 1):
        p = project(b, until=upto)
        if any(s.event.type == "StageRequestSubmitted" for s in b.stored[:upto]):
            assert p.resources.request_resources("S1") == {"S1": {(0, R): "submitted"}}
            assert p.resources.running() == 1
