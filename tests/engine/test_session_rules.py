"""Session-engine rules on a scripted FAKE engine (fast; the same scenarios run on live vLLM
engines in test_live_engine.py). Every assertion is made on the log the engine wrote, through
the same projections the offline audit uses."""

import asyncio

import pytest

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig, SessionError
from engine_bridge.plugin import TextPlugin
from events import ids
from projections.shell.runner import project_as_of
from reports.render_text import render_turn_text
from tests.fakes.fake_port import FakeStagePort
from tests.fakes.faults import FlakyAbortPort

CONFIG = EngineConfig(max_tokens=6, talker_max_tokens=4, flush_interval_s=0.005)


async def _engine(tmp_path, config):
    ports = [
        FlakyAbortPort(FakeStagePort(0, "thinker", token_delay_s=0.002)),
        FlakyAbortPort(FakeStagePort(1, "talker", token_delay_s=0.002)),
    ]
    return await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/ledger.db", ports, config=config)


@pytest.fixture
async def engine(tmp_path):
    eng = await _engine(tmp_path, CONFIG)
    yield eng
    await eng.aclose()


@pytest.fixture
async def long_engine(tmp_path):
    """Responses of 2,000 tokens (>= 4 s): a test can always cancel mid-response."""
    eng = await _engine(tmp_path, EngineConfig(max_tokens=2000, talker_max_tokens=4, flush_interval_s=0.005))
    yield eng
    await eng.aclose()


async def offline(engine):
    return await project_as_of(engine.store)


def types_of(history, session_id=None):
    return [s.event.type for s in history if session_id is None or s.stream_id == session_id]


async def turn(session, text, **kw):
    await session.append_text(text)
    action = await session.commit(**kw)
    await session.wait_idle(10)
    return action


async def test_two_ephemeral_turns_release_the_first_id(engine):
    s = await engine.open_session("alice")
    await turn(s, "Hello, who are you?")
    await turn(s, "And what can you do?")
    await s.close()
    p = await offline(engine)
    assert p.leaks() == []
    x0, x1 = ids.mint_ephemeral("alice", 0, 0, 0), ids.mint_ephemeral("alice", 0, 0, 1)
    history = await engine.store.read_stream("alice")
    submits = [s.position for s in history if s.event.type == "StageRequestSubmitted" and s.event.request_id == x1]
    releases = [s.position for s in history if s.event.type == "StageRequestReleased" and s.event.request_id == x0]
    assert len(releases) == 2 and max(releases) < submits[0]  # E4: (0,X0),(1,X0) gone before X1
    assert [t.finished_reason for t in p.turn_tables] == ["stop", "stop"]
    assert all(t.stages[0]["num_tokens_out"] == 6 for t in p.turn_tables)
    assert all(1 in t.stages for t in p.turn_tables)  # the talker's row


async def test_listen_only_then_speak_rebinds_and_retargets(engine):
    s = await engine.open_session("bob", auto_response=True)
    assert await turn(s, "mm-hmm") == "START_AUTO_RESPONSE"
    assert [e.type for e in s.drain_events()].count("response.listen") == 1
    await turn(s, "Tell me a joke please")
    await s.close()
    p = await offline(engine)
    assert p.leaks() == []
    history = await engine.store.read_stream("bob")
    completions = [s.event for s in history if s.event.type == "TurnCompleted"]
    assert completions[0].cause == "mechanical"  # listen-only turn never completed: rebind
    _x0, x1 = ids.mint_ephemeral("bob", 0, 0, 0), ids.mint_ephemeral("bob", 0, 0, 1)
    bound = [s.event.request_id for s in history if s.event.type == "ActiveRequestBound"]
    assert bound[-1] == x1  # E5
    assert len(p.turn_tables) == 1  # listen-only turns emit no table (M11)


