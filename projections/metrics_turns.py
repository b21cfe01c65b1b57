"""Per-turn observations of :class:`~projections.metrics.MetricsFold` (issue 16, issue 22): what
one finalized turn table adds to the ``vllm_omni:`` families (finished reason, e2e latency,
tokens, time to first audio, vLLM's TTFT/TPOT/ITL charts) and to its session's
:class:`~projections.metrics_rollup.SessionTally`, plus the audio outputs a later turn's first
audio is read from. The meaning of each sample is in :mod:`projections.metrics`. Pure: no I/O.

Clocks: every duration is two event ``ts`` of one wall clock (the server's), on integer
microseconds (``projections.intervals.span_ms``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from events.types import FINISHED_REASONS, StageOutput
from projections.intervals import span_ms
from projections.metrics_rollup import SessionTally
from projections.metrics_sinks import MetricsSink
from projections.turn_tables import TurnTables

_LATENCY_HISTOGRAMS = (
    "vllm_omni:e2e_request_latency_s",
    "vllm_omni:time_to_first_token_s",
    "vllm_omni:request_time_per_output_token_s",
    "vllm_omni:inter_token_latency_s",
)
"""The per-model histograms whose children exist from the model's first session on."""


def is_audio_output(stage_id: int, num_new_tokens: int, audio_frames: int) -> bool:
    """An output that carries audio: frames reported, or tokens of a stage ≥ 1 (the talker's
    tokens stand for codec frames)."""
    return audio_frames > 0 or (stage_id >= 1 and num_new_tokens > 0)


class TurnObservations:
    """The per-turn families of one :class:`MetricsSink`: :meth:`declare_model` makes a model's
    children exist, :meth:`segment` / :meth:`output` keep the audio outputs a turn's time to
    first audio is read from, :meth:`count` observes one finalized turn table."""

    __slots__ = ("sink",)

    def __init__(self, sink: MetricsSink) -> None:
        self.sink = sink

    def declare_model(self, model: str) -> None:
        """A model's success reasons (all six, so ``rate()`` works), token counters and latency
        histograms exist (zero) from its first session on."""
        sink = self.sink
        for reason in FINISHED_REASONS:
            sink.inc("vllm_omni:requests_success_total", (model, reason), 0)
        for name in ("vllm_omni:prompt_tokens_total", "vllm_omni:generation_tokens_total"):
            sink.inc(name, (model,), 0)
        for name in _LATENCY_HISTOGRAMS:
            sink.declare(name, (model,))

    @staticmethod
    def segment(s: SessionTally, request_id: str, stage_id: int) -> None:
        """A submit/forward of (``request_id``, ``stage_id``): its first audio output is awaited."""
        s.audio_open.add((request_id, stage_id))

    @staticmethod
    def output(s: SessionTally, e: StageOutput) -> None:
        """Keep ``e`` (ts, stage) when it is the first audio output of its segment."""
        key = (e.request_id, e.stage_id)
        if key in s.audio_open and is_audio_output(e.stage_id, e.num_new_tokens, e.audio_frames):
            s.audio_open.discard(key)
            s.audio_first.setdefault(e.request_id, []).append((e.ts, e.stage_id))

    def count(self, s: SessionTally, t: TurnTables) -> None:
        """Observe turn table ``t`` of session ``s`` once per ``response_id``: success reason,
        e2e latency (every reason except abort), tokens, Stage0 latencies and time to first audio."""
        if t.response_id in s.counted_responses:
            return  # a response finalized twice counts once
        s.counted_responses.add(t.response_id)
        sink = self.sink
        model = s.model_name
        s.reasons[t.finished_reason] += 1
        sink.inc("vllm_omni:requests_success_total", (model, t.finished_reason), 1)
        if t.finished_reason != "abort":
            sink.observe("vllm_omni:e2e_request_latency_s", (model,), t.e2e["e2e_total_ms"] / 1000.0)
        stage0 = t.stages.get(0, {})
        sink.inc("vllm_omni:prompt_tokens_total", (model,), stage0.get("num_tokens_in") or 0)
        sink.inc(
            "vllm_omni:generation_tokens_total",
            (model,),
            sum(row.get("num_tokens_out") or 0 for row in t.stages.values()),
        )
        self._latencies(model, stage0)
        if stage0.get("vllm_ttft_ms") is not None:
            s.ttft_ms.append(stage0["vllm_ttft_ms"])
        if (stage0.get("vllm_tpot_ms") or 0) > 0:
            s.tpot_ms.append(stage0["vllm_tpot_ms"])
        first = first_audio(s, t)
        if first is not None:
            ts, stage = first
            ttfp_ms = max(span_ms(t.arrival_ts, ts), 0.0)  # D17 (inside [arrival, finalize] already)
            s.ttfp_ms.append(ttfp_ms)
            sink.observe("vllm_omni:audio_ttfp_s", (model, str(stage)), ttfp_ms / 1000.0)

    def _latencies(self, model: str, stage0: Mapping[str, Any]) -> None:
        """TTFT, request TPOT and ITLs of one turn table's Stage0 row (the figures its
        ``[DuplexSessionSummary]`` and ``--log-stats`` tables print), in seconds."""
        ttft_ms = stage0.get("vllm_ttft_ms")
        if ttft_ms is not None:
            self.sink.observe("vllm_omni:time_to_first_token_s", (model,), ttft_ms / 1000.0)
        tpot_ms = stage0.get("vllm_tpot_ms") or 0
        if tpot_ms > 0:
            self.sink.observe("vllm_omni:request_time_per_output_token_s", (model,), tpot_ms / 1000.0)
        for itl_ms in stage0.get("vllm_itls_ms") or ():
            self.sink.observe("vllm_omni:inter_token_latency_s", (model,), itl_ms / 1000.0)


def first_audio(s: SessionTally, t: TurnTables) -> tuple[float, int] | None:
    """The turn's first audio output (ts, stage) inside [arrival, finalize]; the id's outputs up
    to the finalize (in log order) are then forgotten (a resident id serves later turns)."""
    if t.request_id is None:  # ended before any engine request (D8): no audio
        return None
    outputs = s.audio_first.get(t.request_id)
    if not outputs:
        return None
    inside = [o for o in outputs if t.arrival_ts <= o[0] <= t.finalize_ts]
    # Every output recorded so far came before the finalize in the log, whatever its ts says
    # (a clock stepped back, D17): none of them may lend a later turn its first audio.
    del s.audio_first[t.request_id]
    return min(inside) if inside else None
