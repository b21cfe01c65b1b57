"""Realtime-server benchmark (issue 21): what the ledger costs behind ``/v1/realtime``.

N concurrent WebSocket sessions (``--sessions 8,32,128``) x ``--turns`` text turns each, driven
against two arms served side by side in ONE server process, on the same stage ports:

* **ledger**: the product's app (``realtime.app.build_app``, as ``duplex-ledger serve`` runs
  it) in front of a SessionEngine whose log is a SQLite file;
* **plain**: :mod:`benchmarks.serve_plain`, the same route and GA wire format relaying the same
  ports with no ledger.

The arms run one after the other (rotated round by round), never at once, so the server
process's CPU over an arm's phase is that arm's. **CPU is measured on the server process
only**: the server runs in a child process (this file with ``--serve-child``), the clients
(``websockets``) run here, and the parent reads the child's ``user + system`` CPU with psutil
before and after each phase (children of the server are not counted: with ``--model tiny``
vLLM's engine core is such a child, so the figure is the frontend's, as in
bench_live_overhead.py; with ``--model fake`` the fake ports run inside the server process and
cost the same on both arms).

Per arm and session count it prints: sessions held (clients that got ``session.created``),
client-seen first-delta latency (``response.create`` sent -> first ``response.output_text.delta``
received, perf_counter in the client process) p50/p99, server CPU per turn, the WebSocket
messages (``frames``) and their JSON bytes the clients received per turn (to set what each arm
sends side by side), and events lost; then ledger/plain ratios and the CPU added per turn (ms).
**Events lost** (must be 0): responses with no ``response.done``, responses whose joined
deltas differ from the ``.done`` text, ``error`` events, and (fake ports) deltas short of the
scripted ``max_tokens``; dropped clients' last answers are not counted. **Drops**: 10 % of
the clients (at least one) abort their transport after the first delta of their last turn;
the child then waits until the engine has closed every session and reports the ledger's
audit: ``leaks()`` of the projected log, turn tables not finished, and live request ids on
the ports (all must be empty; "audit clean").

    .venv/bin/python benchmarks/bench_serve.py [--sessions 8,32] [--turns 3] [--rounds 2] [--model fake|tiny] [--quick]

Goals (issue 21): ledger CPU per turn within 1.2x of plain; p99 first delta within +5 ms.
``--quick``: 2 sessions x 1 turn, 1 round (the smoke test's run; not a measurement).
``--no-deflate``: both arms without permessage-deflate, to weigh the compression both pay.
``--no-freeze``: the server's startup heap is not frozen (``duplex-ledger serve`` freezes it
once listening, :mod:`engine_bridge.heap`); the GC column shows what the collector took per turn.
``--profile PATH``: cProfile of the server's loop thread during the ledger arm only
(``--profile-arm plain``: the plain arm's instead, to set the two side by side), and the
profiled arm's function calls per turn, Python and builtin (a figure the machine's load does not move).
``--profile-clock cpu`` times the frames with the loop thread's CPU clock instead of the wall
clock: a wall-clock profile charges the loop's waits for the GIL (while the store's writer
thread runs Python) to the C call that released it (socket ``send``, zlib ``flush``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["What is the capital of France?", "And of Italy?", "Which one is bigger?", "Tell me a fun fact."]
FAKE_MAX_TOKENS = 16
NO_DEFLATE_ENV = "BENCH_SERVE_NO_DEFLATE"  # "1": both arms refuse permessage-deflate (--no-deflate)
NO_FREEZE_ENV = "BENCH_SERVE_NO_FREEZE"  # "1": the server's startup heap is not frozen (--no-freeze)
PROFILE_CLOCK_ENV = "BENCH_SERVE_PROFILE_CLOCK"  # "cpu": --profile times frames by thread CPU (--profile-clock)
RECV_TIMEOUT_S = 60.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


# ---------------------------------------------------------------------------------- server child


def _ports(model: str) -> tuple[list[Any], Any]:
    from engine_bridge.messages import EngineConfig

    if model == "fake":
        from tests.fakes.fake_port import FakeStagePort

        ports = [FakeStagePort(0, "thinker", token_delay_s=0.005), FakeStagePort(1, "talker", token_delay_s=0.002)]
        return ports, EngineConfig(max_tokens=FAKE_MAX_TOKENS, talker_max_tokens=4, ignore_eos=True)
    raise ValueError(model)


async def _start_tiny() -> list[Any]:
    from engine_bridge.vllm_port import VllmStagePort
    from reports.model_prep import resolve_model

    model_dir = resolve_model("tiny")
    thinker = await VllmStagePort.start(model_dir, stage_id=0, name="thinker")
    talker = await VllmStagePort.start(model_dir, stage_id=1, name="talker")
    return [thinker, talker]


def ledger_app(engine: Any) -> Any:
    """The product's app in front of ``engine``: ``realtime.app.build_app``, what
    ``duplex-ledger serve`` runs (the Realtime route and its connection-metrics middleware),
    default options, no auth."""
    from realtime.app import build_app

    return build_app(engine)


async def _serve(app: Any) -> tuple[Any, asyncio.Task[None], int]:
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="off",
            ws="websockets-sansio",  # as realtime/server.py
            ws_per_message_deflate=os.environ.get(NO_DEFLATE_ENV) != "1",
        )
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    return server, task, server.servers[0].sockets[0].getsockname()[1]


async def _settled(engine: Any, timeout_s: float = 30.0) -> None:
    """Until every session the engine opened is closed, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while any(not s.closed for s in engine.sessions.values()) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def _audit(engine: Any, ports: list[Any], timeout_s: float = 30.0) -> dict[str, Any]:
    """Once every session the engine opened is closed (bounded wait): the ledger's audit."""
    from projections.shell.runner import project_as_of

    await _settled(engine, timeout_s)
    still_open = sorted(sid for sid, s in engine.sessions.items() if not s.closed)
    await asyncio.sleep(0.2)  # outputs of the closes reach the log within flush_interval_s
    for s in engine.sessions.values():
        await s.log.flush()
    p = await project_as_of(engine.store)
    reasons: dict[str, int] = {}
    for t in p.turn_tables:
        reasons[str(t.finished_reason)] = reasons.get(str(t.finished_reason), 0) + 1
    live = sorted(rid for port in ports for rid in port.live_request_ids())
    leaks = [str(x) for x in p.leaks()]
    return {
        "sessions": len(engine.sessions),
        "still_open": still_open,
        "leaks": leaks,
        "live_ids": live,
        "turns": len(p.turn_tables),
        "finished_reasons": reasons,
        "clean": not leaks and not live and not still_open,
    }


