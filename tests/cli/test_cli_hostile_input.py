"""Hostile input at the CLI boundary: ids that carry terminal controls, out-of-range numbers and
URL parameters that only fail deep inside a driver. Each is refused (exit 2, one line naming
the field) or shown escaped; JSON keeps the exact value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from events.store.sqlite_schema import SQLITE_TRIGGERS
from reports.cli import app
from reports.printable import printable
from tests.cli.conftest import Cli
from tests.cli.test_cli_events import write_jsonl

CASE_18 = Path(__file__).parents[1] / "cases" / "field" / "CASE-18.jsonl"
UNSAFE = st.sampled_from(["\x1b[31m", "\x07", "\x9b", "\r", "\n", "\t", "\x7f", "\u202e", "\u2066", "\u2028"])


def _unsafe_chars(text: str) -> list[str]:
    return [ch for ch in text if not ch.isprintable() and ch != "\n"]


def _case_18_as(session_id: str, tmp_path: Path) -> Path:
    lines = [json.loads(x) for x in CASE_18.read_text(encoding="utf-8").splitlines() if x.strip()]
    for obj in lines:
        obj.pop("hash", None)  # the chain covers the stream id: a renamed copy is a new log
        obj["stream"] = session_id
    return write_jsonl(tmp_path / "renamed.jsonl", lines)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=4), bad=UNSAFE)
def test_a_session_id_with_terminal_controls_is_printed_escaped(tmp_path_factory, prefix: str, bad: str) -> None:
    tmp = tmp_path_factory.mktemp("hostile")
    cli = Cli(f"sqlite+aiosqlite:///{tmp / 'ledger.db'}")
    session_id = f"S{prefix}{bad}x"
    assert cli("events", "import", str(_case_18_as(session_id, tmp))).exit_code == 0
    for args in (
        ("tables",),
        ("tables", "--summary"),
        ("tables", "--format", "markdown"),
        ("tables", "--format", "csv"),
        ("audit",),
    ):
        out = cli(*args).output
        assert not _unsafe_chars(out), (args, out)
    assert printable(session_id) in cli("tables", "--summary").output
    turns = json.loads(cli("tables", "--format", "json").output)["turns"]
    assert {t["session_id"] for t in turns} == {session_id}  # JSON keeps the exact id


def test_printable_keeps_ordinary_text_and_escapes_each_control() -> None:
    assert printable("sess/ü:1.2 — ok") == "sess/ü:1.2 — ok"
    assert printable("a\x1b[0mb\u202ec\x9b") == "a\\x1b[0mb\\u202ec\\x9b"


@pytest.mark.parametrize("option", ["--until-position"])
@pytest.mark.parametrize("command", ["tables", "audit", "metrics"])
def test_a_position_beyond_64_bits_is_a_usage_error(sqlite_cli: Cli, command: str, option: str) -> None:
    sqlite_cli("db", "upgrade")
    r = sqlite_cli(command, option, str(2**63))
    assert r.exit_code == 2 and option in r.output
    assert sqlite_cli(command, option, str(2**63 - 1)).exit_code in (0, 1)  # accepted (1: audit's leaks)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("nan", "'nan' is not a finite number"),
        ("inf", "'inf' is not a finite number"),
        ("-inf", "'-inf' is not a finite number"),
        ("1e400", "'1e400' is not a finite number"),
        ("-1", "'-1' is not in the range 0<=x<=31622400"),
        ("31622401", "'31622401' is not in the range 0<=x<=31622400"),
    ],
)
@pytest.mark.parametrize("command", ["audit", "metrics"])
def test_max_idle_must_be_a_finite_duration(sqlite_cli: Cli, command: str, value: str, says: str) -> None:
    """A non-finite --max-idle is named as such, with the value as typed (hostile retest of
    issue 23: 'nan' was told it 'should be less than or equal to 31622400')."""
    sqlite_cli("db", "upgrade")
    r = sqlite_cli(command, "--max-idle", value)
    assert r.exit_code == 2
    assert f"Invalid value for '--max-idle': {says}" in r.output
    assert "less than or equal" not in r.output


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--speed", "nan"],
        ["demo", "--speed", "0"],
        ["demo", "--metrics-linger-s", "inf"],
        ["serve", "--idle-timeout-s", "nan"],
    ],
)
def test_other_durations_must_be_finite_too(tmp_path: Path, args: list[str]) -> None:
    """Refused before anything starts (a nan --speed passed ``speed <= 0``)."""
    r = CliRunner().invoke(app, [*args, "--db", f"sqlite+aiosqlite:///{tmp_path / 'never.db'}"])
    assert r.exit_code == 2
    assert f"Invalid value for '{args[1]}': '{args[2]}' is not" in r.output
    assert not (tmp_path / "never.db").exists()


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("sqlite+aiosqlite:///{tmp}/x.db?sslmode=bogus", "takes no query parameter but synchronous"),
        ("postgresql+asyncpg://u:secret@127.0.0.1:99999/x", "port 99999"),
        ("postgresql+asyncpg://u:secret@127.0.0.1:5432/x?sslmode=require", "ssl=<mode>"),
        ("postgresql+asyncpg://u:secret@127.0.0.1:5432/x?ssl=bogus", "ssl='bogus'"),
        ("postgresql+asyncpg://u:secret@127.0.0.1:5432/x?colour=red", "'colour'"),
        ("postgresql+asyncpg://u:secret@[bad/x", "host '[bad' is neither a host name nor an IP address"),
        ("postgresql+asyncpg://u:secret@ho st/x", "host 'ho st'"),
    ],
)
def test_url_parameters_a_driver_would_refuse_are_usage_errors(tmp_path: Path, url: str, names: str) -> None:
    r = Cli(url.format(tmp=tmp_path))("audit")
    assert r.exit_code == 2, r.output
    assert names in r.output and "secret" not in r.output
    assert not (tmp_path / "x.db").exists()


def test_export_of_an_unknown_stream_is_an_error_not_an_empty_file(sqlite_cli: Cli, tmp_path: Path) -> None:
    sqlite_cli("events", "import", str(CASE_18))
    r = sqlite_cli("events", "export", "--stream", "nosuch")
    assert r.exit_code == 2 and "no session 'nosuch'" in r.output
    assert sqlite_cli("events", "export", "--stream", "S1").output.count("\n") == 23


def test_an_unwritable_export_output_names_the_option_not_the_database(sqlite_cli: Cli, tmp_path: Path) -> None:
    sqlite_cli("events", "import", str(CASE_18))
    target = tmp_path / "no" / "such" / "dir" / "out.jsonl"
    r = sqlite_cli("events", "export", "--output", str(target))
    assert r.exit_code == 2, r.output
    assert "--output" in r.output and "cannot write" in r.output and "sqlite" not in r.output
    assert sqlite_cli("events", "export").output.count("\n") > 0  # the ledger is untouched


def test_verify_of_a_missing_ledger_names_the_file_not_an_exception_class(tmp_path: Path) -> None:
    for command in ("verify", "digest"):
        r = Cli(f"sqlite+aiosqlite:///{tmp_path / 'missing.db'}")(command)
        assert r.exit_code == 2 and "no such ledger file" in r.output and "LedgerNotFound" not in r.output


@pytest.mark.parametrize(
    ("url", "secrets"),
    [
        ("postgresql+asyncpg://u:Zq9@tailsecret@127.0.0.1:1/db", ("Zq9", "tailsecret")),
        ("postgresql+asyncpg://u:Zq9@ta:il/secret77@127.0.0.1:1/db", ("Zq9", "secret77", "ta:il")),
        ("postgresql+asyncpg://u:pw12345@127.0.0.1:1/db?password=qpSecret1", ("pw12345", "qpSecret1")),
    ],
)
def test_no_part_of_a_password_is_printed_even_when_it_is_not_encoded(url: str, secrets: tuple[str, ...]) -> None:
    """README: a database password is never printed. An unencoded '@', ':' or '/' in it used to
    leave its tail in clear (as the "host"); a password= query parameter was quoted as typed."""
    r = Cli(url)("audit")
    assert r.exit_code == 2, r.output
    assert not [s for s in secrets if s in r.output], r.output


def test_the_documented_end_of_the_ts_range_is_accepted():
    """D12's range ends at 9999-12-31T23:59:59.999999Z: that spelling is inside it (it maps to
    the largest float still in range); one µs later is refused."""
    from events.limits import MAX_TS_US
    from events.types import ts_from_any, ts_to_us

    assert ts_to_us(ts_from_any("9999-12-31T23:59:59.999999+00:00")) <= MAX_TS_US
    with pytest.raises(ValueError, match="outside"):
        ts_from_any("9999-12-31T23:59:59.999999-00:01")


def test_an_id_that_would_be_a_spreadsheet_formula_is_text_in_csv(tmp_path: Path) -> None:
    import csv
    import io

    cli = Cli(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    session_id = '=HYPERLINK("http://x","a,b")'
    assert cli("events", "import", str(_case_18_as(session_id, tmp_path))).exit_code == 0
    rows = list(csv.DictReader(io.StringIO(cli("tables", "--format", "csv").output)))
    assert rows and {r["session_id"] for r in rows} == {"'" + session_id}
    turns = json.loads(cli("tables", "--format", "json").output)["turns"]
    assert {t["session_id"] for t in turns} == {session_id}


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["audit", "--max-idle", "-5"], "--max-idle"),
        (["audit", "--format", "xml"], "--format"),
        (["audit", "--bogus"], "--bogus"),
        (["nosuch"], "nosuch"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(tmp_path: Path, args: list[str], names: str) -> None:
    """README: one line per problem on stderr — usage errors too (the console entry point, not
    click's multi-line box)."""
    import subprocess
    import sys

    db = ["--db", f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"] if args[0] == "audit" else []
    r = subprocess.run([sys.executable, "-m", "reports.cli", *args, *db], capture_output=True, text=True)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], r.stderr


@pytest.mark.parametrize("where", ["top", "data"])
def test_a_line_with_a_repeated_key_is_refused_by_name(tmp_path: Path, where: str) -> None:
    """Python keeps the last of a repeated JSON key, other parsers the first: such a line
    would read differently elsewhere, so import refuses it (exit 2, line and key named)."""
    if where == "top":
        line = '{"stream":"S1","type":"SessionOpened","ts":1.0,"data":{},"stream":"S2"}'
    else:
        line = '{"stream":"S1","type":"SessionOpened","ts":1.0,"data":{"log_stats":true,"log_stats":false}}'
    path = tmp_path / "dup.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    r = Cli(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")("events", "import", str(path))
    assert r.exit_code == 2 and "line 1" in r.output and "appears twice" in r.output
    assert not (tmp_path / "x.db").exists()


