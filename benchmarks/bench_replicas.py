"""Several replicas on one PostgreSQL ledger (issue 14): takeover latency, lease cost, and
append throughput with 3 replica processes against 1.

* **takeover** — ``--repeat`` runs (default 10) of the process scenario of
  tests/engine/replica_harness.py: 3 replicas × 10 sessions with turns in flight, one SIGKILLed
  at a random moment, every check of the test; prints kill → all its sessions closed (s).
  Then one paused replica (SIGSTOP past its lease, SIGCONT): fenced on every session.
* **lease cost** — one replica with the default timing (10 s lease, renewal every 3.3 s, scan
  every 5 s) for ``--lease-seconds``: statements per minute (counted), the row's size and
  the WAL bytes one renewal writes (``pg_current_wal_lsn``).
* **appends/s** — ``--append-seconds`` of 1 process, then 3 processes, each a SessionEngine
  (lease renewal and scans running) whose 16 coroutines append one ~200-byte event per call
  (expected_version checked) to their own streams; total appends/s over all processes.

Usage: ``.venv/bin/python benchmarks/bench_replicas.py [--pg URL] [--repeat 10]``; the URL
(default ``$DUPLEX_LEDGER_TEST_PG_URL``) names a role allowed to create databases: every
part runs in a fresh database, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine_bridge.engine import SessionEngine  # noqa: E402
from engine_bridge.replicas import ReplicaConfig  # noqa: E402
from events.store.migrate import upgrade  # noqa: E402
from events.store.store import EventStore  # noqa: E402
from tests.engine.replica_harness import run_scenario  # noqa: E402


async def fresh_db(base: str) -> tuple[str, str]:
    import asyncpg
    from sqlalchemy.engine import make_url

    url = make_url(base)
    name = f"dl_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(url.set(drivername="postgresql").render_as_string(hide_password=False))
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    out = url.set(database=name).render_as_string(hide_password=False)
    await upgrade(out)
    return out, name


async def drop_db(base: str, name: str) -> None:
    import asyncpg
    from sqlalchemy.engine import make_url

    admin = await asyncpg.connect(make_url(base).set(drivername="postgresql").render_as_string(hide_password=False))
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


async def takeover(base: str, repeat: int) -> None:
    latencies = []
    for seed in range(100, 100 + repeat):
        url, name = await fresh_db(base)
        try:
            out = await run_scenario(url, Path(tempfile.mkdtemp()), n=3, per=10, lease_s=1.0, mode="kill", seed=seed)
        finally:
            await drop_db(base, name)
        latencies.append(out.takeover_s)
        print(
            f"  kill #{seed - 99}: victim {out.victim}, {out.events} events, all checks ok, "
            f"takeover {out.takeover_s:.2f} s",
            flush=True,
        )
    print(
        f"takeover latency, lease 1.0 s (renew/scan 0.25 s), {repeat} random kills: "
        f"min {min(latencies):.2f} median {statistics.median(latencies):.2f} max {max(latencies):.2f} s"
    )
    url, name = await fresh_db(base)
    try:
        out = await run_scenario(url, Path(tempfile.mkdtemp()), n=3, per=10, lease_s=1.0, mode="stop", seed=99)
    finally:
        await drop_db(base, name)
    print(
        f"paused replica: taken over after {out.takeover_s:.2f} s of pause, fenced on {len(out.fenced)} sessions, "
        "0 events from it after the takeovers"
    )


async def lease_cost(base: str, seconds: float) -> None:
    url, name = await fresh_db(base)
    try:
        engine = await SessionEngine.open(url, [], replica=ReplicaConfig(replica_id="cost"))
        async with await EventStore.open(url) as probe:
            backend = probe.recorder.backend

            def wal(conn):  # type: ignore[no-untyped-def]
                import sqlalchemy as sa

                return conn.execute(
                    sa.text("SELECT pg_current_wal_lsn()::text, (SELECT pg_column_size(t.*) FROM replica_leases t)")
                ).one()

            before = dict(engine.replica.stats)
            await asyncio.sleep(seconds)
            after = dict(engine.replica.stats)
            lsn0, row_bytes = await backend.run_read(wal)
            n = 50
            for _ in range(n):
                await engine.replica.renew()
            lsn1, _ = await backend.run_read(wal)

            def lsn(text: str) -> int:
                hi, lo = text.split("/")
                return (int(hi, 16) << 32) + int(lo, 16)

            per_renew = (lsn(lsn1) - lsn(lsn0)) / n
        await engine.aclose()
    finally:
        await drop_db(base, name)
    minutes = seconds / 60
    renewals = (after["renewals"] - before["renewals"]) / minutes
    scans = (after["scans"] - before["scans"]) / minutes
    lifecycle = (after["lifecycle_queries"] - before["lifecycle_queries"]) / minutes
    print(
        f"lease cost per replica (lease 10 s, measured {seconds:.0f} s): {renewals:.1f} renewals/min "
        f"(1 UPDATE…RETURNING each), {scans:.1f} scans/min (2 SELECTs each: db clock + every lease row), "
        f"{lifecycle:.1f} lifecycle queries/min; {renewals + 2 * scans:.0f} statements/min; lease row "
        f"{row_bytes} bytes; one renewal writes ~{per_renew:.0f} bytes of WAL "
        f"(~{per_renew * renewals / 1024:.1f} KiB/min); 0 events in the log"
    )


APPENDER = """
import asyncio, sys, time
from engine_bridge.engine import SessionEngine
from engine_bridge.replicas import ReplicaConfig
from events.types import StageOutput

