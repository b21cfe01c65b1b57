"""issue 16: the [DuplexSessionSummary] rollup through ``tables --summary`` (text and JSON)."""

import json
import subprocess
import sys

from typer.testing import CliRunner

from reports.cli import app
from tests.logbuilder import LogBuilder, eph
from tests.metrics.test_metrics_fold import S, opened, turn

runner = CliRunner()


def ledger(tmp_path, b) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path}/ledger.db"
    path = tmp_path / "log.jsonl"
    path.write_text(b.jsonl())
    assert runner.invoke(app, ["events", "import", str(path), "--db", url]).exit_code == 0
    return url


def closed_session_log() -> LogBuilder:
    b = LogBuilder()
    opened(b, ts=0.0)
    turn(b, 0, "stop", t0=10.0, audio_at=0.3)
    turn(b, 1, "barge_in", t0=20.0, audio_at=0.5)
    x = eph(S, 2)  # a turn left held at close: a leak the summary names
    b.add("StageRequestReserved", S, 25.0, stage_id=0, request_id=x)
    b.add("StageRequestSubmitted", S, 25.1, stage_id=0, request_id=x)
    b.add("SessionClosed", S, 30.0, reason="session_close")
    return b


def test_text_summary_follows_the_turn_tables_and_plain_tables_are_unchanged(tmp_path):
    url = ledger(tmp_path, closed_session_log())
    plain = runner.invoke(app, ["tables", "--db", url])
    with_summary = runner.invoke(app, ["tables", "--db", url, "--summary"])
    assert plain.exit_code == with_summary.exit_code == 0
    assert with_summary.output.startswith(plain.output)
    rest = with_summary.output[len(plain.output) :].splitlines()
    assert rest[0] == "[DuplexSessionSummary [session=s1 reason=session_close model=smollm2]]"
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in rest[4:-1]}
    assert rows["turns_total"] == "2" and rows["turns_stop"] == "1" and rows["turns_barge_in"] == "1"
    assert rows["audio_ttfp_ms_count"] == "2" and rows["audio_ttfp_ms_p50"] == "300.000"
    assert rows["audio_ttfp_ms_p99"] == "500.000" and rows["session_wall_ms"] == "30,000.000"
    assert rows["request_ids_leaked"] == "1" and rows["leaked_request_id"] == eph(S, 2)


def test_json_summary_row(tmp_path):
    url = ledger(tmp_path, closed_session_log())
    result = runner.invoke(app, ["tables", "--db", url, "--summary", "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert len(doc["turns"]) == 2
    (row,) = doc["sessions"]
    assert row["turns"] == {"total": 2, "stop": 1, "barge_in": 1, "cancel": 0, "close": 0, "abort": 0, "error": 0}
    assert row["audio_ttfp_ms"] == {"count": 2, "mean": 400.0, "p50": 300.0, "p99": 500.0}
    assert row["vllm_tpot_ms"]["count"] == 0 and row["vllm_tpot_ms"]["mean"] is None
    assert row["listen_units"] == 0 and row["session_wall_ms"] == 30000.0
    assert row["leaked_request_ids"] == [eph(S, 2)]


def test_summary_refuses_csv(tmp_path):
    url = ledger(tmp_path, closed_session_log())
    assert runner.invoke(app, ["tables", "--db", url, "--summary", "--format", "csv"]).exit_code == 2


def test_summary_does_not_import_engine_bridge(tmp_path):
    """issue 23 step 3: ``tables --summary`` folds the log once in reports/projections; a fresh
    interpreter running it holds no ``engine_bridge`` module afterwards (and did print the
    summary, so the check saw the path that builds it)."""
    url = ledger(tmp_path, closed_session_log())
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from reports.cli import app\n"
        f"r = CliRunner().invoke(app, ['tables', '--db', {url!r}, '--summary'])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert 'DuplexSessionSummary [session=' in r.output, r.output\n"
        "print(sorted(m for m in sys.modules if m == 'engine_bridge' or m.startswith('engine_bridge.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
