"""The session engine on LIVE vLLM engines (CPU build, tiny random model): the rules of
test_session_rules.py hold against real engines, and the log says what really ran."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig, SessionError
from engine_bridge.plugin import TextPlugin
from events import ids
from projections.shell.runner import project_as_of
from reports.render_text import render_turn_text
from tests.fakes.faults import FlakyAbortPort

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

CONFIG = EngineConfig(max_tokens=8, talker_max_tokens=6, ignore_eos=True, flush_interval_s=0.01)


LONG = EngineConfig(max_tokens=900, talker_max_tokens=6, ignore_eos=True, flush_interval_s=0.01)


def engine_for(tmp_path, live_ports, name="ledger", config=CONFIG, **kw) -> "asyncio.Future[SessionEngine]":
    """A SessionEngine on the shared live ports (wrapped so a test can inject abort failures).
    ``LONG`` responses (900 tokens) leave time to interrupt them."""
    ports = [FlakyAbortPort(live_ports.thinker), FlakyAbortPort(live_ports.talker)]
    return SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/{name}.db", ports, config=config, **kw)


async def turn(session, text):
    await session.append_text(text)
    await session.commit()
    await session.wait_idle(60)


async def first_delta(session):
    deadline = time.monotonic() + 30
    while not any(e.type == "response.text.delta" for e in session.drain_events()):
        assert time.monotonic() < deadline, "no output from the live engine"
        await asyncio.sleep(0.002)


async def test_ephemeral_two_turns_exact_tokens_and_first_id_released(tmp_path, live_ports):
    async with await engine_for(tmp_path, live_ports) as engine:
        s = await engine.open_session("live-alice")
        await turn(s, "Hello there, who are you?")
        await turn(s, "What can you do?")
        await s.close()
        p = await project_as_of(engine.store)
        assert p.leaks() == []
        assert [t.finished_reason for t in p.turn_tables] == ["stop", "stop"]
        for t in p.turn_tables:
            assert t.stages[0]["num_tokens_out"] == 8  # ignore_eos: exactly the budget
            assert t.stages[1]["num_tokens_out"] >= 1
            assert t.stages[1]["audio_generated_frames"] == t.stages[1]["num_tokens_out"] * 480
            assert 0 < t.stages[0]["vllm_ttft_ms"] < 60_000
        x0 = ids.mint_ephemeral("live-alice", 0, 0, 0)
        assert x0 not in live_ports.thinker.live_request_ids()
        # the live printout is what offline re-projection gives, byte for byte
        assert [render_turn_text(t) for t in engine.printed] == [render_turn_text(t) for t in p.turn_tables]


async def test_resident_session_streams_updates_on_one_id(tmp_path, live_ports):
    async with await engine_for(tmp_path, live_ports, plugin=TextPlugin(resumable=True)) as engine:
        s = await engine.open_session("live-res")
        for text in ("Hi!", "How is the weather?", "Thanks, bye."):
            await turn(s, text)
        resident = ids.mint_resident("live-res", 0, 0)
        assert resident in live_ports.thinker.live_request_ids()  # parked between segments
        await s.close()
        assert resident not in live_ports.thinker.live_request_ids()
        history = await engine.store.read_stream("live-res")
        kinds = [
            (e.event.kind, e.event.request_id)
            for e in history
            if e.event.type == "StageRequestSubmitted" and e.event.stage_id == 0
        ]
        assert kinds == [("initial", resident), ("update", resident), ("update", resident)]
        p = await project_as_of(engine.store)
        assert p.leaks() == []
        assert [t.stages[0]["num_tokens_out"] for t in p.turn_tables] == [8, 8, 8]  # per turn, not cumulative


async def test_barge_in_mid_response_aborts_every_pool(tmp_path, live_ports):
    async with await engine_for(tmp_path, live_ports, "b", LONG) as engine:
        s = await engine.open_session("live-barge")
        await s.append_text("Tell me a very long story about the sea.")
        await s.commit()
        await first_delta(s)
        x0 = s.active.request_id
        assert await s.barge_in()
        assert x0 not in live_ports.thinker.live_request_ids()
        await s.close()
        p = await project_as_of(engine.store)
        assert p.leaks() == []
        (t,) = p.turn_tables
        assert t.finished_reason == "barge_in"
        assert 0 < t.stages[0]["num_tokens_out"] < 900


async def test_cancel_and_close_mid_response(tmp_path, live_ports):
    async with await engine_for(tmp_path, live_ports, "c", LONG) as engine:
        a = await engine.open_session("live-cancel")
        await a.append_text("Describe every planet in detail.")
        await a.commit()
        await first_delta(a)
        await a.cancel_response()
        await a.close()
        b = await engine.open_session("live-close")
        await b.append_text("Describe every ocean in detail.")
        await b.commit()
        await first_delta(b)
        running = b.active.request_id
        await b.close("disconnect")
        assert running not in live_ports.thinker.live_request_ids()
        p = await project_as_of(engine.store)
        assert p.leaks() == []
        assert {t.session_id: t.finished_reason for t in p.turn_tables} == {
            "live-cancel": "cancel",
            "live-close": "close",
        }


async def test_listen_only_then_speak(tmp_path, live_ports):
    async with await engine_for(tmp_path, live_ports) as engine:
        s = await engine.open_session("live-listen", auto_response=True)
        await turn(s, "mm-hmm")
        assert any(e.type == "response.listen" for e in s.drain_events())
        await turn(s, "So what do you think about it?")
        await s.close()
        p = await project_as_of(engine.store)
        assert p.leaks() == []
        assert len(p.turn_tables) == 1
        history = await engine.store.read_stream("live-listen")
        assert [e.event.cause for e in history if e.event.type == "TurnCompleted"][0] == "mechanical"


async def test_injected_abort_failure_on_live_engine_restores_keys(tmp_path, live_ports):
    async with await engine_for(tmp_path, live_ports, "f", LONG) as engine:
        ports = engine.ports
        s = await engine.open_session("live-flaky")
        await s.append_text("Tell me everything about volcanoes.")
        await s.commit()
        await first_delta(s)
        x0 = s.active.request_id
        ports[0].fail_next_aborts(1)
        with pytest.raises(SessionError, match="runtime_append_failed"):
            await s.barge_in()
        assert x0 in live_ports.thinker.live_request_ids()  # the failed abort really left it running
        state = s.log.projector.resources.sessions["live-flaky"]
        assert (0, x0) in state.bindings  # restored
        await s.close()  # R7: close retries
        assert x0 not in live_ports.thinker.live_request_ids()
        assert (await project_as_of(engine.store)).leaks() == []


async def test_prompt_over_model_length_is_refused_cleanly(tmp_path, live_ports):
    async with await engine_for(tmp_path, live_ports) as engine:
        s = await engine.open_session("live-long")
        await turn(s, "word " * 2000)
        errors = [e for e in s.drain_events() if e.type == "error"]
        assert errors and errors[0].data["code"] == "prompt_too_long"
        await turn(s, "Short question?")
        await s.close()
        p = await project_as_of(engine.store)
        assert [t.finished_reason for t in p.turn_tables] == ["error", "stop"]
        assert p.leaks() == []


CHILD = textwrap.dedent("""
    import asyncio, sys
    from engine_bridge.engine import SessionEngine
    from engine_bridge.messages import EngineConfig
    from engine_bridge.vllm_port import VllmStagePort

    async def main(url, model):
        thinker = await VllmStagePort.start(model, stage_id=0, name="thinker")
        talker = await VllmStagePort.start(model, stage_id=1, name="talker")
        cfg = EngineConfig(max_tokens=100000, ignore_eos=True, flush_interval_s=0.005)
        engine = await SessionEngine.open(url, [thinker, talker], config=cfg)
        s = await engine.open_session("crashy")
        await s.append_text("Talk forever.")
        await s.commit()
        while not any(e.type == "response.text.delta" for e in s.drain_events()):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        await s.log.flush()
        print("MID-RESPONSE", flush=True)
        await asyncio.sleep(3600)

    if __name__ == "__main__":
        asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