async def main(url, name, seconds):
    engine = await SessionEngine.open(url, [], replica=ReplicaConfig(replica_id=name))
    store = engine.store
    count = 0
    stop = time.monotonic() + seconds
    async def one(i):
        nonlocal count
        sid, version = f"{name}-{i}", 0
        while time.monotonic() < stop:
            e = StageOutput(session_id=sid, ts=time.time(), stage_id=0, request_id="duplex-s.czE.i.0.e.0.r.stage0_t3",
                            text_delta="x" * 120, num_new_tokens=3)
            await store.append(sid, [e], expected_version=version)
            version += 1
            count += 1
    print("GO", flush=True)
    await asyncio.gather(*(one(i) for i in range(16)))
    await engine.aclose()
    print(count, flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
"""


async def appends(base: str, seconds: float) -> None:
    results = {}
    for n in (1, 3):
        url, name = await fresh_db(base)
        try:
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", APPENDER, url, f"app{i}", str(seconds)],
                    env=env,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for i in range(n)
            ]
            outs = [p.communicate()[0].split() for p in procs]
            total = sum(int(o[-1]) for o in outs)
        finally:
            await drop_db(base, name)
        results[n] = total / seconds
        print(
            f"  {n} replica process(es): {total} appends in {seconds:.0f} s = {total / seconds:.0f} appends/s",
            flush=True,
        )
    print(
        f"appends/s on one PostgreSQL: 3 replicas {results[3]:.0f} vs 1 replica {results[1]:.0f} "
        f"(x{results[3] / results[1]:.2f}); every append takes the log's one advisory lock"
    )


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pg", default=os.environ.get("DUPLEX_LEDGER_TEST_PG_URL"))
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--lease-seconds", type=float, default=30.0)
    ap.add_argument("--append-seconds", type=float, default=10.0)
    ap.add_argument("--only", choices=["takeover", "lease", "appends"])
    args = ap.parse_args()
    if not args.pg:
        sys.exit("give --pg URL or set DUPLEX_LEDGER_TEST_PG_URL")
    if args.only in (None, "takeover"):
        await takeover(args.pg, args.repeat)
    if args.only in (None, "lease"):
        await lease_cost(args.pg, args.lease_seconds)
    if args.only in (None, "appends"):
        await appends(args.pg, args.append_seconds)


if __name__ == "__main__":
    asyncio.run(main())
