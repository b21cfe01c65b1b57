"""Field cases CASE-30, -31, -33, -37 and -39 (``../shared/cases``), each with the right answer its
case file works out, through the CLI a user runs (import → tables / audit / metrics / digest /
verify); the inputs are the committed copies in ``tests/cases/field/``.

CASE-37 failed before DOMAIN §5.7 D19 (a begin naming an aborted id opened a phantom "completed"
response); the others passed and stay as regression tests. CASE-35 and CASE-38 (replica processes
and a fake-engine sweep) are in ``tests/cases/test_field_cases_35_38.py``."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reports.cli import app
from tests.cases.field_support import FIELD_DIR, kinds_at, run_cli, runner, stage

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def metrics_of(url: str, until: int | None = None) -> Samples:
    """The ``metrics`` exposition of the ledger at ``url`` as {(sample name, labels): value}."""
    args = ["metrics", "--db", url] + ([] if until is None else ["--until-position", str(until)])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(result.stdout)
        for s in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def audit_at(url: str, until: int | None = None) -> dict:
    args = ["audit", "--db", url, "--format", "json"] + ([] if until is None else ["--until-position", str(until)])
    return json.loads(runner.invoke(app, args).stdout)


def url_of(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"


# ---------------------------------------------------------------------------------- CASE-30
def test_case_30_every_reason_counted_once_and_counters_equal_the_tables(tmp_path, approx):
    r = run_cli("CASE-30", tmp_path)
    want = {  # response -> (reason, e2e ms or None = not asserted, stage-0 in, stage-0 out, stage-1 out)
        "S1/resp-1": ("stop", 800.0, 40, 10, 30),
        "S1/resp-2": ("barge_in", 500.0, 50, 5, None),
        "S2/resp-3": ("abort", 400.0, 60, 3, None),
        "S3/resp-4": ("abort", None, 30, 4, None),
        "S3/resp-5": ("close", 500.0, 20, 6, None),
        "S4/resp-6": ("cancel", 300.0, 35, 3, None),
        "S4/resp-7": ("error", 300.0, 45, 1, None),
    }
    assert set(r.turns) == set(want)
    for key, (reason, e2e, tokens_in, out0, out1) in want.items():
        t = r.turns[key]
        assert t["finished_reason"] == reason, key
        if e2e is not None:
            assert t["e2e"]["e2e_total_ms"] == approx(e2e), key
        s0 = stage(t, 0)
        assert (s0["num_tokens_in"], s0["num_tokens_out"]) == (tokens_in, out0), key
        assert (stage(t, 1)["num_tokens_out"] if out1 is not None else None) == out1, key
        assert out1 is not None or [s["stage_id"] for s in t["stages"]] == [0], key
    m = metrics_of(url_of(tmp_path))
    model = "omni-test"
    counted = {
        reason: sample(m, "vllm_omni:requests_success_total", finished_reason=reason, model_name=model)
        for reason in ("stop", "barge_in", "abort", "close", "cancel", "error")
    }
    assert counted == {"stop": 1, "barge_in": 1, "abort": 2, "close": 1, "cancel": 1, "error": 1}
    assert sample(m, "vllm_omni:e2e_request_latency_s_count", model_name=model) == 5
    assert sample(m, "vllm_omni:e2e_request_latency_s_sum", model_name=model) == approx(2.4)
    # The token counters equal the tables' sums, aborted turns included.
    rows = list(r.turns.values())
    prompt = sum(stage(t, 0)["num_tokens_in"] for t in rows)
    generated = sum(s["num_tokens_out"] or 0 for t in rows for s in t["stages"])
    assert (prompt, generated) == (280, 62)
    assert sample(m, "vllm_omni:prompt_tokens_total", model_name=model) == prompt
    assert sample(m, "vllm_omni:generation_tokens_total", model_name=model) == generated
    # The two late terminals (#27, #36) are one warning each; no leak.
    assert r.audit["leaks"] == [] and r.audit_exit == 0
    assert [(w["kind"], w["first_position"], w["request_id"]) for w in r.audit["warnings"]] == [
        ("stale_finalize", 27, "resp-2"),
        ("stale_finalize", 36, "resp-3"),
    ]


# ---------------------------------------------------------------------------------- CASE-31
def bucket_counts(m: Samples, name: str, **labels: str) -> dict[float, float]:
    want = set(labels.items())
    return {
        float(dict(key)["le"]): value
        for (sample_name, key), value in m.items()
        if sample_name == f"{name}_bucket" and want <= set(key)
    }


def test_case_31_latency_histograms_are_observed_in_seconds(tmp_path, approx):
    r = run_cli("CASE-31", tmp_path)
    one, two = r.turns["U1/resp-1"], r.turns["U1/resp-2"]
    s0 = stage(one, 0)
    assert (one["e2e"]["e2e_total_ms"], s0["vllm_ttft_ms"], s0["vllm_tpot_ms"]) == (
        approx(1700.0),
        approx(95.0),
        pytest.approx(255 / 13, abs=1e-3),
    )
    s0 = stage(two, 0)
    assert (two["e2e"]["e2e_total_ms"], s0["vllm_ttft_ms"], s0["vllm_tpot_ms"]) == (
        approx(75000.0),
        approx(500.0),
        pytest.approx(69490 / 499, abs=1e-3),
    )
    m = metrics_of(url_of(tmp_path))
    model = "omni-test"
    e2e = "vllm_omni:e2e_request_latency_s"
    assert sample(m, f"{e2e}_count", model_name=model) == 2
    assert sample(m, f"{e2e}_sum", model_name=model) == approx(76.7)
    for le, count in bucket_counts(m, e2e, model_name=model).items():
        assert count == (0 if le < 1.7 else 1 if le < 75.0 else 2), le
    ttfp = "vllm_omni:audio_ttfp_s"
    assert sample(m, f"{ttfp}_count", model_name=model, stage="1") == 1  # resp-2 has no audio: no sample
    assert sample(m, f"{ttfp}_sum", model_name=model, stage="1") == approx(0.42)
    for le, count in bucket_counts(m, ttfp, model_name=model, stage="1").items():
        assert count == (0 if le < 0.42 else 1), le
    assert not [k for k, v in m.items() if k[0] == f"{ttfp}_count" and dict(k[1]).get("stage") != "1" and v]
    assert sample(m, "duplex_ledger:session_duration_s_count") == 1
    assert sample(m, "duplex_ledger:session_duration_s_sum") == approx(90.5)
    summary = runner.invoke(app, ["tables", "--db", url_of(tmp_path), "--summary"])
    assert summary.exit_code == 0, summary.output
    assert "420.000" in summary.stdout and "90,500.000" in summary.stdout


# ---------------------------------------------------------------------------------- CASE-33
def test_case_33_a_truncated_or_rolled_back_copy_fails_the_originals_digest(tmp_path):
    def db(name: str) -> str:
        return f"sqlite+aiosqlite:///{tmp_path / name}.db"

    def cli(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args))
        return result.exit_code, result.output

    def load(name: str, path: Path) -> None:
        assert cli("events", "import", str(path), "--db", db(name))[0] == 0

    a_lines = (FIELD_DIR / "CASE-33-A.jsonl").read_text().splitlines(keepends=True)
    assert len(a_lines) == 16
    (tmp_path / "t13.jsonl").write_text("".join(a_lines[:13]))
    load("A", FIELD_DIR / "CASE-33-A.jsonl")
    load("T", tmp_path / "t13.jsonl")
    load("B", FIELD_DIR / "CASE-33-B.jsonl")
    rc, out = cli("digest", "--db", db("A"))
    assert rc == 0 and json.loads(out)["position"] == 16
    (tmp_path / "dA.json").write_text(out)
    digest = str(tmp_path / "dA.json")
    assert cli("verify", "--db", db("A"), "--digest", digest)[0] == 0  # 1
    assert cli("verify", "--db", db("T"))[0] == 0  # 2: a chain alone cannot see a cut tail
    rc, out = cli("verify", "--db", db("T"), "--digest", digest)  # 3
    assert rc == 1 and "position 14" in out and "13" in out
    rc, out = cli("digest", "--db", db("T"))  # 4: its own head, never the original's
    assert rc == 0 and json.loads(out)["position"] == 13
    rc, out = cli("verify", "--db", db("B"), "--digest", digest)  # 5
    assert rc == 1 and "position 16" in out
    shutil.copy(tmp_path / "A.db", tmp_path / "G.db")  # 6: honest growth
    load("G", FIELD_DIR / "CASE-33-grow.jsonl")
    assert cli("verify", "--db", db("G"), "--digest", digest)[0] == 0
    shutil.copy(tmp_path / "A.db", tmp_path / "E.db")  # 7, 8: row 16 edited in place
    c = sqlite3.connect(tmp_path / "E.db")
    triggers = c.execute("select name, sql from sqlite_master where type='trigger' and tbl_name='events'").fetchall()
    for name, _ in triggers:
        c.execute(f'drop trigger "{name}"')
    c.execute("update events set data = replace(data, 'completed', 'cancelled') where position = 16")
    for _, sql in triggers:
        c.execute(sql)
    c.commit()
    c.close()
    assert cli("digest", "--db", db("E"))[0] != 0
    rc, out = cli("verify", "--db", db("E"), "--digest", digest)
    assert rc == 1 and "position 16" in out and "edited" in out


# ---------------------------------------------------------------------------------- CASE-37
def test_case_37_a_late_output_after_a_cancel_opens_no_phantom_response(tmp_path, approx):
    """D1/D9/D19: the begin #16 names the aborted X0 — it opens nothing (no resp-2 row), and its
    end #18 ends a response the session never held: one warning each for #15–#18."""
    r = run_cli("CASE-37", tmp_path)
    assert sorted(r.turns) == ["P1/resp-1", "P1/resp-3"]
    one, three = r.turns["P1/resp-1"], r.turns["P1/resp-3"]
    assert (one["finished_reason"], one["e2e"]["e2e_total_ms"]) == ("cancel", approx(900.0))
    assert (stage(one, 0)["num_tokens_in"], stage(one, 0)["num_tokens_out"], stage(one, 0)["vllm_ttft_ms"]) == (
        40,
        4,
        approx(190.0),
    )
    assert (three["finished_reason"], three["e2e"]["e2e_total_ms"]) == ("stop", approx(1250.0))
    assert three["arrival_ts_s"] == approx(72.0)
    s0 = stage(three, 0)
    assert (s0["num_tokens_in"], s0["num_tokens_out"], s0["vllm_ttft_ms"]) == (30, 10, approx(190.0))
    assert "response=resp-2" not in r.tables_text
    assert r.audit["leaks"] == [] and r.audit_exit == 0
    warned = [(w["first_position"], w["kind"]) for w in r.audit["warnings"]]
    assert [p for p, _ in warned] == [15, 16, 17, 18]
    assert kinds_at(r.audit["warnings"], 16) == {"begin_of_unheld_id"}
    assert kinds_at(r.audit["warnings"], 18) == {"stale_finalize"}
    m = metrics_of(url_of(tmp_path))
    counted = {
        reason: sample(m, "vllm_omni:requests_success_total", finished_reason=reason, model_name="omni-test")
        for reason in ("stop", "barge_in", "abort", "close", "cancel", "error")
    }
    assert counted == {"stop": 1, "cancel": 1, "barge_in": 0, "abort": 0, "close": 0, "error": 0}


