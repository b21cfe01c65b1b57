"""A reader that closes the pipe (``duplex-ledger audit | head -1``) ends every printing command
quietly with exit 141 (128 + SIGPIPE, as git and the coreutils), never click's 1, rich's 1, an
``error: BrokenPipeError`` line or Python's "Exception ignored" at exit (hostile retest of
issue 23; the choice is documented in reports/cli_errors.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reports.cli import app
from reports.cli_errors import PIPE_CLOSED

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "cases" / "logs" / "worked-example.jsonl"


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('pipe') / 'ledger.db'}"
    result = CliRunner().invoke(app, ["events", "import", str(LOG), "--db", url])
    assert result.exit_code == 0, result.output
    return url


def closed_reader(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``python -m reports.cli ARGS`` with a stdout pipe whose reader is gone before the
    command writes (the read end is closed at once; start-up alone takes longer)."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "reports.cli", *args],
            stdout=write_fd,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
        )
    finally:
        os.close(write_fd)
    return proc


@pytest.mark.parametrize(
    "args",
    [
        ["audit"],  # rich console (its own hook exits 1)
        ["audit", "--format", "json"],
        ["tables"],
        ["tables", "--summary"],
        ["metrics"],
        ["events", "export"],  # written inside the command's event loop
        ["events", "tail", "--from-position", "1"],
        ["sessions"],
        ["digest"],
        ["verify"],
        ["schema"],
        ["--help"],  # printed while the arguments are parsed
        ["audit", "--help"],
    ],
    ids=" ".join,
)
def test_a_closed_pipe_ends_the_command_quietly_with_141(ledger: str, args: list[str]) -> None:
    db = [] if args in (["schema"], ["--help"], ["audit", "--help"]) else ["--db", ledger]
    proc = closed_reader([*args, *db])
    assert proc.returncode == PIPE_CLOSED, proc.stderr
    assert proc.stderr == ""


def test_the_same_commands_with_a_reader_exit_as_before(ledger: str) -> None:
    """The 141 is the closed pipe's, not the command's: with a reader, audit's own code stands."""
    proc = subprocess.run(
        [sys.executable, "-m", "reports.cli", "audit", "--db", ledger],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert proc.returncode in (0, 1) and "audit at position" in proc.stdout, proc.stderr
