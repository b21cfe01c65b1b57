"""DOMAIN §2.1 on the resources fold: a reopen after a close must advance the incarnation "so ids
of a closed session can never be accepted by its successor". A reopen that states the same (or
an older) incarnation is one ``incarnation_not_advanced`` warning and is judged as the next
incarnation, so the closed session's engine ids stay refused (D9), also after the sweep forgot
the closed session and across a checkpoint."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decider.state import next_incarnation
from projections.projector import SWEEP_EVERY, Projector
from projections.resources import reopened_incarnation
from projections.shell import checkpoint
from projections.shell.runner import FOLD_VERSION
from tests.logbuilder import LogBuilder, eph


def turn(b: LogBuilder, t0: float, incarnation: int, turn_id: int, response_id: str) -> str:
    """One stop turn on s1 under ``incarnation`` (fence and id); returns its request id."""
    x = eph("s1", turn_id, incarnation=incarnation)
    fence = {"incarnation": incarnation, "epoch": 0, "turn_id": turn_id}
    b.add("TurnCommitted", "s1", t0, turn_id=turn_id, response_id=response_id, create_response=True)
    b.add("StageRequestSubmitted", "s1", t0 + 0.01, stage_id=0, request_id=x, fence=fence, num_tokens_in=5)
    b.add("ResponseBegun", "s1", t0 + 0.02, response_id=response_id, request_id=x)
    b.add("StageOutput", "s1", t0 + 0.1, stage_id=0, request_id=x, num_new_tokens=3)
    b.add("ResponseEnded", "s1", t0 + 0.3, response_id=response_id, cause="model")
    b.add("ReleaseRequested", "s1", t0 + 0.4, request_ids=[x], cause="end_of_turn")
    b.add("StageRequestReleased", "s1", t0 + 0.4, stage_id=0, request_id=x, cause="end_of_turn")
    b.add("ReleaseResult", "s1", t0 + 0.4, request_ids=[x], outcome="ok")
    return x


def reopen_log(first: int, stated: int, gap: int = 0) -> tuple[LogBuilder, int, int]:
    """s1 opened under ``first`` with two turns, closed, ``gap`` positions of other sessions,
    reopened stating ``stated``, then one turn that reuses the closed session's turn-1 id
    scheme under ``stated``. Returns the log, the reopen's position and the reused submit's."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, model="m", incarnation=first)
    turn(b, 2.0, first, 0, "resp-1")
    turn(b, 3.0, first, 1, "resp-2")
    b.add("SessionClosed", "s1", 3.9, reason="session_close")
    for i in range((gap + 1) // 2):
        b.add("SessionOpened", f"o{i}", 3.95, model="m")
        b.add("SessionClosed", f"o{i}", 3.95, reason="session_close")
    reopen = b.add("SessionOpened", "s1", 4.0, model="m", incarnation=stated).position
    turn(b, 5.0, stated, 1, "resp-3")
    return b, reopen, reopen + 2


def kinds(p: Projector) -> list[tuple[str, str | None, int]]:
    return [(f.kind, f.request_id, f.first_position) for f in p.findings() if f.session_id == "s1"]


@pytest.mark.parametrize("gap", [0, SWEEP_EVERY + 1], ids=["soon", "after_a_sweep"])
@pytest.mark.parametrize(("first", "stated"), [(0, 0), (2, 2), (2, 1), (3, 0)], ids=["same", "same2", "back", "back3"])
def test_a_reopen_that_does_not_advance_is_warned_and_the_closed_ids_stay_refused(first, stated, gap):
    b, reopen, submit = reopen_log(first, stated, gap)
    old = eph("s1", 1, incarnation=stated)
    p = Projector().apply_all(b.stored)
    found = kinds(p)
    assert found[0] == ("incarnation_not_advanced", None, reopen), found
    assert ("stale_fence", old, submit) in found  # the submit binds nothing
    warned = next(f for f in p.findings() if f.kind == "incarnation_not_advanced")
    assert f"states incarnation {stated}, not above the ended session's {first}" in warned.detail
    assert p.session_resources("s1").incarnation == first + 1
    assert p.resources.held("s1") == 0 and [f for f in p.findings() if f.severity == "leak"] == []
    rows = {t.response_id: t for t in p.turn_tables}
    assert rows["resp-3"].request_id is None  # the new turn's table is not built from the old id
    assert rows["resp-2"].request_id == eph("s1", 1, incarnation=first)


@pytest.mark.parametrize("gap", [0, SWEEP_EVERY + 1], ids=["soon", "after_a_sweep"])
@pytest.mark.parametrize(("first", "stated"), [(0, 1), (2, 5)])
def test_a_reopen_that_advances_is_silent_and_binds_its_own_ids(first, stated, gap):
    b, _, _ = reopen_log(first, stated, gap)
    p = Projector().apply_all(b.stored)
    assert [k for k in kinds(p) if k[0] != "stale_finalize"] == []
    assert p.session_resources("s1").incarnation == stated
    assert {t.response_id: t.request_id for t in p.turn_tables}["resp-3"] == eph("s1", 1, incarnation=stated)


def test_the_successor_of_a_judged_reopen_binds_ids_of_the_judged_incarnation():
    """What the session engine mints after such a reopen (it mints from the fold) is accepted."""
    b, _, _ = reopen_log(0, 0)
    x = turn(b, 6.0, 1, 2, "resp-4")
    p = Projector().apply_all(b.stored)
    assert {t.response_id: t.request_id for t in p.turn_tables}["resp-4"] == x
    assert not any(f.request_id == x for f in p.findings())


def test_the_rule_only_goes_up():
    assert [reopened_incarnation(2, s) for s in (0, 1, 2, 3, 7)] == [3, 3, 3, 3, 7]


@pytest.mark.parametrize("cut_after", ["the_close", "the_sweep"])
def test_the_closed_incarnation_survives_a_checkpoint(cut_after):
    b, reopen, submit = reopen_log(2, 2, SWEEP_EVERY + 1)
    cut = {"the_close": 18, "the_sweep": reopen - 1}[cut_after]
    first = Projector().apply_all(b.stored[:cut])
    done = first.turns.take_finalized()
    blob = checkpoint.seal(checkpoint.encode_state(first), fold_version=FOLD_VERSION, position=cut, log_hash=b"h" * 32)
    resumed = checkpoint.open_blob(blob, fold_version=FOLD_VERSION, expect=Projector).state
    resumed.apply_all(b.stored[cut:])
    straight = Projector().apply_all(b.stored)
    assert resumed.findings() == straight.findings()
    assert ("stale_fence", eph("s1", 1, incarnation=2), submit) in kinds(resumed)
    assert done + resumed.turn_tables == straight.turn_tables


def open_twice_log(first: int, second: int, third: int | None = None) -> tuple[LogBuilder, list[int]]:
    """s1 opened under ``first`` with one turn, then opened again (no close or takeover between)
    stating ``second`` (and ``third``), then one turn under the last stated incarnation, then
    one more under ``first``. Returns the log and the extra opens' positions."""
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, model="m", incarnation=first)
    turn(b, 2.0, first, 0, "resp-1")
    stated = [second] if third is None else [second, third]
    opens = [
        b.add("SessionOpened", "s1", 2.5 + i / 10, model="m", incarnation=n).position for i, n in enumerate(stated)
    ]
    turn(b, 3.0, stated[-1], 1, "resp-2")
    turn(b, 4.0, first, 1, "resp-3")
    b.add("SessionClosed", "s1", 5.0, reason="session_close")
    return b, opens


