"""Pure-ASGI middleware of ``duplex-ledger serve`` (vLLM's house style:
``vllm/entrypoints/openai/server_utils.py`` AuthenticationMiddleware and the serve metrics
middleware): they wrap the app without touching a request's body or a socket's frames.

* :class:`BearerAuth` — ``Authorization: Bearer <key>`` on every ``/v1`` path, HTTP and
  WebSocket alike, checked BEFORE the upgrade: SHA-256 digests compared with
  :func:`secrets.compare_digest` (no timing signal about the key); anything else gets HTTP 401
  (a WebSocket gets the ASGI denial response ``websocket.http.response``, so the client sees a
  401 handshake answer, never an accepted socket). ``/health`` and ``/metrics`` stay open, as
  in vLLM.
* :class:`ConnectionMetrics` — the WebSocket connection families, in a registry of their own:
  ``duplex_ledger:realtime_connections_active`` (gauge), ``…_total`` (counter by ``outcome``:
  ``accepted`` or ``refused`` — closed or denied before the upgrade) and
  ``duplex_ledger:realtime_connection_duration_s`` (histogram, accept to end, monotonic
  clock).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Awaitable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PROTECTED_PREFIX = "/v1"
ACTIVE = "duplex_ledger:realtime_connections_active"
TOTAL = "duplex_ledger:realtime_connections_total"
DURATION = "duplex_ledger:realtime_connection_duration_s"
CONNECTION_FAMILIES = (ACTIVE, TOTAL, DURATION)
DURATION_BUCKETS_S = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class BearerAuth:
    """401 for a ``/v1`` request or WebSocket without ``Authorization: Bearer <one of keys>``."""

    def __init__(self, app: ASGIApp, api_keys: Iterable[str]) -> None:
        self.app = app
        self.key_digests = [_digest(key) for key in api_keys]
        if not self.key_digests:
            raise ValueError("BearerAuth needs at least one API key")

    def authorized(self, headers: Headers) -> bool:
        """Whether the ``Authorization`` header names a key (every digest is compared)."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        presented = _digest(token.strip())
        match = False
        for digest in self.key_digests:
            match |= secrets.compare_digest(presented, digest)
        return match

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path.startswith(PROTECTED_PREFIX) and not self.authorized(Headers(scope=scope)):
            response = JSONResponse(
                {"error": {"type": "invalid_request_error", "code": "invalid_api_key", "message": "Unauthorized"}},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class ConnectionFamilies:
    """The three connection families in ``registry`` (see the module doc)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.active = Gauge(ACTIVE, "Realtime WebSocket connections open now.", registry=registry)
        self.total = Counter(
            TOTAL,
            "Realtime WebSocket connection attempts, by outcome (accepted, refused before the upgrade).",
            ["outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            DURATION,
            "Realtime WebSocket connection lifetime, accept to end (seconds).",
            buckets=DURATION_BUCKETS_S,
            registry=registry,
        )
        for outcome in ("accepted", "refused"):
            self.total.labels(outcome)  # both series exist from the start (0)


class ConnectionMetrics:
    """Counts the app's WebSocket connections into ``families`` (see the module doc)."""

    def __init__(self, app: ASGIApp, families: ConnectionFamilies) -> None:
        self.app = app
        self.families = families

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        f = self.families
        accepted_at: list[float] = []

        def counting_send(message: Message) -> Awaitable[None]:
            # Not a coroutine function: the app awaits ``send``'s own awaitable (one frame
            # less on every message the connection sends; issue 23).
            if message["type"] == "websocket.accept" and not accepted_at:
                accepted_at.append(time.monotonic())
                f.active.inc()
                f.total.labels("accepted").inc()
            return send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            if accepted_at:
                f.active.dec()
                f.duration.observe(time.monotonic() - accepted_at[0])
            else:
                f.total.labels("refused").inc()


__all__ = ["CONNECTION_FAMILIES", "BearerAuth", "ConnectionFamilies", "ConnectionMetrics"]