ANSWER = "bench-serve-answer "  # the child's protocol lines; vLLM logs to the same stdout


_answers: Any = None  # the child's answer stream: the pipe its stdout was, before the redirect


def _answer(fields: dict[str, Any]) -> None:
    _answers.write(ANSWER + json.dumps(fields) + "\n")
    _answers.flush()


def _own_stdout() -> None:
    """Keep the stdout pipe for answers; what else is printed on fd 1 (vLLM's log) goes to
    stderr, so a full pipe the parent is not reading can never block the server."""
    global _answers
    _answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)


_gc_seconds = [0.0, 0.0]  # total, start of the collection running now


def _gc_timer(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_seconds[1] = time.perf_counter()
    else:
        _gc_seconds[0] += time.perf_counter() - _gc_seconds[1]


async def serve_child(model: str, db_path: str, profile_path: str | None = None) -> None:
    """Both arms on one set of ports; prints ``{"plain": port, "ledger": port}``; then answers
    stdin lines ``audit`` (a JSON line), ``profile on`` / ``profile off`` (cProfile of the
    event-loop thread, dumped to ``profile_path`` at the end; answers ``{}``) and ``quit``."""
    import cProfile
    import gc

    gc.callbacks.append(_gc_timer)
    _own_stdout()
    from benchmarks.serve_plain import build_plain_app
    from engine_bridge.engine import SessionEngine
    from engine_bridge.heap import freeze_startup_heap

    if model == "tiny":
        from engine_bridge.messages import EngineConfig

        ports = await _start_tiny()
        config = EngineConfig(max_tokens=16, talker_max_tokens=8, ignore_eos=True)
    else:
        ports, config = _ports(model)
    engine = await SessionEngine.open(f"sqlite+aiosqlite:///{db_path}", ports, config=config)
    plain, plain_task, plain_port = await _serve(build_plain_app(ports, config))
    ledger, ledger_task, ledger_port = await _serve(ledger_app(engine))
    if os.environ.get(NO_FREEZE_ENV) != "1":
        freeze_startup_heap()  # as ``duplex-ledger serve`` does once listening (both arms: one process)
    _answer({"plain": plain_port, "ledger": ledger_port, "max_tokens": config.max_tokens})
    loop = asyncio.get_running_loop()
    # the loop thread's CPU clock (ns) with --profile-clock cpu; else cProfile's wall clock
    cpu_clock = os.environ.get(PROFILE_CLOCK_ENV) == "cpu"
    profile = cProfile.Profile(time.thread_time_ns, 1e-9) if cpu_clock else cProfile.Profile()
    try:
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if line == "audit":
                _answer(await _audit(engine, ports))
            elif line == "settle":  # the arm's sessions closed (bounded), so their closes count to it
                await _settled(engine)
                _answer({})
            elif line == "gc":  # seconds the collector has run so far
                _answer({"gc_s": _gc_seconds[0]})
            elif line in ("profile on", "profile off"):
                profile.enable() if line == "profile on" else profile.disable()
                _answer({})
            else:  # "quit" or EOF
                break
    finally:
        if profile_path:
            profile.dump_stats(profile_path)
        plain.should_exit = ledger.should_exit = True
        await asyncio.gather(plain_task, ledger_task, return_exceptions=True)
        await engine.aclose()
        if model == "tiny":
            for port in ports:
                await port.shutdown()


# ---------------------------------------------------------------------------------- clients


@dataclass
class ArmRun:
    """One arm's phase: what its clients saw and what its server spent."""

    sessions_held: int = 0
    turns: int = 0
    first_delta_ms: list[float] = field(default_factory=list)
    lost: int = 0
    errors: list[str] = field(default_factory=list)
    cpu_s: float = 0.0
    loop_cpu_s: float = 0.0  # of which the server's main (event-loop) thread
    gc_s: float = 0.0  # of which the server's cyclic garbage collector (wall, any thread; perf_counter)
    wall_s: float = 0.0
    frames: int = 0  # WebSocket messages the clients received (every server event, one a message)
    frame_bytes: int = 0  # their JSON text, bytes (before permessage-deflate)


async def _client(
    url: str, session_id: str, turns: int, drop: bool, max_tokens: int | None, run: ArmRun, fake: bool
) -> None:
    from websockets.asyncio.client import connect

    async with connect(f"{url}?model=duplex-ledger&session_id={session_id}", max_size=None) as ws:

        async def recv() -> dict[str, Any]:
            frame = await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S)
            run.frames += 1
            run.frame_bytes += len(frame)
            return json.loads(frame)

        first = await recv()
        if first.get("type") != "session.created":
            run.errors.append(f"{session_id}: first event {first.get('type')}")
            run.lost += 1
            return
        run.sessions_held += 1
        await ws.send(
            json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        )
        for n in range(turns):
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPTS[n % 4]}]}
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            t0 = time.perf_counter()
            await ws.send(json.dumps({"type": "response.create"}))
            deltas: list[str] = []
            done_text: str | None = None
            while True:
                event = await recv()
                kind = event.get("type")
                if kind == "response.output_text.delta":
                    if not deltas:
                        run.first_delta_ms.append((time.perf_counter() - t0) * 1000)
                        if drop and n == turns - 1:
                            ws.transport.abort()  # drop mid-answer, no close frame
                            return
                    deltas.append(event["delta"])
                elif kind == "response.output_text.done":
                    done_text = event["text"]
                elif kind == "error":
                    run.errors.append(f"{session_id}: {event.get('error')}")
                    run.lost += 1
                elif kind == "response.done":
                    break
            run.turns += 1
            if done_text is None or "".join(deltas) != done_text:
                run.lost += 1
            if fake and max_tokens is not None:
                run.lost += max(0, max_tokens - len(deltas))


