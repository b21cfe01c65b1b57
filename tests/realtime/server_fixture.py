"""A real uvicorn server with the Realtime router, in the test's own event loop, on 127.0.0.1
and an ephemeral port (research/realtime.md §6.1). Importable by other test packages:

    async with serve_app(engine, ConnectionOptions()) as port:
        client = AsyncOpenAI(api_key="test-key", websocket_base_url=f"ws://127.0.0.1:{port}/v1")
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from engine_bridge.engine import SessionEngine
from realtime.connection import ConnectionOptions, RealtimeState
from realtime.router import router
from tests.waiting import eventually


class _InLoopServer(uvicorn.Server):
    """uvicorn without its signal handlers: the test runner owns the process's signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def make_app(engine: SessionEngine, options: ConnectionOptions | None = None) -> FastAPI:
    """A FastAPI app serving only ``/v1/realtime`` on ``engine``."""
    app = FastAPI()
    app.include_router(router)
    app.state.realtime = RealtimeState(engine, options or ConnectionOptions())
    return app


@asynccontextmanager
async def serve_app(
    engine: SessionEngine, options: ConnectionOptions | None = None, *, app: FastAPI | None = None
) -> AsyncIterator[int]:
    """Serve ``app`` (default :func:`make_app`) with uvicorn on 127.0.0.1:0; yields the port.
    The websocket frame limit is above ``options.max_frame_bytes`` so the front, not the
    transport, answers an oversized event."""
    options = options or ConnectionOptions()
    app = app or make_app(engine, options)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        log_config=None,  # uvicorn's records propagate to the root logger: tests can capture them
        lifespan="off",
        ws="websockets-sansio",
        ws_max_size=2 * options.max_frame_bytes,
    )
    server = _InLoopServer(config)
    task = asyncio.create_task(server.serve())
    await eventually(lambda: server.started or task.done(), timeout_s=20)
    if task.done():
        task.result()  # raises why it could not start
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