@pytest.mark.parametrize(("first", "second", "third"), [(0, 3, 1), (2, 0, None), (1, 1, None), (0, 5, None)])
def test_an_open_while_open_is_refused_whatever_it_states(first, second, third):
    """Hostile retest of issue 23: a second ``SessionOpened`` with no close or takeover between
    lowered (or raised) the incarnation silently, and the old incarnation's ids still counted.
    The engine never writes one (a reopen follows a close, a takeover's open a
    ``SessionTakenOver``): it opens and changes nothing and is one warning each."""
    b, opens = open_twice_log(first, second, third)
    p = Projector().apply_all(b.stored)
    warned = [f for f in p.findings() if f.kind == "open_while_open"]
    assert [f.first_position for f in warned] == opens
    assert f"open stating incarnation {second} while incarnation {first} is open" in warned[0].detail
    assert p.session_resources("s1").incarnation == first
    rows = {t.response_id: t.request_id for t in p.turn_tables}
    assert rows["resp-1"] == eph("s1", 0, incarnation=first)
    assert rows["resp-3"] == eph("s1", 1, incarnation=first)
    last = second if third is None else third
    if last != first:  # the ids of the refused open's incarnation bind nothing
        assert rows["resp-2"] is None
        assert ("stale_fence", eph("s1", 1, incarnation=last)) in [(f.kind, f.request_id) for f in p.findings()]
    assert [f for f in p.findings() if f.severity == "leak"] == []


