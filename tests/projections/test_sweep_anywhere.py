"""Where a sweep falls changes nothing a reader sees (issue 12, hostile retest of issue 23).

The fold forgets closed sessions at fixed positions (``SWEEP_EVERY``) to bound its memory; what
it keeps of a forgotten session must be exactly what later events are judged by. The strongest
form of that rule: a fold that sweeps before EVERY event and one that never sweeps give the same
turn tables, findings and metrics, on every committed log and field case and on a session that
is closed, gets late facts, and is reopened reusing its response ids (the retest's repro: the
reused ids were ``stale_finalize`` without a sweep and got tables after one).
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from events.records import StoredEvent
from projections import projector as projector_module
from projections.findings import Finding
from projections.metrics import MetricsFold, TallySink
from projections.projector import Projector
from projections.turns import KEPT_PER_SESSION
from reports.cli import app
from tests.cases.field_support import FIELD_DIR, read_jsonl
from tests.histories import generate
from tests.logbuilder import LogBuilder, eph

ENVELOPE = {"type", "session_id", "ts", "event_id", "schema_version"}
LOGS = sorted(FIELD_DIR.glob("*.jsonl")) + sorted((Path(__file__).parents[1] / "cases" / "logs").glob("*.jsonl"))


def observed(events: list[StoredEvent], sweep_every: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Everything a reader sees of ``events`` folded with a sweep every ``sweep_every`` positions."""
    monkeypatch.setattr(projector_module, "SWEEP_EVERY", sweep_every)
    p = Projector().apply_all(events)
    sink = TallySink()
    MetricsFold(sink).apply_all(events)
    return {
        "tables": [t.to_dict() for t in p.turn_tables],
        "findings": [judged_alike(f) for f in p.findings()],
        "request_resources": p.resources.request_resources(),
        "held": p.resources.held(),
        "metrics": (sink.values, sink.observations),
    }


def judged_alike(f: Finding) -> Finding:
    """``f``, with the one judgement a sweep may change: a late abort result of a session the fold
    forgot is an ``abort_of_unknown_id`` (no evidence), as for an id it retired long ago (R6)."""
    if f.kind == "duplicate_ack":
        return replace(f, kind="abort_of_unknown_id", evidence=(f.last_position,))
    return f


def assert_sweep_free(events: list[StoredEvent], monkeypatch: pytest.MonkeyPatch) -> None:
    never = observed(events, 10**15, monkeypatch)
    always = observed(events, 1, monkeypatch)
    for key in never:
        assert always[key] == never[key], key


@pytest.mark.parametrize("path", LOGS, ids=[p.stem for p in LOGS])
def test_a_sweep_before_every_event_changes_nothing_on_committed_logs(path: Path, monkeypatch):
    assert_sweep_free(read_jsonl(path), monkeypatch)


@pytest.mark.parametrize("seed", range(40))
def test_a_sweep_before_every_event_changes_nothing_on_generated_histories(seed: int, monkeypatch):
    assert_sweep_free(generate(random.Random(seed), sessions=3).log.stored, monkeypatch)


