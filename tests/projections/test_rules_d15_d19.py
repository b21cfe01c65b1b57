"""DOMAIN §5.7 D15–D19 on the folds, driven by logs built in memory: downstream segments (D15),
no empty edge table (D16), clocks that step back (D17), writes after a close or a takeover
(D18) and responses on ids the session does not hold (D19)."""

from __future__ import annotations

import pytest

from projections.metrics import MetricsFold, TallySink
from projections.projector import SWEEP_EVERY, Projector
from projections.shell import checkpoint
from projections.shell.runner import FOLD_VERSION
from reports.render_text import omni_timing_line, render_turn_text
from tests.logbuilder import LogBuilder, eph, resident

X0, X1 = eph("s1", 0), eph("s1", 1)
R = resident("s1")


def project(b: LogBuilder) -> Projector:
    return Projector().apply_all(b.stored)


def warnings(p: Projector) -> list[tuple[str, int]]:
    return [(f.kind, f.first_position) for f in p.findings() if f.severity == "warning"]


def metrics(b: LogBuilder) -> TallySink:
    sink = TallySink()
    MetricsFold(sink).apply_all(b.stored)
    return sink


def one_turn(b: LogBuilder, t0: float = 2.0, request_id: str = X0, response_id: str = "r0") -> None:
    """A pre-created stop turn of ``request_id``: commit, submit, output, end, release."""
    b.add("TurnCommitted", "s1", t0, turn_id=0, response_id=response_id, create_response=True)
    b.add("StageRequestSubmitted", "s1", t0 + 0.01, stage_id=0, request_id=request_id, num_tokens_in=5)
    b.add("StageOutput", "s1", t0 + 0.1, stage_id=0, request_id=request_id, num_new_tokens=3)
    b.add("ResponseEnded", "s1", t0 + 0.3, response_id=response_id, cause="model")
    b.add("StageRequestReleased", "s1", t0 + 0.4, stage_id=0, request_id=request_id, cause="end_of_turn")
    b.add("ReleaseRequested", "s1", t0 + 0.4, request_ids=[request_id], cause="end_of_turn")
    b.add("ReleaseResult", "s1", t0 + 0.4, request_ids=[request_id], outcome="ok")


