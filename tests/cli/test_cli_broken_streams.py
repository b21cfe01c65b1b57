"""A command's exit code stays its own when stdout or stderr breaks (hostile retest of the
full-disk fix; policy in reports/cli_errors.py's module doc):

* stderr on a full disk (``2>/dev/full``): a line that cannot be written is dropped; a rejection
  still exits 2, a clean ``audit`` whose note cannot be written still exits 0, leaks still 1
  (:func:`reports.cli_errors.guard_stderr`);
* a command that changed the ledger (``events import``, ``rebuild``, ``db upgrade``, ``run``'s
  closing report) and cannot write its summary says on stderr that it was committed and exits
  with its own code (0 for an import): a retry loop must not import the file twice
  (:func:`reports.cli_errors.committed`);
* ``--output`` on a full disk is the file system failing (exit 1, as ``> /dev/full``); a path
  that cannot be written at all stays rejected input (exit 2)."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from reports import cli_engine
from reports.cli import app
from reports.cli_errors import OPERATIONAL, REJECTED, output_error_code
from tests.cli.streams import FULL, LOGS, WORKED, cli, imported, url_of

HELD = LOGS / "case-13-reasons.jsonl"  # S3 holds an id at the end: `audit --session S3` is clean + a note
COMMITTED = "was committed; its summary could not be written: No space left on device (errno 28)"

pytestmark = pytest.mark.skipif(not FULL.exists(), reason="no /dev/full on this system")
runner = CliRunner()


def event_count(url: str) -> int:
    result = runner.invoke(app, ["events", "export", "--db", url])
    assert result.exit_code == 0, result.output
    return len(result.output.splitlines())


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> str:
    return imported(HELD, tmp_path_factory.mktemp("held") / "ledger.db")


# --- stderr on a full disk: the command's own exit code -------------------------------------
@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["audit", "--bogus"], REJECTED),  # click's usage error, said in main()
        (["tables", "--session", "nosuch"], REJECTED),  # report() inside the command
        (["audit", "--session", "S3"], 0),  # clean; its note on S3's held id cannot be written
        (["audit"], 1),  # leaks: still 1, the dropped lines turn no failure into success
    ],
    ids=["audit --bogus", "tables --session nosuch", "audit --session S3", "audit leaks"],
)
def test_stderr_on_a_full_disk_keeps_the_exit_code(held: str, args: list[str], code: int) -> None:
    with FULL.open("w") as full:
        proc = cli([*args, "--db", held], stderr=full)
    assert proc.returncode == code, proc.stdout
    if args[0] == "audit" and code == 0:
        assert "audit at position 50: clean" in proc.stdout  # stdout was whole


def test_the_note_that_was_dropped_is_there_with_a_working_stderr(held: str) -> None:
    """The clean audit above does write to stderr (so the test can fail): a note on S3."""
    proc = cli(["audit", "--session", "S3", "--db", held])
    assert proc.returncode == 0
    assert proc.stderr.startswith("note: session S3 still holds 1 engine id(s)"), proc.stderr


def test_a_rejected_import_with_stderr_on_a_full_disk_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with FULL.open("w") as full:
        proc = cli(["events", "import", str(bad), "--db", url_of(tmp_path / "l.db")], stderr=full)
    assert proc.returncode == REJECTED


# --- committed, but the summary cannot be written -------------------------------------------
def test_an_import_whose_summary_cannot_be_written_says_it_was_committed_and_exits_0(tmp_path: Path) -> None:
    url = url_of(tmp_path / "new.db")
    with FULL.open("w") as full:
        proc = cli(["events", "import", str(WORKED), "--db", url], stdout=full)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [f"warning: the import (8 event(s) from {WORKED}) {COMMITTED}"]
    assert event_count(url) == 8  # it was committed: a retry is not needed


def test_an_import_whose_reader_went_away_says_it_was_committed(tmp_path: Path) -> None:
    url = url_of(tmp_path / "new.db")
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        proc = cli(["events", "import", str(WORKED), "--db", url], stdout=write_fd)
    finally:
        os.close(write_fd)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"warning: the import (8 event(s) from {WORKED}) was committed; its summary could not be written: "
        "the reader went away"
    ]
    assert event_count(url) == 8


@pytest.mark.parametrize("stdout_full", [False, True])
def test_an_import_whose_stderr_reader_went_away_too_exits_0(tmp_path: Path, stdout_full: bool) -> None:
    """``events import f 2>&1 | true``: the summary and then the warning meet a closed pipe;
    the import is committed, so the exit is still 0, not 141 (a pipefail retry loop would
    import a file without event ids twice). Also with stdout on a full disk."""
    url = url_of(tmp_path / "new.db")
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        with FULL.open("w") as full:
            stdout = full if stdout_full else write_fd
            proc = cli(["events", "import", str(WORKED), "--db", url], stdout=stdout, stderr=write_fd)
    finally:
        os.close(write_fd)
    assert proc.returncode == 0
    assert event_count(url) == 8


def test_an_import_with_both_streams_on_a_full_disk_exits_0(tmp_path: Path) -> None:
    url = url_of(tmp_path / "new.db")
    with FULL.open("w") as full:
        proc = cli(["events", "import", str(WORKED), "--db", url], stdout=full, stderr=full)
    assert proc.returncode == 0
    assert event_count(url) == 8


def test_a_rejected_import_with_stdout_on_a_full_disk_is_no_commit(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with FULL.open("w") as full:
        proc = cli(["events", "import", str(bad), "--db", url_of(tmp_path / "l.db")], stdout=full)
    assert proc.returncode == REJECTED, proc.stderr
    assert "committed" not in proc.stderr and "nothing was imported" in proc.stderr


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["rebuild"], "the rebuild (up to position 8)"),
        (["db", "upgrade"], "the upgrade to revision 0004_replica_leases"),  # a new file: created
    ],
    ids=["rebuild", "db upgrade"],
)
def test_a_ledger_change_whose_summary_cannot_be_written_exits_0(tmp_path: Path, args: list[str], what: str) -> None:
    url = imported(WORKED, tmp_path / "l.db") if args == ["rebuild"] else url_of(tmp_path / "new.db")
    with FULL.open("w") as full:
        proc = cli([*args, "--db", url], stdout=full)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [f"warning: {what} {COMMITTED}"]


UNCHANGED = "; its summary could not be written: No space left on device (errno 28)"


@pytest.mark.parametrize(
    ("args", "unchanged"),
    [
        (["db", "upgrade"], "the database was already at revision 0004_replica_leases"),
        (["events", "import", str(WORKED)], f"every event from {WORKED} was already stored"),
    ],
    ids=["db upgrade at head", "import of stored events"],
)
def test_a_command_that_changed_nothing_does_not_say_it_committed(
    tmp_path: Path, args: list[str], unchanged: str
) -> None:
    """Hostile pass: ``db upgrade`` at head and a re-import said 'warning: … was committed'
    with stdout on a full disk, though nothing changed; they say so now (exit 0 still)."""
    url = imported(WORKED, tmp_path / "l.db")
    with FULL.open("w") as full:
        proc = cli([*args, "--db", url], stdout=full)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [f"warning: nothing was committed ({unchanged}){UNCHANGED}"]
    assert event_count(url) == 8


@pytest.mark.parametrize(("log", "code"), [(WORKED, 0), (HELD, 1)], ids=["clean", "leaks"])
def test_a_run_whose_tables_cannot_be_written_keeps_the_audits_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], log: Path, code: int
) -> None:
    """``run``/``demo``: the sessions were played into the ledger (here: imported, the engines
    faked away); the closing tables and audit meet a full disk. One warning names the
    ledger and the commands that re-project them; the exit is the audit's own (0 clean, 1
    leaks), never the full disk's 1 for a clean run."""
    url = imported(log, tmp_path / "l.db")
    monkeypatch.setattr(cli_engine, "_prepare", lambda spec, err: tmp_path)
    monkeypatch.setattr(cli_engine, "quiet_engines", lambda verbose: None)
    monkeypatch.setattr(cli_engine, "run_body", lambda fn, url: (SimpleNamespace(problems=[]), {}))
    trace = cli_engine.bundled_traces()[0]
    with FULL.open("w") as full:
        monkeypatch.setattr(sys, "stdout", full)
        with pytest.raises(cli_engine.typer.Exit) as ended:
            cli_engine._live_run([trace], url, "tiny", "tiny", 1.0, None, None, "float32", False)
        monkeypatch.undo()
    assert ended.value.exit_code == code
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: the run (its sessions are in {url}; `duplex-ledger tables` and `duplex-ledger audit` "
        f"re-project them) {COMMITTED}"
    ]


