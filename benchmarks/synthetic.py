"""Synthetic duplex logs for benchmarks: many sessions, ~30 turns each, both Stage0 id modes,
with barge-ins, listen-only turns and a few leaks. Deterministic for a given seed.

``session_events(i, turns, rng)`` yields ``(ts, type, session_id, payload)`` for one session;
``generate(n_sessions, turns)`` merges all sessions in time order.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from typing import Any

from events import ids

Row = tuple[float, str, str, dict[str, Any]]


def session_events(index: int, turns: int, rng: random.Random, t0: float) -> Iterator[Row]:
    sid = f"bench-{index:05d}"
    resident = index % 2 == 1
    leaky = index % 97 == 0
    never_closed = index % 211 == 0
    incarnation, epoch = 0, 0
    t = t0
    caps = {"supports_core_resumable_request": resident}
    yield (t, "SessionOpened", sid, {"capabilities": caps, "auto_response": False, "num_stages": 2})

    def rid_for(turn: int) -> str:
        return (
            ids.mint_resident(sid, incarnation, epoch)
            if resident
            else ids.mint_ephemeral(sid, incarnation, epoch, turn)
        )

    bound: set[str] = set()
    stale: str | None = None
    for turn in range(turns):
        rid = rid_for(turn)
        fence = {"incarnation": incarnation, "epoch": epoch, "turn_id": turn}
        for _ in range(3):
            t += 0.2
            yield (
                t,
                "InputAppended",
                sid,
                {"size_bytes": 6400, "duration_ms": 200.0, "audio_format": "pcm16", "sample_rate_hz": 16000},
            )
        listen_only = turn % 10 == 7
        barge = turn % 10 == 4
        response_id = f"resp-{sid}-{epoch}-{turn:08x}"
        t += 0.05
        yield (
            t,
            "TurnCommitted",
            sid,
            {"turn_id": turn, "create_response": not listen_only, "response_id": None if listen_only else response_id},
        )
        if stale is not None:  # listen-only turn left its ephemeral id: stale-id rebind (R1)
            yield (t, "TurnCompleted", sid, {"completed_turn_id": turn - 1, "new_turn_id": turn, "cause": "mechanical"})
            yield (t, "StageRequestReleased", sid, {"stage_id": 0, "request_id": stale, "cause": "stale_rebind"})
            yield (t, "AbortRequested", sid, {"request_ids": [stale], "reason": "stale_rebind"})
            for stage in (0, 1):
                yield (t, "AbortResult", sid, {"request_ids": [stale], "stage_id": stage, "outcome": "ok"})
            bound.discard(stale)
            stale = None
        if rid not in bound:
            yield (t, "StageRequestReserved", sid, {"stage_id": 0, "request_id": rid, "fence": fence})
        yield (t, "ActiveRequestBound", sid, {"request_id": rid})
        kind = "update" if rid in bound else "initial"
        t += 0.01
        yield (
            t,
            "StageRequestSubmitted",
            sid,
            {
                "stage_id": 0,
                "request_id": rid,
                "fence": fence,
                "kind": kind,
                "resumable": resident,
                "num_tokens_in": 40 + turn,
            },
        )
        bound.add(rid)
        if listen_only:
            t += 0.1
            yield (t, "StageOutput", sid, {"stage_id": 0, "request_id": rid, "num_new_tokens": 1})
            yield (t, "ResponseListened", sid, {"turn_id": turn, "request_id": rid})
            stale = None if resident else rid
            continue
        yield (t, "ResponseBegun", sid, {"response_id": response_id, "turn_id": turn, "request_id": rid})
        n_out = 8
        for k in range(n_out):
            t += 0.03 + rng.random() * 0.01
            yield (t, "StageOutput", sid, {"stage_id": 0, "request_id": rid, "num_new_tokens": 1})
            if k == 2:
                yield (t, "StageRequestForwarded", sid, {"stage_id": 1, "request_id": rid, "fence": fence})
                yield (
                    t,
                    "TransferTx",
                    sid,
                    {"from_stage": 0, "to_stage": 1, "request_id": rid, "size_bytes": 4096, "tx_time_ms": 0.4},
                )
            if barge and k == 4:
                break
        if barge:
            t += 0.01
            yield (
                t,
                "CancelRequested",
                sid,
                {"source": "barge_in", "wire_reason": "barge_in", "response_id": response_id},
            )
            yield (t, "AbortRequested", sid, {"request_ids": [rid], "reason": "barge_in"})
            yield (t, "TurnFinalized", sid, {"response_id": response_id, "finished_reason": "barge_in"})
            for stage in (0, 1):
                yield (t + 0.001, "AbortResult", sid, {"request_ids": [rid], "stage_id": stage, "outcome": "ok"})
            yield (t, "EpochAdvanced", sid, {"old_epoch": epoch, "new_epoch": epoch + 1})
            epoch += 1
            bound.discard(rid)
            continue
        for _ in range(4):
            t += 0.04
            yield (t, "StageOutput", sid, {"stage_id": 1, "request_id": rid, "audio_frames": 1920})
        stats0 = {
            "num_tokens_in": 40 + turn,
            "num_tokens_out": n_out,
            "stage_gen_time_ms": 250.0,
            "vllm_ttft_ms": 40.0,
            "vllm_tpot_ms": 30.0,
        }
        yield (
            t,
            "StageMetricsReported",
            sid,
            {"stage_id": 0, "request_id": rid, "stats": stats0, "stage_submit_ts": t - 0.4},
        )
        stats1 = {
            "num_tokens_in": n_out,
            "num_tokens_out": 40,
            "stage_gen_time_ms": 160.0,
            "audio_generated_frames": 7680,
            "audio_sample_rate": 24000,
            "audio_duration_s": 0.32,
            "rx_transfer_bytes": 4096,
            "rx_decode_time_ms": 0.2,
            "rx_in_flight_time_ms": 0.1,
        }
        yield (
            t,
            "StageMetricsReported",
            sid,
            {"stage_id": 1, "request_id": rid, "stats": stats1, "stage_submit_ts": t - 0.3},
        )
        t += 0.01
        yield (t, "StageOutput", sid, {"stage_id": 1, "request_id": rid, "model_turn_id": turn, "end_of_turn": True})
        yield (t, "ResponseEnded", sid, {"response_id": response_id, "status": "completed", "cause": "model"})
        yield (t, "TurnCompleted", sid, {"completed_turn_id": turn, "new_turn_id": turn + 1, "cause": "model"})
        if not resident:
            for stage in (0, 1):
                yield (t, "StageRequestFinished", sid, {"stage_id": stage, "request_id": rid})
            if not (leaky and turn % 3 == 0):
                for stage in (0, 1):
                    yield (
                        t,
                        "StageRequestReleased",
                        sid,
                        {"stage_id": stage, "request_id": rid, "cause": "end_of_turn"},
                    )
                yield (t, "ReleaseRequested", sid, {"request_ids": [rid]})
                yield (t + 0.001, "ReleaseResult", sid, {"request_ids": [rid], "outcome": "ok"})
                bound.discard(rid)
        yield (t, "TurnFinalized", sid, {"response_id": response_id, "finished_reason": "stop"})
    if never_closed:
        return
    t += 0.5
    yield (t, "SessionClosed", sid, {"reason": "session_close"})
    for rid in sorted(bound):
        yield (t, "AbortRequested", sid, {"request_ids": [rid], "reason": "session_close"})
        for stage in (0, 1):
            yield (t + 0.001, "AbortResult", sid, {"request_ids": [rid], "stage_id": stage, "outcome": "ok"})


def generate(n_sessions: int, turns: int, seed: int = 7) -> Iterator[Row]:
    """All sessions merged in ts order (sessions start staggered over the first minutes)."""
    rng = random.Random(seed)
    streams = [
        session_events(i, turns, random.Random(rng.random()), 1_757_000_000.0 + i * 0.37) for i in range(n_sessions)
    ]
    return heapq.merge(*streams, key=lambda row: row[0])