def test_until_position_past_the_head_reports_the_head(sqlite_cli: Cli) -> None:
    sqlite_cli("events", "import", str(CASE_18))
    past = sqlite_cli("audit", "--until-position", "500").output
    assert "audit at position 23:" in past
    assert past == sqlite_cli("audit", "--until-position", "23").output


def test_an_edited_event_row_is_named_and_rebuild_keeps_the_evidence(sqlite_cli: Cli, tmp_path: Path) -> None:
    """A copied file whose event row 5 was edited (guard trigger dropped, hash not recomputed):
    audit/tables name the broken chain on stderr, and rebuild refuses (exit 1, nothing
    changed) instead of rewriting the read models that still disagree with the edit."""
    import sqlite3

    sqlite_cli("events", "import", str(CASE_18))
    assert sqlite_cli("tables").exit_code == 0  # read models and checkpoint written
    path = Path(sqlite_cli.url.split("///", 1)[1])
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TRIGGER events_no_update")
        data = conn.execute("SELECT data FROM events WHERE position = 5").fetchone()[0]
        forged = data.replace('"num_new_tokens":1', '"num_new_tokens":99')
        assert forged != data
        conn.execute("UPDATE events SET data = ? WHERE position = 5", (forged,))
        conn.execute(SQLITE_TRIGGERS["events_no_update"])  # the guard put back: only the chain tells
    before = path.read_bytes()
    told = sqlite_cli("audit")
    assert "hash chain is broken at position 5" in told.stderr
    r = sqlite_cli("rebuild", "--quiet")
    assert r.exit_code == 1 and "hash chain is broken at position 5" in r.output
    assert path.read_bytes() == before


