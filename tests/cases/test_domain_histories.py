"""DOMAIN §4.3 example histories and E1–E5: the audit passes the correct histories and finds
exactly the leaks each leaking history describes."""

from tests.cases.support import leak_tuples, project
from tests.logbuilder import LogBuilder, eph

X0, X1 = eph("s1", 0), eph("s1", 1)


def first_turn(b: LogBuilder, model_turn_id: int | None = 0, finished: bool = True) -> None:
    b.add("SessionOpened", "s1", 1.0, capabilities={"supports_core_resumable_request": False})
    b.add("StageRequestReserved", "s1", 1.0, stage_id=0, request_id=X0)
    b.add("TurnCommitted", "s1", 2.0, turn_id=0, response_id="resp-A", create_response=True)
    b.add("ActiveRequestBound", "s1", 2.0, request_id=X0)
    b.add("StageRequestSubmitted", "s1", 2.01, stage_id=0, request_id=X0, num_tokens_in=10)
    b.add("ResponseBegun", "s1", 2.02, response_id="resp-A", turn_id=0, request_id=X0)
    b.add("StageRequestForwarded", "s1", 2.2, stage_id=1, request_id=X0)
    if finished:
        b.add("StageRequestFinished", "s1", 2.4, stage_id=0, request_id=X0)
    b.add(
        "StageOutput",
        "s1",
        2.5,
        stage_id=1,
        request_id=X0,
        model_turn_id=model_turn_id,
        end_of_turn=model_turn_id is not None,
        finished=finished,
    )
    b.add("ResponseEnded", "s1", 2.5, response_id="resp-A", cause="model" if model_turn_id is not None else None)


def second_commit(b: LogBuilder, ts: float = 3.0) -> None:
    b.add("TurnCommitted", "s1", ts, turn_id=1, create_response=False)
    b.add("StageRequestReserved", "s1", ts, stage_id=0, request_id=X1, fence={"turn_id": 1})


def test_correct_completed_turns_r4():
    b = LogBuilder()
    first_turn(b)
    b.add("TurnCompleted", "s1", 2.5, completed_turn_id=0, new_turn_id=1, cause="model")
    b.add("StageRequestReleased", "s1", 2.6, stage_id=0, request_id=X0, cause="end_of_turn")
    b.add("StageRequestReleased", "s1", 2.6, stage_id=1, request_id=X0, cause="end_of_turn")
    b.add("ReleaseRequested", "s1", 2.6, request_ids=[X0])
    b.add("ReleaseResult", "s1", 2.61, request_ids=[X0], outcome="ok")
    second_commit(b)
    b.add("ActiveRequestBound", "s1", 3.0, request_id=X1)
    b.add("StageRequestSubmitted", "s1", 3.01, stage_id=0, request_id=X1, num_tokens_in=10)
    p = project(b)
    assert leak_tuples(p) == []
    assert p.resources.held("s1") == 1
    assert p.resources.request_resources("s1") == {"s1": {(0, X1): "submitted"}}


def test_leaking_pr_e_completed_turns_holds_one_more_id_per_turn():
    b = LogBuilder()
    first_turn(b)
    b.add("TurnCompleted", "s1", 2.5, completed_turn_id=0, new_turn_id=1, cause="model")
    second_commit(b)  # step 8 missing
    b.add("ActiveRequestBound", "s1", 3.0, request_id=X1)
    b.add("StageRequestSubmitted", "s1", 3.01, stage_id=0, request_id=X1, num_tokens_in=10)
    p = project(b)
    assert p.resources.held("s1") == 2
    assert p.resources.request_resources("s1")["s1"][(0, X0)] == "finished"
    assert leak_tuples(p) == [("s1", 0, X0, "finished_not_released")]


def test_correct_rebind_with_failure_restores_and_does_not_submit():
    b = LogBuilder()
    first_turn(b, model_turn_id=None, finished=False)  # response ended without model_turn_id
    second_commit(b)
    b.add("TurnCompleted", "s1", 3.0, completed_turn_id=0, new_turn_id=1, cause="mechanical")
    b.add("StageRequestReleased", "s1", 3.0, stage_id=0, request_id=X0, cause="stale_rebind")
    b.add("StageRequestReleased", "s1", 3.0, stage_id=1, request_id=X0, cause="stale_rebind")
    b.add("AbortRequested", "s1", 3.0, request_ids=[X0], reason="stale_rebind")
    b.add("AbortResult", "s1", 3.001, request_ids=[X0], stage_id=0, outcome="failed", error="boom")
    b.add("AbortResult", "s1", 3.001, request_ids=[X0], stage_id=1, outcome="failed", error="boom")
    b.add("StageRequestRestored", "s1", 3.002, stage_id=0, request_id=X0)
    b.add("StageRequestRestored", "s1", 3.002, stage_id=1, request_id=X0)
    b.add(
        "CommandRejected",
        "s1",
        3.003,
        command="commit",
        error_code="runtime_append_failed",
        message="abort of stale id failed",
        request_id=X0,
    )
    p = project(b)
    assert p.resources.request_resources("s1") == {
        "s1": {(0, X0): "submitted", (1, X0): "submitted", (0, X1): "reserved"}
    }
    assert leak_tuples(p) == []  # still open: close will retry X0 (R3, R7)
    b.add("SessionClosed", "s1", 4.0, reason="session_close")
    b.add("AbortRequested", "s1", 4.0, request_ids=[X0], reason="session_close")
    b.add("AbortResult", "s1", 4.001, request_ids=[X0], stage_id=0, outcome="ok")
    b.add("AbortResult", "s1", 4.001, request_ids=[X0], stage_id=1, outcome="ok")
    b.add("StageRequestReleased", "s1", 4.002, stage_id=0, request_id=X1, cause="close")
    assert leak_tuples(project(b)) == []


