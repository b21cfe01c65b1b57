"""Typed session events of the append-only log (DOMAIN §0).

Every event is a frozen pydantic v2 model discriminated by ``type`` and carries:

* ``event_id`` — UUID, unique in the whole log (re-appending it is idempotent);
* ``session_id`` — the stream the event belongs to (non-empty);
* ``ts`` — wall-clock epoch seconds (float, UTC) of the moment the fact happened, never
  recomputed. Accepted as a float, an int, an ISO-8601 string with an offset or a tz-aware
  ``datetime``; always normalised to UTC and rounded to the microsecond (CASE-08);
* ``schema_version`` — the model's current version; older rows are upcast on read
  (:mod:`events.upcasting`).

Unknown fields, wrong types and missing fields raise :class:`pydantic.ValidationError`, whose
message names the event type and the field. Validation is strict (pydantic strict mode,
:mod:`events.limits`): ``"3"`` is not ``3``, ``true`` is not ``1``, ``"yes"`` is not ``true``
(an ``event_id`` may be a UUID's text, ``ts`` an ISO-8601 time); committed rows are read back
with ``strict=False`` (:mod:`events.records`), so every log written before still reads. Use :func:`parse_event` for a plain dict.

These models are the door and the declaration (validation, the JSON Schema); readers never see
them: every event read back or handed to a fold is its struct (:mod:`events.structs`, derived
from the model here; issue 23 step 1).
"""

from __future__ import annotations

import math
import os
import random
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union
from uuid import UUID, SafeUUID

from pydantic import Field, SerializerFunctionWrapHandler, TypeAdapter, field_validator, model_serializer

from events.limits import MAX_TS_US, MIN_TS_US, LimitedModel, short_number
from events.stats import EngineStamp, StageRequestStats

FinishedReason = Literal["stop", "barge_in", "cancel", "close", "abort", "error"]
FINISHED_REASONS: tuple[str, ...] = ("stop", "barge_in", "cancel", "close", "abort", "error")
CommitAction = Literal["START_AUTO_RESPONSE", "COMMIT_ONLY", "DEFER_ACTIVE_RESPONSE"]
Outcome = Literal["ok", "failed", "not_running", "unknown_id"]


def ts_from_any(value: Any) -> float:
    """Normalise a timestamp to UTC epoch seconds rounded to the microsecond.

    Accepts int/float seconds, a tz-aware ``datetime`` or an ISO-8601 string with an offset.
    Raises ValueError for naive datetimes/strings (no timezone), NaN/inf, and any time
    outside 1970-01-01T00:00:00 … 9999-12-31T23:59:59.999999 UTC, whatever its spelling
    (DOMAIN §5.7 D12: the store keeps integer microseconds in that range).
    """
    if isinstance(value, bool):
        raise ValueError(f"ts must be epoch seconds or an ISO-8601 time, got {value!r}")
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"ts {value!r} is not an ISO-8601 time") from None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"ts {value.isoformat()!r} has no timezone; give an offset such as +00:00")
        try:
            delta = value.astimezone(UTC) - _EPOCH
        except OverflowError:  # an offset that moves year 1 or 9999 out of datetime's range
            raise ValueError(f"ts {value.isoformat()!r} is outside {_TS_RANGE}") from None
        us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return _in_range(us, value.isoformat())
    if isinstance(value, (int, float)):
        try:
            f = float(value)
        except OverflowError:
            raise ValueError(f"ts {short_number(value)} is outside {_TS_RANGE}") from None
        if not math.isfinite(f):
            raise ValueError(f"ts must be finite epoch seconds, got {value!r}")
        return _in_range(ts_to_us(f), value)
    raise ValueError(f"ts must be epoch seconds or an ISO-8601 time, got {value!r}")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TS_RANGE = "1970-01-01T00:00:00Z … 9999-12-31T23:59:59.999999Z"


