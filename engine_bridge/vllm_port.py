"""``VllmStagePort``: a :class:`~engine_bridge.ports.StagePort` over one vLLM 0.32 ``AsyncLLM``.

The only module of the project that imports vllm, and only inside :meth:`VllmStagePort.start`
(``import engine_bridge.vllm_port`` pulls neither vllm nor torch).

Engine: ``AsyncEngineArgs(model, dtype, enforce_eager=True, max_model_len,
kv_cache_memory_bytes, disable_log_stats=True)`` plus one per-engine custom stat logger that
keeps vLLM's ``FinishedRequestStats`` by request id (so ``RequestOutput.metrics`` is filled and
each engine's numbers stay its own). ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set before the
import unless already set. Every request uses ``RequestOutputKind.DELTA``; token ids, text and
``RequestStateStats`` are copied into immutable :class:`StageChunk` / :class:`EngineMetrics`
at receipt (vLLM mutates its own objects). vLLM iterators are always closed with ``aclose()``.

Errors: ``VLLMValidationError`` for an over-long prompt → :class:`PromptTooLong` (before any
output); ``EngineDeadError`` (or a shut-down port) → :class:`EngineDead`; any other vLLM client
or generate error → :class:`StagePortError`; any exception from ``engine.abort`` →
:class:`AbortFailed`. A mapped error's message names the stage, not the engine request id (it
can reach a client); the id is its ``request_id`` and is logged (``logger.warning``).

Resident streams (``open_stream``): one vLLM request whose prompt is an async generator of
``StreamingInput`` fed from an ``asyncio.Queue``. A segment is done when an output carries a
``finish_reason``; the next segment is only handed to vLLM after that (vLLM merges the outputs
of back-to-back chunks otherwise, keeping one ``finish_reason``). When the input ends
(``close_stream``) while idle, vLLM's iterator just stops; the port then yields one synthetic
chunk ``(no tokens, segment_done=False, finished=True, finish_reason=None)`` so every stream
ends with ``finished=True``. ``StageChunk.num_prompt_tokens`` of a stream chunk is that
segment's own input tokens (vLLM's ``prompt_token_ids`` grows with every chunk; the port
subtracts the length seen at the previous segment's end). A segment over the model length
surfaces as PromptTooLong from the stream's iterator (vLLM validates streaming chunks inside
its input task), which then ends.

Closing a port iterator before its request ended (``aclose()``, or cancelling the task that
consumes it) closes vLLM's iterator, and vLLM then aborts the request (no ``abort`` chunk, no
log of it): a caller that must keep a request running (e.g. after a failed abort) must keep
consuming its iterator. The FakeStagePort behaves the same.

Gating caveat: a segment counts as done when the stream's iterator *receives* its last output,
so ``update_stream`` waits for the consumer of that iterator; consume it in its own task.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from engine_bridge.ports import (
    AbortFailed,
    EngineDead,
    EngineMetrics,
    FinishedStats,
    GenerationParams,
    PromptTooLong,
    StageChunk,
    StagePortError,
    StreamSegment,
)

__all__ = ["VllmStagePort", "copy_metrics", "plain_chat_prompt"]

logger = logging.getLogger(__name__)

#: Finished-request stats kept per engine before the oldest are dropped (never popped ones).
FINISHED_STATS_CAP = 4096


def _load_vllm() -> SimpleNamespace:
    """Import the vllm names the port uses (lazy; sets the single-process env var first)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.protocol import StreamingInput
    from vllm.exceptions import VLLMError, VLLMValidationError
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError
    from vllm.v1.metrics.loggers import StatLoggerBase

    return SimpleNamespace(
        SamplingParams=SamplingParams,
        AsyncEngineArgs=AsyncEngineArgs,
        StreamingInput=StreamingInput,
        VLLMError=VLLMError,
        VLLMValidationError=VLLMValidationError,
        RequestOutputKind=RequestOutputKind,
        AsyncLLM=AsyncLLM,
        EngineDeadError=EngineDeadError,
        StatLoggerBase=StatLoggerBase,
    )


