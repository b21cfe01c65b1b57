"""What the hash-chain check costs a reader of a ledger file (hostile-test finding M7):
``audit``'s ``ProjectionRunner.checked_catch_up`` on an audited copy of the synthetic log
(default /tmp/dl-bench-300x36.db, 301,595 events) with the chain check (``chain_fault``) and
with it replaced by a no-op, alternating repeats in one process; medians and their ratio,
plus the chain check alone as a share of the reader.

    .venv/bin/python benchmarks/bench_reader_chain.py [--db PATH] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def run(path: Path, rounds: int) -> tuple[int, list[float], list[float], list[float]]:
    """``rounds`` alternating repeats of (reader with the check, reader without, check alone)."""
    from events.chain_walk import chain_fault
    from events.store.store import EventStore
    from projections.shell import checked as checked_module
    from projections.shell import runner as runner_module

    async def no_check(_store: object, _until: int) -> None:
        return None

    with_s, without_s, alone_s = [], [], []
    async with await EventStore.open(f"sqlite+aiosqlite:///{path}") as store:
        head = await store.head_position()
        await runner_module.ProjectionRunner(store, note=lambda _m: None).checked_catch_up()  # audited copy
        for _ in range(rounds):
            for checked, out in ((True, with_s), (False, without_s)):
                checked_module.chain_fault = chain_fault if checked else no_check  # type: ignore[assignment]
                start = time.perf_counter()
                await runner_module.ProjectionRunner(store, note=lambda _m: None).checked_catch_up()
                out.append(time.perf_counter() - start)
            checked_module.chain_fault = chain_fault
            start = time.perf_counter()
            assert await chain_fault(store, head) is None
            alone_s.append(time.perf_counter() - start)
    return head, with_s, without_s, alone_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", type=Path, default=Path("/tmp/dl-bench-300x36.db"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-reader-chain-") as tmp:
        copy = Path(tmp) / "ledger.db"
        shutil.copyfile(args.db, copy)
        head, with_s, without_s, alone_s = asyncio.run(run(copy, args.rounds))
    w, wo, a = statistics.median(with_s), statistics.median(without_s), statistics.median(alone_s)
    print(f"{head} events, {args.rounds} alternating rounds (medians)")
    print(f"reader with chain check / without: {w / wo:.3f}x")
    print(f"chain check alone / reader without it: {a / wo:.3f}x ({a / head * 1e6:.2f} us/event)")


if __name__ == "__main__":
    main()
