"""Remaining DOMAIN §6 items that are not case-shaped: E6, E10, M19, M20, and the live
(follow) mode of the runner."""

import asyncio

import pytest

from engine_bridge.plugin import TextPlugin
from engine_bridge.ports import StagePortError, StreamSegment
from engine_bridge.session_log import SessionLog
from events.stats import StageRequestStats
from events.store.store import EventStore
from events.types import Capabilities, parse_event
from projections.collapse import collapse_segments
from projections.shell.runner import ProjectionRunner
from tests.cases.support import project
from tests.fakes.fake_port import FakeStagePort
from tests.logbuilder import LogBuilder, eph, resident


async def test_e6_default_capabilities_are_ephemeral_and_mint_stage0_t0(tmp_path):
    assert Capabilities().supports_core_resumable_request is False
    assert TextPlugin().capabilities().supports_core_resumable_request is False
    assert "id shape" in (Capabilities.__doc__ or "")  # the flag's documentation says what it selects
    from engine_bridge.engine import SessionEngine

    ports = [FakeStagePort(0), FakeStagePort(1)]
    async with await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/e6.db", ports) as engine:
        await engine.open_session("s1")
        history = await engine.store.read_stream("s1")
        reserved = [e.event.request_id for e in history if e.event.type == "StageRequestReserved"]
        assert reserved == [eph("s1", 0)] and reserved[0].endswith(".r.stage0_t0")


def test_e10_update_on_ephemeral_refused_by_the_log_and_by_the_port():
    b = LogBuilder()
    b.add("StageRequestSubmitted", "s1", 1.0, stage_id=0, request_id=eph("s1", 0), num_tokens_in=3)
    b.add("StageRequestSubmitted", "s1", 2.0, stage_id=0, request_id=eph("s1", 0), kind="update")
    b.add("StageRequestSubmitted", "s1", 3.0, stage_id=0, request_id=resident("s1"), kind="initial")
    b.add("StageRequestSubmitted", "s1", 4.0, stage_id=0, request_id=resident("s1"), kind="update")
    p = project(b)
    assert [f.kind for f in p.findings() if f.severity == "warning"] == ["update_on_ephemeral"]


async def test_e10_port_refuses_update_without_an_open_stream():
    port = FakeStagePort(0)
    with pytest.raises(StagePortError):
        await port.update_stream(eph("s1", 0), StreamSegment("hello"))


async def test_m19_printing_failure_never_blocks_finalize(tmp_path):
    store = await EventStore.open(f"sqlite+aiosqlite:///{tmp_path}/m19.db", create=True)
    try:

        def boom(turn):
            raise RuntimeError("printer broke")

        log = SessionLog(store, "s1", 0, on_turn=boom)
        x = eph("s1", 3)
        await log.emit(
            parse_event({"type": "ResponseBegun", "session_id": "s1", "ts": 1.0, "response_id": "r", "request_id": x})
        )
        await log.emit(parse_event({"type": "TurnFinalized", "session_id": "s1", "ts": 2.0, "response_id": "r"}))
        session = log.projector.turns.sessions["s1"]
        assert session.open is None and list(session.terminals) == ["r"]  # still finalized, once
    finally:
        await store.close()


def test_m20_weighted_tpot_is_pinned_at_the_stats_level():
    """The collapse helper weights TPOT by max(n_out - 1, 1) (declared change vs last-wins)."""
    row = collapse_segments(
        [StageRequestStats(num_tokens_out=4, vllm_tpot_ms=10.0), StageRequestStats(num_tokens_out=6, vllm_tpot_ms=20.0)]
    )
    assert row["vllm_tpot_ms"] == pytest.approx(16.25)


async def test_runner_follow_projects_live_appends(tmp_path):
    store = await EventStore.open(f"sqlite+aiosqlite:///{tmp_path}/follow.db", create=True)
    try:
        runner = ProjectionRunner(store, batch_size=100)
        stop = asyncio.Event()
        task = asyncio.create_task(runner.follow(stop, idle_flush_s=0.02))
        x = eph("s1", 0)
        await store.append(
            "s1",
            [
                parse_event(
                    {"type": "ResponseBegun", "session_id": "s1", "ts": 1.0, "response_id": "r1", "request_id": x}
                )
            ],
        )
        await store.append(
            "s1", [parse_event({"type": "ResponseEnded", "session_id": "s1", "ts": 2.0, "response_id": "r1"})]
        )
        for _ in range(200):
            if await runner.turn_tables():
                break
            await asyncio.sleep(0.02)
        stop.set()
        await asyncio.wait_for(task, 5)
        assert [t.response_id for t in await runner.turn_tables()] == ["r1"]
        assert runner.position == 2
    finally:
        await store.close()
