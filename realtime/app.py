"""The HTTP/WebSocket application of ``duplex-ledger serve`` (issue 21): the Realtime route
plus what a server next to vLLM is expected to answer.

* ``GET /health`` — 200 ``{"status": "ok"}`` while the engine takes sessions, 503
  ``{"status": "shutting_down"}`` once its shutdown began (a load balancer stops sending);
* ``GET /v1/models`` — the OpenAI list shape: one model, the name ``?model=`` accepts;
* ``GET /metrics`` — Prometheus text (0.0.4): the engine's families (``vllm_omni:*``,
  ``duplex_ledger:*``, :mod:`engine_bridge.prometheus`, without ``*_created`` series) followed
  by the connection families of :mod:`realtime.middleware`;
* ``/v1/realtime`` — the WebSocket of :mod:`realtime.router` (state: ``app.state.realtime``).

With ``api_key`` every ``/v1`` path needs ``Authorization: Bearer <key>`` (401 before the
WebSocket upgrade otherwise); ``/health`` and ``/metrics`` stay open, as in vLLM.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from engine_bridge.prometheus import exposition
from realtime.connection import ConnectionOptions, RealtimeState
from realtime.middleware import BearerAuth, ConnectionFamilies, ConnectionMetrics
from realtime.router import router

if TYPE_CHECKING:
    from engine_bridge.engine import SessionEngine

OWNED_BY = "duplex-ledger"


def models_list(options: ConnectionOptions, created_s: int) -> dict[str, Any]:
    """``/v1/models`` body: ``{"object": "list", "data": [{"id", "object": "model", "created",
    "owned_by"}]}`` (``created``: epoch seconds the app was built)."""
    return {
        "object": "list",
        "data": [{"id": options.model_name, "object": "model", "created": created_s, "owned_by": OWNED_BY}],
    }


def build_app(
    engine: SessionEngine,
    *,
    options: ConnectionOptions | None = None,
    api_key: str | None = None,
    connection_registry: CollectorRegistry | None = None,
) -> FastAPI:
    """The FastAPI app serving ``engine`` (see the module doc). ``options``: the Realtime
    front's (model name, idle timeout, duplex dialect...). ``api_key``: None or empty = no
    auth. ``connection_registry``: where the connection families go (default: a new one,
    ``app.state.connection_families.registry``)."""
    options = options or ConnectionOptions()
    created_s = int(time.time())
    app = FastAPI(title="duplex-ledger serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(router)
    app.state.realtime = RealtimeState(engine, options)
    families = ConnectionFamilies(connection_registry or CollectorRegistry(auto_describe=True))
    app.state.connection_families = families

    @app.get("/health")
    async def health() -> JSONResponse:
        if engine.closing:
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(models_list(options, created_s))

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = exposition(engine.metrics.registry) + exposition(families.registry)
        return PlainTextResponse(text, media_type=CONTENT_TYPE_LATEST)

    if api_key:
        app.add_middleware(BearerAuth, api_keys=[api_key])
    app.add_middleware(ConnectionMetrics, families=families)  # outermost: a 401 counts as refused
    return app


__all__ = ["build_app", "models_list"]
