"""Collects what one stage segment delivered and turns it into a ``StageMetricsReported``
payload via :func:`engine_bridge.metrics_map.stage_stats_from_outputs`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine_bridge.metrics_map import stage_stats_from_outputs
from engine_bridge.ports import EngineMetrics, FinishedStats, StageChunk
from events.stats import StageRequestStats


@dataclass
class SegmentRecorder:
    """One segment: ``submit_ts`` wall clock (s); chunks added as received."""

    stage_id: int
    submit_ts: float
    num_prompt_tokens: int | None = None
    resident: bool = False
    frames_per_token: int | None = None
    sample_rate_hz: int | None = None
    rx_bytes: int | None = None
    tokens: int = 0
    first_output_ts: float | None = None
    last_output_ts: float | None = None
    metrics: EngineMetrics | None = None
    finish_reason: str | None = None
    receipts: list[tuple[float, int]] = field(default_factory=list)

    def add(self, chunk: StageChunk) -> None:
        n = len(chunk.new_token_ids)
        self.receipts.append((chunk.received_ts, n))
        if n:
            self.tokens += n
            if self.first_output_ts is None:
                self.first_output_ts = chunk.received_ts
            self.last_output_ts = chunk.received_ts
        if chunk.metrics is not None:
            self.metrics = chunk.metrics
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason

    def stats(self, finished: FinishedStats | None) -> tuple[StageRequestStats, dict[str, Any]]:
        """(stats, engine-stamp fields for StageMetricsReported)."""
        seg = stage_stats_from_outputs(
            num_prompt_tokens=self.num_prompt_tokens,
            num_output_tokens=self.tokens,
            metrics=self.metrics,
            finished=finished,
            submit_wall_s=self.submit_ts,
            first_output_wall_s=self.first_output_ts,
            last_output_wall_s=self.last_output_ts,
            receipts=self.receipts,
            resident=self.resident,
            finish_reason=self.finish_reason,
            frames_per_token=self.frames_per_token,
            sample_rate=self.sample_rate_hz,
        )
        stats = seg.stats
        if self.rx_bytes is not None:
            stats = stats.model_copy(update={"rx_transfer_bytes": self.rx_bytes})
        stamps = {
            "engine_submit_ts": seg.engine_submit_ts,
            "engine_first_token_ts": seg.engine_first_token_ts,
            "engine_last_token_ts": seg.engine_last_token_ts,
        }
        return stats, stamps