def _main_thread_cpu_s(proc: Any) -> float:
    """user + system seconds of the process's main thread (its id is the pid, Linux)."""
    return sum(t.user_time + t.system_time for t in proc.threads() if t.id == proc.pid)


async def run_arm(url: str, arm: str, sessions: int, turns: int, child: Child, max_tokens: int, fake: bool) -> ArmRun:
    """One arm's phase: ``sessions`` clients at once; the server's CPU from before the first
    connect until the server has closed every session (the dropped clients' included)."""
    import psutil

    run = ArmRun()
    drops = max(1, math.ceil(sessions * 0.1))
    nonce = secrets.token_hex(3)
    proc = psutil.Process(child.proc.pid)
    g0 = (await asyncio.to_thread(child.ask, "gc"))["gc_s"]
    c0, m0 = proc.cpu_times(), _main_thread_cpu_s(proc)
    t0 = time.perf_counter()
    results = await asyncio.gather(
        *(
            _client(url, f"bench-{arm}-{sessions}-{i}-{nonce}", turns, i >= sessions - drops, max_tokens, run, fake)
            for i in range(sessions)
        ),
        return_exceptions=True,
    )
    run.wall_s = time.perf_counter() - t0
    await asyncio.to_thread(child.ask, "settle")
    c1, m1 = proc.cpu_times(), _main_thread_cpu_s(proc)
    run.cpu_s = (c1.user - c0.user) + (c1.system - c0.system)
    run.loop_cpu_s = m1 - m0
    run.gc_s = (await asyncio.to_thread(child.ask, "gc"))["gc_s"] - g0
    for r in results:
        if isinstance(r, BaseException):
            run.errors.append(repr(r))
            run.lost += 1
    return run


