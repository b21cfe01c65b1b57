"""Critical-path stamps for the live benchmark (issue 15), taken around the ports and the
client queue, without touching the session engine.

* :class:`StampedPort` wraps a :class:`~engine_bridge.ports.StagePort`: it notes
  ``time.perf_counter()`` when a ``generate`` iterator starts (vLLM's ``add_request`` happens
  on that first ``__anext__``) and when each chunk comes out of the engine, in the
  :data:`TURN` dict of the calling context (a session's turn task inherits its caller's
  context, so the dict the benchmark set before ``commit()`` is the one the port sees).
* :func:`stamp_client_queue` makes a session's client queue note, for every
  ``response.text.delta``, the seconds since the engine output it carries.
* :func:`thread_cpu_s` — CPU seconds of one thread (``pthread_getcpuclockid``), for the
  frontend CPU figures; :data:`WRITER_CPU` collects the ledger writer threads' own.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import AsyncIterator
from typing import Any

TURN: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("bench_turn", default=None)
WRITER_CPU: list[float] = []  # CPU seconds of each ledger writer thread, appended when it ends


class StampedPort:
    """Delegates everything to ``inner``; ``generate`` notes ``add`` (s, perf_counter) once and
    ``out`` before every chunk it hands on, in the current :data:`TURN` dict."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def generate(self, request_id: str, prompt: str, params: Any) -> AsyncIterator[Any]:
        return self._generate(request_id, prompt, params)

    async def _generate(self, request_id: str, prompt: str, params: Any) -> AsyncIterator[Any]:
        turn = TURN.get()
        if turn is not None and "add" not in turn:
            turn["add"] = time.perf_counter()
        async for chunk in self._inner.generate(request_id, prompt, params):
            if turn is not None:
                turn["out"] = time.perf_counter()
            yield chunk


def stamp_client_queue(session: Any, out_to_client: list[float]) -> None:
    """Wrap ``session.client.queue.put_nowait`` (the session's client queue) so every
    ``response.text.delta`` appends ``now - TURN['out']`` (s) to ``out_to_client``."""
    queue = session.client.queue
    put = queue.put_nowait

    def put_nowait(item: Any) -> None:
        for event in item if isinstance(item, list) else (item,):  # a batch: one engine step's events
            if event is not None and event.type == "response.text.delta":
                turn = TURN.get()
                if turn is not None and "out" in turn:
                    out_to_client.append(time.perf_counter() - turn["out"])
        put(item)

    queue.put_nowait = put_nowait


def thread_cpu_s(ident: int) -> float:
    """CPU seconds (user + system) of the thread with ``threading`` ident ``ident``."""
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


def count_writer_threads() -> None:
    """Make every ledger :class:`~events.store.writer_thread.WriterThread` add its thread's CPU
    seconds to :data:`WRITER_CPU` when it ends."""
    from events.store.writer_thread import WriterThread

    if getattr(WriterThread, "_bench_counted", False):
        return
    main = WriterThread._main

    def counted(self: Any) -> None:
        try:
            main(self)
        finally:
            WRITER_CPU.append(time.thread_time())

    WriterThread._main = counted  # type: ignore[method-assign]
    WriterThread._bench_counted = True  # type: ignore[attr-defined]
