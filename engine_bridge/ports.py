"""The hard boundary between the session engine and a stage engine (vLLM v1 style: small typed
messages, one clock per duration).

A :class:`StagePort` wraps one engine (one pipeline stage). The session engine only ever
talks to ports; ``engine_bridge.vllm_port`` is the only module that imports vllm, and
``tests.fakes.fake_port`` is a scripted fake for fast rule tests (never a stand-in for a
test that claims vLLM behaviour).

Clocks: ``StageChunk.received_ts`` is wall clock (``time.time()``) taken at receipt;
``EngineMetrics`` stamps ending in ``_mono`` are the engine core's monotonic clock and are only
ever subtracted from each other (CASE-08).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from decider.commands import PortFailure
from events.limits import storable_text


class StagePortError(RuntimeError):
    """A port operation failed; ``request_id`` names the request when there is one."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class AbortFailed(StagePortError):
    """The engine could not abort the ids (R3: the caller restores the keys and fails)."""


class PromptTooLong(StagePortError):
    """The prompt is over the model's length (vLLM ``VLLMValidationError``)."""


class EngineDead(StagePortError):
    """The engine is shut down or died."""


def port_failure(exc: BaseException) -> PortFailure:
    """The kind of a port's failure the rules decide on (``FailTurn.error``): a
    :class:`PromptTooLong` or :class:`EngineDead` by name, anything else ``STAGE_ERROR``."""
    if isinstance(exc, PromptTooLong):
        return PortFailure.PROMPT_TOO_LONG
    if isinstance(exc, EngineDead):
        return PortFailure.ENGINE_DEAD
    return PortFailure.STAGE_ERROR


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """Sampling for one request or one resident segment."""

    max_tokens: int = 32
    temperature: float = 0.0
    ignore_eos: bool = False
    seed: int | None = 0


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """A copy of vLLM's ``RequestStateStats`` taken at receipt (vLLM mutates its own object).

    ``arrival_time_wall_s`` is wall clock; every ``*_mono_s`` stamp is the engine core's
    monotonic clock. None = not reported."""

    arrival_time_wall_s: float | None = None
    queued_mono_s: float | None = None
    scheduled_mono_s: float | None = None
    first_token_mono_s: float | None = None
    last_token_mono_s: float | None = None
    num_generation_tokens: int = 0
    first_token_latency_s: float | None = None


@dataclass(frozen=True, slots=True)
class FinishedStats:
    """vLLM's ``FinishedRequestStats`` for one finished request, seconds (engine clock)."""

    request_id: str
    finish_reason: str | None
    e2e_latency_s: float
    num_prompt_tokens: int
    num_generation_tokens: int
    queued_time_s: float
    prefill_time_s: float
    inference_time_s: float
    decode_time_s: float
    mean_time_per_output_token_s: float


@dataclass(frozen=True, slots=True)
class StageChunk:
    """One output of a stage request, copied at receipt (DELTA: only new tokens).

    * ``segment_done``: this request's (or this resident segment's) generation is complete
      (vLLM: ``finish_reason`` set on the output);
    * ``finished``: the engine request itself ended (ordinary requests: same as
      ``segment_done``; a resident stream ends only when closed or aborted);
    * ``finish_reason``: ``stop`` / ``length`` / ``abort`` / None.
    """

    request_id: str
    stage_id: int
    new_token_ids: tuple[int, ...]
    text_delta: str
    segment_done: bool
    finished: bool
    finish_reason: str | None
    received_ts: float
    num_prompt_tokens: int | None = None
    metrics: EngineMetrics | None = None

    def __post_init__(self) -> None:
        # At the door: model text that cannot be stored (a lone surrogate) becomes U+FFFD, so
        # what the client sees and what the log keeps agree (DOMAIN §5.7 D12, docs/design.md).
        text = storable_text(self.text_delta)
        if text is not self.text_delta:
            object.__setattr__(self, "text_delta", text)


@dataclass(frozen=True, slots=True)
class StreamSegment:
    """One unit of resident (streaming) input: submit_initial, then submit_update per unit."""

    prompt: str
    params: GenerationParams = field(default_factory=GenerationParams)


@runtime_checkable
class StagePort(Protocol):
    """One stage engine. All methods are coroutines unless noted; errors are StagePortError
    subclasses."""

    stage_id: int
    name: str

    def generate(self, request_id: str, prompt: str, params: GenerationParams) -> AsyncIterator[StageChunk]:
        """An ordinary request (ephemeral Stage0 turn, or a Stage1 forward). The iterator
        ends after the chunk with ``finished=True`` (an abort yields one last chunk with
        ``finish_reason='abort'``). Raises PromptTooLong before any output; EngineDead."""
        ...

    def open_stream(self, request_id: str, first: StreamSegment) -> AsyncIterator[StageChunk]:
        """A resident request fed by streaming input (submit_initial). Chunks of every
        segment come out of this one iterator; ``segment_done`` marks each segment's end.
        The iterator ends when :meth:`close_stream` is called or the request is aborted."""
        ...

    async def update_stream(self, request_id: str, segment: StreamSegment) -> None:
        """submit_update: feed the next segment of an open resident request. Waits until the
        previous segment is done (vLLM merges outputs otherwise). Raises StagePortError when
        no stream is open under that id."""
        ...

    async def close_stream(self, request_id: str) -> None:
        """End a resident request's input; its iterator ends."""
        ...

    async def abort(self, request_ids: Sequence[str]) -> None:
        """Abort the ids on this engine. Returns once the engine accepted the abort; "returned"
        is not proof anything was running. Raises AbortFailed."""
        ...

    def live_request_ids(self) -> set[str]:
        """Ids the engine still holds (running or parked), for reconciliation."""
        ...

    def pop_finished_stats(self, request_id: str) -> FinishedStats | None:
        """The engine's finished-request stats for the id, once (None if none: aborted or
        streaming requests get none)."""
        ...

    def count_tokens(self, text: str) -> int:
        """Prompt tokens of ``text`` with this engine's tokenizer."""
        ...

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        """The model's chat template applied to ``messages`` (role/content), with the
        generation prompt."""
        ...

    async def shutdown(self) -> None: ...
