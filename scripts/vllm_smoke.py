#!/usr/bin/env python
"""Smoke test and fact finder for vLLM (CPU build 0.32) ``AsyncLLM``.

Starts real engines on the tiny random model and on SmolLM2-135M-Instruct
(prepared by :mod:`reports.model_prep`) and checks the behaviour that the
session ledger relies on; prints one ``FACT {json}`` line per observation and
optionally writes them all to a JSON file. docs/vllm-notes.md is based on a run
of this script.

Usage::

    .venv/bin/python scripts/vllm_smoke.py [--cache-dir DIR] [--only tiny|smollm2|all]
                                           [--json OUT.json]

Needs ``scripts/install-vllm.sh`` first. Takes about 1-2 minutes on 2 cores.
Exit status 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import os

# Must be set before vllm is imported: engine core in a child process, but no
# extra worker process (starts in ~6-8 s instead of ~14-23 s on CPU).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, is_dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FACTS: list[dict] = []
FAILURES: list[str] = []


def fact(name: str, **data) -> None:
    rec = {"fact": name, **data}
    FACTS.append(rec)
    print("FACT " + json.dumps(rec, default=str), flush=True)


def check(cond: bool, what: str) -> None:
    if not cond:
        FAILURES.append(what)
        print("CHECK FAILED: " + what, flush=True)


def rss_mib_tree() -> float:
    """RSS in MiB of this process plus all its descendants (engine core)."""
    import psutil

    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return round(total / 2**20, 1)


# ---------------------------------------------------------------------------
# custom stat logger


def make_stat_logger_factory(sink: list):
    """Per-engine StatLoggerFactory: ``factory(vllm_config, engine_index) -> StatLoggerBase``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class CollectingStatLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            self.engine_index = engine_index
            self.records = 0
            self.initialized = False

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            self.records += 1
            if iteration_stats is not None:
                sink.extend(iteration_stats.finished_requests)

        def log_engine_initialized(self):
            self.initialized = True

    return CollectingStatLogger


async def start_engine(model_dir: Path, stat_loggers=None, **overrides):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    kwargs = dict(
        model=str(model_dir),
        dtype="float16",
        enforce_eager=True,
        max_model_len=1024,
        kv_cache_memory_bytes=64 * 2**20,
    )
    kwargs.update(overrides)
    t0 = time.monotonic()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs), stat_loggers=stat_loggers)
    return engine, round(time.monotonic() - t0, 2)


async def collect(engine, prompt, sp, request_id):
    outs = []
    t0 = time.monotonic()
    async for out in engine.generate(prompt, sp, request_id):
        outs.append((round(time.monotonic() - t0, 4), out))
    return outs


# ---------------------------------------------------------------------------
# tiny model checks


