"""Helpers of the reliability suite (issue 11): run the CLI, fingerprint the data.

Every corpus test checks three things of each bad input: it was *tried*, it was *refused
cleanly* (the expected exit code, at most a few lines on stderr, no traceback, no password),
and *no data changed* (the ledger's export, or a foreign file's bytes, are identical after).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from typer.testing import CliRunner, Result

from reports.cli import app

LOG = Path(__file__).parents[1] / "cases" / "logs" / "case-12-arrival.jsonl"
SECRET = "s3cr3t-pw"


def cli(*args: str) -> Result:
    """``duplex-ledger ARGS`` in-process; exceptions are part of the result, never raised."""
    return CliRunner().invoke(app, list(args), catch_exceptions=True)


def refused_cleanly(result: Result, code: int, *, max_lines: int = 3) -> None:
    """Assert ``result`` is a refusal: exit ``code``, a short message, no traceback, no secret."""
    text = result.output
    assert result.exit_code == code, (result.exit_code, text, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in text and SECRET not in text, text
    lines = [line for line in text.splitlines() if line.strip()]
    assert 1 <= len(lines) <= max_lines, text


def fingerprint(path: Path) -> dict[str, str | None]:
    """sha256 of a file and of its SQLite companions (None: absent)."""
    out: dict[str, str | None] = {}
    for suffix in ("", "-wal", "-shm", "-journal"):
        p = Path(f"{path}{suffix}")
        out[suffix or "main"] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
    return out


def export(url: str) -> str:
    """The whole log as JSONL (the ledger's data, for "nothing changed" checks)."""
    result = cli("events", "export", "--db", url)
    assert result.exit_code == 0, result.output
    return result.stdout
