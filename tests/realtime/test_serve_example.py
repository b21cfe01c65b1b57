"""The README's Realtime client (examples/realtime_client.py) runs as written against
``serve``'s app, on the scripted FAKE engine (answers of 300 fake tokens, so the third is
cancelled mid-answer): a text turn, an audio turn, a cancelled answer — and the ledger says
the same (per-turn reasons, clean audit)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine_bridge.messages import EngineConfig
from realtime.app import build_app
from tests.realtime.conftest import fake_engine
from tests.realtime.ledger import settled_ledger
from tests.realtime.test_serve_app import KEY, Served

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "realtime_client.py"
CONFIG = EngineConfig(max_tokens=300, talker_max_tokens=4, flush_interval_s=0.005)


def load_example():
    spec = importlib.util.spec_from_file_location("realtime_client", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_example_client_talks_to_serve(tmp_path):
    example = load_example()
    engine = await fake_engine(tmp_path, CONFIG)
    try:
        app = build_app(engine, api_key=KEY)
        async with Served(app) as srv:
            results = await example.converse(srv.client(KEY), session_id="rt-example")
            assert [r["status"] for r in results] == ["incomplete", "incomplete", "cancelled"]  # 300 tokens: length
            assert all(r["id"].startswith("resp-rt-example-") for r in results)
            assert results[0]["text"] and results[0]["audio_bytes"] == 0
            assert results[1]["text"] and results[1]["audio_bytes"] > 0 and results[1]["audio_bytes"] % 960 == 0
            reasons = await settled_ledger(app.state.realtime, "rt-example")
        assert reasons == ["stop", "stop", "cancel"]
        history = [s.event for s in await engine.store.read_stream("rt-example")]
        (opened,) = [e for e in history if e.type == "SessionOpened"]
        assert opened.protocol == "realtime" and opened.connection_id
        (audio,) = [e for e in history if e.type == "InputAppended" and e.input_kind == "audio"]
        assert (audio.sample_rate_hz, audio.duration_ms) == (24_000, 1000.0)
    finally:
        await engine.aclose()
