"""The resources fold split by job (issue 23): R3's check at a new Stage0 submit looks at the
ids whose abort or release failed, a failed id that was cleaned up later is forgotten with its
life (flat memory), and every class of the fold's modules stays under 300 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import projections
from projections.projector import Projector
from projections.resources import RETIRED_IDS_KEPT
from tests.logbuilder import LogBuilder, eph


def _turn(b: LogBuilder, p: Projector, t: int, ts: float, *, abort_fails: bool, retried: bool) -> float:
    """One turn whose Stage0 id is aborted before it finishes (R2); ``abort_fails``: the first
    ack is ``failed`` (R3); ``retried``: a second abort then succeeds."""
    x = eph("s", t)
    abort = ("AbortRequested", dict(request_ids=[x], stage_ids=[0]))
    steps: list[tuple[str, dict]] = [
        ("StageRequestReserved", dict(stage_id=0, request_id=x, fence={"turn_id": t})),
        ("StageRequestSubmitted", dict(stage_id=0, request_id=x, fence={"turn_id": t}, num_tokens_in=3)),
        ("TurnCompleted", dict(completed_turn_id=t, new_turn_id=t + 1)),
        ("StageRequestReleased", dict(stage_id=0, request_id=x)),
        abort,
    ]
    if abort_fails:
        steps.append(("AbortResult", dict(request_ids=[x], stage_id=0, outcome="failed")))
    if retried:
        steps += [abort, ("AbortResult", dict(request_ids=[x], stage_id=0, outcome="ok"))]
    for type_name, fields in steps:
        ts += 0.01
        p.apply(b.add(type_name, "s", ts, **fields))
    return ts


def test_failed_abort_then_new_submit_is_one_r3_leak_and_cleaned_failures_are_forgotten():
    b, p = LogBuilder(), Projector(live=True)
    p.apply(b.add("SessionOpened", "s", 1.0))
    ts, turns = 1.0, RETIRED_IDS_KEPT + 40
    for t in range(turns):  # every abort fails once, then goes through: nothing is owed
        ts = _turn(b, p, t, ts + 1.0, abort_fails=True, retried=True)
    state = p.resources.sessions["s"]
    assert len(state.failed_ids) <= RETIRED_IDS_KEPT + 1 and len(state.lives) <= RETIRED_IDS_KEPT + 1
    assert [f.kind for f in p.findings()] == []
    # An abort that fails and is never retried: the next Stage0 submit is one R3 leak naming it.
    ts = _turn(b, p, turns, ts + 1.0, abort_fails=True, retried=False)
    _turn(b, p, turns + 1, ts + 1.0, abort_fails=False, retried=False)
    found = [(f.kind, f.request_id) for f in p.findings() if f.kind == "submit_after_failed_abort"]
    assert found == [("submit_after_failed_abort", eph("s", turns))]


def test_no_class_of_the_resources_fold_is_over_300_lines():
    root = Path(projections.__file__).parent
    sizes = {
        f"{path.name}:{node.name}": (node.end_lineno or node.lineno) - node.lineno + 1
        for path in sorted(root.glob("resource*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }
    assert "resources.py:ResourcesFold" in sizes
    assert {name: n for name, n in sizes.items() if n > 300} == {}
