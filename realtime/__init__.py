"""The Realtime WebSocket front (issue 21): OpenAI Realtime GA wire format on ``/v1/realtime``
over the session engine, with vLLM-Omni's duplex dialect as an opt-in (``?duplex=1``).

Layers: ``realtime`` sits above ``engine_bridge`` (it may import events, projections and
engine_bridge; nothing below imports it). See docs/design.md, "Realtime front".
"""

from realtime.connection import ConnectionOptions, RealtimeConnection, RealtimeState
from realtime.router import router

__all__ = ["ConnectionOptions", "RealtimeConnection", "RealtimeState", "router"]
