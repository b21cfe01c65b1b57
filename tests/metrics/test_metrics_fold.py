"""issue 16: the Prometheus families computed by projections.metrics from logs the tests build."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine_bridge.prometheus import LedgerMetrics
from projections.metrics import FAMILIES, MetricsFold, TallySink
from tests.logbuilder import LogBuilder, eph

S = "s1"
MODEL = "smollm2"


def opened(b, ts=0.0, session=S):
    b.add("SessionOpened", session, ts, model=MODEL)


def turn(b, n, reason, *, t0, audio_at=None, tokens_in=10, tokens_out=4, session=S):
    """One ephemeral turn n: commit at t0 (arrival), submit, stage-0 output, forward and (when
    ``audio_at``) a stage-1 audio output, then the terminal event for ``reason``."""
    x = eph(session, n)
    rid = f"resp-{n}"
    b.add("TurnCommitted", session, t0, turn_id=n, create_response=True, response_id=rid)
    b.add("StageRequestSubmitted", session, t0 + 0.01, stage_id=0, request_id=x, num_tokens_in=tokens_in)
    b.add("ResponseBegun", session, t0 + 0.02, response_id=rid, turn_id=n, request_id=x)
    b.add("StageOutput", session, t0 + 0.1, stage_id=0, request_id=x, num_new_tokens=tokens_out)
    if audio_at is not None:
        b.add("StageRequestForwarded", session, t0 + 0.15, stage_id=1, request_id=x)
        b.add("StageOutput", session, t0 + 0.16, stage_id=1, request_id=x, num_new_tokens=0)  # no audio yet
        b.add("StageOutput", session, t0 + audio_at, stage_id=1, request_id=x, num_new_tokens=3, audio_frames=1440)
        b.add("StageOutput", session, t0 + audio_at + 0.1, stage_id=1, request_id=x, num_new_tokens=2, audio_frames=960)
    end = t0 + 1.0
    if reason == "stop":
        b.add("ResponseEnded", session, end, response_id=rid, cause="model")
    elif reason == "abort":
        b.add("StageRequestFinished", session, end, stage_id=0, request_id=x, finish_reason="abort")
        b.add("TurnFinalized", session, end, response_id=rid, finished_reason="abort")
    else:
        b.add("TurnFinalized", session, end, response_id=rid, finished_reason=reason)
    b.add("ReleaseRequested", session, end + 0.01, request_ids=[x])
    for stage in (0, 1) if audio_at is not None else (0,):
        b.add("StageRequestReleased", session, end + 0.01, stage_id=stage, request_id=x)
    b.add("ReleaseResult", session, end + 0.02, request_ids=[x], outcome="ok")
    return rid


def fold(b) -> tuple[MetricsFold, TallySink]:
    sink = TallySink()
    return MetricsFold(sink).apply_all(b.stored), sink


def reasons(sink) -> dict[str, float]:
    return {labels[1]: v for (name, labels), v in sink.values.items() if name == "vllm_omni:requests_success_total"}


def test_two_stop_one_barge_in_one_abort():
    b = LogBuilder()
    opened(b)
    for n, reason in enumerate(["stop", "barge_in", "stop", "abort"]):
        turn(b, n, reason, t0=10.0 * (n + 1))
    f, sink = fold(b)
    assert {k: v for k, v in reasons(sink).items() if v} == {"stop": 2, "barge_in": 1, "abort": 1}
    assert reasons(sink)["cancel"] == reasons(sink)["close"] == reasons(sink)["error"] == 0  # all six exist
    e2e = sink.observations[("vllm_omni:e2e_request_latency_s", (MODEL,))]
    assert len(e2e) == 3 and e2e == pytest.approx([1.0, 1.0, 1.0])  # abort is not observed
    assert sink.values[("vllm_omni:prompt_tokens_total", (MODEL,))] == 40
    assert sink.values[("vllm_omni:generation_tokens_total", (MODEL,))] == 16
    # the same through prometheus_client: exposed names and values
    text = LedgerMetrics().apply_all(b.stored).exposition()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert samples[("vllm_omni:requests_success_total", (("finished_reason", "stop"), ("model_name", MODEL)))] == 2
    assert samples[("vllm_omni:e2e_request_latency_s_count", (("model_name", MODEL),))] == 3
    assert "_created" not in text


def test_exposed_family_names_are_the_issue_names():
    text = LedgerMetrics().apply_all(LogBuilder().stored).exposition()
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert declared == {n for n in FAMILIES if n != "duplex_ledger:running_counter_drift"}


def test_audio_ttfp_one_sample_per_turn_from_arrival_never_negative():
    b = LogBuilder()
    opened(b)
    turn(b, 0, "stop", t0=10.0, audio_at=0.4)
    turn(b, 1, "stop", t0=20.0)  # no audio: no sample
    f, sink = fold(b)
    (ttfp,) = [v for (name, labels), v in sink.observations.items() if name == "vllm_omni:audio_ttfp_s"]
    assert ttfp == [0.4]  # commit (arrival) at 10.0 -> first audio frames at 10.4; the empty output does not count
    assert ("vllm_omni:audio_ttfp_s", (MODEL, "1")) in sink.observations


def test_audio_before_arrival_gives_no_sample():
    b = LogBuilder()
    opened(b)
    x = eph(S, 0)
    b.add("StageRequestForwarded", S, 5.0, stage_id=1, request_id=x)
    b.add("StageOutput", S, 5.1, stage_id=1, request_id=x, num_new_tokens=1, audio_frames=480)
    b.add("ResponseBegun", S, 6.0, response_id="r", turn_id=0, request_id=x, commit_ts=6.0)
    b.add("ResponseEnded", S, 7.0, response_id="r", cause="model")
    _, sink = fold(b)
    assert not any(name == "vllm_omni:audio_ttfp_s" for name, _ in sink.observations)


def test_a_response_finalized_twice_counts_once_and_listen_only_turns_add_nothing():
    b = LogBuilder()
    opened(b)
    rid = turn(b, 0, "stop", t0=10.0)
    b.add("TurnFinalized", S, 12.0, response_id=rid, finished_reason="cancel")  # second terminal
    x1 = eph(S, 1)
    b.add("TurnCommitted", S, 20.0, turn_id=1, create_response=False)
    b.add("StageRequestSubmitted", S, 20.01, stage_id=0, request_id=x1)
    b.add("ResponseListened", S, 20.2, turn_id=1, request_id=x1)
    b.add("TurnCompleted", S, 21.0, completed_turn_id=1, new_turn_id=2, cause="mechanical")
    _, sink = fold(b)
    assert {k: v for k, v in reasons(sink).items() if v} == {"stop": 1}
    assert len(sink.observations[("vllm_omni:e2e_request_latency_s", (MODEL,))]) == 1
    assert sink.values[("duplex_ledger:listen_units_total", ())] == 1
    assert sink.values[("duplex_ledger:listen_only_turns_total", ())] == 1


def test_a_listen_followed_by_a_speak_in_the_same_turn_is_not_listen_only():
    b = LogBuilder()
    opened(b)
    x = eph(S, 0)
    b.add("ResponseListened", S, 1.0, turn_id=0, request_id=x)
    b.add("ResponseBegun", S, 2.0, response_id="r", turn_id=0, request_id=x)
    b.add("ResponseEnded", S, 3.0, response_id="r", cause="model")
    b.add("TurnCompleted", S, 3.0, completed_turn_id=0, new_turn_id=1)
    b.add("SessionClosed", S, 4.0)
    _, sink = fold(b)
    assert sink.values[("duplex_ledger:listen_units_total", ())] == 1
    assert ("duplex_ledger:listen_only_turns_total", ()) not in sink.values


def test_failed_close_cleanup_keeps_the_slot_pending_until_it_is_cleaned():
    b = LogBuilder()
    opened(b, ts=100.0)
    x = eph(S, 0)
    b.add("StageRequestReserved", S, 100.0, stage_id=0, request_id=x)
    b.add("StageRequestSubmitted", S, 101.0, stage_id=0, request_id=x)
    b.add("SessionClosed", S, 110.0, reason="disconnect")
    b.add("StageRequestReleased", S, 110.0, stage_id=0, request_id=x, cause="disconnect")
    b.add("AbortRequested", S, 110.0, request_ids=[x], reason="disconnect")
    b.add("AbortResult", S, 110.1, request_ids=[x], stage_id=0, outcome="failed", error="boom")
    b.add("StageRequestRestored", S, 110.1, stage_id=0, request_id=x)
    f, sink = fold(b)
    assert sink.values[("duplex_ledger:sessions_admitted", ())] == 0
    assert sink.values[("duplex_ledger:sessions_cleanup_pending", ())] == 1
    assert ("duplex_ledger:sessions_closed_total", ("disconnect",)) not in sink.values
    assert sink.values[("duplex_ledger:abort_failures_total", ("0",))] == 1
    assert sink.observations[("duplex_ledger:session_duration_s", ())] == [10.0]
    assert f.leaked_request_ids() == 1
    # recovery retries the abort: the slot is freed and the session counts as closed
    b.add("StageRequestReleased", S, 200.0, stage_id=0, request_id=x, cause="recovered_after_crash")
    b.add("AbortRequested", S, 200.0, request_ids=[x], reason="recovered_after_crash")
    b.add("AbortResult", S, 200.1, request_ids=[x], stage_id=0, outcome="ok")
    for stored in b.stored[-3:]:
        f.apply(stored)
    assert sink.values[("duplex_ledger:sessions_cleanup_pending", ())] == 0
    assert sink.values[("duplex_ledger:sessions_closed_total", ("disconnect",))] == 1
    assert f.leaked_request_ids() == 0


def test_session_rollup_at_close():
    b = LogBuilder()
    opened(b, ts=0.0)
    turn(b, 0, "stop", t0=10.0, audio_at=0.3)
    turn(b, 1, "barge_in", t0=20.0, audio_at=0.5)
    # a listen-only unit of turn 2 (submitted first: a listen unit of an id the session does not
    # hold is refused by the audit and counts nowhere, DOMAIN §5.7 D9)
    b.add("StageRequestSubmitted", S, 24.9, stage_id=0, request_id=eph(S, 2), num_tokens_in=3)
    b.add("ResponseListened", S, 25.0, turn_id=2, request_id=eph(S, 2))
    b.add("SessionClosed", S, 30.0, reason="session_close")
    f, sink = fold(b)
    (r,) = f.rollups
    assert r.turns_by_reason == {"stop": 1, "barge_in": 1, "cancel": 0, "close": 0, "abort": 0, "error": 0}
    assert r.session_wall_ms == 30000.0 and r.listen_units == 1 and r.close_reason == "session_close"
    assert (r.ttfp_ms.count, r.ttfp_ms.mean, r.ttfp_ms.p50, r.ttfp_ms.p99) == (2, pytest.approx(400.0), 300.0, 500.0)
    assert r.ttft_ms.count == 2  # ledger-derived: first token - submit
    assert sink.values[("duplex_ledger:listen_only_turns_total", ())] == 1  # turn 2 listened, then the close
    assert sink.observations[("duplex_ledger:session_turns", ())] == [2.0]