# ------------------------------------------------------------------------------------ D15
def test_d15_downstream_tail_between_the_update_and_the_forward_joins_nothing():
    """The (1, R) binding outlives turn 0; what stage 1 reports after turn 1's update and before
    turn 1's forward is turn 0's tail: one output_outside_segment warning, no tokens anywhere."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, capabilities={"supports_core_resumable_request": True})
    tail_at = None
    for turn, t0 in ((0, 2.0), (1, 3.0)):
        b.add("TurnCommitted", "s1", t0, turn_id=turn, response_id=f"resp-{turn}", create_response=True)
        kind = "update" if turn else "initial"
        b.add("StageRequestSubmitted", "s1", t0 + 0.01, stage_id=0, request_id=R, num_tokens_in=5, kind=kind)
        b.add("StageOutput", "s1", t0 + 0.1, stage_id=0, request_id=R, num_new_tokens=3, model_turn_id=turn)
        if turn == 1:
            b.add("StageOutput", "s1", t0 + 0.12, stage_id=1, request_id=R, num_new_tokens=40)
            tail_at = b.position
        b.add("StageRequestForwarded", "s1", t0 + 0.2, stage_id=1, request_id=R, fence={"turn_id": turn})
        b.add("StageOutput", "s1", t0 + 0.3, stage_id=1, request_id=R, num_new_tokens=4, model_turn_id=turn)
        b.add("ResponseEnded", "s1", t0 + 0.4, response_id=f"resp-{turn}", cause="model")
        b.add("TurnCompleted", "s1", t0 + 0.4, completed_turn_id=turn, new_turn_id=turn + 1)
    p = project(b)
    assert [t.stages[1]["num_tokens_out"] for t in p.turn_tables] == [4, 4]
    assert warnings(p) == [("output_outside_segment", tail_at)]
    assert (1, R) in p.session_resources("s1").bindings  # the binding itself outlives the turn


# ------------------------------------------------------------------------------------ D16
def test_d16_a_bare_stage1_snapshot_names_its_edge_but_prints_no_edge_table():
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0)
    b.add("TurnCommitted", "s1", 2.0, turn_id=0, response_id="r0", create_response=True)
    b.add("StageRequestSubmitted", "s1", 2.01, stage_id=0, request_id=X0, num_tokens_in=5)
    b.add("StageOutput", "s1", 2.1, stage_id=0, request_id=X0, num_new_tokens=3)
    b.add("StageRequestForwarded", "s1", 2.2, stage_id=1, request_id=X0, fence={"turn_id": 0})
    b.add("StageMetricsReported", "s1", 2.3, stage_id=1, request_id=X0, stats={"num_tokens_out": 4})
    b.add("ResponseEnded", "s1", 2.7, response_id="r0", cause="model")
    (t,) = project(b).turn_tables
    assert [e.edge for e in t.transfers] == ["0->1"]  # D4: the edge exists (size 0)
    assert omni_timing_line(t).endswith("transfers=[0->1=0.00ms]")
    text = render_turn_text(t)
    assert "[StageRequestStats" in text and "TransferEdgeStats" not in text


def test_d16_an_edge_with_a_row_still_prints_its_table():
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0)
    b.add("TurnCommitted", "s1", 2.0, turn_id=0, response_id="r0", create_response=True)
    b.add("StageRequestSubmitted", "s1", 2.01, stage_id=0, request_id=X0, num_tokens_in=5)
    b.add("StageRequestForwarded", "s1", 2.2, stage_id=1, request_id=X0, fence={"turn_id": 0})
    b.add(
        "StageMetricsReported",
        "s1",
        2.3,
        stage_id=1,
        request_id=X0,
        stats={"num_tokens_out": 4, "rx_transfer_bytes": 2048, "rx_decode_time_ms": 1.5},
    )
    b.add("ResponseEnded", "s1", 2.7, response_id="r0", cause="model")
    (t,) = project(b).turn_tables
    text = render_turn_text(t)
    assert "TransferEdgeStats" in text and "| size_kbytes" in text


# ------------------------------------------------------------------------------------ D17
def stepped_back_log() -> LogBuilder:
    """The host clock steps back twice inside a turn (the first output and the end are earlier
    than the submit and the commit) and once across the session (close before open)."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 10.0, num_stages=1, model="m")
    b.add("TurnCommitted", "s1", 12.0, turn_id=0, response_id="r0", create_response=True)  # 2
    b.add("StageRequestSubmitted", "s1", 12.01, stage_id=0, request_id=X0, num_tokens_in=5)  # 3
    b.add("StageOutput", "s1", 11.5, stage_id=0, request_id=X0, num_new_tokens=3)  # 4
    b.add("StageOutput", "s1", 11.6, stage_id=0, request_id=X0, num_new_tokens=3)  # 5
    b.add("ResponseEnded", "s1", 11.7, response_id="r0", cause="model")  # 6
    b.add("StageRequestReleased", "s1", 11.8, stage_id=0, request_id=X0, cause="end_of_turn")
    b.add("ReleaseRequested", "s1", 11.8, request_ids=[X0], cause="end_of_turn")
    b.add("ReleaseResult", "s1", 11.8, request_ids=[X0], outcome="ok")
    b.add("SessionClosed", "s1", 9.0, reason="session_close")  # 10
    return b


def test_d17_negative_spans_are_zero_and_one_warning_each_naming_both_positions():
    p = project(stepped_back_log())
    (t,) = p.turn_tables
    assert t.e2e["e2e_total_ms"] == 0.0 and t.summary["e2e_wall_time_ms"] == 0.0
    assert t.summary["e2e_stage_0_wall_time_ms"] == 0.0
    row = t.stages[0]
    assert row["stage_gen_time_ms"] == 0.0 and (row["vllm_ttft_ms"] or 0.0) == 0.0
    assert row["vllm_tpot_ms"] == pytest.approx(20.0)  # 11.5 -> 11.6 did not step back
    stepped = sorted((f.first_position, f.last_position) for f in p.findings() if f.kind == "clock_stepped_back")
    # e2e (commit 2 -> end 6), TTFT (submit 3 -> first token 4), generation (3 -> last output 5),
    # session wall time (open 1 -> close 10): one warning each, both positions named.
    assert stepped == [(1, 10), (2, 6), (3, 4), (3, 5)]
    assert all(f.severity == "warning" for f in p.findings())
    text = render_turn_text(t)
    assert "-" not in "".join(line for line in text.splitlines() if line.startswith("| e2e_total_ms"))


def test_d17_no_histogram_gets_a_negative_observation():
    sink = metrics(stepped_back_log())
    observed = {family: values for (family, _), values in sink.observations.items()}
    assert observed["vllm_omni:e2e_request_latency_s"] == [0.0]
    assert observed["duplex_ledger:session_duration_s"] == [0.0]
    assert all(v >= 0 for values in sink.observations.values() for v in values)


