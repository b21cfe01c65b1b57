"""A reader that closes the pipe (``duplex-ledger audit | head -1``) ends every printing command
quietly with exit 141 (128 + SIGPIPE, as git and the coreutils), never click's 1, rich's 1, an
``error: BrokenPipeError`` line or Python's "Exception ignored" at exit (hostile retest of
issue 23; the choice is documented in reports/cli_errors.py)."""

from __future__ import annotations

import os
import subprocess

import pytest

from reports.cli_errors import PIPE_CLOSED
from tests.cli.streams import PRINTING_COMMANDS, WORKED, cli, imported, with_db


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> str:
    return imported(WORKED, tmp_path_factory.mktemp("pipe") / "ledger.db")


def closed_reader(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``python -m reports.cli ARGS`` with a stdout pipe whose reader is gone before the
    command writes (the read end is closed at once; start-up alone takes longer)."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        return cli(args, stdout=write_fd)
    finally:
        os.close(write_fd)


@pytest.mark.parametrize(
    "args",
    [
        *PRINTING_COMMANDS,  # audit: a rich console (its own hook exits 1)
        ["audit", "--format", "json"],
        ["events", "tail", "--from-position", "1"],
        ["audit", "--help"],
    ],
    ids=" ".join,
)
def test_a_closed_pipe_ends_the_command_quietly_with_141(ledger: str, args: list[str]) -> None:
    proc = closed_reader(with_db(args, ledger))
    assert proc.returncode == PIPE_CLOSED, proc.stderr
    assert proc.stderr == ""


def test_the_same_commands_with_a_reader_exit_as_before(ledger: str) -> None:
    """The 141 is the closed pipe's, not the command's: with a reader, audit's own code stands."""
    proc = cli(["audit", "--db", ledger])
    assert proc.returncode in (0, 1) and "audit at position" in proc.stdout, proc.stderr
