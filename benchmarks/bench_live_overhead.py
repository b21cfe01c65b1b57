"""Live-overhead benchmark (issue 5): what the ledger adds on top of vLLM.

8 concurrent sessions x 5 turns on live engines (Stage0 thinker + Stage1 talker, CPU build),
the same workload driven (a) through duplex-ledger's SessionEngine with its log on SQLite and
(b) straight against the same vLLM ports with no ledger, twice (plain and plain-B: the A/A
noise floor), in the same process, the three arms rotated round by round. Per turn, ledger
minus plain (issue 15): commit() -> Stage0 ``add_request`` p50/p99 and engine output -> client
``response.text.delta`` p50/p99 (perf_counter stamps taken by :mod:`benchmarks.live_stamps`
around the port and the session's client queue; plain: turn start -> add_request, output ->
the loop's own append), frontend CPU per turn (``thread_time`` of the event-loop thread plus
the ledger writer threads' CPU), engine-core steps per round, turn p50 of paired rounds; the
wall ratio is printed next to the A/A ratio (shown, not judged).

    .venv/bin/python benchmarks/bench_live_overhead.py [--model tiny] [--rounds 6] [--strict-arm] [--profile PATH]

``--strict-arm`` adds a fourth arm, the ledger with strict write-ahead (the engine call waits
for its intent's commit, ``SessionLog.pipelined = False``), to weigh the pipelined intents in
the same rounds. ``--profile`` runs cProfile on the loop thread during the ledger arm and
prints the top duplex-ledger frames (its timings are then inflated: profile in a run of its own).
After the warm-up the process's heap (vLLM, torch, the engines) is frozen as ``duplex-ledger
serve`` freezes it once started (:mod:`engine_bridge.heap`); ``--no-freeze`` leaves it to every
full collection pass.

Targets (issue 15): added commit -> add_request p50 <= 1 ms, p99 <= 5 ms; output -> client p50
<= 0.5 ms; frontend CPU <= 2 ms per turn; steps within ±2 %; turn p50 within +5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.live_stamps import TURN, WRITER_CPU, StampedPort, count_writer_threads, stamp_client_queue  # noqa: E402

SESSIONS, TURNS = 8, 5
QUESTIONS = [
    "What is the capital of France?",
    "And of Italy?",
    "Which one is bigger?",
    "Tell me a fun fact about it.",
    "Thanks, that is all.",
]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


class Arm:
    """What one arm collected over all its rounds (times in ms unless named otherwise)."""

    def __init__(self) -> None:
        self.walls: list[float] = []  # s, one per round
        self.turn_p50: list[float] = []  # one per round
        self.turns: list[float] = []
        self.commit_to_add: list[float] = []  # commit() (plain: turn start) -> Stage0 add_request
        self.out_to_client: list[float] = []  # engine output -> client event, per text delta
        self.loop_cpu_s = 0.0  # CPU of the event-loop thread (the vLLM frontend and the ledger)
        self.writer_cpu_s = 0.0  # CPU of the ledger's writer threads
        self.steps: list[list[int]] = []  # engine iterations per round, per stage
        self.appends = 0  # ledger arms: store appends of the sessions' logs


async def run_ledger(
    ports, config, db_path: Path, synchronous: str, arm: Arm, pipelined: bool = True
) -> tuple[int, int, tuple[int, float, float]]:
    """One round through SessionEngine, stamps into ``arm``; (events, log bytes, (durable
    and pipelined emits, seconds callers or gated outputs waited on them, seconds the
    pipelined intents took to commit)). ``arm.appends`` counts the sessions' store appends."""
    from engine_bridge.engine import SessionEngine
    from engine_bridge.session_log import SessionLog

    SessionLog.pipelined = pipelined
    latencies: list[float] = []
    engine = await SessionEngine.open(
        f"sqlite+aiosqlite:///{db_path}", [StampedPort(ports[0]), *ports[1:]], config=config, synchronous=synchronous
    )

    async def one(i: int) -> None:
        s = await engine.open_session(f"bench-{i}-{time.monotonic_ns()}")
        stamp_client_queue(s, arm.out_to_client)
        for q in QUESTIONS[:TURNS]:
            turn: dict[str, float] = {}
            TURN.set(turn)
            t0 = time.perf_counter()
            await s.append_text(q)
            tc = time.perf_counter()
            await s.commit()
            await s.wait_idle(300)
            latencies.append((time.perf_counter() - t0) * 1000)
            if "add" in turn:
                arm.commit_to_add.append((turn["add"] - tc) * 1000)
        await s.close()

    writer0, cpu0 = sum(WRITER_CPU), time.thread_time()
    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(SESSIONS)))
    wall = time.perf_counter() - start
    arm.loop_cpu_s += time.thread_time() - cpu0
    events = sum(s.log.events_written for s in engine.sessions.values())
    arm.appends += sum(s.log.appends for s in engine.sessions.values())
    durable = (
        sum(s.log.durable_emits + s.log.ahead_emits for s in engine.sessions.values()),
        sum(s.log.durable_wait_s for s in engine.sessions.values()),
        sum(s.log.ahead_commit_s for s in engine.sessions.values()),
    )
    await engine.aclose()
    arm.writer_cpu_s += sum(WRITER_CPU) - writer0
    arm.walls.append(wall)
    arm.turns += latencies
    arm.turn_p50.append(pct(latencies, 0.5))
    size = sum(p.stat().st_size for p in db_path.parent.glob(db_path.name + "*"))
    return events, size, durable


