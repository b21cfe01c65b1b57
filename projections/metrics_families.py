"""The metric families the log determines (issue 16, issue 22): names, kinds, label names,
buckets and help text, as :data:`FAMILIES`; what each sample means is documented in
:mod:`projections.metrics`. Declarations only: no state, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FamilyKind = Literal["counter", "gauge", "histogram"]

E2E_BUCKETS_S: tuple[float, ...] = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
"""vLLM's ``vllm:e2e_request_latency_seconds`` buckets (s)."""
TTFP_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
"""vLLM's time-to-first-token buckets (s), used for time to first audio packet."""
TTFT_BUCKETS_S: tuple[float, ...] = TTFP_BUCKETS_S
"""vLLM's ``vllm:time_to_first_token_seconds`` buckets (s)."""
ITL_BUCKETS_S: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
"""vLLM's ``vllm:inter_token_latency_seconds`` / ``request_time_per_output_token_seconds``
buckets (s)."""
SESSION_DURATION_BUCKETS_S: tuple[float, ...] = (
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
    86400.0,
)
SESSION_TURNS_BUCKETS: tuple[float, ...] = (0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0, 89.0, 144.0)
UNKNOWN_MODEL = "unknown"
"""``model_name`` of a session whose ``SessionOpened`` names no model."""


@dataclass(frozen=True)
class Family:
    """One metric family: the exposed name (counters end in ``_total``), its kind, label names,
    buckets (histograms) and help text."""

    name: str
    kind: FamilyKind
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    help: str = ""


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "vllm_omni:requests_success_total",
            "counter",
            ("model_name", "finished_reason"),
            help="Finalized duplex turns (one per response_id) by finished reason (DOMAIN §2.4).",
        ),
        Family(
            "vllm_omni:e2e_request_latency_s",
            "histogram",
            ("model_name",),
            E2E_BUCKETS_S,
            help="Turn arrival to finalize, seconds, wall clock; every reason except abort.",
        ),
        Family(
            "vllm_omni:prompt_tokens_total", "counter", ("model_name",), help="Stage0 prompt tokens of finalized turns."
        ),
        Family(
            "vllm_omni:generation_tokens_total",
            "counter",
            ("model_name",),
            help="Output tokens of every stage of finalized turns.",
        ),
        Family(
            "vllm_omni:audio_ttfp_s",
            "histogram",
            ("model_name", "stage"),
            TTFP_BUCKETS_S,
            help="Turn arrival to the turn's first audio output, seconds, server wall clock; one per turn.",
        ),
        Family(
            "vllm_omni:time_to_first_token_s",
            "histogram",
            ("model_name",),
            TTFT_BUCKETS_S,
            help="Stage0 vllm_ttft_ms of each turn table, seconds (vLLM's time_to_first_token).",
        ),
        Family(
            "vllm_omni:request_time_per_output_token_s",
            "histogram",
            ("model_name",),
            ITL_BUCKETS_S,
            help="Stage0 vllm_tpot_ms (> 0) of each turn table, seconds (vLLM's request TPOT).",
        ),
        Family(
            "vllm_omni:inter_token_latency_s",
            "histogram",
            ("model_name",),
            ITL_BUCKETS_S,
            help="Each Stage0 vllm_itls_ms entry of each turn table, seconds.",
        ),
        Family(
            "vllm_omni:num_requests_running",
            "gauge",
            ("model_name",),
            help="Engine ids the log says run and that gave an output since their latest submit/forward.",
        ),
        Family(
            "vllm_omni:num_requests_waiting",
            "gauge",
            ("model_name",),
            help="Engine ids the log says run that gave no output yet since their latest submit/forward.",
        ),
        Family(
            "duplex_ledger:listen_units_total",
            "counter",
            help="Listen-only units (ResponseListened): the model kept listening.",
        ),
        Family(
            "duplex_ledger:listen_only_turns_total",
            "counter",
            help="Turns that listened and ended without beginning a response.",
        ),
        Family("duplex_ledger:sessions_admitted", "gauge", help="Sessions opened and not closed."),
        Family(
            "duplex_ledger:sessions_cleanup_pending",
            "gauge",
            help="Closed sessions whose request ids are still held (close cleanup pending or failed).",
        ),
        Family("duplex_ledger:request_ids_leaked", "gauge", help="Distinct request ids with a leak finding (audit)."),
        Family("duplex_ledger:abort_failures_total", "counter", ("stage",), help="Failed aborts, one per pool call."),
        Family(
            "duplex_ledger:session_duration_s",
            "histogram",
            (),
            SESSION_DURATION_BUCKETS_S,
            help="SessionOpened to SessionClosed, seconds, wall clock.",
        ),
        Family(
            "duplex_ledger:session_turns",
            "histogram",
            (),
            SESSION_TURNS_BUCKETS,
            help="Turn tables (finalized responses) per closed session.",
        ),
        Family(
            "duplex_ledger:sessions_closed_total",
            "counter",
            ("reason",),
            help="Closed sessions that hold nothing any more, by close reason.",
        ),
        Family(
            "duplex_ledger:running_counter_drift",
            "gauge",
            help="Request ids the log says are running minus the ids the engines hold (live only).",
        ),
    )
}
OFFLINE_FAMILIES: tuple[str, ...] = tuple(n for n in FAMILIES if n != "duplex_ledger:running_counter_drift")
"""Families the log alone determines (everything but the engine-side drift)."""
