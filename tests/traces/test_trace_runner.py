"""The trace runner on a scripted FAKE engine (fast; time scaled way down): the bundled
examples run concurrently, leave a clean audit, and each cancel source ends its turn with the
DOMAIN §2.4 reason. The same traces run on live vLLM in test_demo_live.py."""

import json

import pytest

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from projections.shell.runner import project_as_of
from reports import cli_engine
from reports.trace_player import run_trace
from reports.traces import parse_trace, parse_traces
from tests.fakes.fake_port import FakeStagePort

CONFIG = EngineConfig(max_tokens=12, talker_max_tokens=12, flush_interval_s=0.005)
SPEED = 25.0


@pytest.fixture
async def engine(tmp_path):
    ports = [FakeStagePort(0, "thinker", token_delay_s=0.004), FakeStagePort(1, "talker", token_delay_s=0.004)]
    eng = await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/ledger.db", ports, config=CONFIG)
    yield eng
    await eng.aclose()


def reasons(projector, session):
    return [t.finished_reason for t in projector.turn_tables if t.session_id == session]


async def test_bundled_examples_run_clean_with_the_expected_reasons(engine):
    trace = parse_traces(cli_engine.bundled_traces())
    seen = []
    result = await run_trace(engine, trace, speed=SPEED, on_progress=seen.append)
    assert result.problems == []
    assert seen[-1].lines_done == len(trace.lines)
    assert all(s.closed for s in engine.sessions.values())
    p = await project_as_of(engine.store)
    assert p.leaks() == [] and [f for f in p.findings(30.0) if f.severity == "leak"] == []
    assert p.resources.running() == 0 and p.resources.held() == 0
    assert reasons(p, "cafe-order") == ["stop", "stop", "barge_in", "stop", "cancel", "stop"]
    assert reasons(p, "travel-planner") == ["stop", "stop", "stop", "close"]  # disconnect mid-response
    assert reasons(p, "math-tutor") == ["stop", "stop", "cancel", "cancel", "stop"]
    # the listen-only "Mm-hmm." ended a turn with response.listen and printed no table
    assert ("travel-planner", "listen") in result.turn_ends("travel-planner")
    assert len(result.turn_ends("travel-planner")) == len(reasons(p, "travel-planner")) + 1
    # the progress line counts what the README counts: one ended response per turn table, the
    # listen unit apart (it ended no response)
    done = sum(t.finished_reason == "stop" for t in p.turn_tables)
    shown = (len(p.turn_tables), done, len(result.turn_ends()) - len(p.turn_tables))
    assert (seen[-1].responses_ended, seen[-1].responses_done, seen[-1].listens) == shown == (15, 10, 1)
    assert f"responses ended 15 (answered {done}) · kept listening 1" in seen[-1].status()
    actions = {(o.session, o.line_no): o.detail for o in result.outcomes if o.type == "input.commit"}
    assert actions[("cafe-order", 8)] == "DEFER_ACTIVE_RESPONSE"  # the "Uh-huh." over the answer
    assert actions[("travel-planner", 6)] == "START_AUTO_RESPONSE"
    history = await engine.store.read_stream("cafe-order")
    audio = [s.event for s in history if s.event.type == "InputAppended" and s.event.input_kind == "audio"]
    assert audio and all(e.payload_b64 is None and e.digest_sha256 for e in audio)
    assert abs(audio[0].duration_ms - 1600.0) < 1e-6


async def test_refusals_and_no_effect_lines_are_recorded_not_fatal(engine, tmp_path):
    lines = [
        {"t": 0, "session": "x", "type": "session.open"},
        {"t": 0, "session": "x", "type": "response.create"},  # nothing committed
        {"t": 0, "session": "x", "type": "barge_in"},  # nothing running
        {"t": 0, "session": "x", "type": "input.append", "text": "Hello there, how are you?"},
        {"t": 0, "session": "x", "type": "input.commit"},
        {"t": 0, "session": "x", "type": "input.append", "text": "Bye.", "wait": "idle"},
        {"t": 0, "session": "x", "type": "input.commit"},
    ]  # no close: the runner closes after the last answer
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    result = await run_trace(engine, parse_trace(path), speed=SPEED, log_stats=False)
    statuses = [(o.line_no, o.status) for o in result.outcomes]
    assert statuses[:3] == [(1, "ok"), (2, "error"), (3, "no_effect")]
    assert "input_audio_buffer_empty" in result.outcomes[1].detail
    assert result.outcomes[-1].detail == "closed at end of trace"
    p = await project_as_of(engine.store)
    assert reasons(p, "x") == ["stop", "stop"] and p.leaks() == []
    opened = [s.event for s in await engine.store.read_stream("x") if s.event.type == "SessionOpened"]
    assert opened[0].log_stats is False  # the override reached the log


async def test_reopen_gets_a_new_incarnation(engine, tmp_path):
    lines = [
        {"t": 0, "session": "r", "type": "session.open"},
        {"t": 0.1, "session": "r", "type": "disconnect"},
        {"t": 0.2, "session": "r", "type": "session.open", "capabilities": {"resumable": True}},
        {"t": 0.3, "session": "r", "type": "session.close"},
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    result = await run_trace(engine, parse_trace(path), speed=SPEED)
    assert [o.detail for o in result.outcomes if o.type == "session.open"] == ["incarnation 0", "incarnation 1"]
    assert [e.type for e in result.client_events["r"]].count("session.closed") == 2


async def test_speed_must_be_positive(engine):
    with pytest.raises(ValueError):
        await run_trace(engine, parse_traces(cli_engine.bundled_traces()), speed=0)
