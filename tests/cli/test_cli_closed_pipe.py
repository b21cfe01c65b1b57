"""A reader that closes the pipe (``duplex-ledger audit | head -1``) ends every printing command
quietly with exit 141 (128 + SIGPIPE, as git and the coreutils), never click's 1, rich's 1, an
``error: BrokenPipeError`` line or Python's "Exception ignored" at exit (hostile retest of
issue 23; the choice is documented in reports/cli_errors.py)."""

from __future__ import annotations

import os
import subprocess

import pytest

from reports.cli_errors import PIPE_CLOSED
from tests.cli.streams import PRINTING_COMMANDS, WORKED, cli, cli_argv, cli_env, imported, with_db


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


@pytest.fixture(scope="module")
def long_ledger(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ledger whose ``tables`` output is far larger than a pipe's buffer (64 KiB)."""
    from tests.logbuilder import LogBuilder

    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, num_stages=1)
    for t in range(400):
        b.stop_turn("s1", t, f"r{t}", 2.0 + t, finished=True)
    path = tmp_path_factory.mktemp("long") / "long.jsonl"
    path.write_text(b.jsonl())
    return imported(path, path.with_suffix(".db"))


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_reader_that_leaves_mid_output_ends_tables_with_141(long_ledger: str, fmt: str) -> None:
    """``tables | head -1`` on a long log: the reader goes while the one big write waits, and
    Linux returns the bytes taken, not EPIPE, so the command used to exit 0 with its output
    cut (final hostile retest). It is written in pieces (``cli_errors.echo_text``): 141."""
    proc = subprocess.Popen(
        [*cli_argv(), "tables", "--format", fmt, "--db", long_ledger],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **cli_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert len(proc.stdout.read(10)) == 10
    proc.stdout.close()
    assert proc.wait(timeout=120) == PIPE_CLOSED, proc.stderr.read()