# ------------------------------------------------------------------------------------ D18
AFTER_END = [
    ("StageRequestReserved", dict(stage_id=0, request_id=X1, fence={"turn_id": 1})),
    ("StageRequestSubmitted", dict(stage_id=0, request_id=X1, num_tokens_in=5, fence={"turn_id": 1})),
    ("StageRequestForwarded", dict(stage_id=1, request_id=X1, fence={"turn_id": 1})),
    ("InputAppended", dict(input_kind="text", text="x", request_id=X1, fence={"turn_id": 1})),
    ("TurnCommitted", dict(turn_id=1, response_id="r1", create_response=True)),
    ("ResponseBegun", dict(response_id="r1", turn_id=1, request_id=X1)),
    ("StageOutput", dict(stage_id=0, request_id=X1, num_new_tokens=3)),
    ("StageMetricsReported", dict(stage_id=0, request_id=X1, stats={"num_tokens_out": 3})),
    ("StageRequestFinished", dict(stage_id=0, request_id=X1, finish_reason="stop")),
    ("ResponseListened", dict(turn_id=1, request_id=X1)),
    ("SessionClosed", dict(reason="session_close")),
]


def other_sessions(b: LogBuilder, events: int, t0: float = 3.5) -> None:
    """At least ``events`` positions of other sessions, each opened and closed (they are
    forgotten at the sweeps too)."""
    for i in range((events + 1) // 2):
        b.add("SessionOpened", f"o{i}", t0, model="m")
        b.add("SessionClosed", f"o{i}", t0, reason="session_close")


def closed_then(end: str, writes: list[tuple[str, dict]], gap: int = 0) -> tuple[LogBuilder, int]:
    """A session with one turn, ended by its close, by a takeover (``SessionTakenOver`` then the
    new owner's ``SessionClosed``) or by a takeover whose close comes after the ``writes``
    ("zombie": the old owner writes between them), then ``gap`` positions of other sessions,
    then ``writes``."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, model="m")
    one_turn(b)
    if end != "closed":
        b.add("SessionTakenOver", "s1", 3.0, replica_id="B", replica_incarnation=1, previous_replica_id="A")
    if end != "zombie":
        b.add("SessionClosed", "s1", 3.0, reason="recovered_after_crash" if end == "takeover" else "session_close")
    other_sessions(b, gap)
    base = b.position
    for i, (type_name, fields) in enumerate(writes):
        b.add(type_name, "s1", 4.0 + i / 100, **fields)
    if end == "zombie":
        b.add("SessionClosed", "s1", 5.0, reason="recovered_after_crash")
    return b, base


@pytest.mark.parametrize("gap", [0, SWEEP_EVERY + 1], ids=["soon", "after_a_sweep"])
@pytest.mark.parametrize("end", ["closed", "takeover", "zombie"])
@pytest.mark.parametrize(("type_name", "fields"), AFTER_END, ids=[t for t, _ in AFTER_END])
def test_d18_a_write_after_the_end_binds_opens_and_counts_nothing(end, type_name, fields, gap):
    """However late: a write more than :data:`SWEEP_EVERY` positions after the close comes after
    the fold forgot the session's working state, and is refused all the same."""
    if end == "zombie" and type_name == "SessionClosed":
        pytest.skip("the first close after a takeover is the new owner's (written with the takeover)")
    clean, _ = closed_then(end, [], gap)
    b, base = closed_then(end, [(type_name, fields)], gap)
    p, p_clean = project(b), project(clean)
    late = [f for f in p.findings() if f.first_position > base]
    assert [(f.kind, f.severity) for f in late] == [("after_close", "warning")]
    assert late[0].request_id == fields.get("request_id", fields.get("response_id"))
    assert [t.to_dict() for t in p.turn_tables] == [t.to_dict() for t in p_clean.turn_tables]
    s, s_clean = p.session_resources("s1"), p_clean.session_resources("s1")
    assert (s.bindings, p.resources.running("s1"), p.resources.held("s1")) == ({}, 0, 0)
    assert s.bindings == (s_clean.bindings if s_clean is not None else {})  # None: forgotten at the sweep
    assert [f for f in p.findings() if f.severity == "leak"] == []
    assert metrics(b).values == metrics(clean).values
    assert metrics(b).observations == metrics(clean).observations


def test_d18_the_closes_own_cleanup_still_applies_after_the_close():
    """CASE-39's shape: the abort's missing ack arrives after SessionClosed and releases (D10)."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, num_stages=1)
    b.add("StageRequestSubmitted", "s1", 2.0, stage_id=0, request_id=X0, num_tokens_in=5)
    b.add("SessionClosed", "s1", 3.0, reason="disconnect")
    b.add("StageRequestReleased", "s1", 3.1, stage_id=0, request_id=X0, cause="session_close")
    b.add("AbortRequested", "s1", 3.2, request_ids=[X0], reason="session_close")
    b.add("AbortResult", "s1", 3.3, request_ids=[X0], stage_id=0, outcome="ok")
    p = project(b)
    assert p.findings() == [] and p.resources.held("s1") == 0


@pytest.mark.parametrize("gap", [0, SWEEP_EVERY + 1], ids=["soon", "after_a_sweep"])
def test_d18_a_reopened_session_accepts_writes_again(gap):
    b, _ = closed_then("closed", [], gap)
    b.add("SessionOpened", "s1", 5.0, incarnation=1)
    x = eph("s1", 0, incarnation=1)
    b.add("StageRequestSubmitted", "s1", 5.1, stage_id=0, request_id=x, num_tokens_in=5)
    p = project(b)
    assert warnings(p) == [] and p.resources.running("s1") == 1
    assert "s1" not in p.resources.closed_sessions


def late_write_log() -> tuple[LogBuilder, int, int]:
    """s1 closed; a sweep later (other sessions) a submit on it; then a reopen and a submit of
    the new incarnation. Returns the log, the late submit's position and the close's."""
    b, _ = closed_then("closed", [])
    closed_at = b.position
    other_sessions(b, SWEEP_EVERY + 1)
    late = b.add("StageRequestSubmitted", "s1", 4.0, stage_id=0, request_id=X1, num_tokens_in=5, fence={"turn_id": 1})
    b.add("StageOutput", "s1", 4.1, stage_id=0, request_id=X1, num_new_tokens=3)
    return b, late.position, closed_at


def after_close(p: Projector) -> list[tuple[str | None, int, tuple[int, ...]]]:
    return [(f.request_id, f.first_position, f.evidence) for f in p.findings() if f.kind == "after_close"]


def test_d18_a_forgotten_closed_session_leaves_only_its_close_point():
    b, late, closed_at = late_write_log()
    before = Projector().apply_all(b.stored[: late - 1])
    assert "s1" not in before.resources.sessions  # the sweep did forget its working state
    assert before.resources.closed_sessions["s1"][0] == closed_at
    p = project(b)
    assert after_close(p) == [(X1, late, (closed_at, late)), (X1, late + 1, (closed_at, late + 1))]
    assert (p.resources.running("s1"), p.resources.held("s1"), p.session_resources("s1").bindings) == (0, 0, {})
    assert [f for f in p.findings() if f.severity == "leak"] == []
    clean, _ = closed_then("closed", [])
    other_sessions(clean, SWEEP_EVERY + 1)
    assert metrics(b).values == metrics(clean).values
    assert [t.to_dict() for t in p.turn_tables] == [t.to_dict() for t in project(clean).turn_tables]


@pytest.mark.parametrize("at", ["before_the_sweep", "after_the_sweep", "just_before_the_write"])
def test_d18_the_close_record_survives_a_checkpoint_round_trip(at):
    b, late, closed_at = late_write_log()
    b.add("SessionOpened", "s1", 5.0, incarnation=1)
    x = eph("s1", 0, incarnation=1)
    b.add("StageRequestSubmitted", "s1", 5.1, stage_id=0, request_id=x, num_tokens_in=5)
    cut = {"before_the_sweep": SWEEP_EVERY - 1, "after_the_sweep": SWEEP_EVERY + 1, "just_before_the_write": late - 1}[
        at
    ]
    first = Projector()
    for s in b.stored[:cut]:
        first.apply(s)
    done = first.turns.take_finalized()
    blob = checkpoint.seal(checkpoint.encode_state(first), fold_version=FOLD_VERSION, position=cut, log_hash=b"h" * 32)
    resumed = checkpoint.open_blob(blob, fold_version=FOLD_VERSION, expect=Projector).state
    assert checkpoint.same_state(resumed, first)
    assert resumed.resources.closed_sessions == first.resources.closed_sessions
    resumed.apply_all(b.stored[cut:])
    straight = project(b)
    assert (
        after_close(resumed)
        == after_close(straight)
        == [
            (X1, late, (closed_at, late)),
            (X1, late + 1, (closed_at, late + 1)),
        ]
    )
    assert resumed.findings() == straight.findings()
    assert done + resumed.turn_tables == straight.turn_tables
    assert resumed.resources.running("s1") == straight.resources.running("s1") == 1  # the reopen's submit


# ------------------------------------------------------------------------------------ D19
@pytest.mark.parametrize("unheld", ["aborted", "released", "older epoch"])
def test_d19_an_auto_response_begun_on_an_unheld_id_opens_nothing(unheld):
    """No row (no D8 'no engine request' row either), one warning for the begin and one for the
    end of the response the session never held; the next turn is untouched."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, auto_response=True, num_stages=1)
    b.add("StageRequestReserved", "s1", 1.1, stage_id=0, request_id=X0, fence={"turn_id": 0})
    b.add("InputAppended", "s1", 1.5, input_kind="text", text="hi", request_id=X0, fence={"turn_id": 0})
    b.add("TurnCommitted", "s1", 1.6, turn_id=0, create_response=False, action="START_AUTO_RESPONSE")
    b.add("StageRequestSubmitted", "s1", 1.7, stage_id=0, request_id=X0, num_tokens_in=5)
    if unheld == "aborted":
        b.add("StageRequestReleased", "s1", 1.8, stage_id=0, request_id=X0, cause="barge_in")
        b.add("AbortRequested", "s1", 1.8, request_ids=[X0], reason="barge_in")
        b.add("AbortResult", "s1", 1.9, request_ids=[X0], stage_id=0, outcome="ok")
    elif unheld == "released":
        b.add("StageRequestFinished", "s1", 1.8, stage_id=0, request_id=X0, finish_reason="stop")
        b.add("StageRequestReleased", "s1", 1.8, stage_id=0, request_id=X0, cause="end_of_turn")
        b.add("ReleaseRequested", "s1", 1.8, request_ids=[X0], cause="end_of_turn")
        b.add("ReleaseResult", "s1", 1.9, request_ids=[X0], outcome="ok")
    else:
        b.add("EpochAdvanced", "s1", 1.8, old_epoch=0, new_epoch=1)
        b.add("StageRequestReleased", "s1", 1.8, stage_id=0, request_id=X0, cause="cancel")
        b.add("AbortRequested", "s1", 1.8, request_ids=[X0], reason="cancel")
        b.add("AbortResult", "s1", 1.9, request_ids=[X0], stage_id=0, outcome="ok")
    b.add("ResponseBegun", "s1", 2.0, response_id="phantom", turn_id=0, request_id=X0)
    begin_at = b.position
    b.add("ResponseEnded", "s1", 2.2, response_id="phantom", status="completed", cause="model")
    p = project(b)
    assert p.turn_tables == []
    assert warnings(p) == [("begin_of_unheld_id", begin_at), ("stale_finalize", begin_at + 1)]
    counted = {labels[1]: v for (family, labels), v in metrics(b).values.items() if "success" in family}
    assert sum(counted.values()) == 0


def test_d19_a_pre_created_response_stays_a_d8_row_whatever_its_begin_names():
    """D8 covers a response that ends before any engine request was submitted for it: created
    at commit, its begin naming an aborted id changes nothing (one warning), it ends as a row
    with no engine request and no text tables."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, num_stages=1)
    b.add("StageRequestSubmitted", "s1", 1.2, stage_id=0, request_id=X0, num_tokens_in=5)
    b.add("StageRequestReleased", "s1", 1.3, stage_id=0, request_id=X0, cause="barge_in")
    b.add("AbortRequested", "s1", 1.3, request_ids=[X0], reason="barge_in")
    b.add("AbortResult", "s1", 1.4, request_ids=[X0], stage_id=0, outcome="ok")
    b.add("TurnCommitted", "s1", 2.0, turn_id=1, response_id="resp-D8", create_response=True)
    b.add("ResponseBegun", "s1", 2.1, response_id="resp-D8", turn_id=1, request_id=X0)
    b.add("ResponseEnded", "s1", 2.5, response_id="resp-D8", cause="model")
    p = project(b)
    (t,) = p.turn_tables
    assert (t.response_id, t.request_id, t.finished_reason, t.e2e["e2e_total_ms"]) == ("resp-D8", None, "stop", 500.0)
    assert render_turn_text(t) == ""
    assert warnings(p) == [("begin_of_unheld_id", 7)]
