"""The read path (each row's payload JSON decoded into its struct) and the write path (the
struct handed on from each validated model, ``events.structs.struct_of``) give equal events and
the same fold answers, on every event kind (issue 10: a valid snapshot once crashed ``tables``
on the read path only; issue 23 step 1: one shape for both)."""

from __future__ import annotations

import random
from pathlib import Path

from events.records import StoredEvent
from events.types import EVENT_CLASSES
from projections.projector import Projector
from tests.cases.field_support import read_jsonl
from tests.histories import as_read_back, generate
from tests.logbuilder import LogBuilder, eph

LOG_DIRS = [Path(__file__).parents[1] / "cases" / "logs", Path(__file__).parents[1] / "cases" / "field"]


def every_other_kind() -> list[StoredEvent]:
    """The kinds the case logs and generated histories rarely carry."""
    x = eph("k", 0)
    b = LogBuilder()
    b.add("SessionOpened", "k", 1.0, protocol="realtime", connection_id="c1")
    b.add("InputAppended", "k", 1.02, input_kind="text", text="dropped")
    b.add("InputCleared", "k", 1.05, dropped_chunks=1)
    b.add("CommandRejected", "k", 1.1, command="commit", error_code="input_audio_buffer_empty", message="empty")
    b.add("StageRequestSubmitted", "k", 1.2, stage_id=0, request_id=x)
    b.add("TransferTx", "k", 1.3, from_stage=0, to_stage=1, request_id=x, size_bytes=10, tx_time_ms=1.5)
    b.add("StageRequestReleased", "k", 1.4, stage_id=0, request_id=x)
    b.add("AbortRequested", "k", 1.5, request_ids=[x])
    b.add("AbortResult", "k", 1.6, request_ids=[x], stage_id=0, outcome="failed", error="boom")
    b.add("StageRequestRestored", "k", 1.7, stage_id=0, request_id=x)
    b.add("StageRequestLost", "k", 1.8, stage_id=0, request_id=x)
    b.add(
        "StageMetricsReported",
        "k",
        1.9,
        stage_id=0,
        request_id=x,
        stats={"num_tokens_out": 2},
        engine_submit_ts={"clock": "engine_monotonic", "s": 5.0},
        engine_first_token_ts={"clock": "wall", "s": 1.9},
    )  # mixed clocks: flagged, ignored
    b.add(
        "SessionTakenOver",
        "k",
        1.95,
        replica_id="B",
        replica_incarnation=1,
        previous_replica_id="A",
        previous_incarnation=0,
    )
    b.add("SessionClosed", "k", 2.0, reason="recovered_after_crash")
    return b.stored


def state_of(p: Projector) -> tuple:
    return (
        [t.to_dict() for t in p.turn_tables],
        p.findings(),
        p.resources.request_resources(),
        p.resources.running(),
        p.resources.held(),
    )


def test_every_log_folds_the_same_on_both_paths():
    logs = [read_jsonl(path) for d in LOG_DIRS for path in sorted(d.glob("*.jsonl"))]
    logs += [generate(random.Random(seed), 2).log.stored for seed in range(40)]
    logs.append(every_other_kind())
    kinds = set()
    for stored in logs:
        kinds |= {s.event.type for s in stored}
        assert state_of(Projector().apply_all(stored)) == state_of(Projector().apply_all(as_read_back(stored)))
    assert kinds == set(EVENT_CLASSES), set(EVENT_CLASSES) - kinds
