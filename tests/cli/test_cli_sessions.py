"""Finding things (issue 22): ``sessions`` lists a log's sessions; a wrong ``--session`` or
``--response`` is exit 2 naming the nearest ids; a SQLite URL with a host is exit 2 showing
the right form; ``--help`` keeps every default at 80 columns and imports no database layer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reports.cli import COMMANDS, app
from tests.cases.logbook import LOG_DIR

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


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


def _log_lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (LOG_DIR / f"{name}.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(
    "name", ["case-13-reasons", "case-06-v2-abort-failed", "case-01-running-gauge", "case-12-arrival", "worked-example"]
)
def test_sessions_lists_every_session_with_its_positions_turns_and_held_ids(ledger, name):
    url = ledger(name)
    doc = json.loads(run("sessions", "--db", url, "--format", "json").stdout)
    tables = json.loads(run("tables", "--db", url, "--format", "json").stdout)["turns"]
    lines = _log_lines(name)
    streams = sorted({line["stream"] for line in lines})
    assert [s["session_id"] for s in doc["sessions"]] == streams
    for s in doc["sessions"]:
        mine = [i for i, line in enumerate(lines, start=1) if line["stream"] == s["session_id"]]
        assert (s["first_position"], s["last_position"]) == (mine[0], mine[-1])
        assert (s["first_ts"], s["last_ts"]) == (lines[mine[0] - 1]["ts"], lines[mine[-1] - 1]["ts"])
        # turns: the session's turn tables as `tables` prints them, not its commits (a newcomer
        # saw 3 against 2 on one log); case-12-arrival has 2 commits and 3 tables
        assert s["turns"] == sum(t["session_id"] == s["session_id"] for t in tables)
        lifecycle = [lines[i - 1]["type"] for i in mine if lines[i - 1]["type"] in ("SessionOpened", "SessionClosed")]
        assert s["state"] == ("closed" if lifecycle[-1:] == ["SessionClosed"] else "open")  # a reopen is open
        audit = json.loads(run("audit", "--db", url, "--session", s["session_id"], "--format", "json").stdout)
        assert len(s["held"]) == audit["held"]
    text = run("sessions", "--db", url).stdout.splitlines()
    assert text[0].split()[:5] == ["session", "state", "replica", "turns", "held"]
    assert [line.split()[0] for line in text[1:]] == streams


def test_sessions_shows_held_ids_in_text(ledger):
    url = ledger("case-06-v2-abort-failed")
    held = json.loads(run("sessions", "--db", url, "--format", "json").stdout)["sessions"][0]["held"]
    assert held and held[0] in run("sessions", "--db", url).stdout


@pytest.mark.parametrize("command", ["audit", "tables", "timeline"])
def test_a_mistyped_session_is_exit_2_and_names_the_nearest(ledger, command, tmp_path):
    url = ledger("case-13-reasons")
    extra = ["--output", str(tmp_path / "t.html")] if command == "timeline" else []
    result = run(command, "--db", url, "--session", "S11", *extra)
    assert result.exit_code == 2
    if command != "timeline":  # timeline keeps its own message (not this helper's file)
        assert "did you mean 'S1'" in result.output


def test_a_session_nothing_resembles_points_at_the_sessions_command(ledger):
    result = run("audit", "--db", ledger("case-13-reasons"), "--session", "zzzzzzzz")
    assert result.exit_code == 2 and "`duplex-ledger sessions` lists them" in result.output


def test_a_response_the_log_does_not_hold_is_exit_2_like_a_session(ledger):
    url = ledger("case-13-reasons")
    result = run("tables", "--db", url, "--response", "resp-100")
    assert result.exit_code == 2
    assert "no response 'resp-100' in the log; did you mean 'resp-10'" in result.output
    other = run("tables", "--db", url, "--session", "S2", "--response", "resp-10")
    assert other.exit_code == 2 and "in session 'S2'" in other.output


@pytest.mark.parametrize("bad", ["sqlite+aiosqlite://x/y/z.db", "sqlite+aiosqlite://user@host/l.db"])
@pytest.mark.parametrize("command", [["db", "upgrade"], ["audit"], ["sessions"]])
def test_a_sqlite_url_with_a_host_is_exit_2_with_the_right_form(tmp_path, monkeypatch, bad, command):
    monkeypatch.chdir(tmp_path)  # restored after the test: later tests run from the repository
    result = run(*command, "--db", bad)
    assert result.exit_code == 2, result.output
    assert "sqlite+aiosqlite:////ABSOLUTE/PATH.db" in result.output
    assert list(tmp_path.iterdir()) == []  # nothing was created


def _cli(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": str(ROOT)}
    code = "import sys; from reports.cli import main; sys.argv[0] = 'duplex-ledger'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("command", [[], ["audit"], ["tables"], ["demo"], ["events", "tail"], ["sessions"]])
def test_help_at_80_columns_keeps_every_default_whole(command):
    out = _cli(*command, "--help").stdout
    assert out and max(map(len, out.splitlines())) <= 80
    assert "…" not in out
    if command:
        assert "sqlite+aiosqlite:///./duplex-ledger.db" in " ".join(out.split())


def test_no_command_shows_the_help_on_stderr_and_exits_2():
    """``duplex-ledger`` alone printed nothing at all and exited 2 (hostile): click raises its
    help as an error when not in standalone mode, and the entry point dropped it."""
    out = _cli()
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("Usage: duplex-ledger") and all(f"  {name}" in out.stderr for name in COMMANDS)


def test_help_lists_every_command_without_importing_them():
    code = (
        "import sys; from reports.cli import app; from typer.testing import CliRunner; "
        "r = CliRunner().invoke(app, ['--help']); "
        "print(r.exit_code, sorted(m for m in sys.modules if m.split('.')[0] in "
        "('sqlalchemy', 'vllm', 'torch', 'engine_bridge', 'pydantic', 'alembic')))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60).stdout
    assert out.strip() == "0 []"
    listed = _cli("--help").stdout
    assert all(f"  {name}" in listed for name in COMMANDS)
