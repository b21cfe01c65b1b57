"""Run the app of :mod:`realtime.app` with uvicorn in-process, on the caller's event loop (the
engine's loop: one loop for the sessions and the sockets), and shut down cleanly.

Shutdown (SIGTERM or SIGINT, or :attr:`ServeHandle.stop`): the engine is closed first
(``engine.aclose()``, reason ``server_shutdown``): every running response ends ``close`` in the
log (DOMAIN §2.4, §5.7 D13) and on the wire (each connection sends its terminal events and
closes 1001); then the connections are given ``shutdown_grace_s`` to finish their last sends,
and only then does uvicorn stop listening and exit. uvicorn's own signal handling is replaced
(it would re-raise the signal after its shutdown, so the process would die by it instead of
exiting 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI

from realtime.connection import RealtimeState

logger = logging.getLogger(__name__)

SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


class ListenError(ValueError):
    """The server could not listen on the address it was given (taken, not local, ...)."""


def check_listen(host: str, port: int) -> None:
    """Raise :class:`ListenError` when ``host:port`` cannot be bound now (checked before the
    engines start, so a taken port costs no model load). Port 0 always can."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ListenError(f"--host {host!r}: {exc}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers (:func:`serve` owns SIGTERM/SIGINT)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class ServeHandle:
    """What a running :func:`serve` exposes: ``port`` once bound, ``stop`` (set it to shut
    down as a signal would), ``signal_name`` (which signal stopped it; None otherwise)."""

    port: int | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    signal_name: str | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)


async def serve(
    app: FastAPI,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    handle: ServeHandle | None = None,
    on_started: Callable[[int], None] | None = None,
    handle_signals: bool = True,
    shutdown_grace_s: float = 10.0,
    log_level: str = "warning",
) -> ServeHandle:
    """Serve ``app`` (built by :func:`realtime.app.build_app`) on ``host:port`` (0: any free
    port) until SIGTERM/SIGINT (``handle_signals``) or ``handle.stop``; then shut down as the
    module doc says and return the handle. ``on_started(port)`` is called once listening.
    Raises :class:`ListenError` if uvicorn could not listen (the port is taken...)."""
    handle = handle or ServeHandle()
    state: RealtimeState = app.state.realtime
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if handle_signals:
        for sig in SHUTDOWN_SIGNALS:

            def on_signal(sig: signal.Signals = sig) -> None:
                handle.signal_name = handle.signal_name or sig.name
                handle.stop.set()

            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="off",
        ws="websockets-sansio",
        ws_max_size=2 * state.options.max_frame_bytes,
    )
    server = _Uvicorn(config)
    task = asyncio.create_task(server.serve(), name="uvicorn")
    try:
        while not server.started and not task.done():  # uvicorn says "started" by a flag only
            await asyncio.wait({task}, timeout=0.02)
        if task.done():
            try:
                task.result()  # raises why it could not start
            except SystemExit:  # uvicorn exits when it cannot bind (it has logged why)
                raise ListenError(f"cannot listen on {host}:{port}") from None
            raise ListenError(f"uvicorn stopped before listening on {host}:{port}")
        handle.port = int(server.servers[0].sockets[0].getsockname()[1])
        handle.started.set()
        if on_started is not None:
            on_started(handle.port)
        stop = asyncio.ensure_future(handle.stop.wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        await shutdown(state, shutdown_grace_s)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, STOP_TIMEOUT_S)
    return handle


async def shutdown(state: RealtimeState, grace_s: float) -> None:
    """Close the engine (``server_shutdown``: running answers end ``close``), then wait up to
    ``grace_s`` (monotonic) for the connections to send their last events and close."""
    engine = state.engine
    if not engine.closing:
        try:
            await engine.aclose()
        except Exception:  # noqa: BLE001 - logged; the server still stops
            logger.exception("shutdown: closing the session engine failed")
    deadline = time.monotonic() + grace_s
    while state.connections and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    if state.connections:
        logger.warning("shutdown: %d connection(s) still open after %.1f s", len(state.connections), grace_s)


__all__ = ["ListenError", "ServeHandle", "check_listen", "serve", "shutdown"]