async def run_plain(ports, config, arm: Arm) -> None:
    from engine_bridge.ports import GenerationParams

    thinker, talker = StampedPort(ports[0]), ports[1]
    latencies: list[float] = []
    params = GenerationParams(max_tokens=config.max_tokens, temperature=0.0, ignore_eos=config.ignore_eos)

    async def one(i: int) -> None:
        history: list[dict[str, str]] = []
        for n, q in enumerate(QUESTIONS[:TURNS]):
            turn: dict[str, float] = {}
            TURN.set(turn)
            t0 = time.perf_counter()
            rid = f"plain-{i}-{n}-{time.monotonic_ns()}"
            messages = [
                {"role": "system", "content": config.system_prompt},
                *history[-6:],
                {"role": "user", "content": q},
            ]
            prompt = thinker.chat_prompt(messages)
            thinker.count_tokens(prompt)
            text = []
            async for chunk in thinker.generate(rid, prompt, params):
                text.append(chunk.text_delta)
                arm.out_to_client.append((time.perf_counter() - turn["out"]) * 1000)
            thinker.pop_finished_stats(rid)
            answer = "".join(text)
            budget = max(1, min(config.talker_max_tokens, talker.count_tokens(answer or " ")))
            async for _ in talker.generate(
                rid, answer or " ", GenerationParams(max_tokens=budget, ignore_eos=config.ignore_eos)
            ):
                pass
            talker.pop_finished_stats(rid)
            history += [{"role": "user", "content": q}, {"role": "assistant", "content": answer}]
            latencies.append((time.perf_counter() - t0) * 1000)
            arm.commit_to_add.append((turn["add"] - t0) * 1000)

    cpu0 = time.thread_time()
    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(SESSIONS)))
    arm.walls.append(time.perf_counter() - start)
    arm.loop_cpu_s += time.thread_time() - cpu0
    arm.turns += latencies
    arm.turn_p50.append(pct(latencies, 0.5))


LEDGER_CODE = ("/events/", "/projections/", "/engine_bridge/")


def print_profile(profile: cProfile.Profile, path: str, turns: int, top: int = 25) -> None:
    """Dump ``profile`` (the loop thread during the ledger arm) to ``path`` and print its top
    frames of duplex-ledger code by own time, in µs per turn."""
    profile.dump_stats(path)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    rows = [
        (tt, ct, nc, f"{Path(fn).parent.name}/{Path(fn).name}:{line}({name})")
        for (fn, line, name), (_, nc, tt, ct, _) in stats.items()
        if any(c in fn for c in LEDGER_CODE)
    ]
    rows.sort(reverse=True)
    print(
        f"loop-thread profile, ledger arm, duplex-ledger frames by own time ({path}); "
        f"total own time {sum(r[0] for r in rows) / turns * 1e6:.0f} µs per turn (cProfile-inflated)"
    )
    print(f"{'own µs/turn':>12s}{'cum µs/turn':>12s}{'calls/turn':>11s}  frame")
    for tt, ct, nc, name in rows[:top]:
        print(f"{tt / turns * 1e6:>12.0f}{ct / turns * 1e6:>12.0f}{nc / turns:>11.1f}  {name}")


