"""SIGTERM and SIGINT on a serving process (:mod:`tests.realtime.serve_worker`: the real
:func:`realtime.server.serve` with its signal handlers, on the scripted FAKE engine): the
running answer ends on the wire (its ``response.done``, then close 1001) and ``close`` in the
log, the session is closed ``server_shutdown``, and the process exits 0."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from events.store import EventStore
from projections.shell.runner import project_as_of
from tests.realtime.test_cancel_and_disconnect import start_long_reply
from tests.realtime.test_duplex_and_admission import closed_with
from tests.realtime.wire import Wire

ROOT = Path(__file__).resolve().parents[2]


async def _line(proc: asyncio.subprocess.Process, prefix: str, timeout_s: float = 60) -> str:
    assert proc.stdout is not None
    while True:
        raw = await asyncio.wait_for(proc.stdout.readline(), timeout_s)
        assert raw, f"worker ended before printing {prefix!r}"
        line = raw.decode().strip()
        if line.startswith(prefix):
            return line[len(prefix) :].strip()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_ends_running_answers_close_and_exits_0(tmp_path, sig):
    url = f"sqlite+aiosqlite:///{tmp_path}/ledger.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.realtime.serve_worker", url, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE
    )
    try:
        port = int(await _line(proc, "PORT"))
        client = AsyncOpenAI(api_key="k", websocket_base_url=f"ws://127.0.0.1:{port}/v1")
        async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": "sig"}) as conn:
            wire = Wire(conn)
            await wire.recv()
            rid = await start_long_reply(wire)
            proc.send_signal(sig)
            done = await wire.until("response.done")
            assert done["response"]["id"] == rid and done["response"]["status"] != "completed"
            assert await closed_with(wire) == 1001
            wire.check()
        assert await _line(proc, "STOPPED") == sig.name
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    store = await EventStore.open(url)
    try:
        p = await project_as_of(store)
        assert [t.finished_reason for t in p.turn_tables] == ["close"]
        assert p.leaks() == []
        closed = [s.event.reason for s in await store.read_stream("sig") if s.event.type == "SessionClosed"]
        assert closed == ["server_shutdown"]
    finally:
        await store.close()