def copy_metrics(m: Any) -> EngineMetrics | None:
    """Copy a vLLM ``RequestStateStats`` (or None) into an immutable :class:`EngineMetrics`.
    vLLM's 0.0 means "not stamped yet" for its timestamps; it becomes None here."""
    if m is None:
        return None

    def ts(name: str) -> float | None:
        v = getattr(m, name, None)
        return float(v) if v else None

    return EngineMetrics(
        arrival_time_wall_s=ts("arrival_time"),
        queued_mono_s=ts("queued_ts"),
        scheduled_mono_s=ts("scheduled_ts"),
        first_token_mono_s=ts("first_token_ts"),
        last_token_mono_s=ts("last_token_ts"),
        num_generation_tokens=int(getattr(m, "num_generation_tokens", 0) or 0),
        first_token_latency_s=ts("first_token_latency"),
    )


def _finished_stats(f: Any) -> FinishedStats:
    reason = f.finish_reason
    return FinishedStats(
        request_id=str(f.request_id),
        finish_reason=None if reason is None else str(reason),
        e2e_latency_s=float(f.e2e_latency),
        num_prompt_tokens=int(f.num_prompt_tokens),
        num_generation_tokens=int(f.num_generation_tokens),
        queued_time_s=float(f.queued_time),
        prefill_time_s=float(f.prefill_time),
        inference_time_s=float(f.inference_time),
        decode_time_s=float(f.decode_time),
        mean_time_per_output_token_s=float(f.mean_time_per_output_token),
    )


@dataclass
class EngineCounters:
    """What one engine's stat logger has counted: ``iterations`` — engine-core steps whose
    outputs reached this frontend (one ``record`` call with iteration stats each). Fewer
    steps for the same tokens means the requests were batched together more."""

    iterations: int = 0


def _stat_logger_factory(base: type, sink: OrderedDict[str, FinishedStats], counters: EngineCounters) -> type:
    """A per-engine ``StatLoggerBase`` class (a valid vLLM StatLoggerFactory) filling ``sink``
    and ``counters``."""

    class FinishedStatsLogger(base):  # type: ignore[misc, valid-type]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            if iteration_stats is None:
                return
            counters.iterations += 1
            for f in iteration_stats.finished_requests:
                sink[str(f.request_id)] = _finished_stats(f)
                sink.move_to_end(str(f.request_id))
            while len(sink) > FINISHED_STATS_CAP:
                sink.popitem(last=False)

        def log_engine_initialized(self) -> None:
            pass

    return FinishedStatsLogger


def plain_chat_prompt(messages: Sequence[dict[str, str]]) -> str:
    """Fallback chat framing: ``"User: …\\nAssistant: …\\nAssistant:"`` (role capitalised)."""
    lines = [f"{m.get('role', 'user').capitalize()}: {m.get('content', '')}" for m in messages]
    return "\n".join([*lines, "Assistant:"])


@dataclass(eq=False)
class _Stream:
    """Port-side state of one open resident request."""

    request_id: str
    inputs: asyncio.Queue = field(default_factory=asyncio.Queue)  # StreamSegment | None (= end)
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set: every fed segment is done
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    submitted: int = 1
    completed: int = 0
    prompt_base: int = 0  # vLLM prompt_token_ids length at the end of the previous segment
    closing: bool = False
    ended: bool = False


