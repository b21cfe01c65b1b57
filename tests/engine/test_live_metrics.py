"""issue 16 on LIVE vLLM engines (tiny model): the engine's /metrics, scraped over HTTP, has the
samples ``duplex-ledger metrics`` re-projects from the same log; the drift gauge compares the
log with what vLLM really holds."""

import asyncio
import time
import urllib.request
from pathlib import Path

import pytest

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from reports.cli_metrics import project_metrics
from tests.engine.test_live_engine import first_delta, turn
from tests.metrics.test_metrics_live_offline import assert_same_samples, samples

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

CONFIG = EngineConfig(max_tokens=8, talker_max_tokens=6, ignore_eos=True, flush_interval_s=0.01)


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return samples(response.read().decode())


async def test_live_metrics_equal_the_offline_ones(tmp_path, live_ports):
    url = f"sqlite+aiosqlite:///{tmp_path}/live-metrics.db"
    engine = await SessionEngine.open(url, [live_ports.thinker, live_ports.talker], config=CONFIG)
    async with engine:
        port = engine.metrics.serve(0)
        s = await engine.open_session("live-metrics")
        await turn(s, "Hello there, who are you?")
        await turn(s, "What can you do?")
        await s.append_text("Tell me a very long story about the sea.")
        s.config = EngineConfig(
            max_tokens=900,
            talker_max_tokens=6,
            ignore_eos=True,  # a long answer to interrupt
            flush_interval_s=0.01,
        )
        s.drain_events()  # the earlier turns' deltas
        await s.commit()
        await first_delta(s)
        during = scrape(port)
        assert during[("duplex_ledger:sessions_admitted", ())] == 1
        # running in the log = running on vLLM (the write-ahead submit precedes the engine call
        # by a few ms, so a scrape in between may see +1 for a moment)
        assert during[("duplex_ledger:running_counter_drift", ())] in (0, 1)
        deadline = time.monotonic() + 5
        while engine.metrics.running_counter_drift() != 0:
            assert time.monotonic() < deadline, "the log and vLLM disagree on what runs"
            await asyncio.sleep(0.01)
        assert engine.metrics.fold.running() == 1  # over the sessions' own folds (issue 23)
        assert await s.barge_in()
        await s.close()
        start = time.perf_counter()
        live = scrape(port)
        scrape_ms = (time.perf_counter() - start) * 1000
        folded = engine.metrics.events_applied  # the live folds are not timed (issue 23)
    assert live.pop(("duplex_ledger:running_counter_drift", ())) == 0
    offline = samples((await project_metrics(url)).exposition())
    assert_same_samples(live, offline)
    model = Path(live_ports.thinker.model_dir).name
    reasons = {dict(k[1])["finished_reason"]: v for k, v in live.items() if k[0] == "vllm_omni:requests_success_total"}
    assert reasons == {"stop": 2, "barge_in": 1, "cancel": 0, "close": 0, "abort": 0, "error": 0}
    assert live[("vllm_omni:e2e_request_latency_s_count", (("model_name", model),))] == 3
    # The two answered turns reached the talker; the interrupted one did when the talker's first
    # packet beat the barge-in (a loaded CI machine: 3). Live equals offline either way (above).
    assert live[("vllm_omni:audio_ttfp_s_count", (("model_name", model), ("stage", "1")))] in (2, 3)
    assert live[("duplex_ledger:sessions_closed_total", (("reason", "session_close"),))] == 1
    assert folded > 0
    print(f"\nmetrics: {folded} events counted live; scrape {scrape_ms:.1f} ms")
