"""DOMAIN §5.7 (D1–D14) on the folds, driven by event logs built in memory: the peer scenario
of issue 10, the 0.30.0 table details (D2–D5, D8), JSON numbers, warnings (D9), the read-side
twins, and the live fold's log_stats-off sessions (M14)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from projections.projector import Projector
from reports.cli import app
from reports.render_formats import render_csv, render_json, render_markdown
from reports.render_text import render_tables_text, render_turn_text
from tests.logbuilder import LogBuilder, eph, resident

X0, X1 = eph("s1", 0), eph("s1", 1)
R = resident("s1")


def project(b: LogBuilder) -> Projector:
    return Projector().apply_all(b.stored)


def warnings(p: Projector) -> list[tuple[str, int]]:
    return [(f.kind, f.first_position) for f in p.findings() if f.severity == "warning"]


def test_pre_created_response_is_titled_and_built_by_its_begin_id():
    """Issue 10 peer scenario (D1, D7): resp-B was pre-created while X0 (listen-only) was bound;
    the abort of X0 does not end resp-B, which begins with X1 and is titled X1, turn 1."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0)
    b.add("StageRequestSubmitted", "s1", 2.0, stage_id=0, request_id=X0, num_tokens_in=10, fence={"turn_id": 0})
    b.add("ResponseListened", "s1", 2.5, turn_id=0, request_id=X0)
    b.add("TurnCommitted", "s1", 4.0, turn_id=0, response_id="resp-B", create_response=True)
    b.add("AbortRequested", "s1", 4.003, request_ids=[X0], reason="stale_rebind")
    b.add("StageRequestSubmitted", "s1", 4.01, stage_id=0, request_id=X1, num_tokens_in=12, fence={"turn_id": 1})
    b.add("ResponseBegun", "s1", 4.02, response_id="resp-B", turn_id=1, request_id=X1)
    b.add("StageOutput", "s1", 4.2, stage_id=0, request_id=X1, num_new_tokens=1)
    b.add("ResponseEnded", "s1", 4.6, response_id="resp-B", cause="model")
    (t,) = project(b).turn_tables
    assert (t.request_id, t.turn_id, t.finished_reason) == (X1, 1, "stop")
    assert t.e2e["e2e_total_ms"] == 600.0
    assert t.stages[0]["num_tokens_in"] == 12 and t.stages[0]["vllm_ttft_ms"] == 190.0
    assert f"[RequestE2EStats [request_id={X1} response=resp-B turn=1 reason=stop]]" in render_turn_text(t)


