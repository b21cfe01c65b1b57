"""Cancel mid-stream and disconnect mid-response (research §6.2 scenarios 3, 4) on the FAKE
engine with 2,000-token replies, so a cancel or a drop always lands mid-response."""

from __future__ import annotations

import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed

from engine_bridge.messages import EngineConfig
from realtime.connection import ConnectionOptions
from reports.cli_metrics import project_metrics
from tests.realtime.conftest import fake_engine, sdk_client
from tests.realtime.ledger import settled_ledger
from tests.realtime.server_fixture import make_app, serve_app
from tests.realtime.test_conformance import user_text
from tests.realtime.wire import Wire
from tests.waiting import eventually


async def start_long_reply(wire: Wire, text: str = "Tell me a long story") -> str:
    await wire.send(user_text(text))
    await wire.send({"type": "response.create"})
    created = await wire.until("response.created")
    await wire.until("response.output_audio_transcript.delta")  # the first output (trace wait: "output")
    return created["response"]["id"]


async def test_cancel_mid_stream_then_next_turn(long_engine, long_state, long_port):
    client = sdk_client(long_port)
    async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-cancel"}) as conn:
        wire = Wire(conn)
        await wire.recv()
        await wire.send({"type": "response.cancel", "event_id": "idle-cancel"}, refused="response_cancel_not_active")
        await wire.error_for("idle-cancel")
        idle_by_id = {"type": "response.cancel", "event_id": "idle-cancel-id", "response_id": "resp_nope"}
        await wire.send(idle_by_id, refused="response_cancel_not_active")
        assert (await wire.error_for("idle-cancel-id"))["error"]["param"] == "response_id"
        r0 = await start_long_reply(wire)
        assert r0.startswith("resp-rt-cancel-0-")
        await conn.response.cancel()
        done = await wire.until("response.done")
        assert done["response"]["id"] == r0 and done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
        r1 = await start_long_reply(wire, "Just say hi")
        assert r1.startswith("resp-rt-cancel-1-")  # epoch 0 -> 1
        await wire.send({"type": "output_audio_buffer.clear"})
        cleared = await wire.until("output_audio_buffer.cleared")
        assert cleared["response_id"] == r1
        assert (await wire.until("response.done"))["response"]["id"] == r1
        assert [f["response"]["status"] for f in wire.of_type("response.done")] == ["cancelled", "cancelled"]
        wire.check()
    assert await settled_ledger(long_state, "rt-cancel") == ["cancel", "cancel"]
    history = [s.event for s in await long_engine.store.read_stream("rt-cancel")]
    assert [e.source for e in history if e.type == "CancelRequested"] == [
        "response.cancel",
        "output_audio_buffer_clear",
    ]
    assert [(e.old_epoch, e.new_epoch) for e in history if e.type == "EpochAdvanced"][:2] == [(0, 1), (1, 2)]
    # the idle cancels (one naming a response_id) are refused as a refused response.create
    # is: logged, as well as told
    rejected = [(e.command, e.error_code) for e in history if e.type == "CommandRejected"]
    assert rejected == [("response.cancel", "response_cancel_not_active")] * 2


async def test_input_clear_leaves_the_running_response_alone(long_engine, long_state, long_port):
    async with sdk_client(long_port).realtime.connect(model="duplex-ledger", extra_query={"session_id": "rt-clr"}) as c:
        wire = Wire(c)
        await wire.recv()
        r0 = await start_long_reply(wire)
        await wire.send({"type": "input_audio_buffer.append", "audio": "AAAAAA==", "transcript": "uh"})
        await wire.send({"type": "input_audio_buffer.clear", "event_id": "clr"})
        await wire.until("input_audio_buffer.cleared")
        seen = len(wire.of_type("response.output_audio_transcript.delta"))
        await wire.until("response.output_audio_transcript.delta")  # the response goes on
        assert len(wire.of_type("response.output_audio_transcript.delta")) > seen
        assert not wire.of_type("response.done")
        await wire.send({"type": "response.cancel", "response_id": r0})
        assert (await wire.until("response.done"))["response"]["status"] == "cancelled"
        wire.check()
    assert await settled_ledger(long_state, "rt-clr") == ["cancel"]
    history = [s.event for s in await long_engine.store.read_stream("rt-clr")]
    assert [e.dropped_chunks for e in history if e.type == "InputCleared"] == [1]


