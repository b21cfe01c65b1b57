"""Stage statistics snapshot carried by ``StageMetricsReported`` (DOMAIN §5.1).

One :class:`StageRequestStats` is one stage segment as vLLM-Omni 0.30.0 ``metrics/stats.py``
defines it. Units live in the names: ``_ms`` milliseconds, ``_s`` seconds, ``_bytes`` bytes,
``audio_sample_rate`` Hz; token counts are ints. Every field is optional so a producer sends
what it has; ``None`` means "not reported" (never a zero sentinel, CASE-03).

:class:`EngineStamp` tags an engine timestamp with its clock domain, so a duration is only ever
computed from two stamps of one clock (CASE-08; vLLM ``RequestStateStats`` mixes a wall-clock
``arrival_time`` with monotonic ``first_token_ts`` etc.).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from events.limits import LimitedModel, LimitedRecord

ClockDomain = Literal["wall", "engine_monotonic"]


class EngineStamp(LimitedModel):
    """A timestamp in seconds (finite: DOMAIN §5.7 D12), with the clock it was read from."""

    clock: ClockDomain
    s: float


class StageRequestStats(LimitedRecord):
    """One stage segment snapshot (DOMAIN §5.1 field catalogue). Numbers are finite and ints
    fit in 64 bits, ``extra`` included (DOMAIN §5.7 D12)."""

    batch_id: int | None = None
    batch_size: int | None = None
    num_tokens_in: int | None = None
    num_tokens_out: int | None = None
    stage_gen_time_ms: float | None = None
    rx_transfer_bytes: int | None = None
    rx_decode_time_ms: float | None = None
    rx_in_flight_time_ms: float | None = None
    stage_stats: dict[str, float] | None = None
    replica_id: int | None = None
    final_output_type: str | None = None
    finish_reason: str | None = None
    postprocess_time_ms: float | None = None
    diffusion_metrics: dict[str, float] | None = None
    audio_generated_frames: int | None = None
    audio_sample_rate: int | None = None
    audio_duration_s: float | None = None
    image_pixels: int | None = None
    num_inference_steps: int | None = None
    denoise_step_latency_ms: float | None = None
    pipeline_timings: dict[str, float] | None = None
    output_unit_type: str | None = None
    output_unit_count: int | None = None
    serving_time_to_first_output_ms: float | None = None
    image_time_to_first_output_ms: float | None = None
    time_per_output_unit_ms: float | None = None
    inter_output_latency_ms: float | None = None
    inter_output_latencies_ms: list[float] | None = None
    vllm_ttft_ms: float | None = None
    vllm_tpot_ms: float | None = None
    vllm_itl_ms: float | None = None
    vllm_itls_ms: list[float] | None = None
    # Merged keys with no row field (DOMAIN §5.4: `audio_frames` maps to
    # `audio_generated_frames`; anything else is dropped and logged at debug, M3).
    extra: dict[str, Any] = Field(default_factory=dict)


STAT_FIELDS: tuple[str, ...] = tuple(f for f in StageRequestStats.model_fields if f != "extra")