async def main(
    model: str,
    rounds: int,
    synchronous: str,
    dtype: str,
    flush_s: float,
    profile_path: str | None = None,
    strict: bool = False,
    freeze: bool = True,
) -> None:
    from engine_bridge.heap import freeze_startup_heap
    from engine_bridge.messages import EngineConfig
    from engine_bridge.vllm_port import VllmStagePort
    from reports.model_prep import resolve_model

    count_writer_threads()
    model_dir = resolve_model(model)
    talker_dir = resolve_model("tiny")
    thinker = await VllmStagePort.start(model_dir, stage_id=0, name="thinker", dtype=dtype)
    talker = await VllmStagePort.start(talker_dir, stage_id=1, name="talker", dtype=dtype)
    # Exact lengths on both arms: both stages run to their budget.
    config = EngineConfig(max_tokens=24, talker_max_tokens=24, ignore_eos=True, flush_interval_s=flush_s)
    ports = [thinker, talker]
    arms = {"ledger": Arm(), "plain": Arm(), "plain-B": Arm(), **({"ledger-strict": Arm()} if strict else {})}
    events = size = durable_n = 0
    durable_wait_s = ahead_s = 0.0
    profile = cProfile.Profile() if profile_path else None
    try:
        await run_plain(ports, config, Arm())  # warm-up (not counted)
        if freeze:
            freeze_startup_heap()  # as duplex-ledger serve does once started (every arm: one process)
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(rounds):
                names = list(arms)
                order = names[r % len(names) :] + names[: r % len(names)]  # each arm takes each place in turn
                for which in order:
                    steps0 = [p.counters.iterations for p in ports]
                    if which == "ledger-strict":
                        await run_ledger(
                            ports, config, Path(tmp) / f"strict{r}.db", synchronous, arms[which], pipelined=False
                        )
                    elif which == "ledger":
                        if profile is not None:
                            profile.enable()
                        ev, sz, (n_durable, wait_s, commit_s) = await run_ledger(
                            ports, config, Path(tmp) / f"round{r}.db", synchronous, arms[which]
                        )
                        if profile is not None:
                            profile.disable()
                        durable_n += n_durable
                        durable_wait_s += wait_s
                        ahead_s += commit_s
                        events += ev
                        size += sz
                    else:
                        await run_plain(ports, config, arms[which])
                    arms[which].steps.append([p.counters.iterations - n for p, n in zip(ports, steps0)])
    finally:
        await talker.shutdown()
        await thinker.shutdown()
    report(arms, model, rounds, synchronous, flush_s, dtype, events, size, durable_n, durable_wait_s, ahead_s)
    if profile is not None and profile_path is not None:
        print_profile(profile, profile_path, SESSIONS * TURNS * rounds)


