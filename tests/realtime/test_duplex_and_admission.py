"""The opt-in duplex dialect (``?duplex=1``), admission at open, and the slow-client bound, on
the FAKE engine."""

from __future__ import annotations

import pytest
from websockets.exceptions import ConnectionClosed

from engine_bridge.messages import EngineConfig
from realtime.connection import ConnectionOptions
from tests.realtime.conftest import LONG, fake_engine, sdk_client
from tests.realtime.ledger import settled_ledger
from tests.realtime.server_fixture import make_app, serve_app
from tests.realtime.test_cancel_and_disconnect import start_long_reply
from tests.realtime.test_conformance import user_text
from tests.realtime.wire import Wire
from tests.waiting import eventually

DUPLEX = ConnectionOptions(extensions=True)


async def closed_with(wire: Wire) -> int:
    """Read until the server closes; the close code."""
    with pytest.raises(ConnectionClosed) as info:
        for _ in range(100):
            await wire.recv()
    return info.value.rcvd.code


@pytest.fixture
def options() -> ConnectionOptions:
    return DUPLEX


async def test_duplex_barge_in_listen_and_session_close(long_engine, long_state, long_port):
    query = {"session_id": "rt-duplex", "duplex": "1", "mode": "auto_response"}
    async with sdk_client(long_port).realtime.connect(model="duplex-ledger", extra_query=query) as conn:
        wire = Wire(conn, duplex=True)
        created = await wire.recv()
        assert created["session"]["x_duplex_ledger"]["dialect"] == "ga+duplex"
        await wire.send(user_text("mm-hmm"))  # a backchannel: the model keeps listening
        listen = await wire.until("response.listen")
        assert listen["session_id"] == "rt-duplex"
        r0 = await start_long_reply(wire, "Tell me a long story")  # auto_response: no response.create
        await wire.send({"type": "barge_in", "event_id": "b1"})
        done = await wire.until("response.done")
        assert done["response"]["id"] == r0
        assert done["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
        r1 = await start_long_reply(wire, "Now another long story")
        await wire.send({"type": "input.cancel"})
        done = await wire.until("response.done")
        if not wire.of_type("input_audio_buffer.cleared"):  # the front's answer and the engine's events interleave
            await wire.until("input_audio_buffer.cleared")
        assert done["response"]["id"] == r1 and done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "client_cancelled"  # wire says barge_in (M17)
        await wire.send({"type": "session.close"})
        closed = await wire.until("session.closed")
        assert closed["reason"] == "session_close"
        assert await closed_with(wire) == 1000
        wire.check()
    assert await settled_ledger(long_state, "rt-duplex") == ["barge_in", "cancel"]
    history = [s.event for s in await long_engine.store.read_stream("rt-duplex")]
    assert [e.reason for e in history if e.type == "SessionClosed"] == ["session_close"]


async def test_duplex_must_be_offered(engine):
    async with serve_app(engine, ConnectionOptions()) as port:
        query = {"session_id": "rt-noduplex", "duplex": "1"}
        async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query=query) as conn:
            wire = Wire(conn)
            error = await wire.recv()
            assert error["error"]["code"] == "duplex_not_enabled" and error["error"]["param"] == "duplex"
            assert await closed_with(wire) == 1008
    assert "rt-noduplex" not in engine.sessions


async def test_admission_refusals_close_the_socket(tmp_path):
    engine = await fake_engine(tmp_path, EngineConfig(max_tokens=6, max_sessions=1, flush_interval_s=0.005))
    try:
        app = make_app(engine)
        async with serve_app(engine, app=app) as port:
            client = sdk_client(port)
            async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": "a"}) as first:
                await Wire(first).recv()
                async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": "a"}) as again:
                    wire = Wire(again)
                    assert (await wire.recv())["error"]["code"] == "session_exists"
                    assert await closed_with(wire) == 1008
                async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": "b"}) as full:
                    wire = Wire(full)
                    error = (await wire.recv())["error"]
                    assert (error["code"], error["type"]) == ("max_sessions_reached", "rate_limit_error")
                    assert await closed_with(wire) == 1013
                async with client.realtime.connect(model="other-model", extra_query={"session_id": "c"}) as bad:
                    wire = Wire(bad)
                    assert (await wire.recv())["error"]["code"] == "model_not_found"
                    assert await closed_with(wire) == 1008
                # the first connection is untouched
                await first.session.update(session={"type": "realtime", "output_modalities": ["text"]})
                assert (await Wire(first).until("session.updated"))["session"]["output_modalities"] == ["text"]
        assert sorted(engine.sessions) == ["a"]
        assert await settled_ledger(app.state.realtime, "a") == []
    finally:
        await engine.aclose()


async def test_a_client_that_overflows_its_queue_is_closed_as_a_disconnect(tmp_path):
    engine = await fake_engine(tmp_path, LONG)
    try:
        app = make_app(engine, ConnectionOptions(outbound_queue_max=3))
        async with serve_app(engine, app=app) as port:
            client = sdk_client(port)
            async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": "calm"}) as calm:
                calm_wire = Wire(calm)
                await calm_wire.recv()
                async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": "slow"}) as slow:
                    wire = Wire(slow)
                    await wire.recv()
                    await wire.send(user_text("Tell me everything"))
                    await wire.send({"type": "response.create"})  # its burst of 4 events overflows 3
                    assert await closed_with(wire) == 1008
                await eventually(lambda: engine.sessions["slow"].closed)
                await calm_wire.send({"type": "input_audio_buffer.clear"})
                assert (await calm_wire.recv())["type"] == "input_audio_buffer.cleared"
                assert not engine.sessions["calm"].closed
        assert await settled_ledger(app.state.realtime, "slow") == ["close"]
        history = [s.event for s in await engine.store.read_stream("slow")]
        assert [e.reason for e in history if e.type == "SessionClosed"] == ["disconnect"]
    finally:
        await engine.aclose()


async def test_an_open_that_fails_is_an_error_then_1011(engine, monkeypatch):
    async def broken(*args, **kwargs):
        raise RuntimeError("the ledger is unreachable")

    monkeypatch.setattr(engine, "open_session", broken)
    async with serve_app(engine) as port:
        async with sdk_client(port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "x"}) as conn:
            wire = Wire(conn)
            error = (await wire.recv())["error"]
            assert (error["code"], error["type"]) == ("internal_error", "server_error")
            assert "unreachable" not in error["message"]  # the server's internals stay in its log
            assert await closed_with(wire) == 1011