def test_resident_tail_of_an_ended_turn_joins_no_later_turn():
    """D1: for a resident id the segment decides. A late output of turn 0 (model_turn_id 0)
    after the update that opened turn 1 is one warning and changes no table."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, capabilities={"supports_core_resumable_request": True})
    b.add("TurnCommitted", "s1", 2.0, turn_id=0, response_id="resp-1", create_response=True)
    b.add("StageRequestSubmitted", "s1", 2.01, stage_id=0, request_id=R, num_tokens_in=5)
    b.add("StageOutput", "s1", 2.2, stage_id=0, request_id=R, num_new_tokens=3, model_turn_id=0, end_of_turn=True)
    b.add("ResponseEnded", "s1", 2.3, response_id="resp-1", cause="model")
    b.add("TurnCompleted", "s1", 2.3, completed_turn_id=0, new_turn_id=1)
    b.add("StageOutput", "s1", 2.4, stage_id=0, request_id=R, num_new_tokens=7)  # tail before the update
    b.add("TurnCommitted", "s1", 3.0, turn_id=1, response_id="resp-2", create_response=True)
    b.add(
        "StageRequestSubmitted",
        "s1",
        3.01,
        stage_id=0,
        request_id=R,
        kind="update",
        num_tokens_in=4,
        fence={"turn_id": 1},
    )
    b.add("StageOutput", "s1", 3.1, stage_id=0, request_id=R, num_new_tokens=9, model_turn_id=0)  # late, turn 0
    b.add("StageOutput", "s1", 3.2, stage_id=0, request_id=R, num_new_tokens=2, model_turn_id=1, end_of_turn=True)
    b.add("ResponseEnded", "s1", 3.3, response_id="resp-2", cause="model")
    p = project(b)
    one, two = p.turn_tables
    assert one.stages[0]["num_tokens_out"] == 3
    assert two.stages[0]["num_tokens_out"] == 2 and two.stages[0]["num_tokens_in"] == 4
    assert two.stages[0]["vllm_ttft_ms"] == 190.0
    assert warnings(p) == [("output_outside_segment", 7), ("output_outside_segment", 10)]


def stage0_only(ts_submit=10.0, ts_receipt=10.5, ts_final=11.0) -> LogBuilder:
    b = LogBuilder()
    b.add("SessionOpened", "s1", 9.0, num_stages=2)
    b.add("TurnCommitted", "s1", 10.0, turn_id=0, response_id="r", create_response=True)
    b.add("ResponseBegun", "s1", 10.0, response_id="r", request_id=X0)
    b.add(
        "StageMetricsReported",
        "s1",
        ts_receipt,
        stage_id=0,
        request_id=X0,
        stage_submit_ts=ts_submit,
        stats={"num_tokens_out": 3},
    )
    return b


def test_d2_only_the_final_stage_is_raised_to_the_finalize():
    b = stage0_only()
    b.add("ResponseEnded", "s1", 11.0, response_id="r", cause="model")
    (t,) = project(b).turn_tables
    assert t.summary["e2e_stage_0_wall_time_ms"] == 500.0
    assert "e2e_stage_1_wall_time_ms" not in t.summary  # no other stage stands in for stage 1


def test_d3_rx_size_set_once_and_d4_edge_from_a_bare_snapshot():
    b = stage0_only()
    for ts, n_out in ((10.6, 10), (10.7, 11)):
        b.add(
            "StageMetricsReported",
            "s1",
            ts,
            stage_id=1,
            request_id=X0,
            stats={"num_tokens_out": n_out, "rx_transfer_bytes": 1000, "rx_decode_time_ms": 0.5},
        )
    b.add("ResponseEnded", "s1", 11.0, response_id="r", cause="model")
    (t,) = project(b).turn_tables
    (edge,) = t.transfers
    assert (edge.size_bytes, edge.rx_decode_time_ms) == (1000, 1.0)
    assert "| size_kbytes       | 0.977 |" in render_turn_text(t)

    b = stage0_only()
    b.add("StageMetricsReported", "s1", 10.6, stage_id=1, request_id=X0, stats={"num_tokens_out": 10})
    b.add("ResponseEnded", "s1", 11.0, response_id="r", cause="model")
    (t,) = project(b).turn_tables
    assert [(e.edge, e.size_bytes) for e in t.transfers] == [("0->1", 0)]
    assert "transfers=[0->1=0.00ms]" in render_turn_text(t)


def test_d5_missing_string_cell_prints_none():
    b = stage0_only()
    b.add(
        "StageMetricsReported",
        "s1",
        10.6,
        stage_id=1,
        request_id=X0,
        stats={"num_tokens_out": 10, "output_unit_type": "audio"},
    )
    b.add("ResponseEnded", "s1", 11.0, response_id="r", cause="model")
    (t,) = project(b).turn_tables
    row = [line for line in render_turn_text(t).splitlines() if line.startswith("| output_unit_type")]
    assert [cell.strip() for cell in row[0].split("|")[2:4]] == ["None", "audio"]


def test_d8_response_ending_before_any_engine_request():
    b = LogBuilder()
    b.add("TurnCommitted", "s1", 1.0, turn_id=0, response_id="resp-E", create_response=True)
    b.add("TurnFinalized", "s1", 1.2, response_id="resp-E", finished_reason="error")
    (t,) = project(b).turn_tables
    assert (t.request_id, t.finished_reason, t.e2e["e2e_total_ms"]) == (None, "error", 200.0)
    doc = json.loads(render_json([t]))["turns"][0]
    assert doc["request_id"] is None and doc["finished_reason"] == "error"
    assert render_tables_text([t]) == ""
    assert "request_id=]" not in render_markdown([t]) and "[OmniTiming]" not in render_markdown([t])
    assert render_csv([t]).splitlines()[1].startswith("s1,resp-E,,0,error,summary")


def test_json_numbers_are_the_microsecond_values():
    b = LogBuilder()
    b.add("TurnCommitted", "s1", 10.5, turn_id=0, response_id="r", create_response=True)
    b.add("StageRequestSubmitted", "s1", 10.51, stage_id=0, request_id=X0, num_tokens_in=60)
    b.add("ResponseBegun", "s1", 10.52, response_id="r", request_id=X0)
    b.add("StageOutput", "s1", 10.7, stage_id=0, request_id=X0, num_new_tokens=1)
    b.add("StageOutput", "s1", 11.0, stage_id=0, request_id=X0, num_new_tokens=9)
    b.add("ResponseEnded", "s1", 11.1, response_id="r", cause="model")
    (t,) = project(b).turn_tables
    text = render_json([t])
    assert '"vllm_ttft_ms": 190.0' in text and '"vllm_tpot_ms": 33.333' in text
    assert "9999999" not in text and "0000001" not in text


def test_d9_each_stale_terminal_is_one_warning_and_the_engine_pair_is_none():
    b = LogBuilder()
    b.add("TurnCommitted", "s1", 1.0, turn_id=0, response_id="r", create_response=True)
    b.add("ResponseBegun", "s1", 1.1, response_id="r", request_id=X0)
    b.add("ResponseEnded", "s1", 2.0, response_id="r", cause="model")  # 3: finalizes
    b.add("TurnFinalized", "s1", 2.0, response_id="r", finished_reason="stop")  # 4: same terminal
    b.add("TurnFinalized", "s1", 2.5, response_id="r", finished_reason="stop")  # 5: a second terminal
    b.add("CancelRequested", "s1", 2.6, source="barge_in", response_id="r")  # 6: another
    b.add("TurnFinalized", "s1", 2.6, response_id="r", finished_reason="barge_in")  # 7: joins 6
    b.add("ResponseEnded", "s1", 2.7, response_id="nope")  # 8: unknown response
    p = project(b)
    assert len(p.turn_tables) == 1 and p.turn_tables[0].finished_reason == "stop"
    assert warnings(p) == [("stale_finalize", 5), ("stale_finalize", 6), ("stale_finalize", 8)]


def test_d9_appends_to_ids_the_session_does_not_hold():
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0)
    b.add("StageRequestReserved", "s1", 1.0, stage_id=0, request_id=X0)
    b.add("InputAppended", "s1", 1.1, request_id=X0)  # held: fine
    b.add("StageRequestReleased", "s1", 1.2, stage_id=0, request_id=X0)
    b.add("InputAppended", "s1", 1.3, request_id=X0)  # released
    b.add("InputAppended", "s1", 1.4, request_id=X1)  # never held
    b.add("InputAppended", "s1", 1.5, request_id=X0, fence={"incarnation": 1})  # other incarnation
    p = project(b)
    assert warnings(p) == [("append_after_release", 5), ("append_to_unknown_id", 6), ("stale_fence", 7)]
    assert p.turns.sessions["s1"].pending_stamp == 1.1  # refused appends stamp nothing


def test_d10_ack_releases_only_the_binding_its_abort_saw():
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0)
    b.add("StageRequestSubmitted", "s1", 1.1, stage_id=0, request_id=X0)
    b.add("AbortRequested", "s1", 1.2, request_ids=[X0])
    b.add("AbortResult", "s1", 1.3, request_ids=[X0], stage_id=0, outcome="ok")
    b.add("StageRequestSubmitted", "s1", 1.4, stage_id=0, request_id=X0)  # rebound (a buggy plugin)
    b.add("AbortResult", "s1", 1.5, request_ids=[X0], stage_id=0, outcome="ok")  # duplicate old ack
    b.add("AbortResult", "s1", 1.5, request_ids=[X0], stage_id=1, outcome="ok")  # answers the abort
    b.add("SessionClosed", "s1", 2.0)
    p = project(b)
    assert p.resources.request_resources("s1")["s1"] == {(0, X0): "submitted"}
    assert ("duplicate_ack", 6) in warnings(p)
    assert [(f.kind, f.request_id) for f in p.leaks()] == [("held_after_close", X0)]


def test_d11_engine_abort_output_finalizes_abort():
    b = LogBuilder()
    b.add("TurnCommitted", "s1", 1.0, turn_id=0, response_id="r", create_response=True)
    b.add("StageRequestSubmitted", "s1", 1.01, stage_id=0, request_id=X0)
    b.add("ResponseBegun", "s1", 1.02, response_id="r", request_id=X0)
    b.add("StageOutput", "s1", 1.25, stage_id=0, request_id=X0, num_new_tokens=0, finished=True, finish_reason="abort")
    b.add("ResponseEnded", "s1", 1.3, response_id="r", status="completed")
    (t,) = project(b).turn_tables
    assert (t.finished_reason, t.e2e["e2e_total_ms"]) == ("abort", 250.0)


def test_d13_server_shutdown_is_close():
    b = LogBuilder()
    b.add("ResponseBegun", "s1", 1.0, response_id="r", request_id=X0)
    b.add("CancelRequested", "s1", 2.0, source="server_shutdown", response_id="r")
    (t,) = project(b).turn_tables
    assert t.finished_reason == "close"


def stamped_log() -> LogBuilder:
    """A snapshot with engine stamps and no vllm_ttft_ms (the read path once crashed on it)."""
    b = stage0_only()
    b.add(
        "StageMetricsReported",
        "s1",
        10.6,
        stage_id=1,
        request_id=X0,
        stats={"num_tokens_out": 4},
        engine_submit_ts={"clock": "engine_monotonic", "s": 100.0},
        engine_first_token_ts={"clock": "engine_monotonic", "s": 100.25},
        engine_last_token_ts={"clock": "engine_monotonic", "s": 100.55},
    )
    b.add("ResponseEnded", "s1", 11.0, response_id="r", cause="model")
    return b


def test_stamped_snapshot_through_the_cli_read_path(tmp_path):
    b = stamped_log()
    path = tmp_path / "log.jsonl"
    path.write_text(b.jsonl())
    url = f"sqlite+aiosqlite:///{tmp_path / 'l.db'}"
    runner = CliRunner()
    assert runner.invoke(app, ["events", "import", str(path), "--db", url]).exit_code == 0
    result = runner.invoke(app, ["tables", "--db", url, "--format", "json"])
    assert result.exit_code == 0, result.output
    (turn,) = json.loads(result.stdout)["turns"]
    s1 = [s for s in turn["stages"] if s["stage_id"] == 1][0]
    assert (s1["vllm_ttft_ms"], s1["vllm_tpot_ms"]) == (250.0, 100.0)
    assert runner.invoke(app, ["audit", "--db", url]).exit_code == 0


@pytest.mark.parametrize("log_stats", [True, False])
def test_m14_live_fold_opens_nothing_for_log_stats_off(log_stats):
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, log_stats=log_stats)
    b.add("TurnCommitted", "s1", 2.0, turn_id=0, response_id="r", create_response=True)
    b.add("StageRequestSubmitted", "s1", 2.01, stage_id=0, request_id=X0)
    b.add("ResponseBegun", "s1", 2.02, response_id="r", request_id=X0)
    b.add("StageMetricsReported", "s1", 2.5, stage_id=0, request_id=X0, stats={"num_tokens_out": 3})
    live = Projector(live=True)
    for stored in b.stored[:-1] + [b.stored[-1]]:
        live.apply(stored)
    assert ("s1" in live.turns.sessions) is log_stats
    b.add("ResponseEnded", "s1", 3.0, response_id="r", cause="model")
    live.apply(b.stored[-1])
    assert len(live.turns.take_finalized()) == (1 if log_stats else 0)
    assert len(project(b).turn_tables) == 1  # offline re-projection builds it either way


def test_live_and_read_back_fold_the_same(tmp_path):
    """The live hand-off (struct_of of each validated model) and the read path (each row's
    payload JSON decoded) give the same structs, and so the same fold."""
    from tests.histories import as_read_back

    b = stamped_log()
    a, c = project(b), Projector().apply_all(as_read_back(b.stored))
    assert a.turn_tables and [t.to_dict() for t in a.turn_tables] == [t.to_dict() for t in c.turn_tables]


def reopened_with_the_same_response_id() -> LogBuilder:
    """A session closed and reopened (incarnation 1) that names a response of its first
    incarnation again: a crafted or buggy log (live ids carry a random suffix)."""
    b = LogBuilder()
    for incarnation, t0 in ((0, 1.0), (1, 10.0)):
        x = eph("s1", 0, incarnation=incarnation)
        b.add("SessionOpened", "s1", t0, incarnation=incarnation)
        b.add("TurnCommitted", "s1", t0 + 1, turn_id=0, response_id="resp-1", create_response=True)
        b.add("StageRequestSubmitted", "s1", t0 + 1.1, stage_id=0, request_id=x, fence={"incarnation": incarnation})
        b.add("ResponseBegun", "s1", t0 + 1.2, response_id="resp-1", request_id=x)
        b.add("ResponseEnded", "s1", t0 + 2, response_id="resp-1", cause="model")
        b.add("StageRequestReleased", "s1", t0 + 2.1, stage_id=0, request_id=x)
        b.add("SessionClosed", "s1", t0 + 3)
    return b


def test_a_reused_response_id_is_one_table_and_warnings_and_the_ledger_stays_buildable(tmp_path):
    b = reopened_with_the_same_response_id()
    p = project(b)
    assert [t.response_id for t in p.turn_tables] == ["resp-1"]
    assert warnings(p) == [("stale_finalize", 9), ("stale_finalize", 11), ("stale_finalize", 12)]
    path = tmp_path / "log.jsonl"
    path.write_text(b.jsonl())
    url = f"sqlite+aiosqlite:///{tmp_path / 'l.db'}"
    runner = CliRunner()
    assert runner.invoke(app, ["events", "import", str(path), "--db", url]).exit_code == 0
    # The second incarnation's id is released without an ack: the in-memory fold reports that
    # leak, and so must the CLI (it used to hide it: the runner forgot the closed session at
    # its batch end, issue 12).
    assert [f.kind for f in p.leaks()] == ["counter_not_decremented"]
    for command in (["audit"], ["tables"], ["rebuild"], ["tables"]):
        result = runner.invoke(app, [*command, "--db", url])
        assert result.exit_code == (1 if command == ["audit"] else 0), result.output
        assert command != ["audit"] or "counter_not_decremented" in result.output


def test_a_stale_terminal_never_changes_the_finalized_reason():
    b = LogBuilder()
    b.add("ResponseBegun", "s1", 1.0, response_id="r", request_id=X0)
    b.add("TurnFinalized", "s1", 2.0, response_id="r", finished_reason="barge_in")
    b.add("TurnFinalized", "s1", 2.1, response_id="r", finished_reason="cancel")
    b.add("ResponseEnded", "s1", 2.2, response_id="r", cause="model")
    p = project(b)
    assert [t.finished_reason for t in p.turn_tables] == ["barge_in"]
    details = [f.detail for f in p.findings() if f.kind == "stale_finalize"]
    assert len(details) == 2 and all("already finalized (barge_in)" in d for d in details)


def test_a_response_begun_after_close_is_a_warning_not_a_table():
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0)
    b.add("SessionClosed", "s1", 2.0)
    b.add("ResponseBegun", "s1", 3.0, response_id="late", request_id=X0)
    b.add("ResponseEnded", "s1", 3.5, response_id="late", cause="model")
    p = project(b)
    assert p.turn_tables == []
    assert warnings(p) == [("after_close", 3), ("stale_finalize", 4)]


@pytest.mark.parametrize("named", ["never-submitted", "aborted"])
def test_a_begin_naming_an_unheld_id_opens_the_response_without_an_engine_request(named: str):
    """D1/D9/D19 with D8: in a log that records submits, a begin naming an id with no live
    segment is one warning and changes nothing; the response, pre-created at commit, ends before
    any engine request was submitted for it (a D8 JSON/CSV row, request_id null), and the id's
    facts join nothing (each one warning). Without the commit it opens nothing at all
    (tests/projections/test_rules_d15_d19.py)."""
    ghost = X1 if named == "never-submitted" else X0
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0)
    b.add("StageRequestSubmitted", "s1", 2.0, stage_id=0, request_id=X0, num_tokens_in=10, fence={"turn_id": 0})
    if named == "aborted":
        b.add("AbortRequested", "s1", 2.1, request_ids=[X0], reason="barge_in")
        b.add("AbortResult", "s1", 2.2, request_ids=[X0], stage_id=0, outcome="ok")
    b.add("TurnCommitted", "s1", 3.0, turn_id=1, response_id="resp-G", create_response=True)
    b.add("ResponseBegun", "s1", 3.1, response_id="resp-G", turn_id=1, request_id=ghost)
    begin_at = b.position
    b.add("StageOutput", "s1", 3.2, stage_id=0, request_id=ghost, num_new_tokens=6)
    b.add("ResponseEnded", "s1", 3.5, response_id="resp-G", cause="model")
    p = project(b)
    (t,) = p.turn_tables
    assert (t.request_id, t.finished_reason) == (None, "stop") and t.stages == {}
    assert render_turn_text(t) == ""
    kinds = dict((pos, kind) for kind, pos in warnings(p))
    assert kinds[begin_at] == "begin_of_unheld_id"
    assert begin_at + 1 in kinds  # the ghost's output: one warning, joins nothing
    assert len(warnings(p)) == len(kinds) == 2


def test_a_begin_without_submits_in_the_log_still_titles_by_its_id():
    """A metrics-only log (no submits at all) attributes by the begin's id, as before."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0)
    b.add("TurnCommitted", "s1", 3.0, turn_id=0, response_id="resp-M", create_response=True)
    b.add("ResponseBegun", "s1", 3.1, response_id="resp-M", turn_id=0, request_id=X0)
    b.add("StageOutput", "s1", 3.2, stage_id=0, request_id=X0, num_new_tokens=6)
    b.add("ResponseEnded", "s1", 3.5, response_id="resp-M", cause="model")
    p = project(b)
    (t,) = p.turn_tables
    assert t.request_id == X0 and t.stages[0]["num_tokens_out"] == 6 and warnings(p) == []


