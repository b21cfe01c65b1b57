"""Stage1 (the talker) of a turn: Stage0's text forwarded under the same id, write-ahead
(``Forward`` then the gated call), its outputs recorded and sent as audio deltas, its stats and
finish recorded with the turn's other held results."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from decider import Forward
from engine_bridge.client_feed import ClientFeed
from engine_bridge.messages import EngineConfig
from engine_bridge.outputs import OutputCoalescer
from engine_bridge.ports import StageChunk, StagePort
from engine_bridge.segments import SegmentRecorder
from engine_bridge.session_log import SessionLog
from engine_bridge.turn_run import TurnRun, generation_params
from events.types import StageMetricsReported, StageRequestFinished, TransferTx


async def talk(
    turn: TurnRun,
    *,
    port1: StagePort,
    config: EngineConfig,
    log: SessionLog,
    feed: ClientFeed,
    run: Callable[[Any, TurnRun | None], Awaitable[Any]],
) -> None:
    """Forward Stage0's text to Stage1 under the same id (key (1, X)); its tokens stand for
    audio codec frames. ``run``: decide a command of the turn and execute its steps."""
    sid = log.session_id
    text = turn.answer()
    payload_bytes = len(text.encode())
    n_text_tokens = max(1, port1.count_tokens(text) if text else 1)
    budget = max(1, min(config.talker_max_tokens, round(n_text_tokens * config.talker_tokens_per_text_token)))
    if turn.cancelled:
        raise asyncio.CancelledError  # a cancel won the race: nothing is forwarded for a cancelled turn
    tx_start = time.perf_counter()
    forwarded_ts = time.time()
    await run(Forward(forwarded_ts, turn.ref), turn)
    stream = log.gated(port1.generate(turn.request_id, text or " ", generation_params(config, budget, stage_id=1)))
    tx_ms = (time.perf_counter() - tx_start) * 1000.0
    log.emit_held(
        TransferTx(
            session_id=sid,
            ts=time.time(),
            from_stage=0,
            to_stage=1,
            request_id=turn.request_id,
            size_bytes=payload_bytes,
            tx_time_ms=tx_ms,
        )
    )
    recorder = SegmentRecorder(
        stage_id=1,
        submit_ts=forwarded_ts,
        num_prompt_tokens=n_text_tokens,
        frames_per_token=config.frames_per_talker_token,
        sample_rate_hz=config.audio_sample_rate_hz,
        rx_bytes=payload_bytes,
    )
    last: StageChunk | None = None
    turn.outputs = OutputCoalescer(
        log,
        1,
        turn.request_id,
        window_s=config.flush_interval_s,
        frames_per_token=config.frames_per_talker_token,
    )
    async for chunk in stream:  # one engine step's output per item: a batch of one
        if turn.cancelled:
            continue
        recorder.add(chunk)
        turn.outputs.add(chunk)
        frames = len(chunk.new_token_ids) * config.frames_per_talker_token
        if frames:
            turn.stage1_tokens_out += len(chunk.new_token_ids)
            feed.send_batch(
                "response.audio.delta",
                (
                    {
                        "response_id": turn.ref.response_id,
                        "frames": frames,
                        "sample_rate_hz": config.audio_sample_rate_hz,
                    },
                ),
            )
        last = chunk
    turn.outputs.flush()
    if turn.cancelled or (last is not None and last.finish_reason == "abort"):
        raise asyncio.CancelledError
    stats, stamps = recorder.stats(port1.pop_finished_stats(turn.request_id))
    now = time.time()
    log.emit_held(
        StageMetricsReported(
            session_id=sid,
            ts=now,
            stage_id=1,
            request_id=turn.request_id,
            stats=stats,
            stage_submit_ts=forwarded_ts,
            **stamps,
        ),
        StageRequestFinished(
            session_id=sid,
            ts=now,
            stage_id=1,
            request_id=turn.request_id,
            finish_reason=last.finish_reason if last else None,
            model_turn_id=turn.ref.turn_id,
            end_of_turn=True,
        ),
    )