async def tiny_checks(tiny_dir: Path) -> None:
    from vllm import SamplingParams
    from vllm.engine.protocol import StreamingInput
    from vllm.exceptions import VLLMValidationError
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.exceptions import EngineDeadError

    finished_stats: list = []
    factory = make_stat_logger_factory(finished_stats)
    rss0 = rss_mib_tree()
    engine, start_s = await start_engine(tiny_dir, stat_loggers=[factory])
    rss1 = rss_mib_tree()
    fact("tiny_engine_start", seconds=start_s, rss_mib_before=rss0, rss_mib_after=rss1)

    # --- plain generation, CUMULATIVE (default) ---------------------------
    sp = SamplingParams(max_tokens=32, ignore_eos=True, temperature=0.0)
    t0 = time.monotonic()
    outs = await collect(engine, "Hello, how are you?", sp, "plain-1")
    gen_s = round(time.monotonic() - t0, 3)
    last = outs[-1][1]
    same_list = all(o.outputs[0].token_ids is last.outputs[0].token_ids for _, o in outs)
    same_metrics = all(o.metrics is last.metrics for _, o in outs)
    fact(
        "tiny_generate_cumulative",
        seconds=gen_s,
        n_yields=len(outs),
        n_tokens=len(last.outputs[0].token_ids),
        finished=last.finished,
        finish_reason=last.outputs[0].finish_reason,
        token_ids_same_object_every_yield=same_list,
        metrics_same_object_every_yield=same_metrics,
        metrics_type=type(last.metrics).__name__,
        metrics=asdict(last.metrics) if is_dataclass(last.metrics) else repr(last.metrics),
        text=last.outputs[0].text[:60],
    )
    check(len(last.outputs[0].token_ids) == 32 and last.finished, "tiny: 32 tokens, finished")
    await asyncio.sleep(0.05)
    fact(
        "finished_request_stats_after_plain",
        n=len(finished_stats),
        stats=[asdict(s) for s in finished_stats],
    )
    check(len(finished_stats) == 1, "custom stat logger got one FinishedRequestStats")

    # --- DELTA ----------------------------------------------------------------
    sp = SamplingParams(
        max_tokens=16, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA
    )
    outs = await collect(engine, "Hello, how are you?", sp, "delta-1")
    fact(
        "tiny_generate_delta",
        n_yields=len(outs),
        tokens_per_yield=[len(o.outputs[0].token_ids) for _, o in outs],
        finished_flags=[o.finished for _, o in outs],
        total=sum(len(o.outputs[0].token_ids) for _, o in outs),
    )
    # Lagging consumer: tokens merge into fewer yields.
    gen = engine.generate("Hello, how are you?", sp, "delta-lag")
    lag = []
    async for o in gen:
        lag.append(len(o.outputs[0].token_ids))
        await asyncio.sleep(0.05)
    fact("tiny_generate_delta_lagging_consumer", tokens_per_yield=lag, total=sum(lag))

    # --- streaming input (resident request) -----------------------------------
    await streaming_checks(engine, StreamingInput, SamplingParams, RequestOutputKind,
                           finished_stats)

    # --- abort -------------------------------------------------------------------
    finished_stats.clear()
    sp = SamplingParams(max_tokens=900, ignore_eos=True, temperature=0.0)
    seen = []
    during = {}

    async def consume():
        async for o in engine.generate("Hello", sp, "abort-me"):
            seen.append((len(o.outputs[0].token_ids), o.finished, o.outputs[0].finish_reason))
            if len(seen) == 3:
                during["num_unfinished"] = engine.get_num_unfinished_requests()
                during["external_req_ids"] = {
                    k: list(v) for k, v in engine.output_processor.external_req_ids.items()
                }

    task = asyncio.create_task(consume())
    while len(seen) < 5:
        await asyncio.sleep(0.005)
    t0 = time.monotonic()
    await engine.abort("abort-me")
    abort_call_s = round(time.monotonic() - t0, 4)
    exc = None
    try:
        await asyncio.wait_for(task, 5)
    except Exception as e:  # noqa: BLE001
        exc = repr(e)
    await asyncio.sleep(0.05)
    fact(
        "abort",
        abort_call_seconds=abort_call_s,
        last_outputs=seen[-2:],
        consumer_exception=exc,
        during=during,
        num_unfinished_after=engine.get_num_unfinished_requests(),
        external_req_ids_after=dict(engine.output_processor.external_req_ids),
        finished_request_stats_for_aborted=[asdict(s) for s in finished_stats],
    )
    check(seen[-1][1] and seen[-1][2] == "abort", "abort: last output finished, reason abort")
    # Abort of unknown / already finished ids.
    errs = []
    for rid in ("never-existed", "plain-1", "abort-me"):
        try:
            await engine.abort(rid)
        except Exception as e:  # noqa: BLE001
            errs.append(repr(e))
    fact("abort_unknown_finished_or_aborted_ids", exceptions=errs)

    # --- duplicate request ids ---------------------------------------------------
    sp = SamplingParams(max_tokens=900, ignore_eos=True, temperature=0.0)
    res_a, res_b = [], []

    async def run(dst):
        async for o in engine.generate("Hello", sp, "dup"):
            dst.append((len(o.outputs[0].token_ids), o.finished, o.outputs[0].finish_reason,
                        o.request_id))

    ta, tb = asyncio.create_task(run(res_a)), asyncio.create_task(run(res_b))
    while len(res_a) < 2 or len(res_b) < 2:
        await asyncio.sleep(0.005)
    dup_map = {k: list(v) for k, v in engine.output_processor.external_req_ids.items()}
    n_unf = engine.get_num_unfinished_requests()
    await engine.abort("dup")
    await asyncio.gather(ta, tb)
    fact("duplicate_request_id", external_req_ids=dup_map, num_unfinished=n_unf,
         a_last=res_a[-1], b_last=res_b[-1])

    # --- break vs aclose vs task cancel -----------------------------------------
    gen = engine.generate("Hello", sp, "break-me")
    async for o in gen:
        break
    await asyncio.sleep(0.2)
    after_break = engine.get_num_unfinished_requests()
    await gen.aclose()
    await asyncio.sleep(0.05)
    after_aclose = engine.get_num_unfinished_requests()

    async def consume_forever():
        async for _ in engine.generate("Hello", sp, "cancel-me"):
            pass

    t = asyncio.create_task(consume_forever())
    await asyncio.sleep(0.3)
    before_cancel = engine.get_num_unfinished_requests()
    t.cancel()
    try:
        await t
    except asyncio.CancelledError:
        pass
    await asyncio.sleep(0.05)
    fact("break_aclose_cancel", unfinished_after_break=after_break,
         unfinished_after_aclose=after_aclose, unfinished_before_cancel=before_cancel,
         unfinished_after_cancel=engine.get_num_unfinished_requests())

    # --- prompt too long ---------------------------------------------------------
    try:
        await collect(engine, TokensPrompt(prompt_token_ids=[5] * 1100),
                      SamplingParams(max_tokens=4), "too-long")
        fact("prompt_over_max_model_len", raised=None)
        check(False, "prompt over max_model_len must raise")
    except Exception as e:  # noqa: BLE001
        fact("prompt_over_max_model_len", raised=f"{type(e).__module__}.{type(e).__qualname__}",
             is_VLLMValidationError=isinstance(e, VLLMValidationError), message=str(e)[:200])
    # prompt + max_tokens over max_model_len
    try:
        outs = await collect(engine, TokensPrompt(prompt_token_ids=[5] * 1000),
                             SamplingParams(max_tokens=100, ignore_eos=True), "long-ish")
        fact("prompt_plus_max_tokens_over_max_model_len",
             n_tokens=len(outs[-1][1].outputs[0].token_ids),
             finish_reason=outs[-1][1].outputs[0].finish_reason)
    except Exception as e:  # noqa: BLE001
        fact("prompt_plus_max_tokens_over_max_model_len",
             raised=f"{type(e).__module__}.{type(e).__qualname__}", message=str(e)[:200])

    # --- two engines in one process -------------------------------------------------
    finished2: list = []
    rss_a = rss_mib_tree()
    engine2, start2 = await start_engine(
        tiny_dir, stat_loggers=[make_stat_logger_factory(finished2)])
    rss_b = rss_mib_tree()
    sp = SamplingParams(max_tokens=32, ignore_eos=True, temperature=0.0)
    n_before = len(finished_stats)
    r1, r2 = await asyncio.gather(collect(engine, "Hello", sp, "e1"),
                                  collect(engine2, "Hello", sp, "e2"))
    await asyncio.sleep(0.05)
    fact("two_engines", second_start_seconds=start2, rss_mib_one_engine=rss_a,
         rss_mib_two_engines=rss_b,
         same_tokens=list(r1[-1][1].outputs[0].token_ids) == list(r2[-1][1].outputs[0].token_ids),
         engine1_new_finished_stats=len(finished_stats) - n_before,
         engine2_finished_stats=[s.request_id for s in finished2])
    check(len(finished2) == 1, "second engine's logger got its own FinishedRequestStats")

    # --- shutdown ------------------------------------------------------------------------
    t0 = time.monotonic()
    engine2.shutdown()
    sd = round(time.monotonic() - t0, 2)
    try:
        await collect(engine2, "Hello", sp, "after-shutdown")
        after = None
    except Exception as e:  # noqa: BLE001
        after = f"{type(e).__module__}.{type(e).__qualname__}"
    fact("shutdown", seconds=sd, generate_after_shutdown_raises=after,
         is_EngineDeadError=after is not None and after.endswith("EngineDeadError"),
         errored=engine2.errored)
    t0 = time.monotonic()
    engine.shutdown()
    fact("shutdown_first_engine", seconds=round(time.monotonic() - t0, 2),
         rss_mib_after_both=rss_mib_tree())
    _ = EngineDeadError  # import path check
    # Drop the engines now: otherwise AsyncLLM.__del__ runs at interpreter exit
    # and prints "TypeError: 'NoneType' object is not callable" (harmless).
    del engine, engine2
    gc.collect()


