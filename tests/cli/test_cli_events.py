"""``duplex-ledger events import|export|tail`` and the JSONL format."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from tests.cli.conftest import Cli

GOOD = [
    {"stream": "S1", "type": "SessionOpened", "ts": 1757000000.5, "data": {"auto_response": True}},
    {"stream": "S1", "type": "TurnCommitted", "ts": "2025-09-04T23:33:40+08:00", "data": {"turn_id": 0}},
    {
        "stream": "sess/ü:1.2",
        "type": "StageOutput",
        "ts": 1757000020.850001,
        "data": {"stage_id": 0, "request_id": "duplex-s.czE.i.0.e.0.r.stage0_t0", "text_delta": "héllo"},
    },
    {
        "stream": "S1",
        "type": "StageRequestSubmitted",
        "ts": 1757000021,
        "schema_version": 1,
        "data": {"stage_id": 0, "request_id": "duplex-s.UzE.i.0.e.0.r.stage0_t0", "tokens_in": 12},
    },
    {
        "stream": "S1",
        "type": "ResponseEnded",
        "ts": "2025-09-04T15:33:40+00:00",
        "data": {"response_id": "resp-2", "status": "completed"},
    },
]


def write_jsonl(path: Path, objs: list[dict] | list[str]) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for o in objs:
            fh.write((o if isinstance(o, str) else json.dumps(o, ensure_ascii=False)) + "\n")
    return path


def with_ids(objs: list[dict]) -> list[dict]:
    return [{**o, "event_id": str(uuid.UUID(int=i + 1))} for i, o in enumerate(objs)]


def test_export_import_export_is_byte_identical(cli: Cli, tmp_path: Path, sqlite_url: str) -> None:
    """Source on the parametrised backend, copy on SQLite (and vice versa for [postgresql])."""
    src = write_jsonl(tmp_path / "in.jsonl", GOOD)
    assert cli("db", "upgrade").exit_code == 0
    assert cli("events", "import", str(src)).exit_code == 0
    first = cli("events", "export")
    assert first.exit_code == 0 and len(first.output.splitlines()) == 5

    copy = Cli(sqlite_url if cli.url != sqlite_url else f"sqlite+aiosqlite:///{tmp_path / 'copy.db'}")
    assert copy("db", "upgrade").exit_code == 0
    exported = tmp_path / "export.jsonl"
    exported.write_text(first.output, encoding="utf-8")
    r = copy("events", "import", str(exported))
    assert r.exit_code == 0 and "imported 5 event(s)" in r.output
    second = copy("events", "export", "--output", str(tmp_path / "again.jsonl"))
    assert second.exit_code == 0
    assert (tmp_path / "again.jsonl").read_bytes() == first.output.encode("utf-8")


def test_import_into_a_new_sqlite_file_creates_the_ledger(tmp_path: Path) -> None:
    """The README's offline path: export, then import into a file that does not exist yet."""
    target = tmp_path / "copies" / "copy.db"
    copy = Cli(f"sqlite+aiosqlite:///{target}")
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{not json"])
    assert copy("events", "import", str(bad)).exit_code == 2
    assert not target.exists()  # a rejected file creates nothing
    r = copy("events", "import", str(write_jsonl(tmp_path / "in.jsonl", GOOD)))
    assert r.exit_code == 0 and "imported 5 event(s)" in r.output
    assert len(copy("events", "export").output.splitlines()) == 5


def test_export_format(cli: Cli, tmp_path: Path) -> None:
    cli("db", "upgrade")
    cli("events", "import", str(write_jsonl(tmp_path / "in.jsonl", GOOD)))
    lines = cli("events", "export").output.splitlines()
    first = json.loads(lines[1])
    assert list(first) == [
        "position",
        "stream",
        "version",
        "type",
        "event_id",
        "schema_version",
        "ts",
        "recorded_at",
        "data",
        "hash",
    ]
    assert (first["position"], first["stream"], first["version"]) == (2, "S1", 2)
    assert '"ts":1757000020.000000,' in lines[1]  # +08:00 normalised to UTC, exact decimals
    assert '"ts":1757000020.850001,' in lines[2] and "sess/ü:1.2" in lines[2]
    v1 = json.loads(lines[3])
    assert v1["schema_version"] == 1 and v1["data"]["tokens_in"] == 12  # kept as stored
    assert json.loads(lines[0])["data"]["auto_response"] is True


def test_bad_lines_are_all_reported_and_nothing_is_imported(sqlite_cli: Cli, tmp_path: Path) -> None:
    sqlite_cli("db", "upgrade")
    lines = [
        json.dumps(GOOD[0]),
        json.dumps({"stream": "S1", "type": "StageOutput", "ts": 1.0, "data": {"stage_id": "x", "request_id": "r"}}),
        "{not json",
        json.dumps({"stream": "S1", "type": "Bogus", "ts": 1.0, "data": {}}),
        json.dumps({"stream": "S1", "type": "TurnCommitted", "data": {"turn_id": 1}}),
        json.dumps({"stream": "S1", "type": "TurnCommitted", "ts": "yesterday", "data": {"turn_id": 1}}),
        json.dumps({"stream": "S1", "type": "TurnCommitted", "ts": 1.0, "data": {"turn_id": 1, "colour": "red"}}),
        json.dumps(GOOD[1]),
    ]
    r = sqlite_cli("events", "import", str(write_jsonl(tmp_path / "bad.jsonl", lines)))
    assert r.exit_code == 2
    out = r.output
    assert "line 2: StageOutput.stage_id: Input should be a valid integer" in out and "(got 'x')" in out
    assert "line 3: not valid JSON" in out
    assert "line 4: type: unknown event type 'Bogus'" in out
    assert "line 5: ts: missing" in out
    assert "line 6: TurnCommitted.ts:" in out and "yesterday" in out
    assert "line 7: TurnCommitted.colour: Extra inputs are not permitted" in out
    assert "line 1:" not in out and "line 8:" not in out
    assert "0 imported, 0 already present, 6 refused (line(s) 2-7), 2 valid held back; nothing was imported" in out
    assert sqlite_cli("events", "export").output == ""


def test_the_import_summary_counts_lines_not_errors(sqlite_cli: Cli, tmp_path: Path) -> None:
    """A line with several errors is one refused line; every line read is accounted for
    (hostile retest of issue 23: 19 lines were summed up as '150 bad line(s)')."""
    sqlite_cli("db", "upgrade")
    lines = [
        json.dumps(GOOD[0]),
        json.dumps({"t": 1, "session": "S1", "mode": "x", "type": "session.open"}),  # five errors, one line
        "",
        json.dumps(GOOD[1]),
        json.dumps({"stream": "S1", "type": "Bogus", "ts": 1.0, "data": {}}),
    ]
    r = sqlite_cli("events", "import", str(write_jsonl(tmp_path / "bad.jsonl", lines)))
    assert r.exit_code == 2
    errors = [line for line in r.output.splitlines() if line.startswith("line 2:")]
    assert len(errors) > 1  # the line's errors are still each named
    last = r.output.splitlines()[-1]
    assert last.startswith(f"5 line(s) read from {tmp_path / 'bad.jsonl'}: 0 imported, 0 already present, 2 refused")
    assert "(line(s) 2, 5), 2 valid held back, 1 blank; nothing was imported" in last


def test_a_clean_import_counts_its_lines(sqlite_cli: Cli, tmp_path: Path) -> None:
    cli = sqlite_cli
    cli("db", "upgrade")
    src = write_jsonl(
        tmp_path / "in.jsonl", [*map(json.dumps, with_ids(GOOD[:2])), "", *map(json.dumps, with_ids(GOOD)[2:])]
    )
    first = cli("events", "import", str(src))
    assert first.exit_code == 0
    assert f"imported 5 event(s) from {src} (0 already present, 0 refused; 6 line(s) read, 1 blank)" in first.output
    again = cli("events", "import", str(src))
    assert f"imported 0 event(s) from {src} (5 already present, 0 refused; 6 line(s) read, 1 blank)" in again.output


def test_reimport_is_idempotent(cli: Cli, tmp_path: Path) -> None:
    cli("db", "upgrade")
    src = write_jsonl(tmp_path / "in.jsonl", with_ids(GOOD))
    assert "imported 5 event(s)" in cli("events", "import", str(src)).output
    r = cli("events", "import", str(src))
    assert r.exit_code == 0 and "imported 0 event(s)" in r.output and "5 already present" in r.output
    assert len(cli("events", "export").output.splitlines()) == 5


def test_version_conflict_imports_nothing(sqlite_cli: Cli, tmp_path: Path) -> None:
    sqlite_cli("db", "upgrade")
    sqlite_cli("events", "import", str(write_jsonl(tmp_path / "a.jsonl", GOOD[:2])))
    clash = [{**GOOD[4], "version": 1}, {**GOOD[0], "stream": "S9"}]
    r = sqlite_cli("events", "import", str(write_jsonl(tmp_path / "b.jsonl", clash)))
    assert r.exit_code == 2 and "stream 'S1': expected version 0, but it is at version 2" in r.output
    assert len(sqlite_cli("events", "export").output.splitlines()) == 2


def test_export_filters(sqlite_cli: Cli, tmp_path: Path) -> None:
    sqlite_cli("db", "upgrade")
    sqlite_cli("events", "import", str(write_jsonl(tmp_path / "in.jsonl", GOOD)))
    s1 = sqlite_cli("events", "export", "--stream", "S1").output.splitlines()
    assert [json.loads(x)["position"] for x in s1] == [1, 2, 4, 5]
    tail = sqlite_cli("events", "export", "--from-position", "4").output.splitlines()
    assert [json.loads(x)["position"] for x in tail] == [4, 5]


def test_export_output_dash_is_stdout_not_a_file_named_dash(sqlite_cli: Cli, tmp_path: Path, monkeypatch) -> None:
    """`-o -` is standard output, as for `timeline` (hostile retest of issue 23: a file named '-')."""
    sqlite_cli("db", "upgrade")
    sqlite_cli("events", "import", str(write_jsonl(tmp_path / "in.jsonl", GOOD)))
    monkeypatch.chdir(tmp_path)
    dashed = sqlite_cli("events", "export", "-o", "-")
    assert dashed.exit_code == 0
    assert dashed.stdout == sqlite_cli("events", "export").stdout != ""
    assert not (tmp_path / "-").exists()


def test_tail_follows_and_exits_cleanly_on_ctrl_c(sqlite_cli: Cli, tmp_path: Path) -> None:
    sqlite_cli("db", "upgrade")
    sqlite_cli("events", "import", str(write_jsonl(tmp_path / "a.jsonl", GOOD[:1])))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reports.cli",
            "events",
            "tail",
            "--from-position",
            "1",
            "--poll-interval",
            "0.05",
            "--db",
            sqlite_cli.url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert json.loads(proc.stdout.readline())["position"] == 1  # catch-up
        sqlite_cli("events", "import", str(write_jsonl(tmp_path / "b.jsonl", GOOD[1:3])))
        assert json.loads(proc.stdout.readline())["position"] == 2  # live, written by another process
        assert json.loads(proc.stdout.readline())["position"] == 3  # observed: it is following
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0  # a bound for a loaded machine, not a wait (issue 22)
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_import_dash_reads_standard_input_piped_from_an_export(sqlite_cli: Cli, tmp_path: Path) -> None:
    """``events export | events import -`` copies a ledger (the hostile pass: ``-`` was refused
    as "file '-' does not exist"); a re-import through the pipe stores nothing again, a bad
    line on standard input is refused naming its line, and the summary names the source."""
    sqlite_cli("db", "upgrade")
    sqlite_cli("events", "import", str(write_jsonl(tmp_path / "in.jsonl", GOOD)))
    exported = sqlite_cli("events", "export").stdout
    copy_url = f"sqlite+aiosqlite:///{tmp_path / 'copy.db'}"

    def import_stdin(text: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "reports.cli", "events", "import", "-", "--db", copy_url]
        return subprocess.run(command, input=text, capture_output=True, text=True, timeout=120)

    first = import_stdin(exported)
    assert first.returncode == 0, first.stderr
    assert "imported 5 event(s) from standard input" in first.stdout + first.stderr
    assert import_stdin(exported).returncode == 0
    copied = subprocess.run(
        [sys.executable, "-m", "reports.cli", "events", "export", "--db", copy_url],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert [json.loads(x)["event_id"] for x in copied.splitlines()] == [
        json.loads(x)["event_id"] for x in exported.splitlines()
    ]
    refused = import_stdin('{"bad": 1}\n')
    assert refused.returncode == 2 and "line 1: bad: unknown field" in refused.stderr
    assert "from standard input" in refused.stderr


def test_import_dash_with_standard_input_closed_is_refused_clearly(tmp_path: Path) -> None:
    """``events import - <&-`` (hostile pass): Python sets ``sys.stdin`` to None, and the import
    failed with ``AttributeError: 'NoneType' object has no attribute 'buffer'`` (exit 1); it is
    refused saying standard input is closed (exit 2), and no ledger file is created."""
    db = tmp_path / "new.db"
    command = [sys.executable, "-m", "reports.cli", "events", "import", "-", "--db", f"sqlite+aiosqlite:///{db}"]
    done = subprocess.run(
        command, stdin=None, capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.close(0)
    )
    assert done.returncode == 2, done.stderr
    assert "standard input is closed" in done.stderr and "AttributeError" not in done.stderr
    assert not db.exists()
