"""``audit``, ``tables`` and ``rebuild`` on case logs imported as JSONL through the CLI."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reports.cli import app
from tests.cases.logbook import LOG_DIR, LOGS
from tests.cases.test_case_01_running_gauge import build as case_01
from tests.logbuilder import eph

GOLDEN = Path(__file__).parents[1] / "tables" / "golden" / "worked-example.txt"
runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture
def ledger(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}/ledger.db"
    assert run("db", "upgrade", "--db", url).exit_code == 0

    def load(name: str) -> str:
        result = run("events", "import", str(LOG_DIR / f"{name}.jsonl"), "--db", url)
        assert result.exit_code == 0, result.output
        return url

    return load


@pytest.mark.parametrize("name", sorted(LOGS))
def test_committed_logs_match_their_builders(name):
    assert (LOG_DIR / f"{name}.jsonl").read_text() == LOGS[name]().jsonl()


def test_worked_example_tables_text_is_golden(ledger):
    url = ledger("worked-example")
    result = run("tables", "--db", url)
    assert result.exit_code == 0
    assert result.output == GOLDEN.read_text()


def test_tables_formats_carry_the_same_numbers(ledger):
    url = ledger("case-09-barge-in")
    data = json.loads(run("tables", "--db", url, "--format", "json").output)
    rows = {t["response_id"]: t for t in data["turns"]}
    assert rows["resp-2"]["finished_reason"] == "barge_in"
    assert rows["resp-2"]["stages"][0]["vllm_ttft_ms"] is None
    assert rows["resp-3"]["stages"][0]["vllm_ttft_ms"] == pytest.approx(280.0, abs=1e-3)
    csv_out = run("tables", "--db", url, "--format", "csv").output
    assert "resp-3" in csv_out and "vllm_ttft_ms" in csv_out
    md = run("tables", "--db", url, "--format", "markdown", "--response", "resp-3").output
    assert "resp-3" in md and "resp-2" not in md


def test_audit_clean_exits_zero(ledger):
    url = ledger("case-06-main")
    result = run("audit", "--db", url, "--format", "json")
    assert result.exit_code == 0
    assert json.loads(result.output)["leaks"] == []


def test_audit_leak_exits_one_with_evidence(ledger):
    url = ledger("case-06-v1-downstream-left")
    result = run("audit", "--db", url, "--format", "json")
    assert result.exit_code == 1
    (leak,) = json.loads(result.output)["leaks"]
    assert (leak["session_id"], leak["stage_id"], leak["kind"]) == ("S1", 1, "downstream_left_after_abort")
    assert leak["evidence_positions"]
    text = run("audit", "--db", url).output
    assert "downstream_left_after_abort" in text and "LEAKS FOUND" in text


def test_audit_time_travel_checkpoint_a_and_b(ledger):
    url = ledger("case-01-running-gauge")
    _, _, checkpoint_a = case_01()
    a = run("audit", "--db", url, "--format", "json", "--until-position", str(checkpoint_a))
    assert a.exit_code == 1
    report = json.loads(a.output)
    assert report["running"] == 1
    assert [(leak["session_id"], leak["request_id"], leak["kind"]) for leak in report["leaks"]] == [
        ("S4", eph("S4", 0), "abort_failed")
    ]
    b = run("audit", "--db", url, "--format", "json")
    assert b.exit_code == 0 and json.loads(b.output)["running"] == 0


def test_audit_session_filter_and_max_idle(ledger):
    url = ledger("case-06-v2-abort-failed")
    assert run("audit", "--db", url, "--session", "S1").exit_code == 1


@pytest.mark.parametrize("command", ["audit", "tables"])
def test_a_session_the_log_does_not_hold_is_a_usage_error(ledger, command):
    """A mistyped --session must not read as a clean audit (a deployment gate) or no tables."""
    url = ledger("case-06-v2-abort-failed")
    result = run(command, "--db", url, "--session", "S1-typo")
    assert result.exit_code == 2
    assert "no session 'S1-typo' in the log" in result.output


def test_tables_refuses_a_response_the_log_does_not_hold(ledger):
    """Like a mistyped --session (issue 22): exit 2, the nearest response ids named."""
    url = ledger("case-12-arrival")
    result = run("tables", "--db", url, "--response", "resp-none", "--format", "json")
    assert result.exit_code == 2 and result.stdout == ""
    assert "no response 'resp-none' in the log" in result.stderr


@pytest.mark.parametrize("workers", [[], ["--workers", "1"], ["--workers", "2"]])
def test_rebuild_then_tables_and_audit_identical(ledger, workers):
    url = ledger("case-06-v2-abort-failed")
    before = run("tables", "--db", url).output, run("audit", "--db", url, "--format", "json").output
    result = run("rebuild", "--db", url, "--quiet", *workers)
    assert result.exit_code == 0 and result.output == ""  # --quiet: no bar and no closing line (L17)
    assert (run("tables", "--db", url).output, run("audit", "--db", url, "--format", "json").output) == before


@pytest.mark.parametrize("command", ["audit", "tables", "rebuild"])
def test_a_missing_ledger_file_is_a_data_error_and_nothing_is_created(tmp_path, command):
    missing = tmp_path / "no-such-dir" / "missing.db"
    result = run(command, "--db", f"sqlite+aiosqlite:///{missing}")
    assert result.exit_code == 2
    assert "no such ledger file" in result.output and str(missing) in result.output
    assert not missing.parent.exists()


@pytest.mark.parametrize("absolute_exists", [True, False])
def test_a_relative_ledger_path_whose_absolute_reading_exists_gets_a_four_slash_hint(
    tmp_path, monkeypatch, absolute_exists
):
    """``sqlite+aiosqlite:///tmp/x.db`` names ``tmp/x.db`` under the working directory; when
    that is missing but ``/tmp/x.db`` exists, the error says so (four slashes)."""
    absolute = tmp_path / "x.db"
    if absolute_exists:
        absolute.write_bytes(b"")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    relative = str(absolute).lstrip("/")
    result = run("audit", "--db", f"sqlite+aiosqlite:///{relative}")
    assert result.exit_code == 2 and f"no such ledger file {relative!r}" in result.output
    hint = f"did you mean sqlite+aiosqlite:///{absolute} (four slashes for an absolute path)?"
    assert (hint in result.output) is absolute_exists, result.output
    assert not (cwd / relative).exists() and list(cwd.iterdir()) == []  # nothing was created


def test_rebuild_rejects_unknown_projection(ledger):
    url = ledger("case-12-arrival")
    assert run("rebuild", "--db", url, "--projection", "nope").exit_code == 2
