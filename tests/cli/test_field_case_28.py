"""CASE-28: incremental catch-up across a mid-turn checkpoint, ``rebuild`` (three times) and a
fresh import give byte-identical turn tables, up to the current head."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from reports.cli import app
from tests.cases.field_support import FIELD_DIR

runner = CliRunner()
PARTS = ("CASE-28-part1", "CASE-28-part2a", "CASE-28-part2b")


def cli(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_case_28_rebuild_and_catch_up_agree(tmp_path):
    a, fresh = f"sqlite+aiosqlite:///{tmp_path / 'a.db'}", f"sqlite+aiosqlite:///{tmp_path / 'f.db'}"
    outputs = []
    for part in PARTS:  # the checkpoint after part2a sits inside an open turn
        cli("events", "import", str(FIELD_DIR / f"{part}.jsonl"), "--db", a)
        outputs.append(cli("tables", "--db", a, "--format", "json"))
    assert "22" in cli("rebuild", "--db", a)
    t4 = cli("tables", "--db", a, "--format", "json")
    cli("rebuild", "--db", a)
    assert "22" in cli("rebuild", "--db", a)
    t5 = cli("tables", "--db", a, "--format", "json")
    for part in PARTS:
        cli("events", "import", str(FIELD_DIR / f"{part}.jsonl"), "--db", fresh)
    t_fresh = cli("tables", "--db", fresh, "--format", "json")
    assert [len(json.loads(t)["turns"]) for t in outputs] == [1, 2, 3]
    assert outputs[2] == t4 == t5 == t_fresh
    turns = [
        (t["session_id"], t["response_id"], t["finished_reason"], t["e2e"]["e2e_total_ms"])
        for t in json.loads(t_fresh)["turns"]
    ]
    assert turns == [
        ("s1", "resp-s1-0-9f2c41aa", "stop", 1700.0),
        ("S1", "resp-2", "barge_in", 120.0),
        ("S1", "resp-3", "barge_in", 850.0),
    ]
    audit = json.loads(cli("audit", "--db", a, "--format", "json"))
    assert (audit["position"], audit["clean"]) == (22, True)
