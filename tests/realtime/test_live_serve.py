"""``serve`` on LIVE vLLM engines (CPU build, tiny random model), with the official ``openai``
SDK: a two-turn text conversation and a cancel mid-stream through the app on the shared live
ports, and one real ``duplex-ledger serve`` process stopped by SIGTERM mid-answer. After each:
the ledger's per-turn reasons, a clean audit, and no live request id on any engine."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from events.store import EventStore
from projections.shell.runner import project_as_of
from realtime.app import build_app
from tests.realtime.ledger import settled_ledger
from tests.realtime.test_duplex_and_admission import closed_with
from tests.realtime.test_serve_app import KEY, Served
from tests.realtime.wire import Wire

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

ROOT = Path(__file__).resolve().parents[2]
SHORT = EngineConfig(max_tokens=8, talker_max_tokens=6, ignore_eos=True, flush_interval_s=0.01)
LONG = EngineConfig(max_tokens=900, talker_max_tokens=6, ignore_eos=True, flush_interval_s=0.01)


def user_text(text: str) -> dict:
    return {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
    }


async def clean_audit(engine: SessionEngine) -> None:
    p = await project_as_of(engine.store)
    assert p.leaks() == []
    assert [f.kind for f in p.findings() if f.severity == "warning"] == []


async def test_live_two_text_turns(tmp_path, live_ports):
    ports = [live_ports.thinker, live_ports.talker]
    engine = await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/live.db", ports, config=SHORT)
    try:
        app = build_app(engine, api_key=KEY)
        async with Served(app) as srv:
            async with srv.client().realtime.connect(model="duplex-ledger", extra_query={"session_id": "lv"}) as conn:
                wire = Wire(conn)
                await wire.recv()
                await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
                ids = []
                for text in ("Hello there, who are you?", "What can you do?"):
                    await wire.send(user_text(text))
                    await wire.send({"type": "response.create"})
                    done = await wire.until("response.done", timeout_s=120)
                    ids.append(done["response"]["id"])
                assert [i.split("-")[2] for i in ids] == ["0", "0"] and len(set(ids)) == 2  # epoch 0 both
                assert len(wire.of_type("response.output_text.delta")) >= 2
                wire.check()
            assert await settled_ledger(app.state.realtime, "lv") == ["stop", "stop"]
        await clean_audit(engine)
    finally:
        await engine.aclose()
    assert all(port.live_request_ids() == set() for port in ports)


async def test_live_cancel_mid_stream(tmp_path, live_ports):
    ports = [live_ports.thinker, live_ports.talker]
    engine = await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/live.db", ports, config=LONG)
    try:
        app = build_app(engine)
        async with Served(app) as srv:
            async with srv.client().realtime.connect(model="duplex-ledger", extra_query={"session_id": "lc"}) as conn:
                wire = Wire(conn)
                await wire.recv()
                await wire.send(user_text("Tell me a long story"))
                await wire.send({"type": "response.create"})
                rid = (await wire.until("response.created", timeout_s=60))["response"]["id"]
                await wire.until("response.output_audio_transcript.delta", timeout_s=60)
                await conn.response.cancel()
                done = await wire.until("response.done", timeout_s=60)
                assert done["response"]["id"] == rid
                assert done["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
                wire.check()
            assert await settled_ledger(app.state.realtime, "lc") == ["cancel"]
        await clean_audit(engine)
    finally:
        await engine.aclose()
    assert all(port.live_request_ids() == set() for port in ports)


async def test_live_serve_process_sigterm_mid_answer(tmp_path, tiny_model_dir):
    url = f"sqlite+aiosqlite:///{tmp_path}/serve.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DUPLEX_LEDGER_API_KEY": KEY}
    argv = [sys.executable, "-c", "from reports.cli import main; main()"]
    args = ["serve", "--port", "0", "--db", url, "--model", "tiny", "--max-tokens", "900"]
    proc = await asyncio.create_subprocess_exec(
        *argv, *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stderr is not None
        port = None
        while port is None:
            line = (await asyncio.wait_for(proc.stderr.readline(), 300)).decode()
            assert line, "serve ended before it was listening"
            found = re.search(r"serving ws://127\.0\.0\.1:(\d+)/v1/realtime", line)
            port = int(found.group(1)) if found else None
        drain = asyncio.create_task(proc.stderr.read())  # keep reading: a full pipe would block serve
        client = AsyncOpenAI(api_key=KEY, websocket_base_url=f"ws://127.0.0.1:{port}/v1")
        async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": "lsig"}) as conn:
            wire = Wire(conn)
            await wire.recv()
            await wire.send(user_text("Tell me a long story"))
            await wire.send({"type": "response.create"})
            await wire.until("response.output_audio_transcript.delta", timeout_s=60)
            proc.send_signal(signal.SIGTERM)
            done = await wire.until("response.done", timeout_s=60)
            assert done["response"]["status"] != "completed"
            assert await closed_with(wire) == 1001
        assert await asyncio.wait_for(proc.wait(), 120) == 0, (await drain).decode()[-3000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    store = await EventStore.open(url)
    try:
        p = await project_as_of(store)
        assert [t.finished_reason for t in p.turn_tables] == ["close"]
        assert p.leaks() == []
        closed = [s.event.reason for s in await store.read_stream("lsig") if s.event.type == "SessionClosed"]
        assert closed == ["server_shutdown"]
    finally:
        await store.close()