# --- --output: the file system failing (1) versus a path that cannot be written (2) ---------
def test_export_output_on_a_full_disk_is_the_file_system_failing(tmp_path: Path) -> None:
    url = imported(WORKED, tmp_path / "l.db")
    proc = cli(["events", "export", "--db", url, "--output", str(FULL)])
    assert proc.returncode == OPERATIONAL, proc.stderr
    assert proc.stderr.splitlines() == ["error: --output '/dev/full': cannot write: No space left on device (errno 28)"]


def test_output_dev_stdout_on_a_pipe_is_written_and_a_closed_one_is_141(tmp_path: Path) -> None:
    """``--output /dev/stdout | …``: /dev/stdout resolves to ``pipe:[N]``, no file, yet opens
    the pipe (hostile retest: exit 2 ``No such file or directory``); a reader that went away
    is 141, as for standard output (was 2 ``Broken pipe``)."""
    url = imported(WORKED, tmp_path / "ledger.db")
    proc = cli(["events", "export", "--db", url, "--output", "/dev/stdout"])
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 8
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        proc = cli(["events", "export", "--db", url, "--output", "/dev/stdout"], stdout=write_fd)
    finally:
        os.close(write_fd)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_an_output_path_that_cannot_be_written_is_rejected(tmp_path: Path) -> None:
    url = imported(WORKED, tmp_path / "l.db")
    proc = cli(["events", "export", "--db", url, "--output", str(tmp_path / "no" / "such" / "out.jsonl")])
    assert proc.returncode == REJECTED, proc.stderr
    assert "cannot write: No such file or directory (errno 2)" in proc.stderr


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("ENOSPC", OPERATIONAL),
        ("EIO", OPERATIONAL),
        ("EFBIG", OPERATIONAL),
        ("EDQUOT", OPERATIONAL),
        ("EACCES", REJECTED),
        ("EISDIR", REJECTED),
        ("ENOENT", REJECTED),
        ("EROFS", REJECTED),
    ],
)
def test_output_error_code(name: str, code: int) -> None:
    number = getattr(errno, name)
    assert output_error_code(OSError(number, os.strerror(number))) == code