def _in_range(us: int, given: Any) -> float:
    """Epoch seconds of ``us`` µs, refused (naming ``given``) outside the D12 range. Near the
    top of the range a float cannot hold every µs: the last instants map to the largest float
    still inside it, so the range's own end (…59.999999) is accepted as documented."""
    if not MIN_TS_US <= us <= MAX_TS_US:
        raise ValueError(f"ts {given!r} is outside {_TS_RANGE} (DOMAIN §5.7 D12)")
    ts = us / 1_000_000
    while ts_to_us(ts) > MAX_TS_US:
        ts = math.nextafter(ts, 0.0)
    return ts


def ts_to_us(ts: float) -> int:
    """Epoch seconds -> integer microseconds, the float's exact value rounded to the nearest µs
    (``round(ts * 1e6)`` loses the last digits once the product passes 2**53, i.e. after the
    year 2255: 72057594038.625 gave ...624992). ``ts_to_us(t) / 1_000_000`` (int / int,
    correctly rounded) gives ``t`` back for every value :func:`ts_from_any` produces."""
    whole = math.floor(ts)
    return whole * 1_000_000 + round((ts - whole) * 1_000_000)  # the fraction of a float is exact


def us_to_ts(us: int) -> float:
    return us / 1_000_000


_MAX_TS = MAX_TS_US / 1_000_000
# Below this, a float's µs round within the D12 range and _in_range needs no adjustment (the
# live write path's fast case: a time.time() reading).
_SAFE_TS = (MAX_TS_US - 10_000_000) / 1_000_000


def ts_to_datetime(ts: float) -> datetime:
    """Epoch seconds -> tz-aware UTC datetime, exact to the microsecond."""
    us = ts_to_us(ts)
    from datetime import timedelta

    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)


_rng = random.Random(random.SystemRandom().getrandbits(128))
os.register_at_fork(after_in_child=lambda: _rng.seed(random.SystemRandom().getrandbits(128)))


class _EventId(UUID):
    """A fresh event id: a UUID that formats its text once (every event's id is written out
    as text twice on the live path, for its row and its struct; ~1.2 µs each time)."""

    __slots__ = ("_text",)
    _text: str

    def __str__(self) -> str:
        try:
            return self._text
        except AttributeError:
            text = UUID.__str__(self)
            object.__setattr__(self, "_text", text)
            return text

    def __repr__(self) -> str:
        return f"UUID({str(self)!r})"


# The variant (RFC 4122) and version (4) bits, as uuid.UUID(int=..., version=4) sets them.
_V4_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))
_V4_SET = (0x8000 << 48) | (4 << 76)
_UNKNOWN_SAFETY = SafeUUID.unknown


def new_event_id() -> UUID:
    """A random (version 4) UUID from a PRNG seeded from the OS at import: event ids need
    uniqueness, not secrecy, and ``uuid4()`` costs a system call per event (~20 µs here).
    Equal to ``UUID(int=bits, version=4)`` of the same bits; its text is formatted once."""
    event_id = object.__new__(_EventId)
    object.__setattr__(event_id, "int", (_rng.getrandbits(128) & _V4_CLEAR) | _V4_SET)
    object.__setattr__(event_id, "is_safe", _UNKNOWN_SAFETY)
    return event_id


class Fence(LimitedModel):
    """(incarnation, epoch, turn_id) of DOMAIN §2.1; the session is the event's stream."""

    incarnation: int = Field(0, ge=0)
    epoch: int = Field(0, ge=0)
    turn_id: int = Field(0, ge=0)

    def key(self) -> tuple[int, int, int]:
        return (self.incarnation, self.epoch, self.turn_id)


class Capabilities(LimitedModel):
    """Model capabilities (DOMAIN §3.4, E6). ``supports_core_resumable_request`` selects the
    Stage0 id shape AND submission mode: true = resident ``stage0`` id per epoch fed by
    submit_initial then submit_update; false (default) = one ephemeral ``stage0_t<N>`` id per
    committed turn, one submit_initial each."""

    supports_core_resumable_request: bool = False
    supports_concurrent_turn_requests: bool = False
    supports_barge_in: bool = True


