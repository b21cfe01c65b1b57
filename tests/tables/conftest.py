"""Shared inputs for the turn-table tests: the DOMAIN §5.6 worked example."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from events.stats import StageRequestStats
from projections.turn_tables import TurnTables, build_turn_tables

ENGINE_ID = "duplex-s.czE.i.0.e.0.r.stage0_t3"
RESPONSE_ID = "resp-s1-0-9f2c41aa"
GOLDEN_COPY = Path(__file__).parent / "golden" / "worked-example.txt"


def worked_example_kwargs() -> dict[str, Any]:
    """build_turn_tables inputs of DOMAIN §5.6 (rows a, b, c)."""
    a = StageRequestStats(
        num_tokens_in=120,
        num_tokens_out=5,
        stage_gen_time_ms=180,
        vllm_ttft_ms=95,
        vllm_tpot_ms=24,
        vllm_itls_ms=[30, 22, 22, 22],
        serving_time_to_first_output_ms=1.757e12,
    )
    b = StageRequestStats(
        num_tokens_in=14,
        num_tokens_out=150,
        stage_gen_time_ms=650,
        audio_generated_frames=48000,
        audio_sample_rate=24000,
        audio_duration_s=2.0,
        rx_transfer_bytes=65536,
        rx_decode_time_ms=1.5,
        rx_in_flight_time_ms=0.5,
    )
    c = StageRequestStats(
        num_tokens_in=16,
        num_tokens_out=9,
        stage_gen_time_ms=200,
        vllm_ttft_ms=40,
        vllm_tpot_ms=18,
        vllm_itls_ms=[20] * 6 + [15, 15],
    )
    return dict(
        session_id="s1",
        response_id=RESPONSE_ID,
        request_id=ENGINE_ID,
        turn_id=3,
        finished_reason="stop",
        arrival_ts=1000.000,
        finalize_ts=1001.700,
        segments={0: [a, c], 1: [b]},
        stage_first_ts={0: 1000.050, 1: 1000.420},
        stage_last_ts={0: 1001.300, 1: 1001.600},
        # session TX 1.0 ms / 4096 B at begin, 4.0 ms / 69632 B at finalize
        tx_delta={(0, 1): (4.0 - 1.0, 69632 - 4096, False)},
        edge_order=[(0, 1)],
    )


@pytest.fixture
def worked() -> TurnTables:
    return build_turn_tables(**worked_example_kwargs())
