"""Field cases CASE-18 onward: their JSONL inputs (``tests/cases/field/``, copies of
``shared/cases/data``: :mod:`tests.shared_inputs`), folded in memory and run through the CLI like a user would."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from events.records import StoredEvent
from events.structs import struct_of
from events.types import parse_event
from projections.projector import Projector
from reports.cli import app
from tests.shared_inputs import shared_dir

FIELD_DIR = Path(__file__).parent / "field"
SHARED_DIR = shared_dir() / "cases" / "data"
runner = CliRunner()


def stored_events(name: str) -> list[StoredEvent]:
    """The case log as StoredEvents (positions 1.., versions per stream)."""
    return read_jsonl(FIELD_DIR / f"{name}.jsonl")


def read_jsonl(path: Path) -> list[StoredEvent]:
    """A JSONL log (the project's line format) as StoredEvents, positions by line."""
    out: list[StoredEvent] = []
    versions: dict[str, int] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        obj = json.loads(line)
        event = parse_event(
            {
                "type": obj["type"],
                "session_id": obj["stream"],
                "ts": obj["ts"],
                "event_id": obj["event_id"],
                **obj["data"],
            }
        )
        versions[obj["stream"]] = versions.get(obj["stream"], 0) + 1
        out.append(StoredEvent(lineno, obj["stream"], versions[obj["stream"]], event.ts, struct_of(event)))
    return out


def fold(name: str, until: int | None = None) -> Projector:
    return Projector().apply_all(s for s in stored_events(name) if until is None or s.position <= until)


def resources_after(name: str, position: int, session: str) -> dict[tuple[int, str], str]:
    return fold(name, position).resources.request_resources(session)[session]


@dataclass
class CliResult:
    audit: dict[str, Any]
    audit_exit: int
    turns: dict[str, dict[str, Any]]  # (session/response) -> turn row
    tables_text: str


def run_cli(name: str, tmp_path: Path, *parts: str) -> CliResult:
    """Import the case log(s) into a fresh SQLite ledger, then ``audit``/``tables`` as JSON."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    for part in parts or (name,):
        result = runner.invoke(app, ["events", "import", str(FIELD_DIR / f"{part}.jsonl"), "--db", url])
        assert result.exit_code == 0, result.output
    audit = runner.invoke(app, ["audit", "--db", url, "--format", "json"])
    tables = runner.invoke(app, ["tables", "--db", url, "--format", "json"])
    text = runner.invoke(app, ["tables", "--db", url])
    assert tables.exit_code == 0 and text.exit_code == 0, tables.output + text.output
    turns = {f"{t['session_id']}/{t['response_id']}": t for t in json.loads(tables.stdout)["turns"]}
    return CliResult(json.loads(audit.stdout), audit.exit_code, turns, text.stdout)


def stage(turn: dict[str, Any], stage_id: int) -> dict[str, Any]:
    rows = [s for s in turn["stages"] if s["stage_id"] == stage_id]
    assert len(rows) == 1, f"stage {stage_id} rows: {rows}"
    return rows[0]


def kinds_at(findings: list[dict[str, Any]], position: int) -> set[str]:
    return {f["kind"] for f in findings if f["first_position"] == position or f["last_position"] == position}
