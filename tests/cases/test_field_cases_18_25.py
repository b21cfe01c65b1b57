"""Field cases CASE-18 … CASE-25 (``../shared/cases``), each with the right answer the case
file works out, through the CLI (import → audit/tables JSON) and the in-memory fold.

CASE-18, -19 and -21 failed before DOMAIN §5.7 (D1 attribution, D9/D10 fences and acks, D11
engine abort); CASE-22, -24 and -25 passed and stay as regression tests."""

from __future__ import annotations

import pytest

from tests.cases.field_support import FIELD_DIR, SHARED_DIR, kinds_at, resources_after, run_cli, stage

X18_0 = "duplex-s.UzE.i.0.e.0.r.stage0_t0"
X18_1 = "duplex-s.UzE.i.0.e.1.r.stage0_t0"
X19 = "duplex-s.UzE.i.0.e.0.r.stage0_t0"
X19_B0 = "duplex-s.UzI.i.0.e.0.r.stage0_t0"
Y19_B0 = "duplex-s.UzI.i.1.e.0.r.stage0_t0"
R = "duplex-s.UzE.i.0.e.0.r.stage0"


@pytest.mark.parametrize("path", sorted(FIELD_DIR.glob("*.jsonl")), ids=lambda p: p.name)
def test_committed_copies_match_shared_cases(path):
    shared = SHARED_DIR / path.name
    assert path.read_text() == shared.read_text()


def test_case_18_late_delta_of_aborted_request_joins_no_turn(tmp_path, approx):
    r = run_cli("CASE-18", tmp_path)
    one, two = r.turns["S1/resp-1"], r.turns["S1/resp-2"]
    assert (one["finished_reason"], one["e2e"]["e2e_total_ms"]) == ("barge_in", approx(400.0))
    s0 = stage(one, 0)
    assert (s0["num_tokens_in"], s0["num_tokens_out"], s0["vllm_tpot_ms"]) == (60, 1, None)
    assert s0["vllm_ttft_ms"] == 190.0  # exact on integer µs
    assert two["request_id"] == X18_1 and two["finished_reason"] == "stop"
    s0 = stage(two, 0)
    assert (s0["num_tokens_in"], s0["num_tokens_out"]) == (80, 21)
    assert (s0["vllm_ttft_ms"], s0["vllm_tpot_ms"]) == (180.0, 20.0)
    assert two["e2e"]["e2e_total_ms"] == 620.0 and two["e2e"]["e2e_total_tokens"] == 101
    assert two["summary"]["e2e_stage_0_wall_time_ms"] == 600.0
    assert f"request_id={X18_0} response=resp-2" not in r.tables_text
    assert f"request_id={X18_1} response=resp-2 turn=0 reason=stop" in r.tables_text
    # The late delta (#11) is one warning, not a leak, and re-creates no binding.
    assert r.audit["clean"] and r.audit["running"] == 0 and r.audit["held"] == 0
    assert [(w["kind"], w["request_id"], w["first_position"]) for w in r.audit["warnings"]] == [
        ("output_after_abort", X18_0, 11)
    ]
    assert resources_after("CASE-18", 10, "S1") == {} and resources_after("CASE-18", 11, "S1") == {}


def test_case_19_part_a_stale_submit_refused_and_old_ack_releases_nothing(tmp_path):
    r = run_cli("CASE-19", tmp_path)
    assert resources_after("CASE-19", 11, "S1") == {(1, X19): "submitted"}
    assert resources_after("CASE-19", 12, "S1") == {(1, X19): "submitted"}  # #12 never binds
    assert resources_after("CASE-19", 13, "S1") == {}
    assert resources_after("CASE-19", 14, "S1") == {}
    s1_warnings = [w for w in r.audit["warnings"] if w["session_id"] == "S1"]
    assert "stale_fence" in kinds_at(s1_warnings, 12)
    assert kinds_at(s1_warnings, 14) == {"duplicate_ack"}  # the old abort's late ack changes nothing
    one = r.turns["S1/resp-1"]
    assert (one["finished_reason"], one["e2e"]["e2e_total_ms"]) == ("barge_in", 400.0)


def test_case_19_part_b_dead_incarnation_id_never_binds(tmp_path):
    r = run_cli("CASE-19", tmp_path)
    for position in (24, 26, 37):
        assert resources_after("CASE-19", position, "S2") == {}
    s2_warnings = [w for w in r.audit["warnings"] if w["session_id"] == "S2"]
    assert "forward_ignored" in kinds_at(s2_warnings, 26)
    one, two = r.turns["S2/resp-1"], r.turns["S2/resp-2"]
    assert (one["finished_reason"], one["e2e"]["e2e_total_ms"]) == ("close", 400.0)
    assert two["request_id"] == Y19_B0 and two["finished_reason"] == "stop"
    assert two["e2e"]["e2e_total_ms"] == 410.0 and two["e2e"]["e2e_total_tokens"] == 41
    assert [s["stage_id"] for s in two["stages"]] == [0]  # no stage-1 row from the dead id
    s0 = stage(two, 0)
    assert (s0["num_tokens_in"], s0["num_tokens_out"], s0["vllm_ttft_ms"], s0["vllm_tpot_ms"]) == (35, 6, 190.0, 40.0)
    assert r.audit["clean"] and r.audit["leaks"] == []
    assert f"request_id={Y19_B0} response=resp-2 turn=0 reason=stop" in r.tables_text


