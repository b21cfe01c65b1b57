"""WriterThread.group (issue 15): items queued for one handler while the thread is busy are
handled in one call, each caller gets its own result or exception, other work keeps its
place in the queue, and ``after`` runs once per batch on the loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from events.store.writer_thread import WriterThread


async def test_items_queued_while_busy_form_one_batch_and_keep_their_order() -> None:
    thread = WriterThread("test-writer", max_group_size=100)
    gate = threading.Event()
    batches: list[list[Any]] = []
    order: list[str] = []
    afters: list[int] = []

    def handler(items: list[Any]) -> list[Any]:
        batches.append(items)
        order.append(f"group{items}")
        return [i * 10 if i % 3 else ValueError(f"item {i}") for i in items]

    blocker = asyncio.ensure_future(thread.call(gate.wait))
    await asyncio.sleep(0.05)  # the thread is now busy in gate.wait
    first = [thread.group(handler, i, after=lambda: afters.append(1)) for i in (1, 2, 3)]
    other = asyncio.ensure_future(thread.call(lambda: order.append("call")))
    await asyncio.sleep(0)
    last = thread.group(handler, 4)
    gate.set()
    await blocker
    results = await asyncio.gather(*first, return_exceptions=True)
    assert results[:2] == [10, 20] and isinstance(results[2], ValueError) and "item 3" in str(results[2])
    await other
    assert await last == 40
    assert batches == [[1, 2, 3], [4]]  # the plain call between them splits the batches
    assert order == ["group[1, 2, 3]", "call", "group[4]"]
    assert afters == [1]  # once for the first batch (the second had no ``after``)
    await thread.stop()


async def test_a_handler_that_raises_fails_every_caller_of_its_batch() -> None:
    thread = WriterThread("test-writer")

    def handler(items: list[Any]) -> list[Any]:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await thread.group(handler, 1)
    await thread.stop()


async def test_the_size_bound_splits_a_batch() -> None:
    thread = WriterThread("test-writer", max_group_size=5)
    gate = threading.Event()
    batches: list[list[Any]] = []

    def handler(items: list[Any]) -> list[Any]:
        batches.append(items)
        return list(items)

    blocker = asyncio.ensure_future(thread.call(gate.wait))
    await asyncio.sleep(0.05)
    futures = [thread.group(handler, i, size=2) for i in range(5)]
    gate.set()
    await blocker
    assert await asyncio.gather(*futures) == list(range(5))
    assert batches == [[0, 1, 2], [3, 4]]  # 2 + 2 + 2 rows reach the bound of 5
    await thread.stop()


async def test_an_item_whose_caller_gave_up_before_its_batch_is_not_handled() -> None:
    thread = WriterThread("test-writer")
    gate = threading.Event()
    handled: list[Any] = []

    def handler(items: list[Any]) -> list[Any]:
        handled.extend(items)
        return list(items)

    blocker = asyncio.ensure_future(thread.call(gate.wait))
    await asyncio.sleep(0.05)
    dropped, kept = thread.group(handler, "dropped"), thread.group(handler, "kept")
    dropped.cancel()
    gate.set()
    await blocker
    assert await kept == "kept" and handled == ["kept"]
    await thread.stop()


async def test_items_for_another_handler_are_not_merged_and_keep_their_place() -> None:
    thread = WriterThread("test-writer")
    gate = threading.Event()
    batches: list[tuple[str, list[Any]]] = []

    def handler_a(items: list[Any]) -> list[Any]:
        batches.append(("a", items))
        return [f"a{i}" for i in items]

    def handler_b(items: list[Any]) -> list[Any]:
        batches.append(("b", items))
        return [f"b{i}" for i in items]

    blocker = asyncio.ensure_future(thread.call(gate.wait))
    await asyncio.sleep(0.05)
    gone = thread.group(handler_a, 0)
    futures = [thread.group(handler_a, 1), thread.group(handler_b, 2), thread.group(handler_a, 3)]
    gone.cancel()
    gate.set()
    await blocker
    assert await asyncio.gather(*futures) == ["a1", "b2", "a3"]
    assert batches == [("a", [1]), ("b", [2]), ("a", [3])]  # the cancelled item 0 was never handled
    await thread.stop()