async def streaming_checks(engine, StreamingInput, SamplingParams, RequestOutputKind,
                           finished_stats) -> None:
    """Resident request fed by an async generator of StreamingInput chunks."""
    for kind in (RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE):
        finished_stats.clear()
        sp = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0, output_kind=kind)
        chunk_done = asyncio.Event()
        log: list[dict] = []
        chunks = ["Hello there.", " How are you?", " Tell me more."]
        t0 = time.monotonic()

        async def inputs():
            for i, text in enumerate(chunks):
                chunk_done.clear()
                # per-chunk sampling params may differ (max_tokens per turn)
                yield StreamingInput(prompt=text, sampling_params=sp.clone() if i else None)
                await chunk_done.wait()  # resident: wait for this chunk's output
                await asyncio.sleep(0.2)  # request idles between chunks
            # returning ends the request

        chunk = 0
        async for out in engine.generate(inputs(), sp, f"stream-{kind.name}"):
            co = out.outputs[0]
            log.append(dict(t=round(time.monotonic() - t0, 3), chunk=chunk,
                            finished=out.finished, finish_reason=co.finish_reason,
                            n_token_ids=len(co.token_ids),
                            n_prompt_ids=len(out.prompt_token_ids or []),
                            unfinished=engine.get_num_unfinished_requests()))
            if co.finish_reason is not None:
                chunk += 1
                chunk_done.set()
        await asyncio.sleep(0.05)
        fact(f"streaming_input_{kind.name}", outputs=log,
             finished_request_stats=[asdict(s) for s in finished_stats],
             unfinished_after=engine.get_num_unfinished_requests())
        check(chunk == len(chunks), f"streaming {kind.name}: one finish_reason per chunk")

    # Eager producer (all chunks queued at once) + lagging DELTA consumer:
    # outputs of consecutive chunks can merge, and a merge keeps only the
    # later finish_reason, so chunk boundaries can be lost.
    sp = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0,
                        output_kind=RequestOutputKind.DELTA)

    async def eager_inputs():
        for text in ("Hello there.", " How are you?", " Tell me more."):
            yield StreamingInput(prompt=text)

    log = []
    async for out in engine.generate(eager_inputs(), sp, "stream-eager"):
        log.append((len(out.outputs[0].token_ids), out.outputs[0].finish_reason, out.finished))
        await asyncio.sleep(0.1)
    fact("streaming_input_eager_producer_lagging_consumer", outputs=log,
         total_tokens=sum(n for n, _, _ in log),
         finish_reasons_seen=sum(1 for _, r, _ in log if r))

    # Input generator ends while the last chunk is still generating.
    finished_stats.clear()
    sp = SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.0,
                        output_kind=RequestOutputKind.DELTA)

    async def inputs_end_early():
        yield StreamingInput(prompt="Hello there.")

    log = []
    async for out in engine.generate(inputs_end_early(), sp, "stream-end-early"):
        log.append((len(out.outputs[0].token_ids), out.finished, out.outputs[0].finish_reason))
    await asyncio.sleep(0.05)
    fact("streaming_input_generator_ends_immediately", n_outputs=len(log), last=log[-1:],
         total_tokens=sum(n for n, _, _ in log),
         finished_request_stats=[s.finish_reason for s in finished_stats])

    # Abort a resident request that waits for its next chunk.
    gate = asyncio.Event()

    async def inputs_wait_forever():
        yield StreamingInput(prompt="Hello there.")
        await gate.wait()
        yield StreamingInput(prompt=" more")

    log = []

    async def consume():
        async for out in engine.generate(inputs_wait_forever(), sp, "stream-abort"):
            log.append((len(out.outputs[0].token_ids), out.finished,
                        out.outputs[0].finish_reason))

    task = asyncio.create_task(consume())
    while not any(r[2] for r in log):
        await asyncio.sleep(0.01)
    idle_unfinished = engine.get_num_unfinished_requests()
    idle_map = {k: list(v) for k, v in engine.output_processor.external_req_ids.items()}
    await engine.abort("stream-abort")
    await asyncio.wait_for(task, 5)
    fact("streaming_input_abort_while_idle", unfinished_while_idle=idle_unfinished,
         external_req_ids_while_idle=idle_map, last=log[-1],
         unfinished_after=engine.get_num_unfinished_requests())

    # Forbidden: stop strings / FINAL_ONLY / n>1.
    async def one():
        yield StreamingInput(prompt="x")

    errs = {}
    for label, bad in (("stop", SamplingParams(max_tokens=4, stop=["."])),
                       ("final_only", SamplingParams(max_tokens=4,
                                                     output_kind=RequestOutputKind.FINAL_ONLY)),
                       ("n2", SamplingParams(max_tokens=4, n=2))):
        try:
            async for _ in engine.generate(one(), bad, f"bad-{label}"):
                pass
            errs[label] = None
        except Exception as e:  # noqa: BLE001
            errs[label] = f"{type(e).__qualname__}: {str(e)[:80]}"
    fact("streaming_input_forbidden_params", errors=errs)


