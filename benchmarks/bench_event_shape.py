"""One runtime shape per event (issue 23 step 1): CPU µs per event of the read path and of the
live hand-off, in one process (CPU time, best of ``--repeats``; ratios in one run).

    .venv/bin/python benchmarks/bench_event_shape.py [--sessions 40] [--turns 30] [--repeats 5]

* ``decode``: stored rows -> StoredEvents with each event's struct (``decode_rows``, what every
  reader runs), against pydantic validation of the same rows (``validate_row_json``, the door's
  model: what a reader paid for a model before);
* ``hand-off``: ``struct_of`` of each validated model (what the live session log hands its fold);
* ``live apply``: ``SessionLog._apply`` per event (hand-off + the live fold), no store I/O.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from benchmarks.synthetic import generate
    from engine_bridge.session_log import SessionLog
    from events.records import validate_row_json
    from events.store.rows import NewRow, StoredRow, decode_rows
    from events.structs import struct_of
    from events.types import parse_event

    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    events = [
        parse_event({"type": t, "session_id": sid, "ts": ts, "event_id": uuid.UUID(int=i + 1), **payload})
        for i, (ts, t, sid, payload) in enumerate(generate(args.sessions, args.turns))
    ]
    rows, versions = [], {}
    for position, event in enumerate(events, start=1):
        r = NewRow.checked(event)
        versions[r.stream_id] = versions.get(r.stream_id, 0) + 1
        v = versions[r.stream_id]
        rows.append(StoredRow(position, r.stream_id, v, r.event_id, r.type, r.schema_version, r.ts_us, r.ts_us, r.data))
    n = len(rows)

    def best(fn: Callable[[], Any]) -> float:
        out = []
        for _ in range(args.repeats):
            start = time.process_time()
            fn()
            out.append(time.process_time() - start)
        return min(out) / n * 1e6

    def live() -> None:
        logs: dict[str, SessionLog] = {}
        for event in events:
            log = logs.get(event.session_id)
            if log is None:
                log = logs[event.session_id] = SessionLog(None, event.session_id, 0)  # type: ignore[arg-type]
            log._apply((event,))

    decode = best(lambda: decode_rows(rows))
    validate = best(
        lambda: [validate_row_json(r.type, r.schema_version, r.stream_id, r.event_id, r.ts_us, r.data) for r in rows]
    )
    hand_off = best(lambda: [struct_of(e) for e in events])
    apply = best(live)
    print(f"{n} events, CPU µs per event (best of {args.repeats})")
    print(f"decode rows -> structs (every reader)      {decode:6.2f}")
    print(f"validate rows -> models (reference)        {validate:6.2f}   ratio {validate / decode:4.1f}x")
    print(f"hand-off struct_of(model) (live)           {hand_off:6.2f}")
    print(f"SessionLog._apply (hand-off + live fold)   {apply:6.2f}")


if __name__ == "__main__":
    main()