async def test_crash_recovery_after_sigkill(tmp_path, live_ports, tiny_model_dir):
    url = f"sqlite+aiosqlite:///{tmp_path}/crash.db"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    child = subprocess.Popen(
        [sys.executable, str(script), url, str(tiny_model_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**env, "VLLM_LOGGING_LEVEL": "ERROR"},
        start_new_session=True,
    )

    async def marker() -> None:
        while True:
            line = await asyncio.to_thread(child.stdout.readline)
            assert line, "the child exited before it was mid-response"
            if line.strip() == "MID-RESPONSE":
                return

    try:
        await asyncio.wait_for(marker(), 240)
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the child and its engine-core processes
        child.wait()
    async with await SessionEngine.open(url, [live_ports.thinker, live_ports.talker], config=CONFIG) as engine:
        history = await engine.store.read_stream("crashy")
        kinds = [e.event.type for e in history]
        assert "StageOutput" in kinds  # it was mid-response
        closed = [e.event for e in history if e.event.type == "SessionClosed"]
        assert [c.reason for c in closed] == ["recovered_after_crash"]
        lost = [e for e in history if e.event.type == "StageRequestLost"]
        # every key the log held submitted when the child died, and only those: (0, X0), and
        # (1, X0) too when the talker had been handed the turn before the kill (timing)
        before = await project_as_of(engine.store, until_position=lost[0].position - 1)
        held = before.resources.request_resources("crashy")["crashy"]
        running = sorted(key for key, state in held.items() if state == "submitted")
        assert sorted((e.event.stage_id, e.event.request_id) for e in lost) == running
        assert (0, ids.mint_ephemeral("crashy", 0, 0, 0)) in running
        p = await project_as_of(engine.store)
        assert p.leaks() == []
        assert [t.finished_reason for t in p.turn_tables] == ["close"]
