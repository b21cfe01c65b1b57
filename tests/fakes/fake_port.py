"""``FakeStagePort``: a scripted, in-process FAKE of a stage engine (no vllm, no torch).

For fast rule tests of the session engine only — never a stand-in for a test that claims
vLLM behaviour. It follows the :class:`~engine_bridge.ports.StagePort` contract the way
``VllmStagePort`` does (same chunk flags, same stream gating and ending, same errors):

* Tokens: word ``i`` of ``reply`` (whitespace-split), then ``"tok{i}"`` words; one token per
  chunk; token ids are stable per word within a port (first seen → next id, from 1000).
  With a ``reply`` and ``ignore_eos=False`` the request stops (``finish_reason="stop"``) when
  the reply is exhausted; otherwise it runs to ``max_tokens`` (``"length"``).
* ``token_delay_s`` (s) before each token; 0 still yields to the event loop per token.
* ``count_tokens`` = whitespace split; a prompt (or a resident request's growing context)
  over ``max_model_len`` raises PromptTooLong before any output of that request/segment.
* ``abort``: running or parked ids get one last chunk ``finished=True, finish_reason="abort"``;
  unknown ids: nothing. ``fail_aborts`` style faults live in :mod:`tests.fakes.faults`.
* ``pop_finished_stats``: only for ordinary requests that finished by stop/length (none for
  aborted or streaming ones), like vLLM. Metrics use ``time.monotonic()`` as the "engine"
  clock and ``time.time()`` for ``arrival_time_wall_s``.
* ``shutdown``: later calls raise EngineDead (generate/open_stream) or AbortFailed (abort).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

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

__all__ = ["FakeStagePort"]

_END = object()  # close marker on a stream's input queue
_ABORT = object()  # abort marker on a stream's input queue


@dataclass(eq=False)
class _Req:
    request_id: str
    arrival_wall: float
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    queued_mono: float = field(default_factory=time.monotonic)
    first_mono: float | None = None
    last_mono: float | None = None
    n_generated: int = 0
    first_latency: float | None = None
    # resident only
    inputs: asyncio.Queue | None = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    submitted: int = 1
    completed: int = 0
    closing: bool = False
    ended: bool = False


class FakeStagePort:
    """A FAKE StagePort (see module docstring). ``reply``: scripted words of every answer."""

    def __init__(
        self,
        stage_id: int = 0,
        name: str = "fake",
        *,
        reply: str | None = None,
        token_delay_s: float = 0.0,
        max_model_len: int = 1024,
    ) -> None:
        self.stage_id = stage_id
        self.name = name
        self.reply = reply.split() if reply else None
        self.token_delay_s = token_delay_s
        self.max_model_len = max_model_len
        self._live: dict[str, list[_Req]] = {}
        self._streams: dict[str, _Req] = {}
        self._finished: dict[str, FinishedStats] = {}
        self._vocab: dict[str, int] = {}
        self._dead = False

    # -- token script ---------------------------------------------------------------------

    def _word(self, i: int) -> str:
        return self.reply[i] if self.reply and i < len(self.reply) else f"tok{i}"

    def _token_id(self, word: str) -> int:
        return self._vocab.setdefault(word, 1000 + len(self._vocab))

    def _stops_at(self, i: int, p: GenerationParams) -> bool:
        return self.reply is not None and not p.ignore_eos and i >= len(self.reply)

    def _check_alive(self, request_id: str) -> None:
        if self._dead:
            raise EngineDead(f"fake stage {self.stage_id}: shut down", request_id)

    def _check_len(self, request_id: str, n: int) -> None:
        if n > self.max_model_len:
            raise PromptTooLong(
                f"fake stage {self.stage_id} request {request_id!r}: prompt of {n} tokens "
                f"is over max_model_len {self.max_model_len}",
                request_id,
            )

    def _metrics(self, r: _Req) -> EngineMetrics:
        return EngineMetrics(
            arrival_time_wall_s=r.arrival_wall,
            queued_mono_s=r.queued_mono,
            scheduled_mono_s=r.queued_mono,
            first_token_mono_s=r.first_mono,
            last_token_mono_s=r.last_mono,
            num_generation_tokens=r.n_generated,
            first_token_latency_s=r.first_latency,
        )

    async def _tick(self, r: _Req) -> bool:
        """Wait one token delay; True if the request was aborted meanwhile."""
        if r.aborted.is_set():
            return True
        if self.token_delay_s > 0:
            try:
                await asyncio.wait_for(r.aborted.wait(), self.token_delay_s)
            except TimeoutError:
                pass
        else:
            await asyncio.sleep(0)
        return r.aborted.is_set()

    def _chunk(
        self,
        r: _Req,
        ids: tuple[int, ...],
        text: str,
        *,
        segment_done: bool,
        finished: bool,
        reason: str | None,
        n_prompt: int | None,
    ) -> StageChunk:
        return StageChunk(
            request_id=r.request_id,
            stage_id=self.stage_id,
            new_token_ids=ids,
            text_delta=text,
            segment_done=segment_done,
            finished=finished,
            finish_reason=reason,
            received_ts=time.time(),
            num_prompt_tokens=n_prompt,
            metrics=self._metrics(r),
        )

    async def _segment(
        self, r: _Req, p: GenerationParams, n_prompt: int, *, resident: bool
    ) -> AsyncIterator[StageChunk]:
        """One segment's chunks; the last has segment_done (and finished unless resident)."""
        seg_start_wall = time.time()
        for i in range(p.max_tokens):
            if await self._tick(r):
                return
            now = time.monotonic()
            if i == 0:
                r.first_mono, r.first_latency = now, time.time() - seg_start_wall
            r.last_mono = now
            r.n_generated += 1
            word = self._word(i)
            last = i + 1 >= p.max_tokens or self._stops_at(i + 1, p)
            reason = ("stop" if i + 1 < p.max_tokens else "length") if last else None
            yield self._chunk(
                r,
                (self._token_id(word),),
                (" " if i else "") + word,
                segment_done=last,
                finished=last and not resident,
                reason=reason,
                n_prompt=n_prompt,
            )
            if last:
                return

    def _register(self, r: _Req) -> None:
        self._live.setdefault(r.request_id, []).append(r)

    def _unregister(self, r: _Req) -> None:
        reqs = self._live.get(r.request_id, [])
        if r in reqs:
            reqs.remove(r)
        if not reqs:
            self._live.pop(r.request_id, None)

    def _abort_chunk(self, r: _Req, n_prompt: int) -> StageChunk:
        return self._chunk(r, (), "", segment_done=True, finished=True, reason="abort", n_prompt=n_prompt)

    # -- StagePort ----------------------------------------------------------------------------

    def generate(self, request_id: str, prompt: str, params: GenerationParams) -> AsyncIterator[StageChunk]:
        """Ordinary request (fake); submitted on the first ``__anext__``."""
        return self._generate(request_id, prompt, params)

    async def _generate(self, request_id: str, prompt: str, params: GenerationParams) -> AsyncIterator[StageChunk]:
        self._check_alive(request_id)
        n_prompt = self.count_tokens(prompt)
        self._check_len(request_id, n_prompt)
        r = _Req(request_id, time.time())
        self._register(r)
        try:
            last: StageChunk | None = None
            async for last in self._segment(r, params, n_prompt, resident=False):
                if last.finished:
                    self._finished[request_id] = self._stats(r, last.finish_reason, n_prompt, params)
                    self._unregister(r)
                yield last
            if last is None or not last.finished:
                yield self._abort_chunk(r, n_prompt)
        finally:
            self._unregister(r)

    def _stats(self, r: _Req, reason: str | None, n_prompt: int, p: GenerationParams) -> FinishedStats:
        first, last = r.first_mono or r.queued_mono, r.last_mono or r.queued_mono
        decode = last - first
        return FinishedStats(
            request_id=r.request_id,
            finish_reason=reason,
            e2e_latency_s=time.time() - r.arrival_wall,
            num_prompt_tokens=n_prompt,
            num_generation_tokens=r.n_generated,
            queued_time_s=0.0,
            prefill_time_s=first - r.queued_mono,
            inference_time_s=last - r.queued_mono,
            decode_time_s=decode,
            mean_time_per_output_token_s=decode / (r.n_generated - 1) if r.n_generated > 1 else 0.0,
        )

    def open_stream(self, request_id: str, first: StreamSegment) -> AsyncIterator[StageChunk]:
        """Resident request (fake); registered at once, runs on the first ``__anext__``."""
        self._check_alive(request_id)
        if request_id in self._streams:
            raise StagePortError(f"fake stage {self.stage_id}: stream {request_id!r} is already open", request_id)
        r = _Req(request_id, time.time(), inputs=asyncio.Queue())
        self._streams[request_id] = r
        self._register(r)
        return self._stream(r, first)

    async def _stream(self, r: _Req, first: StreamSegment) -> AsyncIterator[StageChunk]:
        assert r.inputs is not None
        context = 0
        seg: object = first
        try:
            while isinstance(seg, StreamSegment):
                n_prompt = self.count_tokens(seg.prompt)
                context += n_prompt
                self._check_len(r.request_id, context)
                r.arrival_wall = time.time()
                last: StageChunk | None = None
                async for last in self._segment(r, seg.params, n_prompt, resident=True):
                    context += len(last.new_token_ids)
                    if last.segment_done:
                        r.completed += 1
                        if r.completed >= r.submitted:
                            r.idle.set()
                        if r.closing:  # input ended while this segment ran: it ends the request
                            yield dataclasses.replace(last, finished=True)
                            return
                    yield last
                if last is None or not last.segment_done:  # aborted mid-segment
                    yield self._abort_chunk(r, n_prompt)
                    return
                seg = await r.inputs.get()
            if seg is _ABORT:
                yield self._abort_chunk(r, 0)
                return
            yield StageChunk(
                request_id=r.request_id,
                stage_id=self.stage_id,
                new_token_ids=(),
                text_delta="",
                segment_done=False,
                finished=True,
                finish_reason=None,
                received_ts=time.time(),
            )
        finally:
            r.ended = True
            r.idle.set()
            if self._streams.get(r.request_id) is r:
                del self._streams[r.request_id]
            self._unregister(r)

    async def update_stream(self, request_id: str, segment: StreamSegment) -> None:
        """Waits until every earlier segment is done, then feeds ``segment`` (fake)."""
        r = self._streams.get(request_id)
        if r is None or r.closing:
            raise StagePortError(f"fake stage {self.stage_id}: no open stream {request_id!r}", request_id)
        async with r.lock:
            await r.idle.wait()
            if r.ended or r.closing:
                raise StagePortError(f"fake stage {self.stage_id}: stream {request_id!r} ended", request_id)
            r.submitted += 1
            r.idle.clear()
            assert r.inputs is not None
            r.inputs.put_nowait(segment)

    async def close_stream(self, request_id: str) -> None:
        """End the stream's input; unknown or closed ids: nothing happens."""
        r = self._streams.get(request_id)
        if r is None or r.closing:
            return
        r.closing = True
        assert r.inputs is not None
        r.inputs.put_nowait(_END)

    async def abort(self, request_ids: Sequence[str]) -> None:
        """Abort every live request under the ids (fake); unknown ids: nothing."""
        if self._dead and request_ids:
            raise AbortFailed(f"fake stage {self.stage_id}: shut down", request_ids[0])
        for rid in request_ids:
            for r in list(self._live.get(rid, [])):
                r.aborted.set()
                if r.inputs is not None:
                    r.inputs.put_nowait(_ABORT)

    def live_request_ids(self) -> set[str]:
        return {rid for rid, reqs in self._live.items() if any(not r.aborted.is_set() for r in reqs)}

    def pop_finished_stats(self, request_id: str) -> FinishedStats | None:
        return self._finished.pop(request_id, None)

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        lines = [f"{m.get('role', 'user').capitalize()}: {m.get('content', '')}" for m in messages]
        return "\n".join([*lines, "Assistant:"])

    async def shutdown(self) -> None:
        if self._dead:
            return
        await self.abort(list(self._live))
        self._dead = True