class VllmStagePort:
    """One pipeline stage on one vLLM ``AsyncLLM`` (see the module docstring). Build with
    :meth:`start`; attributes ``stage_id``, ``name``, ``max_model_len``, ``model_dir``,
    ``counters`` (:class:`EngineCounters`)."""

    def __init__(
        self,
        engine: Any,
        v: SimpleNamespace,
        *,
        stage_id: int,
        name: str,
        model_dir: Path,
        max_model_len: int,
        finished: OrderedDict[str, FinishedStats],
        counters: EngineCounters | None = None,
    ) -> None:
        self.stage_id = stage_id
        self.name = name
        self.model_dir = model_dir
        self.max_model_len = max_model_len
        self._engine: Any = engine
        self._v = v
        self._finished = finished
        self.counters = counters or EngineCounters()
        self._streams: dict[str, _Stream] = {}
        self._tokenizer = engine.get_tokenizer()

    @classmethod
    async def start(
        cls,
        model_dir: str | Path,
        *,
        stage_id: int,
        name: str,
        max_model_len: int = 1024,
        kv_cache_memory_bytes: int = 64 * 2**20,
        dtype: str = "float16",
        load_progress: bool = True,
    ) -> VllmStagePort:
        """Start an engine on ``model_dir`` (a prepared HF directory, see reports.model_prep).

        Blocks the event loop while vLLM starts (its constructor is synchronous; ~6-20 s on
        CPU). ``kv_cache_memory_bytes`` must be given on CPU; never ``bfloat16`` on CPU.
        ``load_progress``: vLLM's weight-loading progress bars (``use_tqdm_on_load``).
        Raises whatever vLLM raises when the engine cannot start."""
        v = _load_vllm()
        finished: OrderedDict[str, FinishedStats] = OrderedDict()
        counters = EngineCounters()
        args = v.AsyncEngineArgs(
            model=str(model_dir),
            dtype=dtype,
            enforce_eager=True,
            max_model_len=max_model_len,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            disable_log_stats=True,
            use_tqdm_on_load=load_progress,
        )
        logger = _stat_logger_factory(v.StatLoggerBase, finished, counters)
        engine = v.AsyncLLM.from_engine_args(args, stat_loggers=[logger])
        port = cls(
            engine,
            v,
            stage_id=stage_id,
            name=name,
            model_dir=Path(model_dir),
            max_model_len=max_model_len,
            finished=finished,
            counters=counters,
        )
        # vllm's import machinery keeps the first importing frame chain (this frame) alive; a
        # local ``engine`` here would keep the AsyncLLM alive past shutdown() (__del__ at exit).
        del engine
        return port

    # -- helpers ---------------------------------------------------------------------------

    def _live_engine(self, request_id: str | None = None) -> Any:
        if self._engine is None:
            raise EngineDead(f"stage {self.stage_id} ({self.name}): engine is shut down", request_id)
        return self._engine

    def _sampling(self, p: GenerationParams) -> Any:
        return self._v.SamplingParams(
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            ignore_eos=p.ignore_eos,
            seed=p.seed,
            output_kind=self._v.RequestOutputKind.DELTA,
        )

    def _map_error(self, e: BaseException, request_id: str) -> StagePortError:
        """The port error for vLLM's ``e`` on ``request_id`` (module doc, Errors). Its message
        can reach a client (``FailTurn`` → the client's ``error``), so it names the stage, not
        the engine request id (an internal id, DOMAIN §1), which is replaced in vLLM's own text
        too; the id travels as the error's ``request_id`` (the ledger's ``CommandRejected``
        keeps it in its own field). The operator's log gets one warning naming the id."""
        v = self._v
        where = f"stage {self.stage_id} ({self.name})"
        logger.warning("%s request %r failed: %s: %s", where, request_id, type(e).__name__, e)
        text = str(e).replace(request_id, "<request>") if request_id else str(e)
        if isinstance(e, v.EngineDeadError):
            return EngineDead(f"{where}: engine dead: {text}", request_id)
        if isinstance(e, v.VLLMValidationError) and "context length" in text:
            return PromptTooLong(f"{where}: {text}", request_id)
        return StagePortError(f"{where}: {type(e).__name__}: {text}", request_id)

    def _chunk(self, out: Any, *, resident: bool) -> StageChunk:
        c = out.outputs[0] if out.outputs else None
        reason = None if c is None or c.finish_reason is None else str(c.finish_reason)
        finished = bool(out.finished)
        return StageChunk(
            request_id=self._request_id_of(out),
            stage_id=self.stage_id,
            new_token_ids=tuple(c.token_ids) if c is not None else (),
            text_delta=(c.text or "") if c is not None else "",
            segment_done=reason is not None or (finished and not resident),
            finished=finished,
            finish_reason=reason,
            received_ts=time.time(),
            num_prompt_tokens=len(out.prompt_token_ids) if out.prompt_token_ids is not None else None,
            metrics=copy_metrics(out.metrics),
        )

    @staticmethod
    def _request_id_of(out: Any) -> str:
        return str(out.request_id)

    async def _pump(
        self, gen: Any, request_id: str, *, resident: bool, st: _Stream | None = None
    ) -> AsyncIterator[StageChunk]:
        """Copy every output of vLLM's iterator into StageChunks; close the iterator at the end."""
        errors = (self._v.VLLMError, self._v.EngineDeadError)
        try:
            while True:
                try:
                    out = await gen.__anext__()
                except StopAsyncIteration:
                    break
                except errors as e:  # VLLMError covers validation and EngineGenerateError
                    raise self._map_error(e, request_id) from e
                chunk = self._chunk(out, resident=resident)
                if chunk.request_id != request_id:
                    chunk = dataclasses.replace(chunk, request_id=request_id)
                if st is not None and chunk.num_prompt_tokens is not None:
                    # vLLM's prompt_token_ids grows with every input chunk: report this segment's own
                    total = chunk.num_prompt_tokens
                    chunk = dataclasses.replace(chunk, num_prompt_tokens=total - st.prompt_base)
                    if chunk.segment_done:
                        st.prompt_base = total
                if st is not None and chunk.segment_done:
                    st.completed += 1
                    if st.completed >= st.submitted:
                        st.idle.set()
                yield chunk
                if chunk.finished:
                    return
            if resident:  # input ended while idle: vLLM's iterator stops without finished=True
                yield StageChunk(
                    request_id=request_id,
                    stage_id=self.stage_id,
                    new_token_ids=(),
                    text_delta="",
                    segment_done=False,
                    finished=True,
                    finish_reason=None,
                    received_ts=time.time(),
                )
        finally:
            if st is not None:
                st.ended = True
                st.idle.set()
                if self._streams.get(request_id) is st:
                    del self._streams[request_id]
            await gen.aclose()

    # -- StagePort ---------------------------------------------------------------------------

    def generate(self, request_id: str, prompt: str, params: GenerationParams) -> AsyncIterator[StageChunk]:
        """Ordinary request; see :meth:`StagePort.generate`. The request is submitted on the
        iterator's first ``__anext__``."""
        return self._generate(request_id, prompt, params)

    async def _generate(self, request_id: str, prompt: str, params: GenerationParams) -> AsyncIterator[StageChunk]:
        engine = self._live_engine(request_id)
        gen = engine.generate(prompt, self._sampling(params), request_id)
        async for chunk in self._pump(gen, request_id, resident=False):
            yield chunk

    def open_stream(self, request_id: str, first: StreamSegment) -> AsyncIterator[StageChunk]:
        """Resident request (submit_initial). The stream is registered at once (update/close may
        follow immediately); vLLM gets the request on the iterator's first ``__anext__``.
        Raises StagePortError if a stream is already open under ``request_id``."""
        self._live_engine(request_id)
        if request_id in self._streams:
            raise StagePortError(f"stage {self.stage_id}: stream {request_id!r} is already open", request_id)
        st = _Stream(request_id)
        self._streams[request_id] = st
        return self._open(st, first)

    async def _open(self, st: _Stream, first: StreamSegment) -> AsyncIterator[StageChunk]:
        v = self._v
        sampling = self._sampling

        async def inputs():
            seg: StreamSegment | None = first
            while seg is not None:
                yield v.StreamingInput(prompt=seg.prompt, sampling_params=sampling(seg.params))
                seg = await st.inputs.get()

        try:
            engine = self._live_engine(st.request_id)
            gen = engine.generate(inputs(), sampling(first.params), st.request_id)
        except BaseException:
            st.ended = True
            st.idle.set()
            self._streams.pop(st.request_id, None)
            raise
        async for chunk in self._pump(gen, st.request_id, resident=True, st=st):
            yield chunk

    async def update_stream(self, request_id: str, segment: StreamSegment) -> None:
        """submit_update: waits until every earlier segment is done, then feeds ``segment``.
        Raises StagePortError when no stream is open (or it is closing / ended meanwhile)."""
        st = self._streams.get(request_id)
        if st is None or st.closing:
            raise StagePortError(f"stage {self.stage_id}: no open stream {request_id!r}", request_id)
        async with st.lock:
            await st.idle.wait()
            if st.ended or st.closing:
                raise StagePortError(f"stage {self.stage_id}: stream {request_id!r} ended", request_id)
            st.submitted += 1
            st.idle.clear()
            st.inputs.put_nowait(segment)

    async def close_stream(self, request_id: str) -> None:
        """End the stream's input (the current segment, if any, runs to its end); its iterator
        ends with a ``finished=True`` chunk. Unknown or already closed ids: nothing happens."""
        st = self._streams.get(request_id)
        if st is None or st.closing:
            return
        st.closing = True
        st.inputs.put_nowait(None)

    async def abort(self, request_ids: Sequence[str]) -> None:
        """``engine.abort(list(ids))``; returns at once (no proof anything ran). Any exception,
        including a shut-down engine, → AbortFailed naming the first id."""
        ids = [str(i) for i in request_ids]
        if not ids:
            return
        try:
            await self._live_engine(ids[0]).abort(ids)
        except Exception as e:
            raise AbortFailed(f"stage {self.stage_id} ({self.name}): abort {ids} failed: {e}", ids[0]) from e

    def live_request_ids(self) -> set[str]:
        """Caller ids vLLM still holds (running or parked between segments), from
        ``engine.output_processor.external_req_ids`` — internal to vLLM but stable in 0.32
        (caller id → internal ids; entries removed on finish/abort). Shut down: empty set."""
        op = getattr(self._engine, "output_processor", None)
        ext = getattr(op, "external_req_ids", None)
        if ext is None:
            return set()
        return {str(k) for k, internal in list(ext.items()) if internal}

    def pop_finished_stats(self, request_id: str) -> FinishedStats | None:
        """The FinishedStats vLLM reported for ``request_id`` (recorded in the same output-handler
        step that delivers the finished output), once; None for aborted/streaming ones."""
        return self._finished.pop(request_id, None)

    def count_tokens(self, text: str) -> int:
        """Tokens vLLM will count for ``text`` as a prompt (tokenizer default special tokens)."""
        return len(self._tokenizer.encode(text))

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        """The tokenizer's chat template with the generation prompt; :func:`plain_chat_prompt`
        when the tokenizer has none."""
        if getattr(self._tokenizer, "chat_template", None):
            return self._tokenizer.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
            )
        return plain_chat_prompt(messages)

    async def shutdown(self) -> None:
        """``engine.shutdown()`` (synchronous, ~2-3 s), then drop the engine and ``gc.collect()``
        so ``AsyncLLM.__del__`` does not run at interpreter exit. Idempotent; afterwards
        generate/open_stream raise EngineDead and abort raises AbortFailed."""
        engine, self._engine = self._engine, None
        if engine is None:
            return
        try:
            engine.shutdown()
        finally:
            del engine
            gc.collect()
