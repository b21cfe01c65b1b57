"""Outputs in batches (issue 23 step 4): what one engine step delivers travels as one batch —
one coalescer call (one ``emit_held``), one client write — and the client sees the same events,
in the same order, as when every output travels alone. The engines are scripted FAKE ports
(tests/fakes/fake_port.py); an "engine step" of ``k`` outputs is modelled by a wrapper that
hands the pump ``k`` of the fake's outputs back to back, without yielding to the loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine_bridge.client_feed import ClientFeed
from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from engine_bridge.outputs import OutputCoalescer
from engine_bridge.plugin import TextPlugin
from engine_bridge.ports import StageChunk
from events.types import EventBase
from projections.shell.runner import project_as_of
from tests.fakes.fake_port import FakeStagePort


class _CountingLog:
    """A FAKE SessionLog for the coalescer: counts ``emit_held`` calls and keeps the events."""

    session_id = "s"

    def __init__(self) -> None:
        self.calls = 0
        self.events: list[EventBase] = []

    def emit_held(self, *events: EventBase) -> None:
        self.calls += 1
        self.events.extend(events)


def _chunks(n: int, *, window_every: int = 3) -> list[StageChunk]:
    out = []
    for i in range(n):
        last = i == n - 1
        out.append(
            StageChunk(
                request_id="r",
                stage_id=0,
                new_token_ids=(1000 + i,),
                text_delta=f"w{i} ",
                segment_done=last,
                finished=last,
                finish_reason="stop" if last else None,
                received_ts=100.0 + 0.05 * i + (0.1 if i % window_every == 0 else 0.0),
            )
        )
    return out


def test_one_batch_is_one_coalescer_write_with_the_events_of_one_add_per_output() -> None:
    chunks = _chunks(8)
    alone, batched = _CountingLog(), _CountingLog()
    one = OutputCoalescer(alone, 0, "r", window_s=0.1)  # type: ignore[arg-type]
    for chunk in chunks:
        one.add(chunk)
    one.flush()
    OutputCoalescer(batched, 0, "r", window_s=0.1).add_batch(chunks)  # type: ignore[arg-type]
    assert batched.calls == 1
    assert alone.calls > 1
    assert [e.model_dump(exclude={"event_id"}) for e in batched.events] == [
        e.model_dump(exclude={"event_id"}) for e in alone.events
    ]
    assert sum(e.num_new_tokens for e in batched.events) == 8  # type: ignore[attr-defined]


async def test_a_batch_is_one_client_write_the_reader_sees_event_by_event() -> None:
    feed = ClientFeed("s")
    feed.send_batch("response.text.delta", [{"delta": f"w{i}"} for i in range(5)])
    feed.send_batch("response.text.delta", [])  # nothing delivered: no write
    feed.send("response.done", text="x")
    feed.end()
    assert feed.writes == 2
    assert feed.queue.qsize() == 3  # two writes and the end
    seen = [(e.type, e.data) async for e in feed.events()]
    assert seen == [("response.text.delta", {"delta": f"w{i}"}) for i in range(5)] + [("response.done", {"text": "x"})]


def _stepping(port: FakeStagePort, k: int) -> None:
    """Make the resident stream deliver ``k`` outputs per "engine step" (back to back)."""
    open_stream = port.open_stream

    def stepped(*args: Any) -> AsyncIterator[StageChunk]:
        inner = open_stream(*args)

        async def steps() -> AsyncIterator[StageChunk]:
            step: list[StageChunk] = []
            async for chunk in inner:
                step.append(chunk)
                if len(step) == k or chunk.segment_done or chunk.finished:
                    for item in step:  # no await between them: one step's outputs
                        yield item
                    step = []
            for item in step:
                yield item

        return steps()

    port.open_stream = stepped  # type: ignore[method-assign,assignment]


async def _run(
    tmp_path: Any, k: int, auto_response: bool
) -> tuple[list[tuple[str, dict[str, Any]]], list[int], int, list[tuple[str, int, str | None]]]:
    """(client events without ids/stamps, sizes of the text-delta writes, emit_held calls of
    outputs, the log's (type, tokens, text) in order)."""
    port = FakeStagePort(0, "thinker", reply="one two three four five six seven eight nine")
    _stepping(port, k)
    # A window no run outlasts: the log's StageOutput rows then depend on the steps alone, never on
    # how late a loaded machine ran the pump (CI saw an extra row split off by a 5 ms window).
    config = EngineConfig(max_tokens=9, flush_interval_s=60.0)
    url = f"sqlite+aiosqlite:///{tmp_path}/b{k}{auto_response}.db"
    async with await SessionEngine.open(url, [port], config=config, plugin=TextPlugin(resumable=True)) as engine:
        s = await engine.open_session("b", auto_response=auto_response)
        writes: list[int] = []
        send_batch, emit_held = s.client.send_batch, s.log.emit_held
        held_calls = [0]

        def counted(type_: str, batch: Any) -> None:
            if type_ == "response.text.delta" and batch:
                writes.append(len(batch))
            send_batch(type_, batch)

        def held(*events: EventBase) -> None:
            if any(e.type == "StageOutput" for e in events):
                held_calls[0] += 1
            emit_held(*events)

        s.client.send_batch = counted  # type: ignore[method-assign]
        s.log.emit_held = held  # type: ignore[method-assign]
        await s.append_text("count to nine")
        await s.commit()
        await s.wait_idle(10)
        await s.close()
        assert (await project_as_of(engine.store)).leaks() == []
        logged = [
            (h.event.type, getattr(h.event, "num_new_tokens", 0), getattr(h.event, "text_delta", None))
            for h in await engine.store.read_stream("b")
            if h.event.type not in ("SessionOpened", "SessionClosed")
        ]
        seen = [(e.type, {key: v for key, v in e.data.items() if not key.endswith("_id")}) for e in s.drain_events()]
    return seen, writes, held_calls[0], logged


@pytest.mark.parametrize("auto_response", (False, True))
@pytest.mark.parametrize("k", (3, 9))
async def test_outputs_of_one_engine_step_travel_as_one_batch(tmp_path, k, auto_response) -> None:
    """auto_response: the response begins inside the first batch (FirstOutput after its first
    visible output, before the rest): the log's order is that of one output a step."""
    alone, alone_writes, alone_held, alone_log = await _run(tmp_path, 1, auto_response)
    batched, writes, held, log = await _run(tmp_path, k, auto_response)
    assert [t for t, _, _ in log] == [t for t, _, _ in alone_log]  # the log's shape too
    assert sum(n for _, n, _ in log) == sum(n for _, n, _ in alone_log) == 9
    deltas = [data["delta"] for type_, data in batched if type_ == "response.text.delta"]
    assert "".join(deltas).split() == "one two three four five six seven eight nine".split()
    assert batched == alone  # what the client sees is unchanged
    assert sum(writes) == sum(alone_writes) == 9
    assert max(alone_writes) == 1  # one output a step: one write each
    split = 1 if auto_response else 0  # the response begins after the first visible output: its own write
    assert max(writes) > 1 and len(writes) <= len(alone_writes) - (k - 1) + split  # a step's outputs: one write
    assert held <= alone_held


async def test_an_ephemeral_requests_deliveries_are_its_gated_items_one_list_each() -> None:
    """stage0_batches of an ephemeral request: the eagerly started first delivery, then the
    rest of the gated stream, each one engine step's output as a one-item list (no layer of
    its own per output); a stream that ends before its first item delivers nothing; the gate
    holds each item until the pipelined intent is durable."""
    import asyncio

    from decider import TurnRef
    from engine_bridge.eager import start_eagerly
    from engine_bridge.session_log import SessionLog
    from engine_bridge.stage0_batches import stage0_batches
    from engine_bridge.turn_run import TurnRun
    from events.types import TurnCommitted

    class HeldStore:  # a FAKE store whose append waits for ``release``
        def __init__(self) -> None:
            self.release = asyncio.Event()

        async def append(self, stream_id, events, expected_version=None):  # type: ignore[no-untyped-def]
            await self.release.wait()
            return list(range(len(events)))

    async def items(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    async def read(n: int, store: HeldStore) -> list[Any]:
        log = SessionLog(store, "s", 0)  # type: ignore[arg-type]
        log.emit_ahead(TurnCommitted(session_id="s", ts=1.0, turn_id=0))
        turn = TurnRun(TurnRef("r", 0, 0, 0), "hi", True)
        turn.stage0 = log.gated_batches(items(n))  # type: ignore[arg-type]
        turn.first = start_eagerly(turn.stage0.__anext__())
        return [batch async for batch in stage0_batches(turn)]

    store = HeldStore()
    reading = asyncio.ensure_future(read(3, store))
    await asyncio.sleep(0.01)
    assert not reading.done()  # nothing handed on before the intent commits
    store.release.set()
    assert await reading == [[0], [1], [2]]
    assert await read(0, store) == []
