"""A client reconnecting with its session id a few ms after a drop, while the old connection's
close is still settling (its abort in flight), on the FAKE engine whose aborts are slowed: the
new open waits for that close (``ConnectionOptions.reopen_wait_s``) and gets the next
incarnation; past the bound it is refused ``session_exists`` with close 1013 (retry later)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from engine_bridge.engine import SessionEngine
from realtime.connection import ConnectionOptions
from tests.fakes.fake_port import FakeStagePort
from tests.realtime.conftest import LONG, sdk_client
from tests.realtime.ledger import settled_ledger
from tests.realtime.server_fixture import make_app, serve_app
from tests.realtime.test_cancel_and_disconnect import start_long_reply
from tests.realtime.test_duplex_and_admission import closed_with
from tests.realtime.wire import Wire

ABORT_DELAY_S = 0.4


class SlowAbortPort(FakeStagePort):
    """A FAKE stage port whose abort takes ``ABORT_DELAY_S``: a close stays unsettled that long."""

    async def abort(self, request_ids: Sequence[str]) -> None:
        if request_ids:
            await asyncio.sleep(ABORT_DELAY_S)
        await super().abort(request_ids)


async def slow_abort_engine(tmp_path) -> SessionEngine:
    ports = [SlowAbortPort(0, "thinker", token_delay_s=0.002), SlowAbortPort(1, "talker", token_delay_s=0.002)]
    return await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/ledger.db", ports, config=LONG)


async def drop_mid_reply(client, session_id: str) -> None:
    """Open ``session_id``, start a long reply, then close the socket mid-reply."""
    async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": session_id}) as conn:
        wire = Wire(conn)
        assert (await wire.recv())["type"] == "session.created"
        await start_long_reply(wire)


async def test_a_reconnect_while_the_old_close_settles_gets_the_next_incarnation(tmp_path):
    engine = await slow_abort_engine(tmp_path)
    try:
        app = make_app(engine)
        async with serve_app(engine, app=app) as port:
            client = sdk_client(port)
            await drop_mid_reply(client, "rt-reopen")
            old = engine.sessions["rt-reopen"]
            query = {"session_id": "rt-reopen"}
            async with client.realtime.connect(model="duplex-ledger", extra_query=query) as conn:
                wire = Wire(conn)
                created = await wire.recv()
                assert created["type"] == "session.created", created
                assert created["session"]["x_duplex_ledger"]["incarnation"] == 1
                assert old.closed and engine.sessions["rt-reopen"] is not old
                await wire.send({"type": "session.update", "session": {"type": "realtime"}})
                await wire.until("session.updated")
                wire.check()
        assert await settled_ledger(app.state.realtime, "rt-reopen") == ["close"]
        history = [s.event for s in await engine.store.read_stream("rt-reopen")]
        # both sockets were closed by the SDK's close() (1000): each session was ended by its client
        assert [e.reason for e in history if e.type == "SessionClosed"] == ["session_close", "session_close"]
    finally:
        await engine.aclose()


async def test_a_reconnect_past_the_bound_is_refused_retry_later(tmp_path):
    engine = await slow_abort_engine(tmp_path)
    try:
        app = make_app(engine, ConnectionOptions(reopen_wait_s=0.05))
        async with serve_app(engine, app=app) as port:
            client = sdk_client(port)
            await drop_mid_reply(client, "rt-reopen-late")
            query = {"session_id": "rt-reopen-late"}
            async with client.realtime.connect(model="duplex-ledger", extra_query=query) as conn:
                wire = Wire(conn)
                error = (await wire.recv())["error"]
                assert error["code"] == "session_exists" and "retry" in error["message"], error
                assert await closed_with(wire) == 1013
        assert await settled_ledger(app.state.realtime, "rt-reopen-late") == ["close"]
    finally:
        await engine.aclose()