def test_a_byte_order_mark_at_the_start_of_the_file_is_skipped(tmp_path: Path) -> None:
    """A JSONL file saved with a UTF-8 BOM (Windows editors, PowerShell) imports as the same
    file without it (RFC 8259 §8.1); the BOM was refused with Python's 'decode using
    utf-8-sig', which names no line and no remedy."""
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(CASE_18.read_bytes())
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + CASE_18.read_bytes())
    with_bom = Cli(f"sqlite+aiosqlite:///{tmp_path / 'bom.db'}")
    without = Cli(f"sqlite+aiosqlite:///{tmp_path / 'plain.db'}")
    r = with_bom("events", "import", str(bom))
    assert r.exit_code == 0, r.output
    assert without("events", "import", str(plain)).exit_code == 0

    def exported(cli: Cli) -> list[dict]:  # recorded_at is the import's clock, and the hash covers it
        rows = [json.loads(line) for line in cli("events", "export").stdout.splitlines()]
        return [{k: v for k, v in row.items() if k not in ("recorded_at", "hash")} for row in rows]

    assert exported(with_bom) == exported(without) and len(exported(without)) == 23


def test_a_byte_order_mark_on_a_blank_first_line_is_counted_blank(tmp_path: Path) -> None:
    """Every line is accounted for (reports/import_summary.py): a first line holding only the
    BOM the import skips is a blank line, as it is without the BOM."""
    for name, head in (("bom", b"\xef\xbb\xbf\n"), ("bom-spaces", b"\xef\xbb\xbf  \r\n"), ("plain", b"\n")):
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(head + CASE_18.read_bytes())
        r = Cli(f"sqlite+aiosqlite:///{tmp_path / name}.db")("events", "import", str(path))
        assert r.exit_code == 0, r.output
        assert r.stdout.strip().endswith("(0 already present, 0 refused; 24 line(s) read, 1 blank)"), (name, r.stdout)