def closed_reopened_with_reused_ids() -> LogBuilder:
    """s1 answers r0/r1, closes, gets late facts (a terminal of r1, a completed turn, a transfer
    tally, a release), then incarnation 1 reuses r0/r1 and answers a new r2."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, num_stages=1)
    ts = 1.0
    for t, response_id in enumerate(("r0", "r1")):
        ts += 1.0
        b.stop_turn("s1", t, response_id, ts)
    b.add("SessionClosed", "s1", ts + 1.0, reason="disconnect")
    b.add("TurnFinalized", "s1", ts + 1.1, response_id="r1", finished_reason="stop")
    b.add("TurnFinalized", "s1", ts + 1.2, response_id="r0", finished_reason="abort")
    b.add("TurnCompleted", "s1", ts + 1.3, completed_turn_id=7, new_turn_id=8)
    b.add("StageRequestReleased", "s1", ts + 1.4, stage_id=0, request_id=eph("s1", 1), cause="session_close")
    b.add("SessionOpened", "s1", ts + 2.0, num_stages=1, incarnation=1)
    ts += 2.0
    for t, response_id in enumerate(("r0", "r1", "r2")):
        ts += 1.0
        b.stop_turn("s1", t, response_id, ts, incarnation=1)
    b.add("SessionClosed", "s1", ts + 1.0, reason="disconnect")
    return b


def test_a_reopened_session_reusing_response_ids_folds_alike_with_or_without_a_sweep(monkeypatch):
    events = closed_reopened_with_reused_ids().stored
    assert_sweep_free(events, monkeypatch)
    never = observed(events, 10**15, monkeypatch)
    # The first incarnation's ids stay finalized: reused, they are stale (DOMAIN §2.1), not new turns.
    assert [t["response_id"] for t in never["tables"]] == ["r0", "r1", "r2"]
    stale = [f.request_id for f in never["findings"] if f.kind == "stale_finalize"]
    assert stale.count("r0") >= 1 and stale.count("r1") >= 1


def test_the_retest_repro_reads_alike_through_the_cli(tmp_path: Path):
    """The hostile retest's log, through a real SQLite file: 4067 events of another session put
    a sweep between CASE-30's S1 closing and CASE-18's S1 reopening it (incarnation 1, reusing
    resp-1/resp-2). The read models, a fold ``--until-position`` the head, and ``verify`` agree."""
    lines = [{"stream": "F", "type": "SessionOpened", "ts": 1.0, "data": {"num_stages": 2}}]
    lines += [{"stream": "F", "type": "InputAppended", "ts": 1.0 + i / 1000, "data": {}} for i in range(4066)]
    for name, keep, shift, incarnation in (("CASE-30", "S1", 0.0, None), ("CASE-18", "S1", 200.0, 1)):
        for line in (FIELD_DIR / f"{name}.jsonl").read_text().splitlines():
            obj = json.loads(line)
            if obj["stream"] != keep:
                continue
            obj["ts"] += shift
            if incarnation is not None and obj["type"] == "SessionOpened":
                obj["data"]["incarnation"] = incarnation
            lines.append(obj)
    for n, obj in enumerate(lines, start=1):
        obj["event_id"] = str(uuid.UUID(int=n))
    log = tmp_path / "repro.jsonl"
    log.write_text("".join(json.dumps(obj) + "\n" for obj in lines))
    url = f"sqlite+aiosqlite:///{tmp_path / 'repro.db'}"
    runner = CliRunner()
    assert runner.invoke(app, ["events", "import", str(log), "--db", url]).exit_code == 0

    def turns(*extra: str) -> list[tuple[str, str]]:
        result = runner.invoke(app, ["tables", "--db", url, "--format", "json", *extra])
        assert result.exit_code == 0, result.output
        return [(t["session_id"], t["response_id"]) for t in json.loads(result.stdout)["turns"]]

    assert turns() == turns("--until-position", str(len(lines))) == [("S1", "resp-1"), ("S1", "resp-2")]
    verified = runner.invoke(app, ["verify", "--db", url])
    assert verified.exit_code == 0 and verified.stdout.startswith("intact"), verified.output


def test_a_response_id_reused_past_the_kept_terminals_is_stale_and_no_tampering(tmp_path: Path):
    """A session reuses r0 after more than KEPT_PER_SESSION responses: the fold no longer keeps
    r0's terminal (flat memory, issue 13) but still knows r0 finalized (``finalized_earlier``): the
    reuse is ``stale_finalize``, not a second table (hostile retest), so the read model and a
    fold ``--until-position`` the head agree, and ``verify`` finds an untouched ledger intact."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, num_stages=1)
    for t, response_id in enumerate([f"r{n}" for n in range(KEPT_PER_SESSION + 2)] + ["r0"]):
        b.stop_turn("s1", t, response_id, 2.0 + t, finished=True)
    log = tmp_path / "reused.jsonl"
    log.write_text(b.jsonl())
    url = f"sqlite+aiosqlite:///{tmp_path / 'reused.db'}"
    runner = CliRunner()
    imported = runner.invoke(app, ["events", "import", str(log), "--db", url])
    assert imported.exit_code == 0, imported.output
    for extra in ([], ["--until-position", str(len(b.stored))]):
        tables = runner.invoke(app, ["tables", "--db", url, "--format", "json", "--response", "r0", *extra])
        assert tables.exit_code == 0, tables.output
        assert [t["finalize_ts_s"] for t in json.loads(tables.stdout)["turns"]] == [2.3]  # the first r0 only
    audit = runner.invoke(app, ["audit", "--db", url, "--format", "json"])
    assert audit.exit_code in (0, 1), audit.output
    stale = [w["detail"] for w in json.loads(audit.stdout)["warnings"] if w["kind"] == "stale_finalize"]
    assert stale == [
        "commit (pre-created) of response 'r0', already finalized; ignored",
        "ResponseEnded (stop) of response 'r0', already finalized (reason no longer kept)",
    ]
    verified = runner.invoke(app, ["verify", "--db", url])
    assert verified.exit_code == 0 and verified.stdout.startswith("intact"), verified.output