async def test_barge_in_mid_response(long_engine):
    s = await long_engine.open_session("carol")
    await s.append_text("Tell me a long story")
    await s.commit()
    while not any(e.type == "response.text.delta" for e in s.drain_events()):
        await asyncio.sleep(0.001)
    assert await s.barge_in()
    events = s.drain_events()
    assert any(e.type == "response.cancelled" and e.data["reason"] == "barge_in" for e in events)
    assert s.epoch == 1
    await s.append_text("Actually, just say hi")
    await s.commit()
    assert s.active.request_id == ids.mint_ephemeral("carol", 0, 1, 0)  # new epoch, same turn
    await s.close()
    p = await offline(long_engine)
    assert p.leaks() == []
    assert [t.finished_reason for t in p.turn_tables] == ["barge_in", "close"]
    first = p.turn_tables[0]
    assert first.stages[0]["vllm_ttft_ms"] is not None  # a token had arrived before the barge-in
    assert p.resources.request_resources("carol") == {"carol": {}}


@pytest.mark.parametrize(
    "command, reason, wire",
    [
        ("cancel_response", "cancel", "client_cancelled"),
        ("cancel_input", "cancel", "barge_in"),
        ("clear_output_audio", "cancel", "output_audio_buffer_clear"),
    ],
)
async def test_cancel_sources(long_engine, command, reason, wire):
    s = await long_engine.open_session("dave")
    await s.append_text("Explain the weather")
    await s.commit()
    await getattr(s, command)()
    cancelled = [e for e in s.drain_events() if e.type == "response.cancelled"]
    assert cancelled and cancelled[0].data["reason"] == wire  # M17: wire keeps legacy values
    await s.close()
    p = await offline(long_engine)
    assert [t.finished_reason for t in p.turn_tables] == [reason]
    assert p.leaks() == []


@pytest.mark.parametrize("close_reason", ["session_close", "disconnect"])
async def test_close_mid_response(long_engine, close_reason):
    s = await long_engine.open_session("erin")
    await s.append_text("Count to ten slowly")
    await s.commit()
    await asyncio.sleep(0.005)
    await s.close(close_reason)
    p = await offline(long_engine)
    assert [t.finished_reason for t in p.turn_tables] == ["close"]
    assert p.leaks() == []
    with pytest.raises(SessionError, match="session_closed"):
        await s.append_text("hello?")


async def test_abort_failure_restores_keys_and_submits_nothing(engine):
    s = await engine.open_session("frank", auto_response=True)
    await turn(s, "uh-huh")  # listen-only: X0 stays bound, next commit must rebind
    engine.ports[0].fail_next_aborts(1)
    await s.append_text("What time is it?")
    # X0 finished, so the rebind releases it without an abort; force the abort path:
    x0 = ids.mint_ephemeral("frank", 0, 0, 0)
    from engine_bridge.cleanup import CleanupFailed, cleanup_id

    with pytest.raises(CleanupFailed):
        await cleanup_id(s.log, s.ports, x0, cause="stale_rebind", force_abort=True)
    state = s.log.projector.resources.sessions["frank"]
    assert (0, x0) in state.bindings  # R3: restored exactly
    await s.close()
    assert (await offline(engine)).leaks() == []  # close retried the abort (R7)


async def test_barge_in_abort_failure_restores_and_close_retries(long_engine):
    s = await long_engine.open_session("gina")
    await s.append_text("Tell me a long story")
    await s.commit()
    while not any(e.type == "response.text.delta" for e in s.drain_events()):
        await asyncio.sleep(0.001)
    x0 = s.active.request_id
    keys_before = {k for k in s.log.projector.resources.sessions["gina"].bindings if k[1] == x0}
    long_engine.ports[0].fail_next_aborts(1)
    mark = len(await long_engine.store.read_stream("gina"))
    with pytest.raises(SessionError, match="runtime_append_failed"):
        await s.barge_in()
    history = (await long_engine.store.read_stream("gina"))[mark:]
    kinds = [e.event.type for e in history]
    assert kinds.index("AbortRequested") < kinds.index("AbortResult") < kinds.index("StageRequestRestored")
    assert [e.event.outcome for e in history if e.event.type == "AbortResult"][0] == "failed"
    restored = {(e.event.stage_id, e.event.request_id) for e in history if e.event.type == "StageRequestRestored"}
    assert restored == keys_before  # R3: exactly the dropped keys
    assert not any(e.event.type == "StageRequestSubmitted" for e in history)
    assert (await offline(long_engine)).leaks() == []  # held, but close will retry
    await s.close()
    assert (await offline(long_engine)).leaks() == []  # R7: close retried the abort