def test_case_21_engine_abort_of_the_resident_request_finalizes_abort(tmp_path):
    r = run_cli("CASE-21", tmp_path)
    one, two = r.turns["S1/resp-1"], r.turns["S1/resp-2"]
    assert (one["finished_reason"], one["e2e"]["e2e_total_ms"]) == ("stop", 410.0)
    assert (two["finished_reason"], two["e2e"]["e2e_total_ms"]) == ("abort", 250.0)
    s0 = stage(two, 0)
    assert (s0["num_tokens_in"], s0["num_tokens_out"], s0["vllm_ttft_ms"]) == (30, 1, 190.0)
    assert not kinds_at(r.audit["warnings"], 11)  # the update after a `length` boundary is legal
    from tests.cases.field_support import fold

    at_14 = fold("CASE-21", 14).resources
    assert (at_14.running("S1"), at_14.held("S1")) == (0, 1)
    assert resources_after("CASE-21", 19, "S1") == {}
    assert r.audit["clean"]
    reasons = sorted(t["finished_reason"] for t in r.turns.values())
    assert reasons == ["abort", "stop"]


def test_case_22_zero_token_resident_continuation(tmp_path):
    r = run_cli("CASE-22", tmp_path)
    one, two, three = (r.turns[f"S1/resp-{i}"] for i in (1, 2, 3))
    assert (one["e2e"]["e2e_total_ms"], stage(one, 0)["vllm_ttft_ms"], stage(one, 0)["vllm_tpot_ms"]) == (
        410.0,
        190.0,
        20.0,
    )
    s0 = stage(two, 0)
    assert (two["finished_reason"], two["e2e"]["e2e_total_ms"]) == ("stop", 160.0)
    assert (s0["num_tokens_in"], s0["num_tokens_out"], s0["vllm_ttft_ms"], s0["vllm_tpot_ms"]) == (30, 0, None, None)
    s0 = stage(three, 0)
    assert (three["e2e"]["e2e_total_ms"], s0["num_tokens_out"], s0["vllm_ttft_ms"], s0["vllm_tpot_ms"]) == (
        620.0,
        9,
        200.0,
        50.0,
    )
    assert resources_after("CASE-22", 23, "S1") == {(0, R): "submitted"}
    assert resources_after("CASE-22", 24, "S1") == {}
    assert r.audit["clean"] and r.audit["leaks"] == [] and r.audit["warnings"] == []


def test_case_24_cancel_recorded_before_completion_wins(tmp_path):
    r = run_cli("CASE-24", tmp_path)
    assert list(r.turns) == ["S1/resp-1"]
    one = r.turns["S1/resp-1"]
    s0 = stage(one, 0)
    assert (one["finished_reason"], one["e2e"]["e2e_total_ms"]) == ("cancel", 700.0)
    assert (s0["num_tokens_in"], s0["num_tokens_out"], s0["vllm_ttft_ms"], s0["vllm_tpot_ms"]) == (
        30,
        10,
        190.0,
        44.444,
    )
    assert r.tables_text.count("[RequestE2EStats") == 1
    assert r.audit["clean"] and resources_after("CASE-24", 14, "S1") == {}
    assert kinds_at(r.audit["warnings"], 9) == {"stale_finalize"}
    assert [w["request_id"] for w in r.audit["warnings"] if w["kind"] == "stale_finalize"] == ["resp-1"]
    assert not kinds_at(r.audit["warnings"], 10)  # #10 completes #9's terminal: one warning for the pair


def test_case_25_thinker_finished_talker_still_speaking(tmp_path):
    r = run_cli("CASE-25", tmp_path)
    one = r.turns["S1/resp-1"]
    assert (one["finished_reason"], one["e2e"]["e2e_total_ms"]) == ("barge_in", 1500.0)
    s0, s1 = stage(one, 0), stage(one, 1)
    assert (s0["num_tokens_in"], s0["num_tokens_out"], s0["vllm_ttft_ms"], s0["vllm_tpot_ms"]) == (
        45,
        25,
        180.0,
        16.667,
    )
    assert s1["num_tokens_out"] == 120
    x = "duplex-s.UzE.i.0.e.0.r.stage0_t0"
    assert resources_after("CASE-25", 8, "S1") == {(0, x): "finished", (1, x): "submitted"}
    assert resources_after("CASE-25", 11, "S1") == {(1, x): "submitted"}
    assert resources_after("CASE-25", 12, "S1") == {}
    assert r.audit["clean"]
