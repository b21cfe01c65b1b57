"""The Realtime WebSocket route: ``/v1/realtime`` (the SDK appends ``/realtime`` to a ``…/v1``
base). One :class:`RealtimeConnection` per socket; its state (engine, options, live
connections) is ``websocket.app.state.realtime``, a :class:`RealtimeState`.

Query parameters: ``model``, ``session_id`` (default ``sess_<uuid hex>``), ``mode``
(``response_required`` | ``auto_response``), ``resumable`` (0|1), ``duplex`` (1: the vLLM-Omni
duplex dialect, when the server offers it).
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from realtime.connection import RealtimeConnection, RealtimeState

router = APIRouter()


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket) -> None:
    state: RealtimeState = websocket.app.state.realtime
    await RealtimeConnection(websocket, state).handle()