def report(
    arms: dict[str, Arm],
    model: str,
    rounds: int,
    synchronous: str,
    flush_s: float,
    dtype: str,
    events: int,
    size: int,
    durable_n: int,
    durable_wait_s: float,
    ahead_s: float,
) -> None:
    led, pl, aa = arms["ledger"], arms["plain"], arms["plain-B"]
    turns = SESSIONS * TURNS * rounds
    print(
        f"workload: {SESSIONS} sessions x {TURNS} turns, model={model}, talker=tiny, {rounds} rounds, arms "
        f"ledger / plain / plain-B rotated, SQLite synchronous={synchronous}, flush interval {flush_s} s, {dtype}"
    )
    print(f"{'per turn (ms)':34s}{'plain':>10s}{'ledger':>10s}{'added':>10s}{'target':>10s}")

    def row(name: str, p: float, led_v: float, target: str) -> None:
        print(f"{name:34s}{p:>10.3f}{led_v:>10.3f}{led_v - p:>+10.3f}{target:>10s}")

    row("commit -> add_request p50", pct(pl.commit_to_add, 0.5), pct(led.commit_to_add, 0.5), "<= 1")
    row("commit -> add_request p99", pct(pl.commit_to_add, 0.99), pct(led.commit_to_add, 0.99), "<= 5")
    row("engine output -> client p50", pct(pl.out_to_client, 0.5), pct(led.out_to_client, 0.5), "<= 0.5")
    row("engine output -> client p99", pct(pl.out_to_client, 0.99), pct(led.out_to_client, 0.99), "")
    row(
        "frontend CPU (loop + writer)",
        (pl.loop_cpu_s + pl.writer_cpu_s) / turns * 1000,
        (led.loop_cpu_s + led.writer_cpu_s) / turns * 1000,
        "<= 2",
    )
    print(f"{'  of which ledger writer thread':34s}{'':>10s}{led.writer_cpu_s / turns * 1000:>10.2f}")
    paired_p50 = [lp - pp for lp, pp in zip(led.turn_p50, pl.turn_p50)]
    row("turn p50 (median of rounds)", statistics.median(pl.turn_p50), statistics.median(led.turn_p50), "")
    print(
        f"{'turn p50, paired rounds (median)':34s}{'':>10s}{'':>10s}{statistics.median(paired_p50):>+10.2f}"
        f"{'<= +5':>10s}"
    )
    print(
        f"{'  A/A: plain-B minus plain':34s}{'':>10s}{'':>10s}"
        f"{statistics.median(b - a for a, b in zip(pl.turn_p50, aa.turn_p50)):>+10.2f}"
    )
    steps = {name: [sum(r) for r in a.steps] for name, a in arms.items()}
    ratio = statistics.median(steps["ledger"]) / statistics.median(steps["plain"])
    print(
        f"engine steps per round (thinker + talker, median): plain {statistics.median(steps['plain'])}, ledger "
        f"{statistics.median(steps['ledger'])} ({(ratio - 1) * 100:+.1f} %, target within ±2 %), plain-B "
        f"{statistics.median(steps['plain-B'])}"
    )
    wall = statistics.median(w / p for w, p in zip(led.walls, pl.walls))
    noise = statistics.median(b / p for b, p in zip(aa.walls, pl.walls))
    print(
        f"wall ratio ledger/plain (median of paired rounds): {wall:.3f}; A/A noise floor plain-B/plain: {noise:.3f} "
        f"(per round: {', '.join(f'{b / p:.2f}' for b, p in zip(aa.walls, pl.walls))}) — shown, not judged"
    )
    print(
        f"durable + pipelined emits: {durable_n / turns:.1f} per turn; callers and gated outputs waited "
        f"{durable_wait_s / turns * 1000:.1f} ms per turn on them; the pipelined intents' commits took "
        f"{ahead_s / turns * 1000:.1f} ms per turn (not waited on)"
    )
    print(
        f"log: {events / turns:.1f} events per turn in {led.appends / turns:.1f} appends per turn, "
        f"{size / turns:,.0f} bytes of log per turn (SQLite file + WAL)"
    )
    if "ledger-strict" in arms:  # the same ledger with the engine call waiting for its intent's commit
        st = arms["ledger-strict"]
        print(
            f"ledger-strict (added over plain): commit -> add_request p50 "
            f"{pct(st.commit_to_add, 0.5) - pct(pl.commit_to_add, 0.5):+.3f} ms, p99 "
            f"{pct(st.commit_to_add, 0.99) - pct(pl.commit_to_add, 0.99):+.3f} ms; frontend CPU "
            f"{(st.loop_cpu_s + st.writer_cpu_s - pl.loop_cpu_s - pl.writer_cpu_s) / turns * 1000:+.3f} ms per turn; "
            f"turn p50 paired {statistics.median(a - b for a, b in zip(st.turn_p50, pl.turn_p50)):+.2f} ms; "
            f"steps {statistics.median(steps['ledger-strict'])} "
            f"({(statistics.median(steps['ledger-strict']) / statistics.median(steps['plain']) - 1) * 100:+.1f} %)"
        )


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument(
        "--rounds", type=int, default=6, help="rounds of the three rotated arms (the VM is noisy: more is steadier)"
    )
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="NORMAL")
    parser.add_argument("--flush-interval", type=float, default=0.1, help="EngineConfig.flush_interval_s (s)")
    parser.add_argument("--dtype", default="float32", help="float32 is faster than float16 on CPUs without fp16")
    parser.add_argument(
        "--profile",
        metavar="PATH",
        help="cProfile the loop thread during the ledger arm (its "
        "figures are then inflated: profile in a run of its own), dump to PATH, print top frames",
    )
    parser.add_argument(
        "--strict-arm",
        action="store_true",
        help="a fourth arm, ledger-strict: the engine call "
        "waits for its intent's commit (SessionLog.pipelined = False)",
    )
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="the process's startup heap not frozen after the warm-up (engine_bridge.heap; serve freezes it)",
    )
    args = parser.parse_args()
    asyncio.run(
        main(
            args.model,
            args.rounds,
            args.synchronous,
            args.dtype,
            args.flush_interval,
            args.profile,
            args.strict_arm,
            freeze=not args.no_freeze,
        )
    )