async def test_resident_session_one_id_submit_initial_then_update(tmp_path):
    ports = [FakeStagePort(0, "thinker"), FakeStagePort(1, "talker")]
    async with await SessionEngine.open(
        f"sqlite+aiosqlite:///{tmp_path}/r.db", ports, config=CONFIG, plugin=TextPlugin(resumable=True)
    ) as engine:
        s = await engine.open_session("hana")
        for text in ("Hi there", "How are you?", "Bye now"):
            await turn(s, text)
        await s.close()
        history = await engine.store.read_stream("hana")
        submits = [e.event for e in history if e.event.type == "StageRequestSubmitted" and e.event.stage_id == 0]
        resident = ids.mint_resident("hana", 0, 0)
        assert [(e.request_id, e.kind, e.resumable) for e in submits] == [
            (resident, "initial", True),
            (resident, "update", True),
            (resident, "update", True),
        ]
        p = await project_as_of(engine.store)
        assert p.leaks() == []
        assert len(p.turn_tables) == 3
        assert all(t.stages[0]["vllm_ttft_ms"] is not None for t in p.turn_tables)  # per turn (CASE-10)


async def test_defer_active_response_never_aborts(engine):
    s = await engine.open_session("ivan")
    await s.append_text("Tell me about Paris")
    await s.commit()
    await s.append_text("yeah")
    assert await s.commit(overlap_speech_ms=300) == "DEFER_ACTIVE_RESPONSE"  # short ack: dropped
    await s.append_text("and what about Rome?")
    assert await s.commit(overlap_speech_ms=1500) == "DEFER_ACTIVE_RESPONSE"
    await s.wait_idle(10)
    await asyncio.sleep(0.05)
    await s.wait_idle(10)
    await s.close()
    history = await engine.store.read_stream("ivan")
    assert not any(e.event.type == "AbortRequested" and e.event.reason != "session_close" for e in history)
    p = await offline(engine)
    assert [t.finished_reason for t in p.turn_tables] == ["stop", "stop"]  # the deferred one was promoted
    assert p.leaks() == []


async def test_bad_input_is_refused_and_logged(engine):
    s = await engine.open_session("judy")
    with pytest.raises(SessionError, match="input_audio_buffer_empty"):
        await s.commit()
    with pytest.raises(SessionError, match="session_exists"):
        await engine.open_session("judy")
    with pytest.raises(SessionError, match="unknown_session"):
        engine.session("nobody")
    history = await engine.store.read_stream("judy")
    assert history[-1].event.type == "CommandRejected"
    await turn(s, "still usable?")
    await s.close()
    assert (await offline(engine)).leaks() == []


async def test_prompt_too_long_fails_the_turn_and_session_stays_usable(tmp_path):
    ports = [FakeStagePort(0, "thinker", max_model_len=40), FakeStagePort(1, "talker")]
    async with await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/p.db", ports, config=CONFIG) as engine:
        s = await engine.open_session("kim")
        await turn(s, "word " * 60)
        assert any(e.type == "error" and e.data["code"] == "prompt_too_long" for e in s.drain_events())
        await turn(s, "short")
        await s.close()
        p = await project_as_of(engine.store)
        assert [t.finished_reason for t in p.turn_tables] == ["error", "stop"]
        assert p.leaks() == []


async def test_live_tables_equal_offline_reprojection(engine):
    s = await engine.open_session("lee")
    await turn(s, "Hello")
    await turn(s, "Thanks")
    await s.close()
    p = await offline(engine)
    assert [render_turn_text(t) for t in engine.printed] == [render_turn_text(t) for t in p.turn_tables]


