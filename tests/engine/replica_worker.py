"""One engine replica as a child process, for the multi-replica tests and benchmark (issue 14).

    python -m tests.engine.replica_worker URL REPLICA_ID SESSION[,SESSION…] IDS_FILE [options]

Runs a :class:`SessionEngine` on two scripted FAKE stage ports (no vllm), opens its sessions
and keeps a turn in flight on each (append, commit, a random wait, now and then a barge-in)
until a line ``STOP`` (or EOF) arrives on stdin; then it closes the engine and prints one JSON
summary line. Before each append to the store it writes ``<stream> <event_id>`` per event to
IDS_FILE (flushed), so a test can tell which replica wrote every event of the log — also
for a replica killed or paused midway. Prints ``READY`` once every session is open.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig, SessionError
from engine_bridge.replicas import ReplicaConfig
from tests.fakes.fake_port import FakeStagePort


def _record_appends(engine: SessionEngine, path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    append = engine.store.append

    async def recording(stream_id, events, expected_version=None):  # type: ignore[no-untyped-def]
        os.write(fd, "".join(f"{stream_id} {e.event_id}\n" for e in events).encode())
        return await append(stream_id, events, expected_version=expected_version)

    engine.store.append = recording  # type: ignore[method-assign]


async def _drive(session, stop: asyncio.Event, rng: random.Random, fenced: dict[str, str]) -> int:  # type: ignore[no-untyped-def]
    turns = 0
    while not stop.is_set():
        try:
            await session.append_text(f"question {turns} from {session.session_id}")
            await session.commit()
            turns += 1
            await asyncio.sleep(rng.uniform(0.02, 0.25))
            if rng.random() < 0.2:
                await session.barge_in()
            else:
                await session.wait_idle(30)
        except SessionError as exc:
            if exc.code == "session_taken_over":
                fenced[session.session_id] = str(exc)
                return turns
        except Exception as exc:  # noqa: BLE001 - report, never hang the test
            fenced.setdefault(session.session_id, f"{type(exc).__name__}: {exc}")
            return turns
    return turns


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("replica_id")
    ap.add_argument("sessions")
    ap.add_argument("ids_file")
    ap.add_argument("--lease", type=float, default=1.0)
    ap.add_argument("--renew", type=float, default=None)
    ap.add_argument("--scan", type=float, default=None)
    ap.add_argument("--token-delay", type=float, default=0.01)
    ap.add_argument("--probe", action="store_true", help="probe local processes (default off: leases only)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ports = [
        FakeStagePort(0, "thinker", token_delay_s=args.token_delay),
        FakeStagePort(1, "talker", token_delay_s=args.token_delay),
    ]
    config = EngineConfig(max_tokens=30, talker_max_tokens=4, flush_interval_s=0.02)
    replica = ReplicaConfig(
        replica_id=args.replica_id,
        lease_s=args.lease,
        renew_every_s=args.renew,
        scan_every_s=args.scan,
        probe_local_processes=args.probe,
    )
    engine = await SessionEngine.open(args.url, ports, config=config, replica=replica)
    _record_appends(engine, args.ids_file)
    sessions = [await engine.open_session(sid) for sid in args.sessions.split(",") if sid]
    print("READY", flush=True)
    stop = asyncio.Event()
    fenced: dict[str, str] = {}
    rng = random.Random(args.seed)
    drivers = [asyncio.create_task(_drive(s, stop, rng, fenced)) for s in sessions]
    await asyncio.to_thread(sys.stdin.readline)
    stop.set()
    turns = await asyncio.gather(*drivers)
    client_errors = {
        s.session_id: [e.data.get("code") for e in s.drain_events() if e.type == "error"] for s in sessions
    }
    stats = dict(engine.replica.stats)
    taken = [sid for report in engine.replica.reports for sid in report.closed_sessions]
    await engine.aclose()
    for port in ports:
        await port.shutdown()
    print(
        json.dumps(
            {
                "replica": args.replica_id,
                "turns": sum(turns),
                "fenced": fenced,
                "taken_over": taken,
                "client_errors": client_errors,
                "stats": stats,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main())
