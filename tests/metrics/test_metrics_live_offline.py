"""issue 16: the live engine's /metrics and the offline ``duplex-ledger metrics`` give the same
samples for the same log (scripted fake engine; the live-vLLM twin is in
tests/engine/test_live_metrics.py)."""

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from reports import cli_engine
from reports.cli import app
from reports.cli_metrics import project_metrics
from reports.trace_player import run_trace
from reports.traces import parse_traces
from tests.fakes.fake_port import FakeStagePort

CONFIG = EngineConfig(max_tokens=12, talker_max_tokens=12, flush_interval_s=0.005)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def assert_same_samples(live: dict, offline: dict) -> None:
    """Every sample equal; histogram ``_sum`` s to float rounding (sessions interleave in a
    different order live than in the log, and float addition is not associative)."""
    assert live.keys() == offline.keys()
    for key, value in live.items():
        if key[0].endswith("_sum"):
            assert offline[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
        else:
            assert offline[key] == value, key


async def test_live_exposition_equals_the_offline_one(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}/ledger.db"
    ports = [FakeStagePort(0, "thinker", token_delay_s=0.004), FakeStagePort(1, "talker", token_delay_s=0.004)]
    engine = await SessionEngine.open(url, ports, config=CONFIG)
    async with engine:
        port = engine.metrics.serve(0)
        result = await run_trace(engine, parse_traces(cli_engine.bundled_traces()), speed=25.0)
        assert result.problems == []
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            scraped = response.read().decode()
    live = samples(scraped)
    drift = live.pop(("duplex_ledger:running_counter_drift", ()))
    assert drift == 0.0  # nothing running in the log, nothing held by the fake engines
    offline = samples((await project_metrics(url)).exposition())
    assert_same_samples(live, offline)
    # what the bundled traces did (tests/traces/test_trace_runner.py lists the reasons)
    reasons = {dict(k[1])["finished_reason"]: v for k, v in live.items() if k[0] == "vllm_omni:requests_success_total"}
    assert reasons == {"stop": 10, "barge_in": 1, "cancel": 3, "close": 1, "abort": 0, "error": 0}
    assert live[("vllm_omni:e2e_request_latency_s_count", (("model_name", "thinker"),))] == 15
    thinker = (("model_name", "thinker"),)
    assert live[("vllm_omni:time_to_first_token_s_count", thinker)] > 0  # issue 22: the vLLM-style families
    assert live[("vllm_omni:inter_token_latency_s_count", thinker)] > 0
    assert live[("vllm_omni:num_requests_running", thinker)] == live[("vllm_omni:num_requests_waiting", thinker)] == 0
    assert live[("duplex_ledger:listen_units_total", ())] == 1
    assert live[("duplex_ledger:sessions_closed_total", (("reason", "session_close"),))] == 2
    assert live[("duplex_ledger:sessions_closed_total", (("reason", "disconnect"),))] == 1
    assert live[("duplex_ledger:sessions_admitted", ())] == 0
    assert live[("duplex_ledger:request_ids_leaked", ())] == 0
    ttfp = sum(v for k, v in live.items() if k[0] == "vllm_omni:audio_ttfp_s_count")
    assert 1 <= ttfp <= 15


def test_metrics_command_prints_the_exposition_as_of_a_position(tmp_path):
    from tests.cases.logbook import LOG_DIR

    url = f"sqlite+aiosqlite:///{tmp_path}/ledger.db"
    runner = CliRunner()
    assert runner.invoke(app, ["events", "import", str(LOG_DIR / "case-09-barge-in.jsonl"), "--db", url]).exit_code == 0
    full = runner.invoke(app, ["metrics", "--db", url])
    assert full.exit_code == 0, full.output
    got = samples(full.output)
    assert got[("vllm_omni:requests_success_total", (("finished_reason", "barge_in"), ("model_name", "unknown")))] >= 1
    early = runner.invoke(app, ["metrics", "--db", url, "--until-position", "1"])
    assert early.exit_code == 0
    assert (
        "vllm_omni:requests_success_total",
        (("finished_reason", "barge_in"), ("model_name", "unknown")),
    ) not in samples(early.output)
    missing = runner.invoke(app, ["metrics", "--db", f"sqlite+aiosqlite:///{tmp_path}/nope.db"])
    assert missing.exit_code == 2
