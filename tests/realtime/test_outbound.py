"""The connection's outbound path against a FAKE socket whose sends can be made to wait (a
transport that paused writing): a write goes out in the producer's step while nothing waits,
a waiting send holds every later write behind it (the order on the wire is the order of the
writes), and the slow-client bound counts the events held."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from engine_bridge.eager import run_eagerly
from realtime.connection import ConnectionOptions, RealtimeConnection, RealtimeState
from realtime.outbound import Outbound
from tests.waiting import eventually


class PausableSocket:
    """A FAKE websocket: ``send_text`` records the frame, waiting first while ``writable`` is
    clear (as uvicorn's send does when the transport paused writing)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.writable = asyncio.Event()
        self.writable.set()
        self.closed_with: int | None = None

    async def send_text(self, text: str) -> None:
        await self.writable.wait()
        self.sent.append(text)

    async def close(self, code: int = 1000) -> None:
        self.closed_with = code


def connection(outbound_queue_max: int = 1024) -> tuple[RealtimeConnection, Outbound, PausableSocket]:
    """A connection on the FAKE socket, and its outbound path with its sender started."""
    ws = PausableSocket()
    state = RealtimeState(SimpleNamespace(), ConnectionOptions(outbound_queue_max=outbound_queue_max))  # type: ignore[arg-type]
    conn = RealtimeConnection(ws, state)  # type: ignore[arg-type]
    conn.out.start()
    return conn, conn.out, ws


def frames(ws: PausableSocket) -> list[int]:
    import json

    return [json.loads(text)["n"] for text in ws.sent]


async def test_writes_go_out_in_the_producers_step_and_in_order_when_a_send_waits() -> None:
    _, out, ws = connection()
    await eventually(lambda: out._sender_idle)
    out.send_all([{"n": 0}, {"n": 1}])
    assert frames(ws) == [0, 1]  # sent without a wake-up of the sender
    ws.writable.clear()  # the transport pauses: the next send waits
    out.send_all([{"n": 2}, {"n": 3}])
    out.send_all([{"n": 4}])
    assert frames(ws) == [0, 1] and out.queued == 3
    ws.writable.set()
    await eventually(lambda: frames(ws) == [0, 1, 2, 3, 4])
    assert out.queued == 0
    out.send_all([{"n": 5}])
    await eventually(lambda: frames(ws) == [0, 1, 2, 3, 4, 5])
    assert out.sender_task is not None
    out.sender_task.cancel()


async def test_events_held_behind_a_waiting_send_count_toward_the_bound() -> None:
    conn, out, ws = connection(outbound_queue_max=3)
    await eventually(lambda: out._sender_idle)
    ws.writable.clear()
    out.send_all([{"n": 0}, {"n": 1}])
    out.send_all([{"n": 2}])
    assert out.queued == 3 and not out.overflowed
    out.send_all([{"n": 3}])  # a fourth event held: the client is too slow
    assert out.overflowed and out.close_code == 1008 and conn.end_reason == "outbound_queue_full"
    await eventually(lambda: ws.closed_with == 1008)


async def test_run_eagerly_finishes_a_call_that_does_not_wait_without_a_task() -> None:
    done: list[Any] = []

    async def quick() -> None:
        done.append(1)

    assert run_eagerly(quick()) is None and done == [1]
    gate = asyncio.Event()

    async def waits() -> str:
        await gate.wait()
        done.append(2)
        return "ok"

    task = run_eagerly(waits())
    assert task is not None and not task.done()
    gate.set()
    assert await task == "ok" and done == [1, 2]

    async def fails() -> None:
        raise ValueError("x")

    try:
        run_eagerly(fails())
    except ValueError:
        pass
    else:
        raise AssertionError("the first step's exception is raised to the caller")
