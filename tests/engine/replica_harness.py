"""Runs replicas as child processes (:mod:`tests.engine.replica_worker`) and checks, on the
log, what a killed or paused replica left (issue 14). Used by tests/engine/test_replica_processes.py
and benchmarks/bench_replicas.py.

A scenario: ``n`` replicas, ``per`` sessions each with turns in flight; one replica (chosen
at random) is SIGKILLed — or SIGSTOPped past its lease and SIGCONTed — at a random moment.
:func:`run_scenario` returns the measured takeover latency and raises AssertionError when:

* a session of the victim is not closed (``recovered_after_crash``) by a live replica within
  the deadline, or has no ``SessionTakenOver`` naming the victim, or the victim's session
  holds ids afterwards;
* any event of a live replica's session was written by another replica (foreign event), or a
  live replica's session was taken over;
* any event of a taken-over session after its ``SessionTakenOver`` was written by the victim
  (fencing);
* the audit finds a leak, or its ``session_taken_over`` warnings name anything but exactly the
  victim's sessions (and the victim as their replica).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from events.store.owners import session_lifecycles
from events.store.store import EventStore
from projections.shell.runner import project_as_of

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Worker:
    replica_id: str
    sessions: list[str]
    ids_file: Path
    proc: subprocess.Popen[str]
    summary: dict = field(default_factory=dict)  # type: ignore[type-arg]


def spawn(
    url: str,
    replica_id: str,
    sessions: list[str],
    ids_file: Path,
    *,
    lease_s: float,
    seed: int,
    scan_s: float | None = None,
    renew_s: float | None = None,
) -> Worker:
    # PostgreSQL ends a paused replica's open transaction (and its append lock) after a lease.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DUPLEX_LEDGER_PG_IDLE_TX_TIMEOUT_MS": str(round(lease_s * 1000))}
    cmd = [
        sys.executable,
        "-m",
        "tests.engine.replica_worker",
        url,
        replica_id,
        ",".join(sessions),
        str(ids_file),
        "--lease",
        str(lease_s),
        "--seed",
        str(seed),
    ]
    if scan_s is not None:
        cmd += ["--scan", str(scan_s)]
    if renew_s is not None:
        cmd += ["--renew", str(renew_s)]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    return Worker(replica_id, sessions, ids_file, proc)


async def wait_ready(worker: Worker, timeout_s: float = 60.0) -> None:
    line = await asyncio.wait_for(asyncio.to_thread(worker.proc.stdout.readline), timeout_s)  # type: ignore[union-attr]
    if line.strip() != "READY":
        raise AssertionError(f"{worker.replica_id} did not start: {line!r} {worker.proc.stderr.read()[-600:]}")  # type: ignore[union-attr]


async def stop(worker: Worker, timeout_s: float = 60.0) -> dict:  # type: ignore[type-arg]
    out, err = await asyncio.to_thread(worker.proc.communicate, "STOP\n", timeout_s)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if worker.proc.returncode != 0 or not lines:
        raise AssertionError(f"{worker.replica_id} exited {worker.proc.returncode}: {err[-3000:]}")
    worker.summary = json.loads(lines[-1])
    return worker.summary


def writers(workers: list[Worker]) -> dict[str, str]:
    """event_id -> the replica that (tried to) append it."""
    out: dict[str, str] = {}
    for w in workers:
        if w.ids_file.exists():
            for line in w.ids_file.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2:
                    out[parts[1]] = w.replica_id
    return out


async def not_taken_over(store: EventStore, sessions: list[str]) -> list[str]:
    """Those of ``sessions`` whose takeover the log does not yet show done: still open, or
    closed but holding an engine id (the takeover's cleanup is written after its
    ``SessionClosed``; a replica stopped in between leaves it to ``recover``)."""
    lives = await session_lifecycles(store, stream_ids=sessions)
    still = [sid for sid in sessions if sid not in lives or lives[sid].open]
    if still:
        return still
    projector = await project_as_of(store)
    held = {sid: projector.session_resources(sid) for sid in sessions}
    return [sid for sid, state in held.items() if state is not None and state.bindings]


async def wait_taken_over(url: str, sessions: list[str], deadline_s: float) -> float:
    """Seconds until :func:`not_taken_over` is empty for ``sessions`` (AssertionError naming
    them past ``deadline_s``)."""
    start = time.monotonic()
    async with await EventStore.open(url) as store:
        while still := await not_taken_over(store, sessions):
            if time.monotonic() - start > deadline_s:
                raise AssertionError(f"not taken over within {deadline_s} s: {still}")
            await asyncio.sleep(0.02)
        return time.monotonic() - start


@dataclass
class Outcome:
    victim: str
    takeover_s: float  # kill (or the end of the lease, paused) -> every victim session closed and settled
    fenced: dict  # type: ignore[type-arg]
    events: int
    summaries: list[dict]  # type: ignore[type-arg]


async def run_scenario(
    url: str,
    tmp: Path,
    *,
    n: int = 3,
    per: int = 10,
    lease_s: float = 1.0,
    mode: str = "kill",
    seed: int = 0,
    deadline_s: float | None = None,
) -> Outcome:
    """One scenario (see the module doc). ``mode``: ``kill`` (SIGKILL) or ``stop`` (SIGSTOP
    for 2 leases, checked taken over, then SIGCONT)."""
    rng = random.Random(seed)
    tag = f"r{seed}"
    workers = []
    for i in range(n):
        sessions = [f"{tag}-{i}-s{j}" for j in range(per)]
        workers.append(
            spawn(
                url,
                f"{tag}-replica{i}",
                sessions,
                tmp / f"{tag}-ids{i}.txt",
                lease_s=lease_s,
                seed=seed * 10 + i,
                scan_s=lease_s / 4,
                renew_s=lease_s / 4,
            )
        )
    victim = workers[rng.randrange(n)]
    live = [w for w in workers if w is not victim]
    try:
        await asyncio.gather(*(wait_ready(w) for w in workers))
        await asyncio.sleep(rng.uniform(0.1, 1.0))  # a random moment, turns in flight
        deadline = deadline_s if deadline_s is not None else lease_s * 2 + 3.0
        if mode == "kill":
            victim.proc.send_signal(signal.SIGKILL)
            takeover = await wait_taken_over(url, victim.sessions, deadline)
            victim.proc.wait()
        else:
            victim.proc.send_signal(signal.SIGSTOP)
            takeover = await wait_taken_over(url, victim.sessions, deadline)
            victim.proc.send_signal(signal.SIGCONT)
            await asyncio.sleep(lease_s)  # the paused replica resumes: its writes must be refused
        summaries = [await stop(w) for w in live]
        if mode == "stop":
            summaries.append(await stop(victim))
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
                w.proc.kill()
                w.proc.wait()
    events = await check_log(url, workers, victim, live)
    fenced = victim.summary.get("fenced", {}) if mode == "stop" else {}
    if mode == "stop":
        assert set(fenced) == set(victim.sessions), f"paused replica not fenced on every session: {fenced}"
        errors = victim.summary["client_errors"]
        assert all("session_taken_over" in errors[sid] for sid in victim.sessions), errors
    return Outcome(victim.replica_id, takeover, fenced, events, summaries)


async def check_log(url: str, workers: list[Worker], victim: Worker, live: list[Worker]) -> int:
    by = writers(workers)
    async with await EventStore.open(url) as store:
        projector = await project_as_of(store)
        streams: dict[str, list] = {}  # type: ignore[type-arg]
        count = 0
        async for stored in store.read_all():
            streams.setdefault(stored.stream_id, []).append(stored)
            count += 1
    live_ids = {w.replica_id for w in live}
    for w in live:
        for sid in w.sessions:
            history = streams[sid]
            foreign = [
                (s.version, s.event.type, by.get(str(s.event.event_id)))
                for s in history
                if by.get(str(s.event.event_id)) != w.replica_id
            ]
            assert not foreign, f"{sid} of live {w.replica_id} got foreign events: {foreign[:5]}"
            assert not [s for s in history if s.event.type == "SessionTakenOver"], sid
    for sid in victim.sessions:
        history = streams[sid]
        cut = [i for i, s in enumerate(history) if s.event.type == "SessionTakenOver"]
        assert len(cut) == 1, f"{sid}: {len(cut)} takeovers"
        taken = history[cut[0]].event
        assert taken.previous_replica_id == victim.replica_id and taken.replica_id in live_ids, taken
        assert history[cut[0] + 1].event.type == "SessionClosed"
        assert history[cut[0] + 1].event.reason == "recovered_after_crash"
        late = [
            (s.version, s.event.type) for s in history[cut[0] :] if by.get(str(s.event.event_id)) != taken.replica_id
        ]
        assert not late, f"{sid}: events after the takeover not written by the taker: {late[:5]}"
        state = projector.resources.sessions.get(sid)
        assert state is None or not state.bindings, f"{sid} still holds {list(state.bindings)}"
    findings = projector.findings()
    leaks = [f for f in findings if f.severity == "leak"]
    assert leaks == [], [(f.kind, f.session_id, f.request_id, f.detail) for f in leaks[:5]]
    taken_over = sorted(f.session_id for f in findings if f.kind == "session_taken_over")
    assert taken_over == sorted(victim.sessions), taken_over
    return count
