"""Standard output on a full disk (``duplex-ledger tables > /dev/full``) is one ``error: could
not write the output: No space left on device`` line on stderr and exit 1 (operational: the
file system failed), never a traceback, Python's "Exception ignored" at exit, or the database
URL named as what failed (final hostile retest of issue 23; reports/cli_errors.py
``output_failed``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from reports.cli_errors import OPERATIONAL
from tests.cli.streams import FULL, PRINTING_COMMANDS, ROOT, WORKED, cli, imported, with_db

pytestmark = pytest.mark.skipif(not FULL.exists(), reason="no /dev/full on this system")


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> str:
    return imported(WORKED, tmp_path_factory.mktemp("full") / "ledger.db")


@pytest.mark.parametrize(
    "args",
    [
        *PRINTING_COMMANDS,
        ["events", "export", "--output", "-"],
        ["tables", "--help"],
    ],
    ids=" ".join,
)
def test_stdout_on_a_full_disk_is_one_error_line_and_exit_1(ledger: str, args: list[str]) -> None:
    with FULL.open("w") as full:
        proc = cli(with_db(args, ledger), stdout=full)
    assert proc.returncode == OPERATIONAL, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: could not write the output: No space left on device (errno 28); the output is incomplete"
    ]


@pytest.mark.parametrize("args", [["tables"], ["audit"], ["verify"]], ids=" ".join)
def test_a_closed_stdout_is_no_traceback(ledger: str, args: list[str]) -> None:
    """Started with stdout closed (``>&-``): Python has no ``sys.stdout``; the command ends
    with its own exit code and no ``AttributeError`` traceback from the final flush."""
    command = " ".join([sys.executable, "-m", "reports.cli", *args, "--db", ledger])
    proc = subprocess.run(
        ["bash", "-c", f"exec 1>&-; {command}"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert "Traceback" not in proc.stderr and "AttributeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
