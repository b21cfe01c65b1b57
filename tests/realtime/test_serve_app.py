"""``duplex-ledger serve``'s app (realtime/app.py, realtime/server.py) on the FAKE engine, served
by a real uvicorn on 127.0.0.1: /health, /v1/models, /metrics (the engine's families and the
connection ones), Bearer auth before the upgrade (401), max-sessions (error, then 1013), and
the shutdown path (running answer ends ``close`` in the log, the client gets its terminal
events and close 1001, serve returns)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from engine_bridge.messages import EngineConfig
from realtime.app import build_app
from realtime.connection import ConnectionOptions
from realtime.middleware import ACTIVE, CONNECTION_FAMILIES
from realtime.server import ServeHandle, serve
from tests.realtime.conftest import LONG, SHORT, fake_engine
from tests.realtime.ledger import settled_ledger
from tests.realtime.test_cancel_and_disconnect import start_long_reply
from tests.realtime.test_duplex_and_admission import closed_with
from tests.realtime.wire import Wire
from tests.waiting import eventually

KEY = "sk-serve-test"


class Served:
    """A :func:`realtime.server.serve` task on 127.0.0.1:0 (signals left to the test runner)."""

    def __init__(self, app) -> None:
        self.app = app
        self.handle = ServeHandle()
        self.task: asyncio.Task | None = None

    async def __aenter__(self) -> Served:
        self.task = asyncio.create_task(serve(self.app, handle=self.handle, handle_signals=False))
        started = asyncio.ensure_future(self.handle.started.wait())
        await asyncio.wait({self.task, started}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if self.task.done():
            self.task.result()
        assert self.handle.port is not None
        return self

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.handle.port}"

    def client(self, key: str = KEY) -> AsyncOpenAI:
        return AsyncOpenAI(api_key=key, websocket_base_url=f"ws://127.0.0.1:{self.handle.port}/v1")

    async def stop(self) -> None:
        self.handle.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 60)

    async def __aexit__(self, *exc: object) -> None:
        if self.task is not None and not self.task.done():
            await self.stop()


def families(text: str) -> dict[str, dict[tuple, float]]:
    """Exposition text -> {family: {(sample name, labels...): value}} (the real parser)."""
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = {(s.name, *sorted(s.labels.items())): s.value for s in family.samples}
    return out


async def test_health_models_and_metrics(tmp_path):
    engine = await fake_engine(tmp_path, SHORT, "Hi there.")
    options = ConnectionOptions(model_name="ledger-model")
    try:
        async with Served(build_app(engine, options=options)) as srv, httpx.AsyncClient(base_url=srv.http) as http:
            assert (await http.get("/health")).json() == {"status": "ok"}
            models = (await http.get("/v1/models")).json()
            assert models["object"] == "list"
            assert [(m["id"], m["object"], m["owned_by"]) for m in models["data"]] == [
                ("ledger-model", "model", "duplex-ledger")
            ]
            async with srv.client().realtime.connect(model="ledger-model", extra_query={"session_id": "m1"}) as conn:
                wire = Wire(conn)
                await wire.recv()
                before = families((await http.get("/metrics")).text)
                assert before[ACTIVE][(ACTIVE,)] == 1
            await settled_ledger(srv.app.state.realtime, "m1")

            async def none_active() -> bool:
                text = (await http.get("/metrics")).text
                return families(text)[ACTIVE][(ACTIVE,)] == 0

            await eventually(none_active, timeout_s=10)
            response = await http.get("/metrics")
            assert response.headers["content-type"].startswith("text/plain")
            after = families(response.text)
            for name in CONNECTION_FAMILIES:
                assert name.removesuffix("_total") in after, name
            assert "duplex_ledger:request_ids_leaked" in after  # the engine's own families
            assert any(name.startswith("vllm_omni:") for name in after)
            total = after["duplex_ledger:realtime_connections"]  # counter family name without _total
            assert total[("duplex_ledger:realtime_connections_total", ("outcome", "accepted"))] == 1
            duration = after["duplex_ledger:realtime_connection_duration_s"]
            assert duration[("duplex_ledger:realtime_connection_duration_s_count",)] == 1
            await engine.aclose()  # shutting down: a load balancer is told to stop sending
            health = await http.get("/health")
            assert (health.status_code, health.json()) == (503, {"status": "shutting_down"})
    finally:
        await engine.aclose()


async def test_api_key_is_checked_before_the_upgrade(tmp_path):
    engine = await fake_engine(tmp_path, SHORT, "Hi there.")
    try:
        async with Served(build_app(engine, api_key=KEY)) as srv, httpx.AsyncClient(base_url=srv.http) as http:
            assert (await http.get("/v1/models")).status_code == 401
            assert (await http.get("/v1/models", headers={"Authorization": "Bearer wrong"})).status_code == 401
            assert (await http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})).status_code == 200
            assert (await http.get("/health")).status_code == 200  # open, as in vLLM
            ws_url = f"ws://127.0.0.1:{srv.handle.port}/v1/realtime?session_id=denied"
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}):
                with pytest.raises(InvalidStatus) as info:
                    async with ws_connect(ws_url, additional_headers=headers):
                        pass
                assert info.value.response.status_code == 401
            with pytest.raises(Exception, match="401"):
                async with srv.client("wrong-key").realtime.connect(model="duplex-ledger") as conn:
                    await conn.recv_bytes()
            async with srv.client().realtime.connect(model="duplex-ledger", extra_query={"session_id": "ok"}) as conn:
                assert (await Wire(conn).recv())["type"] == "session.created"
            assert "denied" not in engine.sessions  # never reached the engine
            counts = families((await http.get("/metrics")).text)["duplex_ledger:realtime_connections"]
            assert counts[("duplex_ledger:realtime_connections_total", ("outcome", "refused"))] == 4
            await settled_ledger(srv.app.state.realtime, "ok")
    finally:
        await engine.aclose()


async def test_max_sessions_is_an_error_then_close_1013(tmp_path):
    engine = await fake_engine(tmp_path, EngineConfig(max_tokens=6, max_sessions=1, flush_interval_s=0.005))
    try:
        async with Served(build_app(engine, api_key=KEY)) as srv:
            client = srv.client()
            async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": "one"}) as first:
                await Wire(first).recv()
                async with client.realtime.connect(model="duplex-ledger", extra_query={"session_id": "two"}) as full:
                    wire = Wire(full)
                    error = (await wire.recv())["error"]
                    assert error["code"] == "max_sessions_reached"
                    assert await closed_with(wire) == 1013
            assert sorted(engine.sessions) == ["one"]
    finally:
        await engine.aclose()


async def test_shutdown_ends_the_running_answer_close_then_1001(tmp_path):
    engine = await fake_engine(tmp_path, LONG)
    app = build_app(engine)
    async with Served(app) as srv:
        async with srv.client().realtime.connect(model="duplex-ledger", extra_query={"session_id": "sd"}) as conn:
            wire = Wire(conn)
            await wire.recv()
            rid = await start_long_reply(wire)
            stopping = asyncio.create_task(srv.stop())
            done = await wire.until("response.done")
            assert done["response"]["id"] == rid and done["response"]["status"] != "completed"
            assert await closed_with(wire) == 1001
            await asyncio.wait_for(stopping, 60)
            wire.check()
    assert engine.closing and app.state.realtime.connections == {}
    from events.store import EventStore
    from projections.shell.runner import project_as_of

    store = await EventStore.open(f"sqlite+aiosqlite:///{tmp_path}/ledger.db")
    try:
        p = await project_as_of(store)
        assert [t.finished_reason for t in p.turn_tables] == ["close"]
        assert p.leaks() == []
        closed = [s.event.reason for s in await store.read_stream("sd") if s.event.type == "SessionClosed"]
        assert closed == ["server_shutdown"]
    finally:
        await store.close()


async def test_a_taken_port_is_a_listen_error_not_an_exit(tmp_path):
    import socket

    from realtime.server import ListenError

    engine = await fake_engine(tmp_path, SHORT)
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(ListenError, match=f"cannot listen on 127.0.0.1:{port}"):
                await serve(build_app(engine), port=port, handle_signals=False)
    finally:
        await engine.aclose()
