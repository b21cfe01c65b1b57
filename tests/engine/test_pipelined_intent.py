"""Pipelined intents (issue 15, docs/design.md "Pipelined intents"): a submit's intent is
committed while the engine already runs the request, and nothing the request produced reaches
the client or the log before that commit. A SIGKILL in between (engine call made, intent not
committed) leaves the log as if the process died before the call, and recovery reconciles it.
The engines here are scripted FAKE ports (engine_bridge.fake_port), in-process like vLLM's
engine core with VLLM_ENABLE_V1_MULTIPROCESSING=0: they die with the process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from events import ids
from projections.shell.runner import project_as_of
from tests.fakes.fake_port import FakeStagePort

CONFIG = EngineConfig(max_tokens=6, talker_max_tokens=4, ignore_eos=True, flush_interval_s=0.01)


def _ports() -> list[FakeStagePort]:
    return [FakeStagePort(0, "thinker", token_delay_s=0.002), FakeStagePort(1, "talker", token_delay_s=0.002)]


def _hold_intent_commits(engine: SessionEngine) -> asyncio.Event:
    """Make every store append that carries a StageRequestSubmitted wait for the returned
    event before it is written (a slow writer, under test control)."""
    release = asyncio.Event()
    append = engine.store.append

    async def held(stream_id, events, expected_version=None):  # type: ignore[no-untyped-def]
        if any(e.type == "StageRequestSubmitted" for e in events):
            await release.wait()
        return await append(stream_id, events, expected_version=expected_version)

    engine.store.append = held  # type: ignore[method-assign]
    return release


async def test_engine_runs_before_the_intent_commits_but_no_output_passes_before_it(tmp_path) -> None:
    ports = _ports()
    async with await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/p.db", ports, config=CONFIG) as engine:
        release = _hold_intent_commits(engine)
        s = await engine.open_session("s")
        s.drain_events()
        await s.append_text("hello")
        await asyncio.wait_for(s.commit(), 1.0)  # returns although the intent is not committed
        rid = ids.mint_ephemeral("s", 0, 0, 0)
        for _ in range(200):  # the engine call is made without waiting for the commit
            if rid in ports[0].live_request_ids():
                break
            await asyncio.sleep(0.005)
        assert rid in ports[0].live_request_ids()
        await asyncio.sleep(0.05)  # the fake engine has produced tokens by now
        assert [e for e in s.drain_events() if e.type == "response.text.delta"] == []
        kinds = [e.event.type for e in await engine.store.read_stream("s")]
        assert "StageRequestSubmitted" not in kinds and "StageOutput" not in kinds
        release.set()
        await s.wait_idle(5)
        assert len([e for e in s.drain_events() if e.type == "response.text.delta"]) == CONFIG.max_tokens
        await s.close()
        kinds = [e.event.type for e in await engine.store.read_stream("s")]
        assert kinds.index("StageRequestSubmitted") < kinds.index("StageOutput")  # the log stays write-ahead
        assert kinds.index("StageRequestForwarded") < max(i for i, k in enumerate(kinds) if k == "StageOutput")
        assert (await project_as_of(engine.store)).leaks() == []


async def test_a_failed_intent_commit_ends_the_engine_request(tmp_path) -> None:
    ports = _ports()
    async with await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/f.db", ports, config=CONFIG) as engine:
        s = await engine.open_session("s")
        append = engine.store.append

        async def failing(stream_id, events, expected_version=None):  # type: ignore[no-untyped-def]
            if any(e.type == "StageRequestSubmitted" for e in events):
                await asyncio.sleep(0.02)  # the engine is running the request meanwhile
                raise OSError("disk full")
            return await append(stream_id, events, expected_version=expected_version)

        engine.store.append = failing  # type: ignore[method-assign]
        s.drain_events()
        await s.append_text("hello")
        await s.commit()
        await s.wait_idle(5)
        assert ports[0].live_request_ids() == set()  # the gate closed the request: vLLM would abort it
        assert [e for e in s.drain_events() if e.type == "response.text.delta"] == []
        assert "StageRequestSubmitted" not in [e.event.type for e in await engine.store.read_stream("s")]
        engine.sessions.pop("s")  # its log is broken: nothing more is written for it


CHILD = textwrap.dedent("""
    import asyncio, sys
    from engine_bridge.engine import SessionEngine
    from tests.fakes.fake_port import FakeStagePort
    from engine_bridge.messages import EngineConfig

    async def main(url):
        ports = [FakeStagePort(0, "thinker", token_delay_s=0.002), FakeStagePort(1, "talker", token_delay_s=0.002)]
        engine = await SessionEngine.open(url, ports, config=EngineConfig(max_tokens=6, flush_interval_s=0.01))
        append = engine.store.append

        async def never(stream_id, events, expected_version=None):  # the intent's commit never lands
            if any(e.type == "StageRequestSubmitted" for e in events):
                await asyncio.Event().wait()
            return await append(stream_id, events, expected_version=expected_version)

        engine.store.append = never
        s = await engine.open_session("crashy")
        await s.append_text("hello")
        await s.log.flush()
        await s.commit()
        while not ports[0].live_request_ids():
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)
        deltas = sum(e.type == "response.text.delta" for e in s.drain_events())
        print(f"ENGINE-CALLED {sorted(ports[0].live_request_ids())[0]} {deltas}", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1]))
""")


async def test_sigkill_between_engine_call_and_intent_commit_is_reconciled(tmp_path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/crash.db"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), url],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        start_new_session=True,
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)  # type: ignore[union-attr]
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # between the engine call and the intent's commit
        child.wait()
    marker, running, deltas = line.split()
    rid = ids.mint_ephemeral("crashy", 0, 0, 0)
    assert (marker, running, deltas) == ("ENGINE-CALLED", rid, "0")  # the engine ran it; the client saw nothing
    before = [e.event.type for e in await _read(url)]
    assert "StageRequestSubmitted" not in before and "StageOutput" not in before  # the log: as if before the call
    assert before[-1] == "InputAppended"
    ports = _ports()
    async with await SessionEngine.open(url, ports, config=CONFIG) as engine:
        history = [e.event for e in await engine.store.read_stream("crashy")]
        after = [e.type for e in history[len(before) :]]
        assert after == ["SessionTakenOver", "SessionClosed", "StageRequestReleased"]
        assert [e.request_id for e in history[len(before) :] if e.type == "StageRequestReleased"] == [rid]
        assert [e.reason for e in history if e.type == "SessionClosed"] == ["recovered_after_crash"]
        p = await project_as_of(engine.store)
        assert p.leaks() == []
        assert p.resources.sessions["crashy"].bindings == {}
        assert not any(f.severity == "error" for f in p.findings())


async def _read(url: str) -> list:  # type: ignore[type-arg]
    from events.store.store import EventStore

    store = await EventStore.open(url)
    try:
        return await store.read_stream("crashy")
    finally:
        await store.close()