# ---------------------------------------------------------------------------------- CASE-39
def test_case_39_an_unanswered_pool_keeps_the_id_leaked_and_visible_until_its_answer(tmp_path, approx):
    r = run_cli("CASE-39", tmp_path)
    url = url_of(tmp_path)
    x = "duplex-s.RDE.i.0.e.0.r.stage0_t0"
    one, two = r.turns["D1/resp-1"], r.turns["D2/resp-2"]
    assert (one["finished_reason"], one["e2e"]["e2e_total_ms"]) == ("close", approx(900.0))
    assert (stage(one, 0)["num_tokens_in"], stage(one, 0)["num_tokens_out"], stage(one, 1)["num_tokens_out"]) == (
        25,
        1,
        6,
    )
    assert (two["finished_reason"], two["e2e"]["e2e_total_ms"]) == ("stop", approx(500.0))
    at_11 = audit_at(url, 11)
    assert (at_11["held"], at_11["running"], at_11["leaks"]) == (1, 1, [])
    for position in (12, 24):
        audit = audit_at(url, position)
        assert (audit["held"], audit["running"]) == (1, 1), position
        assert [(f["stage_id"], f["request_id"]) for f in audit["leaks"]] == [(1, x)], position
        m = metrics_of(url, position)
        assert sample(m, "duplex_ledger:sessions_cleanup_pending") == 1, position
        assert sample(m, "duplex_ledger:request_ids_leaked") == 1, position
        assert not any(
            k[0] == "duplex_ledger:sessions_closed_total" and dict(k[1]).get("reason") == "disconnect" and v > 0
            for k, v in m.items()
        ), position  # D1 not yet counted as cleanly closed
    end = audit_at(url)
    assert (end["held"], end["running"], end["leaks"], end["warnings"]) == (0, 0, [], [])
    m = metrics_of(url)
    assert sample(m, "duplex_ledger:sessions_cleanup_pending") == 0
    assert sample(m, "duplex_ledger:request_ids_leaked") == 0
    assert sample(m, "duplex_ledger:sessions_closed_total", reason="disconnect") == 1
    assert sample(m, "duplex_ledger:sessions_closed_total", reason="timeout") == 1
    assert not math.isnan(sample(m, "duplex_ledger:session_duration_s_sum"))
