"""Pure mapping from what a stage port reported for one segment to the ledger's metric shapes.

One *segment* is one ordinary request (ephemeral Stage0 turn, Stage1 forward) or one unit of
a resident stream (between two ``segment_done`` chunks). :func:`stage_stats_from_outputs`
turns the port's copies (``EngineMetrics``, ``FinishedStats``) and the caller's wall-clock
stamps into an :class:`events.stats.StageRequestStats` plus the ``EngineStamp`` s that a
``StageMetricsReported`` event carries. No engine, no I/O, no vllm import.

Clock rules (CASE-08): a duration is only ever the difference of two stamps of one clock.
Wall clock: ``submit_wall_s``, the receipt stamps (``StageChunk.received_ts``) and
``EngineMetrics.arrival_time_wall_s``; engine monotonic: every ``EngineMetrics.*_mono_s``.
vLLM's own durations (``first_token_latency_s``, every ``FinishedStats`` field) are already
single-clock differences and are used as they are.

Decisions (documented here, relied on by the session engine):

* ``vllm_ttft_ms`` is anchored on *this segment's* submit.
  Ordinary request: vLLM's ``first_token_latency_s`` (frontend wall clock, from the request's
  arrival = our submit) when reported; else wall ``first_output − submit``.
  Resident segment: always wall ``first_output − submit`` (vLLM resets ``arrival_time`` per
  streaming chunk to when it *accepted* the chunk, which can be later than our submit when the
  port gated the segment; the ledger's TTFT starts at the submit, CASE-10).
* ``vllm_tpot_ms``: ``FinishedStats.mean_time_per_output_token_s`` when present; else
  ``(last_token_mono − first_token_mono) / (n − 1)`` for ``n ≥ 2`` segment tokens (vLLM resets
  ``first_token_ts`` per resident segment, so this is per segment); else None.
* ``vllm_itls_ms``: per-token gaps from the receipt stamps of the token-carrying chunks
  (wall clock). vLLM reports no per-request inter-token list, and DELTA outputs merge when the
  consumer lags, so a chunk carrying ``k`` tokens after a gap ``d`` contributes ``k`` entries of
  ``d / k``: the list has ``n − 1`` entries summing to ``last − first`` receipt.
  ``vllm_itl_ms`` is their mean. Both None without receipts.
* ``stage_gen_time_ms``: ``FinishedStats.inference_time_s`` (scheduled → last token) when
  present; else for an ordinary request ``last_token_mono − scheduled_mono``; for a resident
  segment (vLLM keeps only the first ``scheduled_ts`` of the request) wall
  ``last_output − submit``.
* Engine stamps: ``engine_first_token_ts`` / ``engine_last_token_ts`` are the monotonic
  first/last token stamps; ``engine_submit_ts`` is the monotonic ``queued`` stamp for an
  ordinary request and None for a resident segment (not per segment in vLLM 0.32). All three
  are clock ``engine_monotonic``, never mixed with wall.
* Audio (talker stage, when ``frames_per_token`` and ``sample_rate`` are given):
  ``audio_generated_frames = n × frames_per_token``, ``audio_duration_s = frames / sample_rate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from engine_bridge.ports import EngineMetrics, FinishedStats
from events.stats import EngineStamp, StageRequestStats
from projections.intervals import gen_ms, span_ms, tpot_ms, ttft_ms

__all__ = ["SegmentMetrics", "itls_from_receipts", "stage_stats_from_outputs"]

MONO: Final = "engine_monotonic"


@dataclass(frozen=True, slots=True)
class SegmentMetrics:
    """What a ``StageMetricsReported`` event needs for one segment.

    ``stage_submit_ts`` is wall clock (s); the three stamps are ``engine_monotonic`` or None."""

    stats: StageRequestStats
    stage_submit_ts: float | None
    engine_submit_ts: EngineStamp | None
    engine_first_token_ts: EngineStamp | None
    engine_last_token_ts: EngineStamp | None


def itls_from_receipts(receipts: Sequence[tuple[float, int]]) -> list[float] | None:
    """Per-token inter-token latencies (ms) from ``(received_wall_s, num_new_tokens)`` pairs of
    one segment, in receipt order. Chunks without tokens are ignored; a gap before a chunk of
    ``k`` tokens is split into ``k`` equal entries. None when fewer than one token arrived."""
    pts = [(t, k) for t, k in receipts if k > 0]
    if not pts:
        return None
    out: list[float] = [0.0] * (pts[0][1] - 1)  # tokens merged into the first chunk: no gap seen
    for (t0, _), (t1, k) in zip(pts, pts[1:]):
        d = max(t1 - t0, 0.0) * 1000.0 / k
        out.extend([d] * k)
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def stage_stats_from_outputs(
    *,
    num_prompt_tokens: int | None,
    num_output_tokens: int,
    metrics: EngineMetrics | None,
    finished: FinishedStats | None,
    submit_wall_s: float | None,
    first_output_wall_s: float | None,
    last_output_wall_s: float | None,
    receipts: Sequence[tuple[float, int]] = (),
    resident: bool = False,
    finish_reason: str | None = None,
    frames_per_token: int | None = None,
    sample_rate: int | None = None,
) -> SegmentMetrics:
    """Build one segment's :class:`SegmentMetrics` (see the module docstring for the rules).

    Args:
        num_prompt_tokens: tokens of this segment's input (ordinary: the prompt; resident: the
            segment's own input tokens), or None.
        num_output_tokens: tokens the port delivered for this segment.
        metrics: the last ``EngineMetrics`` copy received for the segment (None: stats off).
        finished: the engine's ``FinishedStats`` for the request (ordinary finished requests
            only; None for aborted and resident ones).
        submit_wall_s / first_output_wall_s / last_output_wall_s: wall clock (s): the submit
            of this segment and the receipts of its first and last token-carrying chunk.
        receipts: ``(received_ts, len(new_token_ids))`` per chunk of the segment, for ITLs.
        resident: the segment is one unit of a resident (streaming) request.
        finish_reason: ``stop`` / ``length`` / ``abort`` / None.
        frames_per_token, sample_rate: talker audio mapping (Hz); both or neither.
    """
    n = num_output_tokens
    m = metrics

    ttft: float | None = None
    if not resident and m is not None and m.first_token_latency_s is not None and n > 0:
        ttft = _ms(m.first_token_latency_s)
    else:
        ttft = ttft_ms(submit_wall_s, first_output_wall_s)

    tpot: float | None = None
    if finished is not None:
        tpot = _ms(finished.mean_time_per_output_token_s)
    elif m is not None:
        tpot = tpot_ms(m.first_token_mono_s, m.last_token_mono_s, n)

    gen: float | None = None
    if finished is not None:
        gen = _ms(finished.inference_time_s)
    elif not resident and m is not None and m.scheduled_mono_s is not None and m.last_token_mono_s is not None:
        gen = span_ms(m.scheduled_mono_s, m.last_token_mono_s)
    else:
        gen = gen_ms(submit_wall_s, last_output_wall_s)

    itls = itls_from_receipts(receipts) if receipts else None
    itl = (sum(itls) / len(itls)) if itls else None

    frames = duration = None
    if frames_per_token is not None and sample_rate:
        frames = n * frames_per_token
        duration = frames / sample_rate

    stats = StageRequestStats(
        num_tokens_in=num_prompt_tokens,
        num_tokens_out=n,
        stage_gen_time_ms=gen,
        finish_reason=finish_reason,
        vllm_ttft_ms=ttft,
        vllm_tpot_ms=tpot,
        vllm_itl_ms=itl,
        vllm_itls_ms=itls,
        audio_generated_frames=frames,
        audio_sample_rate=sample_rate if frames is not None else None,
        audio_duration_s=duration,
    )

    def stamp(v: float | None) -> EngineStamp | None:
        return None if v is None else EngineStamp(clock=MONO, s=v)

    return SegmentMetrics(
        stats=stats,
        stage_submit_ts=submit_wall_s,
        engine_submit_ts=None if (resident or m is None) else stamp(m.queued_mono_s),
        engine_first_token_ts=stamp(m.first_token_mono_s) if m is not None else None,
        engine_last_token_ts=stamp(m.last_token_mono_s) if m is not None else None,
    )