def test_an_open_while_open_counts_no_second_session_in_the_metrics():
    from projections.metrics import MetricsFold, TallySink

    b, opens = open_twice_log(0, 3)
    fold = MetricsFold(TallySink())
    fold.apply_all(b.stored[: opens[0]])
    assert fold.admitted == 1  # the one open session, not two
    fold.apply_all(b.stored[opens[0] :])
    assert fold.admitted == 0 and len(fold.rollups) == 1
    rollup = fold.rollups[0]
    assert rollup.opened_ts == 1.0  # the session's own open, not the refused one at 2.5
    assert sum(rollup.turns_by_reason.values()) == len(Projector().apply_all(b.stored).turn_tables) == 3


LIFE_STEPS = st.lists(st.one_of(st.integers(0, 6), st.sampled_from(["close", "takeover"])), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(steps=LIFE_STEPS)
def test_the_engine_opens_above_what_the_fold_judged_whatever_the_history_holds(steps):
    """The incarnation the session engine states for a (re)open (:func:`next_incarnation`, read
    from the stream's history) is above the one the resources fold judged the session by, so
    the fold accepts that open silently and binds the engine's ids (a fresh engine folds only
    the new incarnation's events, so it mints from what it stated). Hostile retest of the
    open_while_open rule: a refused open (an imported log; the engine never writes one) was
    taken as the session's incarnation by the engine, and a later reopen's ids were all
    ``stale_fence`` offline."""
    b = LogBuilder()
    for i, step in enumerate(steps):
        if step == "close":
            b.add("SessionClosed", "s1", 1.0 + i, reason="session_close")
        elif step == "takeover":
            b.add("SessionTakenOver", "s1", 1.0 + i, replica_id="r2", replica_incarnation=0)
        else:
            b.add("SessionOpened", "s1", 1.0 + i, model="m", incarnation=step)
    b.add("SessionClosed", "s1", 100.0, reason="session_close")
    stated = next_incarnation(e.event for e in b.stored)
    reopen = b.add("SessionOpened", "s1", 101.0, model="m", incarnation=stated).position
    x = turn(b, 102.0, stated, 0, "resp-next")
    p = Projector().apply_all(b.stored)
    assert [f.kind for f in p.findings() if f.first_position >= reopen and f.kind != "stale_finalize"] == []
    assert p.session_resources("s1").incarnation == stated
    assert {t.response_id: t.request_id for t in p.turn_tables}["resp-next"] == x


async def test_a_live_reopen_after_an_imported_open_while_open_binds_its_ids(tmp_path):
    """The same through the session engine (scripted FAKE ports, tests.fakes): a history with
    a refused second open, then a reopen stating no higher incarnation; the engine's next
    session must be judged by the offline fold as the engine ran it."""
    from engine_bridge.engine import SessionEngine
    from events.store import EventStore
    from tests.fakes.fake_port import FakeStagePort

    url = f"sqlite+aiosqlite:///{tmp_path}/ledger.db"
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0, model="m", incarnation=5)
    b.add("SessionOpened", "s1", 2.0, model="m", incarnation=0)  # open_while_open: refused
    b.add("SessionClosed", "s1", 3.0, reason="session_close")
    b.add("SessionOpened", "s1", 4.0, model="m", incarnation=0)  # judged as 6
    b.add("SessionClosed", "s1", 5.0, reason="session_close")
    store = await EventStore.open(url, create=True)
    await store.append("s1", b.events, expected_version=0)
    await store.close()
    ports = [FakeStagePort(0, "thinker", reply="hello there"), FakeStagePort(1, "talker")]
    async with await SessionEngine.open(url, ports) as engine:
        session = await engine.open_session("s1")
        await session.append_text("hi")
        await session.commit()
        await session.wait_idle(10)
        await session.close()
        assert session.incarnation == 7
    store = await EventStore.open(url)
    try:
        p = Projector().apply_all([stored async for stored in store.read_all(from_position=1)])
    finally:
        await store.close()
    assert [f.kind for f in p.findings()] == ["open_while_open", "incarnation_not_advanced"]
    assert [t.request_id for t in p.turn_tables] == [eph("s1", 0, incarnation=7)]
