"""``verify`` benchmark (issue 12): the whole check — hash chain recomputed, the log folded
to the checkpoint, read models and checkpoint compared — on the synthetic log of
bench_rebuild (default 300 sessions x 36 turns, ~300,000 events), against the ceiling
measured in the same run: the same rows read and JSON-decoded by plain ``sqlite3``. Also
prints the chain walk alone (``digest``) and the CPU per event of verify (every process: the
log is folded by the partition processes, each checking the chain links of one range of
positions beside its fold) and of the ceiling. Target (issue 23): verify >= 0.5x.

    .venv/bin/python benchmarks/bench_verify.py [--sessions 300] [--turns 36] [--db PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_rebuild import ceiling, ensure_log  # noqa: E402


def _cpu_s() -> float:
    """CPU seconds of this process plus its finished children (user + system)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def reaped_workers(timeout_s: float = 10.0) -> None:
    """Wait (outside the timed part) until the worker processes have exited and been reaped:
    the fold does not wait for their exit, and a child's CPU is counted once it is reaped."""
    deadline = time.monotonic() + timeout_s
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.005)


async def run(
    path: Path, rounds: int
) -> tuple[int, list[float], list[float], list[float], str, list[float], list[float]]:
    """``rounds`` alternating repeats of the ceiling, ``verify`` and the chain walk alone
    (``digest``); their times, what verify said, and the CPU seconds (all processes) of the
    ceiling and of verify."""
    from events.store.store import EventStore
    from projections.shell.runner import ProjectionRunner
    from reports.cli_verify import head_digest, verify_store

    t_ceiling, t_verify, t_chain, cpu_ceiling, cpu_verify = [], [], [], [], []
    async with await EventStore.open(f"sqlite+aiosqlite:///{path}", synchronous="NORMAL") as store:
        runner = ProjectionRunner(store, batch_size=20_000)
        await runner.load()
        if runner.position != await store.head_position():
            await runner.rebuild()
        for _ in range(rounds):
            cpu0 = _cpu_s()
            t_ceiling.append(ceiling(path)[1])
            cpu_ceiling.append(_cpu_s() - cpu0)
            cpu0, start = _cpu_s(), time.perf_counter()
            verdict = await verify_store(store)
            t_verify.append(time.perf_counter() - start)
            reaped_workers()
            cpu_verify.append(_cpu_s() - cpu0)
            start = time.perf_counter()
            await head_digest(store)
            t_chain.append(time.perf_counter() - start)
    state = "intact" if verdict.fault is None and verdict.mismatch is None else f"{verdict.fault or verdict.mismatch}"
    return verdict.events, t_ceiling, t_verify, t_chain, state, cpu_ceiling, cpu_verify


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--turns", type=int, default=36)
    parser.add_argument("--rounds", type=int, default=3, help="alternating repeats; medians are printed")
    parser.add_argument("--db", type=Path, default=Path("/tmp/duplex-ledger-bench-verify.db"))
    args = parser.parse_args()
    ensure_log(args.db, args.sessions, args.turns)
    events, t_ceilings, t_verifies, t_chains, state, cpu_ceilings, cpu_verifies = asyncio.run(run(args.db, args.rounds))
    t_ceiling, t_verify, t_chain = (statistics.median(t) for t in (t_ceilings, t_verifies, t_chains))
    eps_ceiling, eps_verify, eps_chain = events / t_ceiling, events / t_verify, events / t_chain
    print(
        f"log: {events:,} events ({args.sessions} sessions x {args.turns} turns); verify says: {state}; "
        f"medians of {args.rounds} alternating rounds"
    )
    print(f"{'plain sqlite3 read + json.loads (ceiling)':45s} {eps_ceiling:>12,.0f} events/s  ({t_ceiling:.2f} s)")
    print(f"{'verify (chain + fresh fold + compare)':45s} {eps_verify:>12,.0f} events/s  ({t_verify:.2f} s)")
    print(f"{'chain walk alone (digest)':45s} {eps_chain:>12,.0f} events/s  ({t_chain:.2f} s)")
    print(
        f"{'ratio verify / ceiling':45s} {eps_verify / eps_ceiling:>12.2f}  "
        f"(per round: {', '.join(f'{c / v:.2f}' for c, v in zip(t_ceilings, t_verifies))})"
    )
    print(f"{'ratio chain walk / ceiling':45s} {eps_chain / eps_ceiling:>12.2f}")
    cpu_v, cpu_c = statistics.median(cpu_verifies), statistics.median(cpu_ceilings)
    print(f"{'CPU us per event: verify / ceiling':45s} {cpu_v / events * 1e6:>8.2f} / {cpu_c / events * 1e6:.2f}")


if __name__ == "__main__":
    main()