def test_a_byte_order_mark_on_a_later_line_is_refused_naming_the_line(tmp_path: Path) -> None:
    lines = CASE_18.read_bytes().splitlines(keepends=True)
    joined = tmp_path / "joined.jsonl"
    joined.write_bytes(b"".join([lines[0], b"\xef\xbb\xbf" + lines[1], *lines[2:]]))
    r = Cli(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")("events", "import", str(joined))
    assert r.exit_code == 2
    assert "line 2: starts with a UTF-8 byte order mark (U+FEFF)" in r.output and "remove it" in r.output
    assert "utf-8-sig" not in r.output and str(joined) in r.output
    assert not (tmp_path / "x.db").exists()


def test_a_utf16_file_is_refused_saying_it_looks_like_utf16(tmp_path: Path) -> None:
    """PowerShell's ``>`` writes UTF-16: each line is refused naming the encoding and the fix,
    not only "byte 0xff" (hostile pass); a UTF-8 file's errors carry no such hint."""
    for encoding in ("utf-16", "utf-16-be"):
        path = tmp_path / f"{encoding}.jsonl"
        path.write_bytes(CASE_18.read_text("utf-8").encode(encoding))
        r = Cli(f"sqlite+aiosqlite:///{tmp_path / encoding}.db")("events", "import", str(path))
        assert r.exit_code == 2 and "line 1: " in r.output, r.output
        assert "the file looks like UTF-16: convert it to UTF-8" in r.output.split("line 2:")[0], (encoding, r.output)
    plain = tmp_path / "broken.jsonl"
    plain.write_bytes(b"\xff{}\n{not json\n")
    r = Cli(f"sqlite+aiosqlite:///{tmp_path / 'broken.db'}")("events", "import", str(plain))
    assert r.exit_code == 2 and "not UTF-8: byte 0xff at byte 1" in r.output and "UTF-16" not in r.output


def test_binary_with_nul_bytes_gets_no_utf16_hint_and_empty_input_creates_no_ledger(tmp_path: Path) -> None:
    """Final hostile pass: a NUL here and there is binary, not UTF-16; and an empty input (an
    export that failed upstream of ``| events import -``) leaves no new, empty ledger behind."""
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\x01\x00\xfe\x42\x00\x99\x10\x20\x30\x40\x50\x60\n")
    r = Cli(f"sqlite+aiosqlite:///{tmp_path / 'binary.db'}")("events", "import", str(binary))
    assert r.exit_code == 2 and "line 1: " in r.output and "UTF-16" not in r.output, r.output
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    r = Cli(f"sqlite+aiosqlite:///{tmp_path / 'new.db'}")("events", "import", str(empty))
    assert r.exit_code == 0 and "0 line(s) read" in r.output, r.output
    assert not (tmp_path / "new.db").exists()
