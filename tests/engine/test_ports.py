"""StagePort contract, run against the FakeStagePort and a live VllmStagePort (tiny model),
plus pure tests of engine_bridge.metrics_map and the import boundary."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import pytest

from engine_bridge.metrics_map import itls_from_receipts, stage_stats_from_outputs
from engine_bridge.ports import (
    AbortFailed,
    EngineMetrics,
    FinishedStats,
    GenerationParams,
    PromptTooLong,
    StageChunk,
    StagePort,
    StagePortError,
    StreamSegment,
)
from tests.fakes.fake_port import FakeStagePort
from tests.fakes.faults import FlakyAbortPort

#: async tests run in the session loop: the live engines live there (tests/engine/fixtures.py)
session_loop = pytest.mark.asyncio(loop_scope="session")

TIMEOUT = 60.0
PROMPT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(params=["fake", pytest.param("vllm", marks=pytest.mark.vllm)])
def port(request):
    if request.param == "fake":
        return FakeStagePort(stage_id=0, name="fake-thinker", token_delay_s=0.002)
    return request.getfixturevalue("live_ports").thinker


def rid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def exact(n: int) -> GenerationParams:
    return GenerationParams(max_tokens=n, ignore_eos=True, temperature=0.0)


async def drain(it) -> list[StageChunk]:
    return [c async for c in it]


async def run_with_timeout(coro):
    return await asyncio.wait_for(coro, TIMEOUT)


def ntok(chunks) -> int:
    return sum(len(c.new_token_ids) for c in chunks)


async def wait_not_live(port, request_id: str) -> None:
    for _ in range(200):
        if request_id not in port.live_request_ids():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{request_id} still live: {port.live_request_ids()}")


# --------------------------------------------------------------------------- contract


@session_loop
async def test_protocol_and_tokens(port):
    assert isinstance(port, StagePort)
    n = port.count_tokens(PROMPT)
    assert n > 0
    chat = port.chat_prompt([{"role": "user", "content": "hello"}])
    assert "hello" in chat


@session_loop
async def test_generate_exact_tokens_and_finished_stats(port):
    r = rid("gen")
    chunks = await run_with_timeout(drain(port.generate(r, PROMPT, exact(12))))
    assert ntok(chunks) == 12
    assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
    last = chunks[-1]
    assert last.segment_done and last.finish_reason == "length"
    assert all(c.request_id == r and c.stage_id == port.stage_id for c in chunks)
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert last.num_prompt_tokens == port.count_tokens(PROMPT)
    m = last.metrics
    assert isinstance(m, EngineMetrics)
    assert m.num_generation_tokens == 12
    assert m.first_token_mono_s is not None and m.last_token_mono_s is not None
    assert m.first_token_mono_s <= m.last_token_mono_s
    assert m.arrival_time_wall_s is not None and abs(m.arrival_time_wall_s - last.received_ts) < 60
    # copied at receipt: earlier chunks keep their own numbers
    assert chunks[0].metrics is not None and chunks[0].metrics.num_generation_tokens <= 12
    assert all(a.received_ts <= b.received_ts for a, b in zip(chunks, chunks[1:]))
    fs = port.pop_finished_stats(r)
    assert isinstance(fs, FinishedStats)
    assert (fs.request_id, fs.num_generation_tokens, fs.finish_reason) == (r, 12, "length")
    assert fs.num_prompt_tokens == port.count_tokens(PROMPT)
    assert fs.inference_time_s >= 0 and fs.mean_time_per_output_token_s >= 0
    assert port.pop_finished_stats(r) is None  # once
    await wait_not_live(port, r)


@session_loop
async def test_abort_mid_generation(port):
    r = rid("abort")
    it = port.generate(r, PROMPT, exact(600))
    chunks = [await run_with_timeout(it.__anext__())]
    assert r in port.live_request_ids()
    await port.abort([r])
    chunks += await run_with_timeout(drain(it))
    last = chunks[-1]
    assert (last.finished, last.finish_reason) == (True, "abort")
    assert ntok(chunks) < 600
    await wait_not_live(port, r)
    await asyncio.sleep(0.05)
    assert port.pop_finished_stats(r) is None  # vLLM reports nothing for aborted requests


@session_loop
async def test_closing_the_iterator_early_ends_the_request(port):
    r = rid("aclose")
    it = port.generate(r, PROMPT, exact(600))
    await run_with_timeout(it.__anext__())
    assert r in port.live_request_ids()
    await it.aclose()  # also what cancelling the consuming task does
    await wait_not_live(port, r)


@session_loop
async def test_abort_unknown_id_raises_nothing(port):
    await port.abort([rid("never-submitted")])
    await port.abort([])


@session_loop
async def test_resident_stream_segments(port):
    r = rid("resident")
    it = port.open_stream(r, StreamSegment("Hello there.", exact(5)))
    consumer = asyncio.create_task(drain(it))
    await run_with_timeout(port.update_stream(r, StreamSegment(" How are you?", exact(4))))
    assert r in port.live_request_ids()
    await run_with_timeout(port.update_stream(r, StreamSegment(" Tell me more.", exact(3))))
    await port.close_stream(r)
    chunks = await run_with_timeout(consumer)
    segments, cur = [], []
    for c in chunks:
        cur.append(c)
        if c.segment_done:
            segments.append(cur)
            cur = []
    assert [ntok(s) for s in segments] == [5, 4, 3]
    prompts = ["Hello there.", " How are you?", " Tell me more."]
    assert [s[-1].num_prompt_tokens for s in segments] == [port.count_tokens(p) for p in prompts]
    assert sum(c.segment_done for c in chunks) == 3
    assert [c.finish_reason for c in chunks if c.segment_done] == ["length"] * 3
    assert chunks[-1].finished and not any(c.finished for c in chunks[:-1])
    assert ntok(cur) == 0  # only the closing chunk after the last segment (if any)
    with pytest.raises(StagePortError):
        await port.update_stream(r, StreamSegment("late", exact(1)))
    await wait_not_live(port, r)


@session_loop
async def test_stream_abort_while_parked(port):
    r = rid("resident-abort")
    it = port.open_stream(r, StreamSegment("Hello there.", exact(3)))
    first = []
    async for c in it:
        first.append(c)
        if c.segment_done:
            break
    assert ntok(first) == 3 and r in port.live_request_ids()
    await port.abort([r])
    rest = await run_with_timeout(drain(it))
    assert rest and (rest[-1].finished, rest[-1].finish_reason) == (True, "abort")
    await wait_not_live(port, r)
    with pytest.raises(StagePortError):
        await port.update_stream(r, StreamSegment("x", exact(1)))


@session_loop
async def test_update_unknown_stream_raises(port):
    with pytest.raises(StagePortError):
        await port.update_stream(rid("nope"), StreamSegment("x", exact(1)))
    await port.close_stream(rid("nope"))  # nothing


@session_loop
async def test_prompt_too_long(port):
    prompt = " ".join(["fox"] * (port.max_model_len + 50))
    assert port.count_tokens(prompt) > port.max_model_len
    r = rid("long")
    it = port.generate(r, prompt, exact(4))
    with pytest.raises(PromptTooLong) as ei:
        await run_with_timeout(it.__anext__())
    assert ei.value.request_id == r
    await wait_not_live(port, r)


@session_loop
async def test_stream_segment_too_long_raises_from_iterator(port):
    r = rid("resident-long")
    it = port.open_stream(r, StreamSegment("Hello there.", exact(2)))
    consumer = asyncio.create_task(drain(it))
    await run_with_timeout(port.update_stream(r, StreamSegment(" fox" * (port.max_model_len + 50), exact(2))))
    with pytest.raises(PromptTooLong):
        await run_with_timeout(consumer)
    await wait_not_live(port, r)


@session_loop
async def test_flaky_abort_keeps_request_running(port):
    flaky = FlakyAbortPort(port)
    assert isinstance(flaky, StagePort) and flaky.stage_id == port.stage_id
    r = rid("flaky")
    it = flaky.generate(r, PROMPT, exact(600))
    chunks = [await run_with_timeout(it.__anext__())]
    flaky.fail_next_aborts(1, error="boom")
    with pytest.raises(AbortFailed, match="boom") as ei:
        await flaky.abort([r])
    assert ei.value.request_id == r and flaky.failed_aborts == [[r]]
    assert r in flaky.live_request_ids()
    chunks.append(await run_with_timeout(it.__anext__()))  # still producing
    assert not chunks[-1].finished
    await flaky.abort([r])  # disarmed: reaches the engine
    chunks += await run_with_timeout(drain(it))
    assert chunks[-1].finish_reason == "abort"
    await wait_not_live(port, r)


# --------------------------------------------------------------------------- live-only


@pytest.mark.vllm
@session_loop
async def test_live_two_engines_stats_are_per_engine(live_ports):
    thinker, talker = live_ports.thinker, live_ports.talker
    assert (thinker.stage_id, talker.stage_id) == (0, 1)
    r = rid("both")
    steps0 = (thinker.counters.iterations, talker.counters.iterations)
    a, b = await run_with_timeout(
        asyncio.gather(drain(thinker.generate(r, PROMPT, exact(6))), drain(talker.generate(r, PROMPT, exact(9))))
    )
    assert (ntok(a), ntok(b)) == (6, 9)
    sa, sb = thinker.pop_finished_stats(r), talker.pop_finished_stats(r)
    assert (sa.num_generation_tokens, sb.num_generation_tokens) == (6, 9)
    # Each engine counts its own iterations: at least one per output it delivered.
    assert thinker.counters.iterations - steps0[0] >= len(a)
    assert talker.counters.iterations - steps0[1] >= len(b)
    assert thinker.chat_prompt([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n")


# --------------------------------------------------------------------------- fake-only


@session_loop
async def test_fake_scripted_reply_stops():
    fake = FakeStagePort(reply="Paris is the capital")
    chunks = await drain(fake.generate("x", "q", GenerationParams(max_tokens=32)))
    assert "".join(c.text_delta for c in chunks) == "Paris is the capital"
    assert chunks[-1].finish_reason == "stop" and ntok(chunks) == 4
    again = await drain(fake.generate("y", "q", GenerationParams(max_tokens=32)))
    assert [c.new_token_ids for c in again] == [c.new_token_ids for c in chunks]  # deterministic
    assert fake.count_tokens("a b  c") == 3


@session_loop
async def test_fake_shutdown():
    from engine_bridge.ports import EngineDead

    fake = FakeStagePort()
    await fake.shutdown()
    with pytest.raises(EngineDead):
        await fake.generate("x", "q", exact(1)).__anext__()
    with pytest.raises(AbortFailed):
        await fake.abort(["x"])


# --------------------------------------------------------------------------- metrics_map (pure)


def test_itls_from_receipts_splits_merged_deltas():
    assert itls_from_receipts([(10.0, 1), (10.02, 1), (10.08, 3), (10.09, 0)]) == pytest.approx([20, 20, 20, 20])
    assert itls_from_receipts([(1.0, 2)]) == [0.0]
    assert itls_from_receipts([(1.0, 0)]) is None


def test_stage_stats_ordinary_prefers_vllm_numbers():
    m = EngineMetrics(
        arrival_time_wall_s=1000.0,
        queued_mono_s=50.0,
        scheduled_mono_s=50.01,
        first_token_mono_s=50.1,
        last_token_mono_s=50.5,
        num_generation_tokens=5,
        first_token_latency_s=0.095,
    )
    fs = FinishedStats("r", "length", 0.6, 120, 5, 0.01, 0.09, 0.49, 0.4, 0.024)
    out = stage_stats_from_outputs(
        num_prompt_tokens=120,
        num_output_tokens=5,
        metrics=m,
        finished=fs,
        submit_wall_s=1000.0,
        first_output_wall_s=1000.2,
        last_output_wall_s=1000.6,
        receipts=[(1000.2, 1), (1000.23, 1), (1000.25, 1), (1000.27, 1), (1000.29, 1)],
        finish_reason="length",
    )
    s = out.stats
    assert (s.num_tokens_in, s.num_tokens_out, s.finish_reason) == (120, 5, "length")
    assert s.vllm_ttft_ms == pytest.approx(95.0)
    assert s.vllm_tpot_ms == pytest.approx(24.0)
    assert s.stage_gen_time_ms == pytest.approx(490.0)
    assert s.vllm_itls_ms == pytest.approx([30, 20, 20, 20])
    assert s.vllm_itl_ms == pytest.approx(22.5)
    assert s.audio_generated_frames is None
    assert out.stage_submit_ts == 1000.0
    stamps = [out.engine_submit_ts, out.engine_first_token_ts, out.engine_last_token_ts]
    assert [(st.clock, st.s) for st in stamps] == [
        ("engine_monotonic", 50.0),
        ("engine_monotonic", 50.1),
        ("engine_monotonic", 50.5),
    ]


def test_stage_stats_without_finished_stats_uses_one_clock_each():
    m = EngineMetrics(
        arrival_time_wall_s=1000.0,
        queued_mono_s=50.0,
        scheduled_mono_s=50.02,
        first_token_mono_s=50.1,
        last_token_mono_s=50.3,
        num_generation_tokens=3,
    )
    out = stage_stats_from_outputs(
        num_prompt_tokens=10,
        num_output_tokens=3,
        metrics=m,
        finished=None,
        submit_wall_s=1000.0,
        first_output_wall_s=1000.15,
        last_output_wall_s=1000.35,
        finish_reason="abort",
    )
    s = out.stats
    assert s.vllm_ttft_ms == pytest.approx(150.0)  # wall − wall (no first_token_latency)
    assert s.vllm_tpot_ms == pytest.approx(100.0)  # (50.3 − 50.1) / 2, mono − mono
    assert s.stage_gen_time_ms == pytest.approx(280.0)  # 50.3 − 50.02, mono − mono
    assert s.vllm_itls_ms is None and s.vllm_itl_ms is None


def test_stage_stats_resident_segment_anchored_on_its_submit():
    # vLLM reset arrival_time/first_token_latency to when it accepted the chunk (after gating)
    m = EngineMetrics(
        arrival_time_wall_s=95.1,
        queued_mono_s=1.0,
        scheduled_mono_s=1.0,
        first_token_mono_s=9.1,
        last_token_mono_s=9.4,
        num_generation_tokens=40,
        first_token_latency_s=0.05,
    )
    out = stage_stats_from_outputs(
        num_prompt_tokens=40,
        num_output_tokens=16,
        metrics=m,
        finished=None,
        submit_wall_s=95.005,
        first_output_wall_s=95.155,
        last_output_wall_s=95.455,
        resident=True,
    )
    s = out.stats
    assert s.vllm_ttft_ms == pytest.approx(150.0)
    assert s.vllm_tpot_ms == pytest.approx(20.0)
    assert s.stage_gen_time_ms == pytest.approx(450.0)
    assert out.engine_submit_ts is None  # queued/scheduled stamps are not per segment
    assert out.engine_first_token_ts.clock == out.engine_last_token_ts.clock == "engine_monotonic"


def test_stage_stats_talker_audio_fields():
    out = stage_stats_from_outputs(
        num_prompt_tokens=14,
        num_output_tokens=150,
        metrics=None,
        finished=None,
        submit_wall_s=None,
        first_output_wall_s=None,
        last_output_wall_s=None,
        frames_per_token=320,
        sample_rate=24000,
    )
    s = out.stats
    assert (s.audio_generated_frames, s.audio_sample_rate) == (48000, 24000)
    assert s.audio_duration_s == pytest.approx(2.0)
    assert s.vllm_ttft_ms is None and s.vllm_tpot_ms is None and s.stage_gen_time_ms is None
    assert out.engine_first_token_ts is None


# --------------------------------------------------------------------------- import boundary


def test_importing_engine_bridge_pulls_no_vllm_or_torch():
    code = (
        "import sys, engine_bridge, engine_bridge.vllm_port, tests.fakes.fake_port, "
        "tests.fakes.faults, engine_bridge.metrics_map; "
        "bad = [m for m in ('vllm', 'torch') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
