"""What the tests of broken output streams share (closed pipe, full disk, closed stdout,
broken stderr): the CLI run as the console script runs it (``python -m reports.cli``: its
``main()``) in a subprocess, a ledger imported from a committed log, and the commands that
print."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from reports.cli import app

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "cases" / "logs"
WORKED = LOGS / "worked-example.jsonl"  # 8 events, audit clean, no note
FULL = Path("/dev/full")

PRINTING_COMMANDS: list[list[str]] = [
    ["audit"],
    ["tables"],
    ["tables", "--summary"],
    ["metrics"],
    ["events", "export"],  # written inside the command's event loop
    ["sessions"],
    ["digest"],
    ["verify"],
    ["schema"],
    ["--help"],  # printed while the top-level arguments are parsed
]
"""Commands that write to stdout, each run against a ledger by :func:`with_db`."""


def with_db(args: list[str], url: str) -> list[str]:
    """``args`` plus ``--db url`` unless the command reads no ledger (``schema``, a help)."""
    return [*args] if args == ["schema"] or "--help" in args else [*args, "--db", url]


def url_of(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def imported(log: Path, path: Path) -> str:
    """A ledger at ``path`` holding ``log`` (imported in this process); its URL."""
    url = url_of(path)
    result = CliRunner().invoke(app, ["events", "import", str(log), "--db", url])
    assert result.exit_code == 0, result.output
    return url


def cli_argv() -> list[str]:
    """The console script's command line: ``python -m reports.cli`` (its ``main()``)."""
    return [sys.executable, "-m", "reports.cli"]


def cli_env() -> dict[str, Any]:
    """Where and with what the CLI subprocess runs: this tree, imported first."""
    return {"cwd": ROOT, "env": {**os.environ, "PYTHONPATH": str(ROOT)}}


def cli(
    args: list[str], stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    """``python -m reports.cli ARGS`` (its ``main()``, as the console script) in a subprocess."""
    return subprocess.run([*cli_argv(), *args], stdout=stdout, stderr=stderr, text=True, timeout=120, **cli_env())