class EventBase(LimitedModel):
    """Fields every event carries. Subclasses set ``type`` and may bump SCHEMA_VERSION
    (registering an upcaster for the previous version)."""

    SCHEMA_VERSION: ClassVar[int] = 1
    if TYPE_CHECKING:
        # Every concrete event declares ``type: Literal["<ClassName>"]`` as its first own field;
        # declared here for the type checker only, so the base adds no field (and no field
        # order change to the stored payload).
        type: str

    event_id: UUID = Field(default_factory=new_event_id)
    session_id: str = Field(min_length=1)  # no NUL character: PostgreSQL text refuses it (D12)
    ts: float
    # The payload's schema version: a Literal per class, so a row of another version can only
    # reach the model through events.upcasting (a mismatch is a validation error, never a
    # silent default). A subclass that bumps it redeclares the field with the new Literal.
    schema_version: Literal[1] = 1

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.SCHEMA_VERSION = cls.model_fields["schema_version"].default

    @field_validator("ts", mode="before")
    @classmethod
    def _normalise_ts(cls, v: Any) -> float:
        if type(v) is float and 0 <= v <= _MAX_TS:
            us = ts_to_us(v)
            if us <= MAX_TS_US and us / 1_000_000 == v:
                return v  # already exact to the microsecond and in range (the store's read path)
            if v <= _SAFE_TS:
                return us / 1_000_000  # a clock's reading: what ts_from_any gives, in one step
        return ts_from_any(v)

    @field_validator("event_id", mode="before")
    @classmethod
    def _event_id_text(cls, v: Any) -> Any:
        # A UUID's text is the UUID (JSON has no other spelling), no type confusion: the
        # models' strict mode (events.limits) would refuse it.
        if type(v) is str:
            try:
                return UUID(v)
            except ValueError:
                return v  # refused by the strict UUID check, naming the field
        return v

    @field_validator("session_id", mode="after")
    @classmethod
    def _no_nul(cls, v: str) -> str:
        if "\x00" in v:
            raise ValueError("a session id cannot contain a NUL character (\\x00)")
        return v

    def payload(self) -> dict[str, Any]:
        """The event's own fields (no envelope), JSON-ready."""
        return self.model_dump(mode="json", exclude={"type", "event_id", "session_id", "ts", "schema_version"})