# ---------------------------------------------------------------------------
# SmolLM2


async def smollm2_checks(model_dir: Path) -> None:
    from vllm import SamplingParams

    rss0 = rss_mib_tree()
    engine, start_s = await start_engine(model_dir, stat_loggers=[make_stat_logger_factory([])])
    fact("smollm2_engine_start", seconds=start_s, rss_mib_delta=round(rss_mib_tree() - rss0, 1))
    tok = engine.get_tokenizer()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False, add_generation_prompt=True)
    sp = SamplingParams(max_tokens=32, temperature=0.0)
    t0 = time.monotonic()
    outs = await collect(engine, prompt, sp, "paris")
    dt = round(time.monotonic() - t0, 3)
    last = outs[-1][1]
    text = last.outputs[0].text
    m = last.metrics
    fact("smollm2_paris", seconds=dt, text=text, n_tokens=len(last.outputs[0].token_ids),
         finish_reason=last.outputs[0].finish_reason, ttft_s=round(outs[0][0], 3),
         first_token_latency=m.first_token_latency if m else None)
    check("Paris" in text, "SmolLM2 answers Paris")
    sp = SamplingParams(max_tokens=32, ignore_eos=True, temperature=0.0)
    for i in range(2):
        t0 = time.monotonic()
        outs = await collect(engine, prompt, sp, f"32tok-{i}")
        fact("smollm2_32_tokens", run=i, seconds=round(time.monotonic() - t0, 3),
             ttft_s=round(outs[0][0], 3))
    t0 = time.monotonic()
    engine.shutdown()
    fact("smollm2_shutdown", seconds=round(time.monotonic() - t0, 2))
    del engine
    gc.collect()