@pytest.mark.parametrize("how", ["clean_close", "transport_abort"])
async def test_disconnect_mid_response(long_engine, long_app, long_port, how, caplog, tmp_path):
    caplog.set_level(logging.INFO)
    sid = f"rt-drop-{how}"
    state = long_app.state.realtime
    client = sdk_client(long_port)
    async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": sid}) as conn:
        wire = Wire(conn)
        await wire.recv()
        await start_long_reply(wire)
        (connection,) = state.connections.values()
        if how == "clean_close":
            await conn.close()
        else:
            conn._connection.transport.abort()  # private: an abrupt drop (the server sees 1006)
        wire.check(all_done=False)
    session = long_engine.sessions[sid]
    await eventually(lambda: session.closed and not state.connections, timeout_s=15)
    assert connection.feed_ended.is_set() and connection.out.sender_task.done()
    assert connection.end_reason.startswith("client_closed_") or connection.end_reason == "send_failed"
    assert await settled_ledger(state, sid) == ["close"]
    history = [s.event for s in await long_engine.store.read_stream(sid)]
    # the SDK's close() (1000) ends the session; a dropped transport (1006) is a disconnect
    expected = "session_close" if how == "clean_close" else "disconnect"
    assert [e.reason for e in history if e.type == "SessionClosed"] == [expected]
    exposition = (await project_metrics(f"sqlite+aiosqlite:///{tmp_path}/ledger.db")).exposition()
    closed = {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "duplex_ledger:sessions_closed_total" and sample.value
    }
    assert closed == {expected: 1.0}  # the metric tells a client's close from a drop too
    # reconnecting with the same session_id is the next incarnation
    async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": sid}) as conn:
        wire = Wire(conn)
        created = await wire.recv()
        assert created["session"]["x_duplex_ledger"]["incarnation"] == 1
        await wire.send(user_text("hello again"))
        await wire.send({"type": "response.create"})
        await wire.until("response.output_audio_transcript.delta")
        await wire.send({"type": "response.cancel"})
        assert (await wire.until("response.done"))["response"]["status"] == "cancelled"
        wire.check()
    await eventually(lambda: long_engine.sessions[sid].closed and not state.connections, timeout_s=15)
    assert await settled_ledger(state, sid) == ["close", "cancel"]
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert failures == []  # no unhandled exception on the server, whichever way the client left


async def test_idle_timeout_is_a_disconnect_but_not_while_a_response_runs(tmp_path):
    engine = await fake_engine(tmp_path, EngineConfig(max_tokens=40, talker_max_tokens=4, flush_interval_s=0.005))
    slow_reply = engine.ports[0]
    slow_reply.token_delay_s = 0.05  # 40 tokens x 50 ms: a 2 s answer, four idle timeouts long
    try:
        app = make_app(engine, ConnectionOptions(idle_timeout_s=0.5))
        async with serve_app(engine, app=app) as port:
            async with sdk_client(port).realtime.connect(
                model="duplex-ledger", extra_query={"session_id": "rt-idle"}
            ) as conn:
                wire = Wire(conn)
                await wire.recv()
                await start_long_reply(wire)
                done = await wire.until("response.done", timeout_s=20)  # listening is not idle
                assert done["response"]["status"] == "incomplete"  # ran to its 40-token budget
                with pytest.raises(ConnectionClosed) as info:  # then idle: the server ends it
                    await wire.recv(timeout_s=10)
                assert info.value.rcvd.code == 1000
                wire.check()
            assert await settled_ledger(app.state.realtime, "rt-idle") == ["stop"]
            history = [s.event for s in await engine.store.read_stream("rt-idle")]
            assert [e.reason for e in history if e.type == "SessionClosed"] == ["disconnect"]
    finally:
        await engine.aclose()
