"""Live-overhead benchmark (issue 5): what the ledger adds on top of vLLM.

8 concurrent sessions x 5 turns on live engines (Stage0 thinker + Stage1 talker, CPU build),
the same workload driven (a) through duplex-ledger's SessionEngine with its log on SQLite and
(b) straight against the same vLLM ports with no ledger, in the same process, alternating
a/b for several rounds. Prints wall time and per-turn latency p50/p99 for both, the ratios,
events per turn and log bytes per turn.

    .venv/bin/python benchmarks/bench_live_overhead.py [--model tiny] [--rounds 6]

Targets: the ledger adds <= 3 % wall time and <= 2 ms p99 per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SESSIONS, TURNS = 8, 5
QUESTIONS = ["What is the capital of France?", "And of Italy?", "Which one is bigger?",
             "Tell me a fun fact about it.", "Thanks, that is all."]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


async def run_ledger(ports, config, db_path: Path, synchronous: str) -> tuple[float, list[float], int, int, float,
                                                                          tuple[int, float]]:
    """(wall s, per-turn latencies ms, events, log bytes, CPU s of this process while the
    sessions ran — opening and migrating the ledger excluded, (durable emits, seconds callers
    waited on them))."""
    from engine_bridge.engine import SessionEngine

    latencies: list[float] = []
    engine = await SessionEngine.open(f"sqlite+aiosqlite:///{db_path}", ports, config=config,
                                      synchronous=synchronous)

    async def one(i: int) -> None:
        s = await engine.open_session(f"bench-{i}-{time.monotonic_ns()}")
        for q in QUESTIONS[:TURNS]:
            t0 = time.perf_counter()
            await s.append_text(q)
            await s.commit()
            await s.wait_idle(300)
            latencies.append((time.perf_counter() - t0) * 1000)
        await s.close()

    start, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(i) for i in range(SESSIONS)))
    wall = time.perf_counter() - start
    cpu_s = time.process_time() - cpu0
    events = sum(s.log.events_written for s in engine.sessions.values())
    durable = (sum(s.log.durable_emits for s in engine.sessions.values()),
               sum(s.log.durable_wait_s for s in engine.sessions.values()))
    await engine.aclose()
    size = sum(p.stat().st_size for p in db_path.parent.glob(db_path.name + "*"))
    return wall, latencies, events, size, cpu_s, durable


async def run_plain(ports, config) -> tuple[float, list[float]]:
    from engine_bridge.ports import GenerationParams

    thinker, talker = ports
    latencies: list[float] = []
    params = GenerationParams(max_tokens=config.max_tokens, temperature=0.0, ignore_eos=config.ignore_eos)

    async def one(i: int) -> None:
        history: list[dict[str, str]] = []
        for n, q in enumerate(QUESTIONS[:TURNS]):
            t0 = time.perf_counter()
            rid = f"plain-{i}-{n}-{time.monotonic_ns()}"
            messages = [{"role": "system", "content": config.system_prompt}, *history[-6:],
                        {"role": "user", "content": q}]
            prompt = thinker.chat_prompt(messages)
            thinker.count_tokens(prompt)
            text = []
            async for chunk in thinker.generate(rid, prompt, params):
                text.append(chunk.text_delta)
            thinker.pop_finished_stats(rid)
            answer = "".join(text)
            budget = max(1, min(config.talker_max_tokens, talker.count_tokens(answer or " ")))
            async for _ in talker.generate(rid, answer or " ", GenerationParams(max_tokens=budget, ignore_eos=config.ignore_eos)):
                pass
            talker.pop_finished_stats(rid)
            history += [{"role": "user", "content": q}, {"role": "assistant", "content": answer}]
            latencies.append((time.perf_counter() - t0) * 1000)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(SESSIONS)))
    return time.perf_counter() - start, latencies


async def main(model: str, rounds: int, synchronous: str, dtype: str, flush_s: float) -> None:
    from engine_bridge.messages import EngineConfig
    from engine_bridge.models import resolve_model
    from engine_bridge.vllm_port import VllmStagePort

    model_dir = resolve_model(model)
    talker_dir = resolve_model("tiny")
    thinker = await VllmStagePort.start(model_dir, stage_id=0, name="thinker", dtype=dtype)
    talker = await VllmStagePort.start(talker_dir, stage_id=1, name="talker", dtype=dtype)
    # Exact lengths on both arms: both stages run to their budget.
    config = EngineConfig(max_tokens=24, talker_max_tokens=24, ignore_eos=True, flush_interval_s=flush_s)
    ports = [thinker, talker]
    ledger_walls, plain_walls, ledger_lat, plain_lat = [], [], [], []
    events = size = durable_n = 0
    durable_wait_s = 0.0
    cpu = {"ledger": 0.0, "plain": 0.0}
    steps: dict[str, list[list[int]]] = {"ledger": [], "plain": []}  # engine iterations per round, per stage
    try:
        await run_plain(ports, config)  # warm-up (not counted)
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(rounds):
                order = ("ledger", "plain") if r % 2 == 0 else ("plain", "ledger")
                for which in order:
                    steps0 = [p.counters.iterations for p in ports]
                    if which == "ledger":
                        wall, lat, ev, sz, cpu_s, (n_durable, wait_s) = await run_ledger(
                            ports, config, Path(tmp) / f"round{r}.db", synchronous)
                        durable_n += n_durable
                        durable_wait_s += wait_s
                        ledger_walls.append(wall)
                        cpu["ledger"] += cpu_s
                        ledger_lat += lat
                        events += ev
                        size += sz
                    else:
                        cpu0 = time.process_time()
                        wall, lat = await run_plain(ports, config)
                        cpu["plain"] += time.process_time() - cpu0
                        plain_walls.append(wall)
                        plain_lat += lat
                    steps[which].append([p.counters.iterations - n for p, n in zip(ports, steps0)])
    finally:
        await talker.shutdown()
        await thinker.shutdown()
    turns = SESSIONS * TURNS * rounds
    lw, pw = statistics.median(ledger_walls), statistics.median(plain_walls)
    paired = sorted(lw_r / pw_r for lw_r, pw_r in zip(ledger_walls, plain_walls))
    plain_spread = (max(plain_walls) - min(plain_walls)) / pw
    print(f"workload: {SESSIONS} sessions x {TURNS} turns, model={model}, talker=tiny, {rounds} rounds alternating, "
          f"SQLite synchronous={synchronous}, flush interval {flush_s} s, {dtype}")
    print(f"{'':28s}{'wall s (median)':>16s}{'turn p50 ms':>14s}{'turn p99 ms':>14s}")
    print(f"{'vLLM straight (no ledger)':28s}{pw:>16.3f}{pct(plain_lat, .5):>14.1f}{pct(plain_lat, .99):>14.1f}")
    print(f"{'through duplex-ledger':28s}{lw:>16.3f}{pct(ledger_lat, .5):>14.1f}{pct(ledger_lat, .99):>14.1f}")
    print(f"wall ratio ledger/plain: {lw / pw:.3f} ({(lw / pw - 1) * 100:+.1f} %); "
          f"p99 delta: {pct(ledger_lat, .99) - pct(plain_lat, .99):+.1f} ms; "
          f"p50 delta: {pct(ledger_lat, .5) - pct(plain_lat, .5):+.1f} ms")
    print(f"per-round paired ratios ledger/plain: {', '.join(f'{x:.2f}' for x in paired)}; "
          f"plain arm alone varied by {plain_spread * 100:.0f} % of its median across rounds (noise floor)")
    print(f"durable emits (write-ahead intents): {durable_n / turns:.1f} per turn, callers waited "
          f"{durable_wait_s / max(durable_n, 1) * 1000:.1f} ms each, {durable_wait_s / turns * 1000:.1f} ms per turn")
    print(f"CPU of this process during the timed runs (vLLM frontend + ledger): plain {cpu['plain'] / turns * 1000:.1f} ms/turn, "
          f"ledger {cpu['ledger'] / turns * 1000:.1f} ms/turn")
    print("engine iterations per round (median; the same tokens in fewer steps = better batched): "
          + "; ".join(f"{name} {' + '.join(str(statistics.median(r[i] for r in steps[arm])) for i in range(len(ports)))}"
                      for arm, name in (("plain", "straight"), ("ledger", "ledger"))) + " (thinker + talker)")
    print(f"log: {events / turns:.1f} events per turn, {size / turns:,.0f} bytes of log per turn (SQLite file + WAL)")


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rounds", type=int, default=6, help="alternating a/b rounds (the VM is noisy: more is steadier)")
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="NORMAL")
    parser.add_argument("--flush-interval", type=float, default=0.1, help="EngineConfig.flush_interval_s (s)")
    parser.add_argument("--dtype", default="float32", help="float32 is faster than float16 on CPUs without fp16")
    args = parser.parse_args()
    asyncio.run(main(args.model, args.rounds, args.synchronous, args.dtype, args.flush_interval))
