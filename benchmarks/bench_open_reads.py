"""Loop CPU of the reads a session open makes (issue 23): ``read_stream`` + ``stream_version``
of a fresh stream and of a 100-event stream, A/B in one process (the SQLite raw read path
against the SQLAlchemy async path), ``time.thread_time()`` of the loop thread.

    python -m benchmarks.bench_open_reads [--rounds 1000] [--events 100] [--opens 300]

``--opens N``: also N opens (and closes) of fresh sessions through ``SessionEngine`` with the
fake ports (tests/fakes, named fakes), loop CPU per ``open_session`` only, A/B in blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from events.store import EventStore
from events.types import TurnCommitted


def _turns(stream: str, count: int) -> list[Any]:
    return [TurnCommitted(session_id=stream, ts=1757000000.0 + n / 1000, turn_id=n) for n in range(count)]


async def _per_read_us(store: EventStore, stream: str, rounds: int) -> float:
    for _ in range(20):  # warm-up: connections opened, statements cached
        await store.read_stream(stream)
        await store.stream_version(stream)
    start = time.thread_time()
    for _ in range(rounds):
        await store.read_stream(stream)
        await store.stream_version(stream)
    return (time.thread_time() - start) / rounds * 1e6


async def main(rounds: int, events: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await EventStore.open(f"sqlite+aiosqlite:///{Path(tmp) / 'open.db'}", create=True)
        try:
            await store.append("S-full", _turns("S-full", events), expected_version=0)
            backend: Any = store.recorder.backend
            raw = backend.read_raw
            for label, path in (("sqlalchemy", None), ("raw", raw), ("sqlalchemy", None), ("raw", raw)):
                backend.read_raw = path
                fresh = await _per_read_us(store, "S-fresh", rounds)
                full = await _per_read_us(store, "S-full", rounds)
                print(
                    f"{label:>10}: read_stream+stream_version loop CPU  fresh {fresh:7.1f} µs  {events} events {full:7.1f} µs"
                )
        finally:
            await store.close()


async def opens(count: int) -> None:
    from engine_bridge.engine import SessionEngine
    from tests.fakes.fake_port import FakeStagePort

    with tempfile.TemporaryDirectory() as tmp:
        ports = [FakeStagePort(0, "thinker", token_delay_s=0.001), FakeStagePort(1, "talker", token_delay_s=0.001)]
        async with await SessionEngine.open(f"sqlite+aiosqlite:///{Path(tmp) / 'opens.db'}", ports) as engine:
            backend: Any = engine.store.recorder.backend
            raw, spent = backend.read_raw, {"sqlalchemy": 0.0, "raw": 0.0}
            for block in range(2 * 10):
                label = ("sqlalchemy", "raw")[block % 2]
                backend.read_raw = raw if label == "raw" else None
                for i in range(count // 10):
                    start = time.thread_time()
                    session = await engine.open_session(f"open-{block}-{i}")
                    spent[label] += time.thread_time() - start
                    await session.close()
            for label, total_s in spent.items():
                print(f"{label:>10}: open_session loop CPU {total_s / count * 1e6:7.1f} µs per open ({count} opens)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--opens", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.events))
    if args.opens:
        asyncio.run(opens(args.opens))