def test_correct_rebind_success_retargets_active_request():
    b = LogBuilder()
    first_turn(b, model_turn_id=None, finished=False)
    second_commit(b)
    b.add("TurnCompleted", "s1", 3.0, completed_turn_id=0, new_turn_id=1, cause="mechanical")
    b.add("StageRequestReleased", "s1", 3.0, stage_id=0, request_id=X0, cause="stale_rebind")
    b.add("StageRequestReleased", "s1", 3.0, stage_id=1, request_id=X0, cause="stale_rebind")
    b.add("AbortRequested", "s1", 3.0, request_ids=[X0], reason="stale_rebind")
    b.add("AbortResult", "s1", 3.001, request_ids=[X0], stage_id=0, outcome="ok")
    b.add("AbortResult", "s1", 3.001, request_ids=[X0], stage_id=1, outcome="ok")
    b.add("ActiveRequestBound", "s1", 3.002, request_id=X1)
    b.add("StageRequestSubmitted", "s1", 3.003, stage_id=0, request_id=X1, num_tokens_in=10)
    b.add("StageOutput", "s1", 3.2, stage_id=0, request_id=X1, num_new_tokens=1)
    p = project(b)
    assert leak_tuples(p) == []
    assert p.resources.request_resources("s1") == {"s1": {(0, X1): "submitted"}}  # E1
    assert p.resources.sessions["s1"].active_request_id == X1  # E5


def test_leaking_pr_e_rebind_downstream_left_and_active_not_retargeted():
    b = LogBuilder()
    first_turn(b, model_turn_id=None, finished=False)
    second_commit(b)
    b.add("TurnCompleted", "s1", 3.0, completed_turn_id=0, new_turn_id=1, cause="mechanical")
    b.add("StageRequestReleased", "s1", 3.0, stage_id=0, request_id=X0, cause="stale_rebind")  # (0, X0) only
    b.add("AbortRequested", "s1", 3.0, request_ids=[X0], stage_ids=[0], reason="stale_rebind")
    b.add("AbortResult", "s1", 3.001, request_ids=[X0], stage_id=0, outcome="ok")
    b.add("StageRequestSubmitted", "s1", 3.003, stage_id=0, request_id=X1, num_tokens_in=10)
    b.add("StageOutput", "s1", 3.2, stage_id=0, request_id=X1, num_new_tokens=1)
    b.add("SessionClosed", "s1", 4.0, reason="session_close")
    kinds = leak_tuples(project(b))
    assert ("s1", 1, X0, "downstream_left_after_abort") in kinds
    assert ("s1", 0, X0, "active_not_retargeted") in kinds


def test_leaking_pr_e_rebind_failed_abort_swallowed():
    b = LogBuilder()
    first_turn(b, model_turn_id=None, finished=False)
    second_commit(b)
    b.add("StageRequestReleased", "s1", 3.0, stage_id=0, request_id=X0, cause="stale_rebind")
    b.add("StageRequestReleased", "s1", 3.0, stage_id=1, request_id=X0, cause="stale_rebind")
    b.add("AbortRequested", "s1", 3.0, request_ids=[X0], reason="stale_rebind")
    b.add("AbortResult", "s1", 3.001, request_ids=[X0], stage_id=0, outcome="failed")
    b.add("AbortResult", "s1", 3.001, request_ids=[X0], stage_id=1, outcome="failed")
    b.add("ActiveRequestBound", "s1", 3.002, request_id=X1)
    b.add("StageRequestSubmitted", "s1", 3.003, stage_id=0, request_id=X1, num_tokens_in=10)
    b.add("SessionClosed", "s1", 4.0, reason="session_close")
    kinds = {(k[2], k[3]) for k in leak_tuples(project(b))}
    assert (X0, "submit_after_failed_abort") in kinds
    assert (X0, "abort_failed_not_restored") in kinds
    assert (X1, "held_after_close") in kinds


def test_orphan_after_max_idle_and_not_before():
    b = LogBuilder()
    b.add("StageRequestSubmitted", "s1", 10.0, stage_id=0, request_id=X0, num_tokens_in=10)
    b.add("InputAppended", "s2", 35.0)
    assert leak_tuples(project(b)) == []  # 25 s idle < 30 s
    b.add("InputAppended", "s2", 41.0)
    assert leak_tuples(project(b)) == [("s1", 0, X0, "orphan")]
    assert leak_tuples(project(b), max_idle_s=60) == []
