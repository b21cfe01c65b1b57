"""A response id reused in a session is stale however long ago it was finalized (hostile retest:
reused after more than ``KEPT_PER_SESSION`` other responses, it opened a second turn, so the read
model — one row per ``(session_id, response_id)`` — and a fold ``--until-position`` the head gave
different tables, with no warning; DOMAIN §2.1, D9).

The oracle is the same log with the reuse inside the kept window: the fold keeps the id of every
response finalized before its kept terminals (``SessionTurns.finalized_earlier``), so past the window the tables are the same and the reused id
gets the same ``stale_finalize`` warnings; only their detail no longer names the first reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from projections.projector import Projector
from projections.turns import KEPT_PER_SESSION
from reports.cli import app
from tests.logbuilder import LogBuilder
from tests.projections.test_checkpoint import resumed_at
from tests.projections.test_sweep_anywhere import assert_sweep_free

WITHIN = KEPT_PER_SESSION - 6
"""Responses before the reuse, inside the kept terminals: the oracle."""
PAST = (KEPT_PER_SESSION + 2, KEPT_PER_SESSION + 44)
"""Responses before the reuse, past the kept terminals."""


def answer(b: LogBuilder, sid: str, t: int, response_id: str, ts: float, incarnation: int = 0) -> None:
    """One committed, begun, answered, ended and released response of ``sid``."""
    b.stop_turn(sid, t, response_id, ts, incarnation=incarnation, begun=True, finished=True)


def history(n: int) -> tuple[LogBuilder, float]:
    """Session s1 answers r0..r<n-1>; a second session f answers twice in between (for the
    partitioned fold). Returns the builder and the next free ts."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, num_stages=1)
    b.add("SessionOpened", "f", 1.0, num_stages=1)
    for t in range(n):
        answer(b, "s1", t, f"r{t}", 2.0 + t)
        if t in (1, n // 2):
            answer(b, "f", t, f"f{t}", 2.5 + t)
    b.add("SessionClosed", "f", 2.0 + n, reason="disconnect")
    return b, 3.0 + n


def reused_in_session(n: int) -> LogBuilder:
    """r0 answered again after n responses, then a new response."""
    b, ts = history(n)
    answer(b, "s1", n, "r0", ts)
    answer(b, "s1", n + 1, "new", ts + 1.0)
    b.add("SessionClosed", "s1", ts + 2.0, reason="disconnect")
    return b


def late_terminals(n: int) -> LogBuilder:
    """After n responses: a late engine pair for r0, a cancel, then a commit of r0 and an error."""
    b, ts = history(n)
    b.add("ResponseEnded", "s1", ts, response_id="r0", cause="model")
    b.add("TurnFinalized", "s1", ts + 0.1, response_id="r0", finished_reason="stop")
    b.add("TurnFinalized", "s1", ts + 0.2, response_id="r0", finished_reason="cancel")
    b.add("TurnCommitted", "s1", ts + 0.3, turn_id=n, response_id="r0", create_response=True)
    b.add("TurnFinalized", "s1", ts + 0.4, response_id="r0", finished_reason="error")
    b.add("SessionClosed", "s1", ts + 1.0, reason="disconnect")
    return b


def reopened(n: int) -> LogBuilder:
    """s1 closes after n responses; incarnation 1 reuses r0 and answers a new response."""
    b, ts = history(n)
    b.add("SessionClosed", "s1", ts, reason="disconnect")
    b.add("SessionOpened", "s1", ts + 1.0, num_stages=1, incarnation=1)
    answer(b, "s1", 0, "r0", ts + 2.0, incarnation=1)
    answer(b, "s1", 1, "new", ts + 3.0, incarnation=1)
    b.add("SessionClosed", "s1", ts + 4.0, reason="disconnect")
    return b


SCENARIOS: dict[str, tuple[Callable[[int], LogBuilder], list[str]]] = {
    "in_session": (reused_in_session, ["new"]),
    "late_terminals": (late_terminals, []),
    "reopened": (reopened, ["new"]),
}


def stale_of_r0(p: Projector) -> list[tuple[int, str]]:
    """The ``stale_finalize`` warnings naming r0 as (kind, detail up to "already finalized"):
    comparable across logs of different lengths and whether or not the first reason is kept."""
    return [
        (f.kind, f.detail.split(", already finalized")[0])
        for f in p.findings()
        if f.kind == "stale_finalize" and f.request_id == "r0"
    ]


def response_ids(p: Projector, sid: str = "s1") -> list[str]:
    return [t.response_id for t in p.turn_tables if t.session_id == sid]


@pytest.mark.parametrize("n", PAST)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_reused_id_past_the_kept_terminals_is_stale_as_within_them(scenario: str, n: int, monkeypatch):
    build, new = SCENARIOS[scenario]
    within = Projector().apply_all(build(WITHIN).stored)
    past_events = build(n).stored
    past = Projector().apply_all(past_events)
    # One table per response, none for the reuse (the oracle's shape), whatever n.
    assert response_ids(within) == [f"r{t}" for t in range(WITHIN)] + new
    assert response_ids(past) == [f"r{t}" for t in range(n)] + new
    assert len(past.turns.sessions["s1"].terminals) <= KEPT_PER_SESSION  # still bounded
    kept = past.turns.sessions["s1"].terminals.get("r0")
    assert kept is None or kept.reason is None  # its first reason is no longer kept
    # The same stale_finalize warnings as within the window; the reason is said to be unknown.
    assert stale_of_r0(within) and stale_of_r0(past) == stale_of_r0(within)
    details = [f.detail for f in past.findings() if f.kind == "stale_finalize" and f.request_id == "r0"]
    assert all(
        "begin of" in d or "commit (pre-created) of" in d or d.endswith("already finalized (reason no longer kept)")
        for d in details
    ), details
    assert any(d.endswith("(reason no longer kept)") for d in details)
    assert [f.kind for f in past.findings() if f.kind != "stale_finalize"] == [
        f.kind for f in within.findings() if f.kind != "stale_finalize"
    ]
    assert_sweep_free(past_events, monkeypatch)  # a sweep before every event changes nothing


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_partitions_and_a_checkpoint_past_the_window_keep_the_reused_id_stale(scenario: str):
    build, _ = SCENARIOS[scenario]
    events = build(PAST[0]).stored
    straight = Projector().apply_all(events)
    parts = [Projector().apply_all([s for s in events if s.stream_id == sid]) for sid in ("s1", "f")]
    merged = Projector.merged(parts)
    assert sorted(t.response_id for t in merged.turn_tables) == sorted(t.response_id for t in straight.turn_tables)
    assert merged.findings() == straight.findings()
    cut = len(events) - 12  # the history is folded, the reuse is not yet
    done, resumed = resumed_at(events, cut)  # checks the resumed state equals the folded one
    assert done + resumed.turn_tables == straight.turn_tables
    assert resumed.findings() == straight.findings()


def test_earlier_finalized_ids_survive_a_sweep_as_a_record():
    """The sweep keeps a forgotten closed session's earlier finalized ids with its terminals, and
    gives both back on the session's next event."""
    b = reopened(PAST[0])
    p = Projector()
    close_at = next(s.position for s in b.stored if s.event.type == "SessionClosed" and s.stream_id == "s1")
    for s in b.stored[:close_at]:
        p.apply(s)
    p.forget_closed()
    kept = p.turns.closed_responses["s1"]
    assert "s1" not in p.turns.sessions
    earlier = {f"r{t}" for t in range(PAST[0] - KEPT_PER_SESSION)}
    assert list(kept.terminals) == [f"r{t}" for t in range(PAST[0] - KEPT_PER_SESSION, PAST[0])]
    assert kept.finalized_earlier == earlier
    p.apply(b.stored[close_at])  # incarnation 1 opens
    restored = p.turns.sessions["s1"]
    assert restored.finalized_earlier == earlier and list(restored.terminals) == list(kept.terminals)
    assert all(restored.finalized(f"r{t}") for t in range(PAST[0])) and not restored.finalized("new")
    assert "s1" not in p.turns.closed_responses


def audited(url: str, runner: CliRunner, *extra: str) -> list[dict[str, Any]]:
    result = runner.invoke(app, ["audit", "--db", url, "--format", "json", *extra])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout).get("warnings", [])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_command_gives_one_answer_past_the_window(scenario: str, tmp_path: Path):
    """Through a real SQLite file: the read model's tables, a fold ``--until-position`` the head
    and ``--response r0`` agree (one r0 table), ``audit`` names the reuse, ``verify`` is intact."""
    build, new = SCENARIOS[scenario]
    b = build(PAST[0])
    log = tmp_path / "reused.jsonl"
    log.write_text(b.jsonl())
    url = f"sqlite+aiosqlite:///{tmp_path / 'reused.db'}"
    runner = CliRunner()
    imported = runner.invoke(app, ["events", "import", str(log), "--db", url])
    assert imported.exit_code == 0, imported.output

    def tables(*extra: str) -> list[tuple[str, str, float]]:
        result = runner.invoke(app, ["tables", "--db", url, "--format", "json", *extra])
        assert result.exit_code == 0, result.output
        return [(t["session_id"], t["response_id"], t["finalize_ts_s"]) for t in json.loads(result.stdout)["turns"]]

    head = str(b.position)
    read_model = tables()
    assert read_model == tables("--until-position", head)
    assert [r for s, r, _ in read_model if s == "s1"] == [f"r{t}" for t in range(PAST[0])] + new
    assert tables("--response", "r0") == tables("--response", "r0", "--until-position", head) == [("s1", "r0", 2.3)]
    warnings = audited(url, runner)
    assert warnings == audited(url, runner, "--until-position", head)
    stale = [w["detail"] for w in warnings if w["kind"] == "stale_finalize" and w["request_id"] == "r0"]
    assert any(d.endswith("already finalized (reason no longer kept)") for d in stale), stale
    verified = runner.invoke(app, ["verify", "--db", url])
    assert verified.exit_code == 0 and verified.stdout.startswith("intact"), verified.output
