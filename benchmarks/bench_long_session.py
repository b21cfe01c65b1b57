"""Flat memory of a long-running embedded engine (issue 13): one resident and one ephemeral
session on the scripted FAKE stage ports play N turns each; the process RSS is sampled every
``--every`` turns and printed with its ratio to the first sample after warm-up. Flat memory
means the ratio stays near 1.0 while the log grows.

    .venv/bin/python benchmarks/bench_long_session.py --turns 10000
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_bridge.engine import SessionEngine  # noqa: E402
from engine_bridge.messages import EngineConfig  # noqa: E402
from engine_bridge.plugin import TextPlugin  # noqa: E402
from tests.fakes.fake_port import FakeStagePort  # noqa: E402


def rss_mb() -> float:
    """Current resident set size (MB) from /proc (Linux), else the peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def play(turns: int, every: int, db: Path) -> list[tuple[int, float, float]]:
    config = EngineConfig(max_tokens=4, talker_max_tokens=2, flush_interval_s=0.01)
    samples = []
    for resumable in (False, True):
        ports = [FakeStagePort(0, "thinker", token_delay_s=0.0), FakeStagePort(1, "talker", token_delay_s=0.0)]
        async with await SessionEngine.open(
            f"sqlite+aiosqlite:///{db}", ports, config=config, plugin=TextPlugin(resumable=resumable)
        ) as engine:
            session = await engine.open_session(f"long-{resumable}")
            start = time.perf_counter()
            for i in range(1, turns // 2 + 1):
                await session.append_text(f"turn {i}")
                await session.commit()
                await session.wait_idle(30)
                session.drain_events()
                if i % every == 0:
                    samples.append((i + (turns // 2 if resumable else 0), rss_mb(), time.perf_counter() - start))
            await session.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=1_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        samples = asyncio.run(play(args.turns, args.every, Path(tmp) / "long.db"))
    base = samples[0][1]
    print(f"{'turns':>7} {'RSS MB':>8} {'ratio':>6} {'s':>7}")
    for turns, rss, secs in samples:
        print(f"{turns:>7} {rss:>8.1f} {rss / base:>6.2f} {secs:>7.1f}")


if __name__ == "__main__":
    main()