# --- session lifecycle -----------------------------------------------------------------------
class SessionOpened(EventBase):
    type: Literal["SessionOpened"] = "SessionOpened"
    incarnation: int = Field(0, ge=0)
    capabilities: Capabilities = Field(default_factory=Capabilities)
    auto_response: bool = False
    num_stages: int = Field(2, ge=1)
    log_stats: bool = True
    model: str | None = None
    # Owner (issue 14): the replica that opened the session and its lease incarnation; None
    # in logs written before replicas existed (such a session has no live owner).
    replica_id: str | None = None
    replica_incarnation: int | None = Field(None, ge=0)
    # Front (issue 21, research G9): the protocol the client spoke (``realtime``, ``chat``,
    # ``duplex``...) and the front's connection label; None for a session opened in-process
    # (and in every log written before issue 21).
    protocol: str | None = None
    connection_id: str | None = None

    @model_serializer(mode="wrap")
    def _without_unset_owner_and_front(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Every serialization (``payload()``, the store's row text, ``model_dump_json``) leaves
        out the owner fields while they are unset and ``protocol`` / ``connection_id`` while
        each is None: logs written before replicas or before issue 21 stay byte-identical on
        export, their hash chain unchanged, and a live append stores what an import stores."""
        out: dict[str, Any] = handler(self)
        if self.replica_id is None and self.replica_incarnation is None:
            out.pop("replica_id", None)
            out.pop("replica_incarnation", None)
        for name in ("protocol", "connection_id"):
            if name in out and out[name] is None:
                del out[name]
        return out


class SessionTakenOver(EventBase):
    """A replica took over a session whose owner's lease had expired (issue 14). Written
    durably before anything else of the takeover, so the old owner's next append (at an older
    stream version) is refused. ``replica_id``/``replica_incarnation``: the new owner;
    ``previous_*``: the dead owner (None: a session written before replicas existed);
    ``detected``: lease_expired, lease_released, superseded (its replica restarted),
    process_gone (same host, its process no longer exists) or unowned."""

    type: Literal["SessionTakenOver"] = "SessionTakenOver"
    replica_id: str = Field(min_length=1)
    replica_incarnation: int = Field(ge=0)
    previous_replica_id: str | None = None
    previous_incarnation: int | None = Field(None, ge=0)
    detected: str = "lease_expired"


class SessionClosed(EventBase):
    """Close (irreversible). ``reason``: session_close, disconnect, disconnect_grace_expired,
    timeout, recovered_after_crash, …"""

    type: Literal["SessionClosed"] = "SessionClosed"
    reason: str = "session_close"


class InputAppended(EventBase):
    """A client input chunk. Audio is recorded by format, duration, size and digest; the
    payload itself only when asked (``payload_b64``)."""

    type: Literal["InputAppended"] = "InputAppended"
    input_kind: Literal["audio", "text"] = "audio"
    text: str | None = None
    audio_format: str | None = None
    sample_rate_hz: int | None = Field(None, gt=0)
    duration_ms: float | None = Field(None, ge=0)
    size_bytes: int = Field(0, ge=0)
    digest_sha256: str | None = None
    payload_b64: str | None = None
    is_speech: bool = True
    final: bool = False
    request_id: str | None = None
    fence: Fence | None = None


class InputCleared(EventBase):
    """input_audio_buffer.clear (issue 21, research G1): the uncommitted input buffer is
    dropped; a running response and committed input awaiting ``response.create`` are not
    touched. ``dropped_chunks``: the appends the buffer held (0: an empty buffer cleared)."""

    type: Literal["InputCleared"] = "InputCleared"
    dropped_chunks: int = Field(0, ge=0)
    fence: Fence | None = None


class TurnCommitted(EventBase):
    """input_audio_buffer.commit (DOMAIN §2.3). ``response_id`` is set when the response is
    pre-created at commit (response_required + create_response): the commit ts is then the
    turn's arrival_ts (M6)."""

    type: Literal["TurnCommitted"] = "TurnCommitted"
    turn_id: int = Field(ge=0)
    create_response: bool = True
    action: CommitAction = "COMMIT_ONLY"
    response_id: str | None = None
    overlap_speech_ms: float = Field(0.0, ge=0)


class ResponseListened(EventBase):
    """The model decided to listen: ``response.listen`` was emitted, no response created."""

    type: Literal["ResponseListened"] = "ResponseListened"
    turn_id: int = Field(ge=0)
    request_id: str | None = None


# --- stage requests ----------------------------------------------------------------------
class _StageRequest(EventBase):
    stage_id: int = Field(ge=0)
    request_id: str = Field(min_length=1)


class StageRequestReserved(_StageRequest):
    type: Literal["StageRequestReserved"] = "StageRequestReserved"
    fence: Fence = Field(default_factory=Fence)


class StageRequestSubmitted(_StageRequest):
    """A submit to a stage engine. ``ts`` is when it was submitted (not when recorded)."""

    type: Literal["StageRequestSubmitted"] = "StageRequestSubmitted"
    # v1 named num_tokens_in "tokens_in" (events.upcasting). Narrowing the Literal is the
    # designed way to bump a version (EventBase), which mypy cannot see as a subtype.
    schema_version: Literal[2] = 2  # type: ignore[assignment]
    fence: Fence | None = None
    kind: Literal["initial", "update"] = "initial"
    resumable: bool = False
    num_tokens_in: int | None = Field(None, ge=0)


class StageRequestForwarded(_StageRequest):
    """Stage0 output forwarded to stage ``stage_id`` (≥1) under the SAME request id (DOMAIN §1.2)."""

    type: Literal["StageRequestForwarded"] = "StageRequestForwarded"
    fence: Fence | None = None
    from_stage: int = Field(0, ge=0)

    @field_validator("stage_id")
    @classmethod
    def _downstream(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"a forward targets stage_id >= 1, got {v}")
        return v


class StageOutput(_StageRequest):
    """Output of a stage. ``num_new_tokens`` is the delta (never cumulative)."""

    type: Literal["StageOutput"] = "StageOutput"
    num_new_tokens: int = Field(0, ge=0)
    text_delta: str | None = None
    audio_frames: int = Field(0, ge=0)
    model_turn_id: int | None = Field(None, ge=0)
    end_of_turn: bool = False
    finished: bool = False
    finish_reason: str | None = None


class StageRequestFinished(_StageRequest):
    """The engine reported the request finished (NOT the end of the turn, DOMAIN §2.2)."""

    type: Literal["StageRequestFinished"] = "StageRequestFinished"
    finish_reason: str | None = None
    model_turn_id: int | None = Field(None, ge=0)
    end_of_turn: bool = False


class StageMetricsReported(_StageRequest):
    """One StageRequestStats snapshot (DOMAIN §5.1). ``stage_submit_ts`` is wall clock (M2);
    engine stamps carry their clock domain (CASE-08)."""

    type: Literal["StageMetricsReported"] = "StageMetricsReported"
    stats: StageRequestStats = Field(default_factory=StageRequestStats)
    stage_submit_ts: float | None = None
    engine_submit_ts: EngineStamp | None = None
    engine_first_token_ts: EngineStamp | None = None
    engine_last_token_ts: EngineStamp | None = None

    @field_validator("stage_submit_ts", mode="before")
    @classmethod
    def _norm_submit(cls, v: Any) -> float | None:
        return None if v is None else ts_from_any(v)


class StageRequestReleased(_StageRequest):
    """Binding (stage_id, request_id) dropped from request_resources."""

    type: Literal["StageRequestReleased"] = "StageRequestReleased"
    cause: str = "release"


class StageRequestRestored(_StageRequest):
    """Binding restored after a failed abort/release (R3)."""

    type: Literal["StageRequestRestored"] = "StageRequestRestored"
    fence: Fence | None = None
    submitted: bool = True
    cause: str = "abort_failed"


class StageRequestLost(_StageRequest):
    """Crash recovery: the log held this id as running but no engine has it."""

    type: Literal["StageRequestLost"] = "StageRequestLost"
    cause: str = "not_found_on_engine"


class TransferTx(EventBase):
    """One connector transfer (TX side) between stages; increments, not running totals."""

    type: Literal["TransferTx"] = "TransferTx"
    from_stage: int = Field(ge=0)
    to_stage: int = Field(ge=0)
    request_id: str = Field(min_length=1)
    size_bytes: int = Field(0, ge=0)
    tx_time_ms: float = Field(0.0, ge=0)
    used_shm: bool = False


class ActiveRequestBound(EventBase):
    type: Literal["ActiveRequestBound"] = "ActiveRequestBound"
    request_id: str | None = None


# --- responses and turns -----------------------------------------------------------------
class ResponseBegun(EventBase):
    """Response begin (DOMAIN §2.2, §5.3 open). ``commit_ts`` is the caller's commit ts."""

    type: Literal["ResponseBegun"] = "ResponseBegun"
    response_id: str = Field(min_length=1)
    turn_id: int = Field(0, ge=0)
    request_id: str | None = None
    commit_ts: float | None = None

    @field_validator("commit_ts", mode="before")
    @classmethod
    def _norm_commit(cls, v: Any) -> float | None:
        return None if v is None else ts_from_any(v)


class ResponseEnded(EventBase):
    """Response end. ``cause`` (model, or a cancel source) beats ``status`` (CASE-13)."""

    type: Literal["ResponseEnded"] = "ResponseEnded"
    response_id: str = Field(min_length=1)
    status: Literal["completed", "cancelled", "failed", "incomplete"] | None = None
    cause: str | None = None


class TurnCompleted(EventBase):
    type: Literal["TurnCompleted"] = "TurnCompleted"
    completed_turn_id: int = Field(ge=0)
    new_turn_id: int = Field(ge=0)
    cause: Literal["model", "mechanical"] = "model"


class CancelRequested(EventBase):
    """A cancel source (DOMAIN §2.4) and its legacy wire reason."""

    type: Literal["CancelRequested"] = "CancelRequested"
    source: str = Field(min_length=1)
    wire_reason: str | None = None
    response_id: str | None = None


class EpochAdvanced(EventBase):
    type: Literal["EpochAdvanced"] = "EpochAdvanced"
    old_epoch: int = Field(ge=0)
    new_epoch: int = Field(ge=0)


class TurnFinalized(EventBase):
    """Turn finalize (DOMAIN §5.5). ``finished_reason`` may be a raw cancel source; the
    projection maps it (§2.4) and anything unknown becomes ``abort``."""

    type: Literal["TurnFinalized"] = "TurnFinalized"
    response_id: str = Field(min_length=1)
    finished_reason: str = "stop"


# --- cleanup -----------------------------------------------------------------------------
class AbortRequested(EventBase):
    """Intent to abort ids on stage pools (all pools when ``stage_ids`` is None, R2).
    ``reason`` is the cancel source that caused it (barge_in, abort, session_close, …)."""

    type: Literal["AbortRequested"] = "AbortRequested"
    request_ids: list[str] = Field(min_length=1)
    stage_ids: list[int] | None = None
    reason: str | None = None


class AbortResult(EventBase):
    """Per-pool outcome of an abort."""

    type: Literal["AbortResult"] = "AbortResult"
    request_ids: list[str] = Field(min_length=1)
    stage_id: int = Field(ge=0)
    outcome: Outcome
    error: str | None = None


class ReleaseRequested(EventBase):
    """Intent to clean up ids without abort (finished ids)."""

    type: Literal["ReleaseRequested"] = "ReleaseRequested"
    request_ids: list[str] = Field(min_length=1)
    cause: str = "release"


class ReleaseResult(EventBase):
    type: Literal["ReleaseResult"] = "ReleaseResult"
    request_ids: list[str] = Field(min_length=1)
    outcome: Literal["ok", "failed"]
    error: str | None = None


class CommandRejected(EventBase):
    """A refused command, kept as evidence (CASE-02): nothing else changed."""

    type: Literal["CommandRejected"] = "CommandRejected"
    command: str
    error_code: str
    message: str
    request_id: str | None = None


EVENT_TYPES: tuple[type[EventBase], ...] = (
    SessionOpened,
    InputAppended,
    InputCleared,
    TurnCommitted,
    ResponseListened,
    StageRequestReserved,
    StageRequestSubmitted,
    StageRequestForwarded,
    StageOutput,
    StageRequestFinished,
    StageMetricsReported,
    TransferTx,
    ActiveRequestBound,
    ResponseBegun,
    ResponseEnded,
    TurnCompleted,
    CancelRequested,
    EpochAdvanced,
    StageRequestReleased,
    StageRequestRestored,
    StageRequestLost,
    AbortRequested,
    AbortResult,
    ReleaseRequested,
    ReleaseResult,
    TurnFinalized,
    CommandRejected,
    SessionClosed,
    SessionTakenOver,
)
EVENT_CLASSES: dict[str, type[EventBase]] = {cls.model_fields["type"].default: cls for cls in EVENT_TYPES}

Event = Annotated[Union[tuple(EVENT_TYPES)], Field(discriminator="type")]  # type: ignore[valid-type]  # noqa: UP007
_EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(Event)  # type: ignore[arg-type]  # a runtime-built union


class UnknownEventType(ValueError):
    """A row or line names an event type this code does not know."""


def event_class(type_name: str) -> type[EventBase]:
    try:
        return EVENT_CLASSES[type_name]
    except KeyError:
        raise UnknownEventType(f"unknown event type {type_name!r}; known: {', '.join(sorted(EVENT_CLASSES))}") from None


def parse_event(data: dict[str, Any]) -> EventBase:
    """Validate a dict (envelope + payload, with ``type``) into its event model, strictly (the
    models' strict mode, :mod:`events.limits`: ``"3"`` is not ``3``; ``event_id`` may be a
    UUID's text).

    Raises UnknownEventType or pydantic.ValidationError (naming type and field).
    """
    if not isinstance(data, dict) or "type" not in data:
        raise UnknownEventType(f"an event needs a 'type' field, got {data!r:.120}")
    return event_class(data["type"]).model_validate(data)


def json_schema() -> dict[str, Any]:
    """JSON Schema of all event kinds (a discriminated union on ``type``)."""
    return _EVENT_ADAPTER.json_schema()