def test_a_downstream_output_before_its_forward_joins_nothing():
    """D1 on stage 1: for a resident id whose (1, R) binding survives the turn, the next turn's
    stage-1 facts join only after that turn's forward; one before it (here: after a forward
    refused for its older fence) is one warning and adds no tokens."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, capabilities={"supports_core_resumable_request": True})
    for turn, t0 in ((0, 2.0), (1, 3.0)):
        b.add("TurnCommitted", "s1", t0, turn_id=turn, response_id=f"resp-{turn}", create_response=True)
        b.add(
            "StageRequestSubmitted",
            "s1",
            t0 + 0.01,
            stage_id=0,
            request_id=R,
            num_tokens_in=5,
            kind="update" if turn else "initial",
            fence={"turn_id": turn},
        )
        b.add("StageOutput", "s1", t0 + 0.1, stage_id=0, request_id=R, num_new_tokens=3, model_turn_id=turn)
        if turn == 1:
            b.add("StageRequestForwarded", "s1", t0 + 0.15, stage_id=1, request_id=R, fence={"turn_id": 0})
            b.add("StageOutput", "s1", t0 + 0.16, stage_id=1, request_id=R, num_new_tokens=50)
        b.add("StageRequestForwarded", "s1", t0 + 0.2, stage_id=1, request_id=R, fence={"turn_id": turn})
        b.add("StageOutput", "s1", t0 + 0.3, stage_id=1, request_id=R, num_new_tokens=4, model_turn_id=turn)
        b.add("ResponseEnded", "s1", t0 + 0.4, response_id=f"resp-{turn}", cause="model")
        b.add("TurnCompleted", "s1", t0 + 0.4, completed_turn_id=turn, new_turn_id=turn + 1)
    p = project(b)
    assert [t.stages[1]["num_tokens_out"] for t in p.turn_tables] == [4, 4]
    assert [kind for kind, _ in warnings(p)] == ["forward_ignored", "output_outside_segment"]


def test_a_stage_whose_forward_was_refused_holds_nothing_even_while_stage0_holds_the_id():
    """D9: the first turn's forward under another incarnation's fence never binds (1, X0); the
    stage-1 output that follows is refused by the resources fold (one warning), while stage 0
    of the same id goes on."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0)
    b.add("TurnCommitted", "s1", 2.0, turn_id=0, response_id="resp-0", create_response=True)
    b.add("StageRequestSubmitted", "s1", 2.01, stage_id=0, request_id=X0, num_tokens_in=5, fence={"turn_id": 0})
    b.add("ResponseBegun", "s1", 2.02, response_id="resp-0", turn_id=0, request_id=X0)
    b.add("StageOutput", "s1", 2.1, stage_id=0, request_id=X0, num_new_tokens=3)
    b.add("StageRequestForwarded", "s1", 2.15, stage_id=1, request_id=X0, fence={"incarnation": 1, "turn_id": 0})
    b.add("StageOutput", "s1", 2.16, stage_id=1, request_id=X0, num_new_tokens=50)
    b.add("StageOutput", "s1", 2.2, stage_id=0, request_id=X0, num_new_tokens=2)
    b.add("ResponseEnded", "s1", 2.4, response_id="resp-0", cause="model")
    p = project(b)
    (t,) = p.turn_tables
    assert t.stages[0]["num_tokens_out"] == 5 and 1 not in t.stages
    assert warnings(p) == [("forward_ignored", 6), ("output_of_stale_id", 7)]
    assert (1, X0) not in p.resources.sessions["s1"].bindings