# ---------------------------------------------------------------------------------- driver


class Child:
    """The server child process and its stdin/stdout protocol."""

    def __init__(self, model: str, db_path: Path, profile_path: str | None = None) -> None:
        path = [str(Path(__file__).resolve().parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve-child",
                "--model",
                model,
                "--db",
                str(db_path),
                *(["--profile", profile_path] if profile_path else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.info = self._line()

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"server child exited ({self.proc.wait()})")
            if line.startswith(ANSWER):
                return json.loads(line[len(ANSWER) :])
            sys.stderr.write(line)  # the server's own output (vLLM's log)

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._line()

    def close(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def bench(
    sessions_list: list[int],
    turns: int,
    rounds: int,
    model: str,
    profile_path: str | None = None,
    profile_arm: str = "ledger",
) -> dict[str, Any]:
    """Run the benchmark; returns ``{sessions: {arm: [ArmRun per round], "audit": ...}}``."""
    fake = model == "fake"
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        child = Child(model, Path(tmp) / "ledger.db", profile_path)
        try:
            urls = {arm: f"ws://127.0.0.1:{child.info[arm]}/v1/realtime" for arm in ("plain", "ledger")}
            max_tokens = int(child.info["max_tokens"])
            for n in sessions_list:
                runs: dict[str, list[ArmRun]] = {"plain": [], "ledger": []}
                for r in range(rounds):
                    for arm in ("plain", "ledger") if r % 2 == 0 else ("ledger", "plain"):
                        if profile_path and arm == profile_arm:
                            child.ask("profile on")
                        runs[arm].append(await run_arm(urls[arm], arm, n, turns, child, max_tokens, fake))
                        if profile_path and arm == profile_arm:
                            child.ask("profile off")
                out[str(n)] = {**runs, "audit": child.ask("audit")}
        finally:
            child.close()
    return out


def summarize(n: int, runs: dict[str, Any], turns: int) -> dict[str, Any]:
    """Figures of one session count (the printed row), ratios ledger/plain."""
    s: dict[str, Any] = {"sessions": n}
    for arm in ("plain", "ledger"):
        rs: list[ArmRun] = runs[arm]
        lat = [x for r in rs for x in r.first_delta_ms]
        s[arm] = {
            "held": min(r.sessions_held for r in rs),
            "p50_ms": pct(lat, 0.5),
            "p99_ms": pct(lat, 0.99),
            "cpu_ms_per_turn": sum(r.cpu_s for r in rs) / max(1, sum(r.turns for r in rs)) * 1000,
            "loop_cpu_ms_per_turn": sum(r.loop_cpu_s for r in rs) / max(1, sum(r.turns for r in rs)) * 1000,
            "gc_ms_per_turn": sum(r.gc_s for r in rs) / max(1, sum(r.turns for r in rs)) * 1000,
            "frames_per_turn": sum(r.frames for r in rs) / max(1, sum(r.turns for r in rs)),
            "frame_bytes_per_turn": sum(r.frame_bytes for r in rs) / max(1, sum(r.turns for r in rs)),
            "lost": sum(r.lost for r in rs),
            "errors": [e for r in rs for e in r.errors][:5],
        }
    s["cpu_ratio"] = s["ledger"]["cpu_ms_per_turn"] / max(1e-9, s["plain"]["cpu_ms_per_turn"])
    s["cpu_added_ms_per_turn"] = s["ledger"]["cpu_ms_per_turn"] - s["plain"]["cpu_ms_per_turn"]
    s["p50_added_ms"] = s["ledger"]["p50_ms"] - s["plain"]["p50_ms"]
    s["p99_added_ms"] = s["ledger"]["p99_ms"] - s["plain"]["p99_ms"]
    s["audit"] = runs["audit"]
    return s


def report(results: dict[str, Any], turns: int, rounds: int, model: str) -> list[dict[str, Any]]:
    rows = [summarize(int(n), runs, turns) for n, runs in results.items()]
    print(
        f"workload: {model} ports, {turns} text turns per session, {rounds} round(s) of arms plain/ledger "
        f"rotated, 10 % of clients drop mid-answer on their last turn; server CPU = server process user+sys"
    )
    head = f"{'sessions':>8s} {'arm':>7s} {'held':>5s} {'1st delta p50':>14s} {'p99 (ms)':>9s} {'CPU/turn (ms)':>14s} {'loop thread':>12s} {'GC':>6s} {'frames':>7s} {'bytes':>6s} {'lost':>5s}"
    print(head)
    for s in rows:
        for arm in ("plain", "ledger"):
            a = s[arm]
            print(
                f"{s['sessions']:>8d} {arm:>7s} {a['held']:>5d} {a['p50_ms']:>14.2f} {a['p99_ms']:>9.2f} "
                f"{a['cpu_ms_per_turn']:>14.3f} {a['loop_cpu_ms_per_turn']:>12.3f} {a['gc_ms_per_turn']:>6.3f} "
                f"{a['frames_per_turn']:>7.1f} {a['frame_bytes_per_turn']:>6.0f} {a['lost']:>5d}"
            )
        audit = s["audit"]
        print(
            f"{'':>8s} ledger/plain: CPU per turn x{s['cpu_ratio']:.2f} "
            f"({s['cpu_added_ms_per_turn']:+.3f} ms; goal <= 1.2), first delta "
            f"p50 {s['p50_added_ms']:+.2f} ms, p99 {s['p99_added_ms']:+.2f} ms (goal <= +5); audit after drops: "
            f"{'clean' if audit['clean'] else 'NOT CLEAN'} (turn tables {audit['finished_reasons']}, leaks "
            f"{len(audit['leaks'])}, live ids {len(audit['live_ids'])}, still open {len(audit['still_open'])})"
        )
        for arm in ("plain", "ledger"):
            for e in s[arm]["errors"]:
                print(f"    {arm} error: {e}")
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sessions", default="8,32,128", help="comma-separated session counts")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the two arms, order rotated")
    parser.add_argument("--model", choices=["fake", "tiny"], default="fake")
    parser.add_argument("--quick", action="store_true", help="2 sessions x 1 turn, 1 round (smoke)")
    parser.add_argument(
        "--profile",
        metavar="PATH",
        help="cProfile the server's loop thread during the ledger "
        "arm (figures then inflated: profile in a run of its own), dump to PATH, print the top frames",
    )
    parser.add_argument(
        "--profile-arm", choices=["ledger", "plain"], default="ledger", help="the arm --profile profiles"
    )
    parser.add_argument(
        "--profile-clock",
        choices=["wall", "cpu"],
        default="wall",
        help="--profile's clock: wall (cProfile's default) or the loop thread's CPU time",
    )
    parser.add_argument(
        "--no-deflate",
        action="store_true",
        help="both arms without permessage-deflate (the product, like uvicorn, offers it by default)",
    )
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="the server's startup heap not frozen (engine_bridge.heap; duplex-ledger serve freezes it)",
    )
    parser.add_argument("--serve-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_child:
        asyncio.run(serve_child(args.model, args.db, args.profile))
        return []
    if args.no_deflate:
        os.environ[NO_DEFLATE_ENV] = "1"  # the server child inherits it
    if args.no_freeze:
        os.environ[NO_FREEZE_ENV] = "1"
    if args.profile_clock == "cpu":
        os.environ[PROFILE_CLOCK_ENV] = "cpu"
    sessions = [2] if args.quick else [int(x) for x in args.sessions.split(",")]
    turns, rounds = (1, 1) if args.quick else (args.turns, args.rounds)
    results = asyncio.run(bench(sessions, turns, rounds, args.model, args.profile, args.profile_arm))
    rows = report(results, turns, rounds, args.model)
    if args.profile:
        import pstats

        stats = pstats.Stats(args.profile)
        profiled_turns = sum(r.turns for runs in results.values() for r in runs[args.profile_arm])
        print(
            f"server loop thread, {args.profile_arm} arm ({args.profile_clock} clock): "
            f"{stats.total_calls / max(1, profiled_turns):.0f} function calls (Python and builtin) per turn "
            f"({stats.total_calls} over {profiled_turns} turns); top frames by own time ({args.profile}):"
        )
        stats.sort_stats("tottime").print_stats(25)
    return rows


if __name__ == "__main__":
    main()
