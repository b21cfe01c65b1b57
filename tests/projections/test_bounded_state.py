"""A session of many turns folds in flat memory (issue 13: a week-long embedded engine): the
per-id and per-response memory of the folds is bounded, while late facts of recent ids are
still told apart (one warning each). One exception, by design (hostile retest: a reused response
id must stay stale, never a second table): the turns fold keeps the id of every response
finalized before its kept terminals, one set entry a turn past ``KEPT_PER_SESSION``
(``projections.turn_state``'s memory note: 28-52 bytes of set table a turn on CPython 3.11, plus
the id string, 49 + len(id) bytes)."""

from __future__ import annotations

import sys

from projections.projector import Projector
from projections.resources import RETIRED_IDS_KEPT
from projections.turns import KEPT_PER_SESSION
from tests.logbuilder import LogBuilder, eph


def play(turns: int) -> tuple[LogBuilder, Projector]:
    b = LogBuilder()
    p = Projector(live=True)
    b.add("SessionOpened", "s", 1.0)
    ts = 1.0
    for t in range(turns):
        x = eph("s", t)
        ts += 1.0
        for type_name, fields in (
            ("StageRequestReserved", dict(stage_id=0, request_id=x, fence={"turn_id": t})),
            ("TurnCommitted", dict(turn_id=t, response_id=f"r{t}", create_response=True)),
            ("StageRequestSubmitted", dict(stage_id=0, request_id=x, fence={"turn_id": t}, num_tokens_in=3)),
            ("ResponseBegun", dict(response_id=f"r{t}", turn_id=t, request_id=x)),
            ("StageOutput", dict(stage_id=0, request_id=x, num_new_tokens=2, model_turn_id=t, end_of_turn=True)),
            ("StageRequestFinished", dict(stage_id=0, request_id=x, finish_reason="stop")),
            ("ResponseEnded", dict(response_id=f"r{t}", cause="model")),
            ("TurnCompleted", dict(completed_turn_id=t, new_turn_id=t + 1)),
            ("StageRequestReleased", dict(stage_id=0, request_id=x)),
            ("ReleaseRequested", dict(request_ids=[x])),
            ("ReleaseResult", dict(request_ids=[x], outcome="ok")),
        ):
            ts += 0.01
            p.apply(b.add(type_name, "s", ts, **fields))
        p.turns.take_finalized()
    return b, p


def test_many_turns_keep_bounded_state():
    b, p = play(RETIRED_IDS_KEPT + KEPT_PER_SESSION + 50)
    resources, turns = p.resources.sessions["s"], p.turns.sessions["s"]
    assert len(resources.lives) <= RETIRED_IDS_KEPT + 1
    assert len(turns.submitted) <= KEPT_PER_SESSION + 1 and len(turns.terminals) <= KEPT_PER_SESSION
    # The one per-turn memory: the ids finalized before the kept terminals, at most 64 bytes of
    # set table each (plus the id string).
    count = RETIRED_IDS_KEPT + KEPT_PER_SESSION + 50
    earlier = turns.finalized_earlier
    assert earlier == {f"r{t}" for t in range(count - KEPT_PER_SESSION)} and not earlier & turns.terminals.keys()
    assert sys.getsizeof(earlier) <= 64 * len(earlier)
    # A late output of a recent id is still one warning (output_after_release) and changes nothing.
    last = eph("s", RETIRED_IDS_KEPT + KEPT_PER_SESSION + 49)
    p.apply(b.add("StageOutput", "s", 10_000.0, stage_id=0, request_id=last, num_new_tokens=9))
    assert [f.kind for f in p.findings() if f.severity == "warning"] == ["output_after_release"]
    assert p.leaks() == []