@pytest.mark.parametrize(
    ("session", "refused_id", "why"),
    [
        ("s1", eph("s1", 0, incarnation=7), "incarnation 7"),  # every submit refused: still a log with submits
        ("s9", X0, "another session"),  # DOMAIN §1.3/§2.1: an id minted for s1 (a spliced log)
    ],
)
def test_no_turn_is_built_from_a_refused_id(session, refused_id, why):
    """D1/D9: the only Stage0 submit is refused (one stale_fence warning); the log still records
    submits, so the begin naming that id opens a response without an engine request and the
    id's outputs join nothing (it is not a metrics-only log); nothing binds."""
    b = LogBuilder()
    b.add("SessionOpened", session, 1.0)
    b.add("TurnCommitted", session, 2.0, turn_id=0, response_id="resp-1", create_response=True)
    b.add("StageRequestSubmitted", session, 2.01, stage_id=0, request_id=refused_id, num_tokens_in=5)
    b.add("ResponseBegun", session, 2.02, response_id="resp-1", turn_id=0, request_id=refused_id)
    b.add("StageOutput", session, 2.1, stage_id=0, request_id=refused_id, num_new_tokens=11)
    b.add("ResponseEnded", session, 2.4, response_id="resp-1", cause="model")
    p = project(b)
    (t,) = p.turn_tables
    assert t.request_id is None and t.stages == {}
    assert [kind for kind, _ in warnings(p)] == ["stale_fence", "begin_of_unheld_id", "output_of_stale_id"]
    assert why in p.findings()[0].detail
    assert not p.session_resources(session).bindings