async def test_log_stats_off_prints_nothing_but_reprojects(engine):
    s = await engine.open_session("max", log_stats=False)
    await turn(s, "Hello")
    await s.close()
    assert list(engine.printed) == []
    assert len((await offline(engine)).turn_tables) == 1


async def test_crash_recovery_closes_and_reconciles(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}/c.db"
    ports = [FakeStagePort(0, "thinker", token_delay_s=0.05), FakeStagePort(1, "talker")]
    engine = await SessionEngine.open(url, ports, config=CONFIG)
    s = await engine.open_session("neo")
    await s.append_text("Start a long answer")
    await s.commit()
    await asyncio.sleep(0.02)
    s.active.task.cancel()  # the process "dies": nothing more is written
    await s.log.flush()
    await engine.store.close()
    fresh_ports = [FakeStagePort(0, "thinker"), FakeStagePort(1, "talker")]  # new engines: nothing live
    async with await SessionEngine.open(url, fresh_ports, config=CONFIG) as recovered:
        history = await recovered.store.read_stream("neo")
        kinds = [e.event.type for e in history]
        assert "SessionClosed" in kinds and "StageRequestLost" in kinds
        closed = [e.event for e in history if e.event.type == "SessionClosed"]
        assert closed[0].reason == "recovered_after_crash"
        p = await project_as_of(recovered.store)
        assert p.leaks() == []
        assert [t.finished_reason for t in p.turn_tables] == ["close"]
        s2 = await recovered.open_session("neo")
        assert s2.incarnation == 1
        await s2.close()
    for port in ports:
        await port.shutdown()


async def test_tables_printed_to_the_stats_logger_at_finalize(tmp_path, caplog):
    from reports.render_text import turn_log_messages

    caplog.set_level("INFO", logger="duplex_ledger.stats")
    engine = await SessionEngine.open(
        f"sqlite+aiosqlite:///{tmp_path}/stats.db",
        [FakeStagePort(0, "thinker"), FakeStagePort(1, "talker")],
        config=CONFIG,
        stats_renderer=turn_log_messages,
    )  # the CLI's subscription
    s = await engine.open_session("otto")
    await turn(s, "Hello")
    quiet = await engine.open_session("quiet", log_stats=False)
    await turn(quiet, "Hello")
    # a turn's tables are printed once its finalizing events are durable (hostile L15): at the
    # session's next flush, which closing forces (under load the flush clock may not have run)
    await s.close()
    await quiet.close()
    messages = [r.getMessage() for r in caplog.records if r.name == "duplex_ledger.stats"]
    assert sum(m.startswith("[OmniTiming] req=duplex-s.") for m in messages) == 1  # one line per turn
    assert any(m.startswith("\n[StageRequestStats [request_id=") for m in messages)  # its own message
    assert all("quiet" not in m and ids.encode_session("quiet") not in m for m in messages)
    await engine.aclose()


async def test_stale_fence_is_refused_and_nothing_else_changes(long_engine):
    s = await long_engine.open_session("pia")
    seen = s.fence()  # what the client saw before the barge-in
    await s.append_text("Tell me a long story")
    await s.commit(fence=seen)
    while not any(e.type == "response.text.delta" for e in s.drain_events()):
        await asyncio.sleep(0.001)
    await s.barge_in()
    before = len(s.log.projector.resources.sessions["pia"].bindings)
    with pytest.raises(SessionError, match="stale_fence"):
        await s.append_text("late words from the old epoch", fence=seen)
    with pytest.raises(SessionError, match="stale_fence"):
        await s.commit(fence=seen)
    assert len(s.log.projector.resources.sessions["pia"].bindings) == before
    await s.append_text("fresh words", fence=s.fence())  # the current fence is accepted
    await s.close()
    history = await long_engine.store.read_stream("pia")
    rejected = [e.event for e in history if e.event.type == "CommandRejected"]
    assert [r.error_code for r in rejected] == ["stale_fence", "stale_fence"]
    assert not any(e.event.type == "InputAppended" and e.event.text == "late words from the old epoch" for e in history)
    p = await offline(long_engine)
    assert p.leaks() == []