def main(argv: list[str] | None = None) -> int:
    from reports.model_prep import default_cache_dir, resolve_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help=f"model cache (default {default_cache_dir()})")
    ap.add_argument("--only", choices=("all", "tiny", "smollm2"), default="all")
    ap.add_argument("--json", type=Path, default=None, help="write all facts here")
    args = ap.parse_args(argv)

    import vllm

    fact("versions", vllm=vllm.__version__,
         multiprocessing=os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"))
    if args.only in ("all", "tiny"):
        t0 = time.monotonic()
        tiny = resolve_model("tiny", args.cache_dir)
        fact("tiny_prepare", seconds=round(time.monotonic() - t0, 2), path=str(tiny))
        asyncio.run(tiny_checks(tiny))
    if args.only in ("all", "smollm2"):
        t0 = time.monotonic()
        smol = resolve_model("smollm2", args.cache_dir, progress=print)
        fact("smollm2_prepare", seconds=round(time.monotonic() - t0, 2), path=str(smol))
        asyncio.run(smollm2_checks(smol))
    if args.json:
        args.json.write_text(json.dumps({"facts": FACTS, "failures": FAILURES},
                                        indent=1, default=str))
    print("FAILURES: " + (", ".join(FAILURES) if FAILURES else "none"), flush=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
